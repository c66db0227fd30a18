"""The team's OpenAI-compatible gateway: /v1/ on the panel.

Engines listen on 127.0.0.1; the team reaches them through the panel with a
per-user API key (Bearer). One request:

0. asgi.GatewayHandler: /v1/ is served by Django's ASGI handler without the
   page middleware and per-request thread hand-offs (same URLconf and views);
1. keys.authenticate: one Redis script call reads the key's copy (by its
   sha256; filled from the database on a miss, deleted when the key is
   revoked, so the very next request in every web process sees it) and
   counts the request in the key's rate-limit window (ratelimit);
2. routing.route: the ready deployments serving the request's `model`
   (table cached 1 s per process), round-robin; none ready -> 503 with
   Retry-After, none at all -> 404;
3. proxy: the body goes to the engine over a shared aiohttp connection pool;
   a stream is relayed event by event as it arrives (never buffered whole),
   the `usage` chunk is read on the way, and an engine dying mid-stream ends
   the client's stream with an OpenAI-style error event;
4. usage.record: counted in memory, written per minute bucket about once a
   second (a few UPDATEs per second, not one INSERT per request).

The playground calls the same views with the user's session (and CSRF
token) instead of a key: a real path through the same proxy; its usage is
recorded against the user with no key, and it is not rate limited.
"""
