"""The team's OpenAI-compatible gateway: /v1/ on the panel.

Engines listen on 127.0.0.1; the team reaches them through the panel with a
per-user API key (Bearer). One request:

1. keys.authenticate: the key's sha256 is looked up in Redis (filled from the
   database on a miss, deleted when the key is revoked, so a revocation is
   seen by the very next request in every web process);
2. ratelimit.hit: a fixed one-minute window per key in Redis;
3. routing.pick: the ready deployments serving the request's `model`,
   round-robin; none ready -> 503 with Retry-After, none at all -> 404;
4. proxy: the body goes to the engine over a shared aiohttp connection pool;
   a stream is relayed event by event as it arrives (never buffered whole),
   the `usage` chunk is read on the way, and an engine dying mid-stream ends
   the client's stream with an OpenAI-style error event;
5. usage.record: counted in memory, written per minute bucket about once a
   second (a few UPDATEs per second, not one INSERT per request).

The playground calls the same views with the user's session (and CSRF
token) instead of a key: a real path through the same proxy; its usage is
recorded against the user with no key, and it is not rate limited.
"""
