"""Run one batch: an asyncio loop with `concurrency` workers, a pacing gap,
and a flusher that records results once.

Each line goes through the gateway's own pieces (routing to a ready
deployment, the shared engine pool, usage recorded against the batch's key;
bodies were checked at upload), so a batch is counted and routed as the same
calls from a client would be. A line answered 429/5xx, timed out or whose
connection broke is retried alone with backoff; only an engine that nobody
can connect to (or no ready deployment) pauses the batch.

Recording a result, in this order (the flusher, about twice a second):
1. the lines' output/error JSON is appended to the files and fsynced;
2. one transaction marks those lines done/failed and stores the files'
   committed sizes on the batch row.
A crash between 1 and 2 leaves bytes past the committed size: the next run
truncates them (services.recover) and sends those lines again, so the
output holds every line once. A line is claimed (pending -> sending) by a
conditional update before it is sent, and a line marked done/failed is
never claimed again. What the engine may see twice is a line that was in
flight when the worker died: it had no recorded result.

Memory: lines are claimed in chunks, results are held until the next flush
(< 1 s), and a line's text is read from the input file by offset when it is
sent; nothing grows with the number of lines.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import aiohttp
from django.conf import settings
from django.db import close_old_connections, connection, connections, transaction
from django.db.models import F
from django.utils import timezone

from inference.gateway import routing, usage
from inference.gateway.proxy import Caller, open_upstream
from inference.models import Batch, BatchLine

log = logging.getLogger(__name__)
FLUSH_EVERY_S = 1.0
OWNER_CHECK_S = 2.0  # how soon a revoked key or a disabled user stops a running batch
FLUSH_AT = 512  # results that trigger a flush before the timer
PAUSE_POLL_S = 3.0
RETRYABLE_STATUS = {408, 409, 425, 429, 500, 502, 503, 504}
NOT_READY = {"deployment_not_ready", "deployment_unreachable"}


def max_attempts() -> int:
    return int(getattr(settings, "BATCH_MAX_ATTEMPTS", 5))


def request_timeout() -> float:
    return float(getattr(settings, "BATCH_REQUEST_TIMEOUT_S", 600))


def backoff(attempt: int) -> float:
    base = float(getattr(settings, "BATCH_BACKOFF_S", 1.0))
    return min(60.0, base * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)


@dataclass
class Item:
    pk: int
    custom_id: str
    offset: int
    length: int


@dataclass
class Result:
    pk: int
    ok: bool
    status_code: int | None
    attempts: int
    error: str
    tokens: int
    prompt_tokens: int
    completion_tokens: int
    line: bytes  # the output or error file's line


class Paused(Exception):
    def __init__(self, reason: str, model: str):
        super().__init__(reason)
        self.reason, self.model = reason, model


class GiveBack(Exception):
    """The line has no result and goes back to pending (the batch is stopping)."""


def _int(value) -> int:
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


class _Ids:
    """Unique ids for output lines without a syscall each: a random prefix per process, then a counter."""

    def __init__(self):
        self.prefix = os.urandom(6).hex()
        self.count = itertools.count()

    def __call__(self) -> str:
        return f"{self.prefix}{next(self.count):012x}"


_req_id = _Ids()


def output_line(custom_id: str, status_code: int | None, body, error: dict | None, raw_body: bytes | None = None
                ) -> bytes:
    """One line of the output/error file in OpenAI's shape."""
    head = b'{"id":"batch_req_' + _req_id().encode() + b'","custom_id":' + json.dumps(custom_id).encode()
    if status_code is None:
        return head + b',"response":null,"error":' + json.dumps(error).encode() + b"}\n"
    body_bytes = raw_body if raw_body is not None else json.dumps(body, separators=(",", ":")).encode()
    return (head + b',"response":{"status_code":' + str(status_code).encode() + b',"request_id":"'
            + _req_id().encode() + b'","body":' + body_bytes + b'},"error":'
            + (json.dumps(error).encode() if error else b"null") + b"}\n")


class Runner:
    def __init__(self, batch: Batch):
        self.batch_id = batch.pk
        self.claim = batch.claim
        self.endpoint = batch.endpoint
        self.concurrency = max(1, batch.concurrency)
        self.gap = batch.pacing_ms / 1000.0
        self.default_model = batch.default_model
        self.caller = Caller(batch.key_id, batch.user_id)
        self.input_path = batch.input_file.path
        self.output_path = batch.output_file.path
        self.error_path = batch.error_file.path
        self.db = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"batch-{batch.pk}-db")
        self.results: list[Result] = []
        self.unsent: list[int] = []  # claimed but not sent (pause, cancel): back to pending
        self.cancelled = False
        self.paused: Paused | None = None
        self.lost = False  # another runner took the batch: stop without writing
        self.stop_reason: str | None = None  # its key was revoked or its user disabled or deleted
        self._owner_checked = 0.0
        self._next_send = 0.0
        self._pace = asyncio.Lock() if self.gap else None
        self._flush_now = asyncio.Event()
        self._last_line = 0

    # ------------------------------------------------------------ database (one thread, one connection)
    async def _db(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self.db, fn, *args)

    def _claim_chunk(self, size: int) -> list[Item]:
        rows = list(BatchLine.objects.filter(batch_id=self.batch_id, status=BatchLine.Status.PENDING,
                                             line__gt=self._last_line)
                    .order_by("line").values_list("pk", "line", "custom_id", "offset", "length")[:size])
        if not rows:
            rows = list(BatchLine.objects.filter(batch_id=self.batch_id, status=BatchLine.Status.PENDING)
                        .order_by("line").values_list("pk", "line", "custom_id", "offset", "length")[:size])
        if not rows:
            return []
        ids = [r[0] for r in rows]
        # The claim: only lines still pending are taken (never one with a recorded result).
        with transaction.atomic():
            if not Batch.objects.filter(pk=self.batch_id, claim=self.claim).exists():
                self.lost = True
                return []
            BatchLine.objects.filter(pk__in=ids, status=BatchLine.Status.PENDING).update(
                status=BatchLine.Status.SENDING)
        self._last_line = rows[-1][1]
        return [Item(pk, cid, off, length) for pk, _, cid, off, length in rows]

    def _commit(self, results: list[Result], unsent: list[int], out_size: int, err_size: int) -> dict:
        """Mark lines done/failed and record the files' committed sizes, in one transaction."""
        close_old_connections()
        now = timezone.now()
        with transaction.atomic():
            batch = Batch.objects.select_for_update().filter(pk=self.batch_id).values(
                "claim", "cancel_requested").first()
            if batch is None or batch["claim"] != self.claim:
                self.lost = True
                return {"lost": True}
            lines = []
            ok = failed = pt = ct = 0
            for r in results:
                lines.append(BatchLine(pk=r.pk, status=BatchLine.Status.DONE if r.ok else BatchLine.Status.FAILED,
                                       status_code=r.status_code, attempts=r.attempts, error=r.error[:2000],
                                       tokens=r.tokens))
                ok += r.ok
                failed += not r.ok
                pt += r.prompt_tokens
                ct += r.completion_tokens
            if lines:
                # One prepared UPDATE run per line (executemany): a fraction of the CPU of
                # bulk_update's CASE expressions, which matters on a 2-core host where this
                # thread shares the GIL with the event loop sending the requests.
                table = BatchLine._meta.db_table
                with connection.cursor() as cursor:
                    cursor.executemany(
                        f"UPDATE {table} SET status = %s, status_code = %s, attempts = %s, error = %s, tokens = %s "
                        f"WHERE id = %s AND status = %s",
                        [(x.status, x.status_code, x.attempts, x.error, x.tokens, x.pk, BatchLine.Status.SENDING)
                         for x in lines])
            if unsent:
                BatchLine.objects.filter(pk__in=unsent, status=BatchLine.Status.SENDING).update(
                    status=BatchLine.Status.PENDING)
            Batch.objects.filter(pk=self.batch_id).update(
                completed=F("completed") + ok, failed=F("failed") + failed, prompt_tokens=F("prompt_tokens") + pt,
                completion_tokens=F("completion_tokens") + ct, output_size=out_size, error_size=err_size,
                heartbeat=now)
            Batch.objects.filter(pk=self.batch_id, status=Batch.Status.PAUSED).update(
                status=Batch.Status.IN_PROGRESS, reason="")
        return {"cancel": batch["cancel_requested"]}

    def _progress(self) -> dict:
        from inference.batches.schemas import batch_progress

        return {"type": "batch", **batch_progress(Batch.objects.get(pk=self.batch_id))}

    def _set_paused(self, reason: str) -> dict:
        Batch.objects.filter(pk=self.batch_id, claim=self.claim).update(
            status=Batch.Status.PAUSED, reason=reason, heartbeat=timezone.now())
        from inference.batches import services

        services.raise_alert(Batch.objects.get(pk=self.batch_id))
        return self._progress()

    def _heartbeat(self) -> bool:
        """Still ours; returns whether a cancel was asked (or the owner may no longer run it)."""
        row = Batch.objects.filter(pk=self.batch_id).values("claim", "cancel_requested").first()
        if row is None or row["claim"] != self.claim:
            self.lost = True
            return True
        Batch.objects.filter(pk=self.batch_id).update(heartbeat=timezone.now())
        return row["cancel_requested"] or self._owner_stopped()

    def _owner_stopped(self) -> bool:
        """A revoked key or a disabled or deleted user stops the batch (checked at most every OWNER_CHECK_S)."""
        from inference.batches import services

        self._owner_checked = time.monotonic()
        row = Batch.objects.filter(pk=self.batch_id).values("user_id", "key_id").first()
        if row is None:
            return False
        self.stop_reason = services.owner_stop_reason(row["user_id"], row["key_id"],
                                                      had_user=self.caller.user_id is not None,
                                                      had_key=self.caller.key_id is not None)
        return self.stop_reason is not None

    def _set_running(self) -> None:
        Batch.objects.filter(pk=self.batch_id, claim=self.claim).update(
            status=Batch.Status.IN_PROGRESS, reason="", heartbeat=timezone.now())

    # ------------------------------------------------------------ the run
    async def run(self) -> None:
        # The database thread (claims, commits) and the event loop share the GIL; a
        # shorter switch interval hands it back to the loop sooner, so a request is
        # not held behind a commit (measured in bench/batch.py). Restored after the run.
        switch = sys.getswitchinterval()
        sys.setswitchinterval(min(switch, 0.001))
        try:
            await self._run()
        finally:
            sys.setswitchinterval(switch)

    async def _run(self) -> None:
        self.in_fd = os.open(self.input_path, os.O_RDONLY)
        self.out_fd = os.open(self.output_path, os.O_WRONLY | os.O_APPEND)
        self.err_fd = os.open(self.error_path, os.O_WRONLY | os.O_APPEND)
        try:
            while True:
                self.paused = None
                await self._pass()
                if self.lost or self.cancelled or self.paused is None:
                    break
                await self._wait_ready()
                if self.lost or self.cancelled:
                    break
        finally:
            await usage.flush()
            from inference.gateway import clients

            session = clients.upstream()
            await session.close()  # this loop's pool to the engines ends with the run
            for fd in (self.in_fd, self.out_fd, self.err_fd):
                os.close(fd)
            # Its thread ends: a persistent (PostgreSQL) connection would stay open until collected.
            await self._db(connections.close_all)
            self.db.shutdown(wait=True)

    async def _pass(self) -> None:
        queue: asyncio.Queue = asyncio.Queue(maxsize=self.concurrency * 2)
        workers = [asyncio.create_task(self._worker(queue)) for _ in range(self.concurrency)]
        flusher = asyncio.create_task(self._flusher())
        try:
            chunk = max(256, self.concurrency * 8)
            while not self._stopping():
                items = await self._db(self._claim_chunk, chunk)
                if not items:
                    break
                for i, item in enumerate(items):
                    if self._stopping():
                        self.unsent.extend(x.pk for x in items[i:])
                        break
                    await queue.put(item)
            for _ in workers:
                await queue.put(None)
            await asyncio.gather(*workers)
        finally:
            for w in workers:
                w.cancel()
            flusher.cancel()
            await asyncio.gather(flusher, return_exceptions=True)
            await self._flush()

    def _stopping(self) -> bool:
        return self.cancelled or self.lost or self.paused is not None

    async def _worker(self, queue: asyncio.Queue) -> None:
        while True:
            item = await queue.get()
            if item is None:
                return
            if self._stopping():
                self.unsent.append(item.pk)
                continue
            try:
                result = await self._send(item)
            except Paused as paused:
                if self.paused is None:
                    self.paused = paused
                self.unsent.append(item.pk)
                continue
            except GiveBack:
                self.unsent.append(item.pk)
                continue
            self.results.append(result)
            if len(self.results) >= FLUSH_AT:
                self._flush_now.set()

    async def _paced(self) -> None:
        if self._pace is None:
            return
        async with self._pace:
            now = time.monotonic()
            wait = self._next_send - now
            if wait > 0:
                await asyncio.sleep(wait)
            self._next_send = max(now, self._next_send) + self.gap

    def _payload(self, item: Item) -> tuple[bytes, str]:
        raw = os.pread(self.in_fd, item.length, item.offset)
        obj = json.loads(raw)
        body = obj["body"]
        if not body.get("model") and self.default_model:
            body["model"] = self.default_model
        return json.dumps(body, separators=(",", ":")).encode(), body.get("model", "")

    async def _send(self, item: Item) -> Result:
        payload, model = self._payload(item)
        attempt = 0
        while True:
            attempt += 1
            await self._paced()
            status, body, raw, error = await self._once(payload, model)
            if status is None and error and error["code"] in NOT_READY:
                raise Paused(error["message"], model)
            retry = (status in RETRYABLE_STATUS) if status is not None else error.get("retry", False)
            if retry and attempt < max_attempts():
                # A line that would be retried is not failed because the batch is pausing or
                # cancelling meanwhile: it goes back unsent, and a resumed run sends it again.
                if self._stopping():
                    raise GiveBack()
                await asyncio.sleep(backoff(attempt))
                if self._stopping():
                    raise GiveBack()
                continue
            return self._result(item, attempt, status, body, raw, error)

    async def _once(self, payload: bytes, model: str):
        """(status, parsed body, raw body, error): an engine answer, or our own error.
        A timeout or a connection that broke after it was made is this request's
        trouble, retried with backoff; only an engine nobody can connect to pauses
        the batch (deployment_unreachable, from _call)."""
        limit = request_timeout()
        try:
            async with asyncio.timeout(limit) as deadline:  # no extra task per request, unlike wait_for
                return await self._call(payload, model)
        except TimeoutError as exc:
            if deadline.expired():
                message = f"The engine did not answer within {limit:g} s (BATCH_REQUEST_TIMEOUT_S)."
            else:  # the engine pool's own read timeout
                message = f"The engine stopped sending: {exc!r}"
            return None, None, None, {"code": "timeout", "retry": True, "message": message}
        except (aiohttp.ClientError, OSError) as exc:
            return None, None, None, {"code": "connection_error", "retry": True,
                                      "message": f"The connection to the engine broke: {exc!r}"}

    async def _open(self, upstreams, payload: bytes):
        """(response, target) from the first replica that takes the connection, or
        (None, None) when none does (nothing listens: the deployment is down).
        Unlike the gateway's views._open_first, a connection that is made and then
        closed, reset or timed out is raised, not taken as the replica being down:
        one line's failure is retried alone instead of pausing the whole batch."""
        for target in upstreams:
            try:
                return await open_upstream(target, self.endpoint, payload, False), target
            except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
                continue  # the next replica, if any
        return None, None

    async def _call(self, payload: bytes, model: str):
        """One request through the gateway's relay pieces: routing.route (the ready
        deployments of the model, round-robin), proxy.open_upstream (over the shared
        engine pool; see _open) and usage.record (per key).
        The body was checked line by line at upload, so the gateway's per-request
        body check (views.proxy) is not run again: measured in bench/batch.py, it
        and its extra task per request were a third of the runner's CPU per line."""
        route = await routing.route(model)
        if not route.upstreams:
            if not route.statuses:
                known = ", ".join(await routing.served_models()) or "none is ready"
                return None, None, None, {"code": "model_not_found", "retry": False, "message":
                                          f"The model {model!r} is not served on this panel (ready models: {known})."}
            return None, None, None, {"code": "deployment_not_ready", "retry": False, "message":
                                      f"No deployment of {model!r} is ready (now: "
                                      f"{', '.join(sorted(set(route.statuses)))}); the batch waits for one."}
        response, target = await self._open(route.upstreams, payload)
        if response is None:
            return None, None, None, {"code": "deployment_unreachable", "retry": False, "message":
                                      f"The deployment(s) serving {model!r} are marked ready but do not answer; "
                                      f"the batch waits until one does."}
        caller = self.caller
        try:
            raw = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=target.deployment_id,
                         model=model, error=True)
            return None, None, None, {"code": "upstream_disconnected", "retry": True,
                                      "message": f"The engine serving {model!r} stopped answering: {exc!r}"}
        finally:
            response.close()
        status = response.status
        try:
            body = json.loads(raw)
        except ValueError:
            body = raw.decode("utf-8", "replace")
            raw = None
        if raw is not None and (b"\n" in raw or not isinstance(body, (dict, list))):
            raw = None
        pt = ct = 0
        if isinstance(body, dict) and isinstance(body.get("usage"), dict):
            u = body["usage"]
            pt, ct = _int(u.get("prompt_tokens")), _int(u.get("completion_tokens"))
        usage.record(key_id=caller.key_id, user_id=caller.user_id, deployment_id=target.deployment_id, model=model,
                     prompt_tokens=pt, completion_tokens=ct, error=status >= 400)
        return status, body, raw, None

    def _result(self, item: Item, attempts: int, status, body, raw, error) -> Result:
        if status is None:
            err = {"code": error["code"], "message": error["message"]}
            return Result(item.pk, False, None, attempts, f"{err['code']}: {err['message']}", 0, 0, 0,
                          output_line(item.custom_id, None, None, err))
        pt = ct = 0
        if isinstance(body, dict) and isinstance(body.get("usage"), dict):
            u = body["usage"]
            pt, ct = _int(u.get("prompt_tokens")), _int(u.get("completion_tokens"))
        ok = 200 <= status < 300
        text = ""
        if not ok:
            msg = body.get("error") if isinstance(body, dict) else body
            if isinstance(msg, dict):
                msg = msg.get("message") or json.dumps(msg)
            text = f"HTTP {status}: {str(msg)[:500]}"
        return Result(item.pk, ok, status, attempts, text, pt + ct, pt, ct,
                      output_line(item.custom_id, status, body, None, raw))

    # ------------------------------------------------------------ recording
    async def _flusher(self) -> None:
        last_progress = 0.0
        publishing = None
        while True:
            try:
                await asyncio.wait_for(self._flush_now.wait(), FLUSH_EVERY_S)
            except asyncio.TimeoutError:
                pass
            self._flush_now.clear()
            await self._flush()
            if time.monotonic() - last_progress >= 1.0 and (publishing is None or publishing.done()):
                last_progress = time.monotonic()  # never waits on the channel layer: recording goes first
                publishing = asyncio.create_task(self._publish())

    async def _flush(self) -> None:
        results, self.results = self.results, []
        unsent, self.unsent = self.unsent, []
        if self.lost:
            return
        if not results and not unsent:
            cancel = await self._db(self._heartbeat)
        else:
            out = b"".join(r.line for r in results if r.ok)
            err = b"".join(r.line for r in results if not r.ok)
            out_size = await asyncio.to_thread(self._append, out, err)
            state = await self._db(self._commit, results, unsent, *out_size)
            cancel = state.get("cancel", False)
            if not cancel and time.monotonic() - self._owner_checked >= OWNER_CHECK_S:
                cancel = await self._db(self._owner_stopped)  # a busy run has no idle heartbeat
        if cancel and not self.cancelled:
            self.cancelled = True

    def _append(self, out: bytes, err: bytes) -> tuple[int, int]:
        for fd, data in ((self.out_fd, out), (self.err_fd, err)):
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if data:
                os.fsync(fd)
        return os.fstat(self.out_fd).st_size, os.fstat(self.err_fd).st_size

    async def _publish(self, payload: dict | None = None) -> None:
        try:
            from channels.layers import get_channel_layer
            from monitoring.consumers import LIVE_GROUP

            payload = payload or await self._db(self._progress)
            layer = get_channel_layer()
            if layer is not None:
                await asyncio.wait_for(layer.group_send(LIVE_GROUP, {"type": "live.message", "payload": payload}), 2)
        except Exception as exc:  # noqa: BLE001 - a missed message only delays a progress bar
            log.debug("batch progress not published: %r", exc)

    # ------------------------------------------------------------ paused
    async def _wait_ready(self) -> None:
        """The deployment went away mid-batch: pause with the reason, resume when it is ready again."""
        paused = self.paused
        log.warning("batch %s paused: %s", self.batch_id, paused.reason)
        await self._publish(await self._db(self._set_paused, paused.reason))
        while True:
            await asyncio.sleep(PAUSE_POLL_S)
            if await self._db(self._heartbeat):
                self.cancelled = True
                return
            if self.lost:
                return
            if (await routing.route(paused.model)).upstreams:
                await self._db(self._set_running)
                log.info("batch %s resumed: %s is ready again", self.batch_id, paused.model)
                return
