"""Conditions that need state across samples, and the checks a host makes of itself.

``GpuConditions.observe`` runs in the monitor's tick on the samples it already
has (pure Python, no I/O): it decides which GPU events open or clear and hands
them to ``raise_event_nowait`` (a background thread writes them).

``HostAgent`` is a thread each monitor runs beside its sampling loop: it sends
deliveries no worker picked up (delivery.deliver_due), and every
HOST_CHECK_EVERY_S checks free disk, that a worker serves this host's queue,
and that the other hosts' monitors still beat. The Celery worker runs the
same monitor check (``check_monitors``) so that one host's silent monitor is
noticed even when it is the only one.
"""
from __future__ import annotations

import logging
import shutil
import threading
import time
from pathlib import Path
from typing import Callable

from django.conf import settings
from django.db import close_old_connections, connections
from django.urls import reverse
from django.utils.translation import gettext as _

from dashboard.outage import DB_UNREACHABLE, Outage
from monitoring.alerts import conf, delivery, services
from monitoring.alerts.events import raise_event, raise_event_nowait
from monitoring.liveness import KNOWN_HOSTS_KEY  # host -> last time its monitor was seen (Redis hash)

log = logging.getLogger("kiln.alerts")

THERMAL_OR_HW_BITS = 0x8 | 0x20 | 0x40  # HW slowdown, thermal (software), thermal (hardware)


class GpuConditions:
    """State across samples for one host's GPUs: when each condition started, which are open."""

    def __init__(self, host: str, *, raise_fn: Callable = raise_event_nowait, clock=time.monotonic,
                 slowdown_s=None, pcie_s=None, memory_pct=None, memory_s=None):
        self.host = host
        self.raise_fn = raise_fn
        self.clock = clock
        self.slowdown_s = conf.SLOWDOWN_S if slowdown_s is None else slowdown_s
        self.pcie_s = conf.PCIE_S if pcie_s is None else pcie_s
        self.memory_pct = conf.MEMORY_FULL_PCT if memory_pct is None else memory_pct
        self.memory_s = conf.MEMORY_FULL_S if memory_s is None else memory_s
        self.since: dict[tuple[str, str], float] = {}
        self.open: set[tuple[str, str]] = set()
        # Resolved here, not in the first tick: the first reverse() loads every URLconf (~1 s).
        try:
            self.link = reverse("monitoring")
        except Exception:  # noqa: BLE001 - a broken page must not stop GPU sampling
            log.exception("alert links: cannot resolve the monitoring page")
            self.link = "/monitoring/"

    def observe(self, gpus: list[dict], xids: list[dict]) -> None:
        try:
            now = self.clock()
            for g in gpus:
                self._gpu(g, now)
            for x in xids:
                self._xid(x)
        except Exception:  # noqa: BLE001 - alerts must never stop sampling
            log.exception("alert conditions could not be checked")

    def _fields(self, g: dict) -> dict:
        return {"host": self.host, "link": self.link,
                "details": {"uuid": g.get("uuid"), "gpu": g.get("index"), "name": g.get("name")}}

    def _lasting(self, kind: str, g: dict, active: bool, needed_s: float, subject: str, extra: dict, now: float):
        ident = (kind, g.get("uuid") or str(g.get("index")))
        if active:
            start = self.since.setdefault(ident, now)
            if ident not in self.open and now - start >= needed_s:
                self.open.add(ident)
                fields = self._fields(g)
                fields["details"].update(extra, lasting_s=round(now - start, 1))
                self.raise_fn(kind, subject=subject, **fields)
        else:
            self.since.pop(ident, None)
            if ident in self.open:
                self.open.discard(ident)
                fields = self._fields(g)
                self.raise_fn(kind, resolved=True, subject=_("GPU %(i)s on %(host)s: cleared") % {
                    "i": g.get("index"), "host": self.host}, **fields)

    def _gpu(self, g: dict, now: float) -> None:
        label = _("GPU %(i)s (%(name)s) on %(host)s") % {"i": g.get("index"), "name": g.get("name"), "host": self.host}
        bits = g.get("clocks_event_bits") or 0
        reasons = [r for r in (g.get("clocks_event_reasons") or []) if "thermal" in r or "HW" in r]
        self._lasting("gpu_slowdown", g, bool(bits & THERMAL_OR_HW_BITS), self.slowdown_s,
                      _("%(gpu)s is slowed down: %(why)s") % {"gpu": label, "why": ", ".join(reasons)},
                      {"reasons": reasons, "temperature_c": g.get("temperature_c")}, now)
        down = g.get("pcie_downgraded")
        if down is not None:
            self._lasting("gpu_pcie_downgraded", g, bool(down), self.pcie_s,
                          _("%(gpu)s: PCIe link at Gen%(gen)s x%(width)s, maximum Gen%(gmax)s x%(wmax)s") % {
                              "gpu": label, "gen": g.get("pcie_gen"), "width": g.get("pcie_width"),
                              "gmax": g.get("pcie_gen_max"), "wmax": g.get("pcie_width_max")},
                          {"pcie_gen": g.get("pcie_gen"), "pcie_width": g.get("pcie_width"),
                           "pcie_gen_max": g.get("pcie_gen_max"), "pcie_width_max": g.get("pcie_width_max")}, now)
        ecc = {k: g.get(k) for k in ("ecc_uncorrected_volatile", "remapped_rows_pending", "remapped_rows_failure",
                                     "retired_pages_pending")}
        bad = bool(ecc["ecc_uncorrected_volatile"]) or any(ecc[k] for k in list(ecc)[1:])
        self._lasting("gpu_ecc", g, bad, 0.0,
                      _("%(gpu)s: uncorrectable ECC errors or memory repair pending (reset the GPU when idle)") % {
                          "gpu": label}, ecc, now)
        used, total = g.get("memory_used_bytes"), g.get("memory_total_bytes")
        if used is not None and total:
            pct = 100.0 * used / total
            self._lasting("gpu_memory_full", g, pct >= self.memory_pct, self.memory_s,
                          _("%(gpu)s memory is %(pct).1f%% full") % {"gpu": label, "pct": pct},
                          {"memory_used_pct": round(pct, 1)}, now)

    def _xid(self, x: dict) -> None:
        uuid = x.get("uuid") or str(x.get("gpu_index"))
        self.raise_fn("gpu_xid", severity="critical", host=self.host, link=self.link,
                      key=f"xid:{uuid}:{x.get('xid')}",
                      subject=_("GPU %(i)s on %(host)s: %(what)s") % {"i": x.get("gpu_index"), "host": self.host,
                                                                     "what": x.get("description")},
                      details={"uuid": x.get("uuid"), "gpu": x.get("gpu_index"), "xid": x.get("xid")})


# ----------------------------------------------------------------- host checks


def check_disk(host: str, folders: dict[str, Path] | None = None, *, free_gb: float | None = None) -> None:
    free_gb = conf.DISK_FREE_GB if free_gb is None else free_gb
    folders = folders or {"models": Path(settings.MODELS_DIR), "data": Path(settings.DATA_DIR)}
    for name, folder in folders.items():
        try:
            usage = shutil.disk_usage(folder)
        except OSError:
            continue
        free = usage.free / 1024**3
        key = f"disk:{host}:{name}"
        if free < free_gb:
            raise_event("disk_low", host=host, key=key, link=reverse("models"),
                        subject=_("Only %(free).1f GiB free in the %(name)s folder on %(host)s (%(path)s)") % {
                            "free": free, "name": name, "host": host, "path": folder},
                        details={"path": str(folder), "free_gb": round(free, 1), "threshold_gb": free_gb})
        else:
            raise_event("disk_low", resolved=True, host=host, key=key,
                        subject=_("Free space in the %(name)s folder on %(host)s is back to %(free).1f GiB") % {
                            "name": name, "host": host, "free": free})


def workers_for_queue(queue: str, timeout: float = 1.5) -> list[str] | None:
    """Names of the workers consuming ``queue``; None when the broker cannot be asked."""
    from dashboard.celery import app

    try:
        answers = app.control.inspect(timeout=timeout).active_queues() or {}
    except Exception as exc:  # noqa: BLE001 - broker down: a different problem, said elsewhere
        log.warning("cannot ask the workers which queues they serve: %s", exc)
        return None
    return sorted(w for w, queues in answers.items() if any(q.get("name") == queue for q in queues or []))


def check_worker(host: str, *, workers_fn=workers_for_queue) -> None:
    queue = f"host.{host}"
    workers = workers_fn(queue)
    if workers is None:
        return
    if workers:
        raise_event("no_worker", resolved=True, host=host, details={"queue": queue},
                    subject=_("A worker serves %(queue)s again (%(w)s)") % {"queue": queue, "w": ", ".join(workers)})
    else:
        raise_event("no_worker", host=host, link=reverse("home"), details={"queue": queue},
                    subject=_("No worker serves the queue %(queue)s: downloads, launches and stops on %(host)s "
                              "wait") % {"queue": queue, "host": host})


def check_monitors(redis_client, *, silent_s: float | None = None, forget_after_s: float = 7 * 86400) -> None:
    """Raise host_offline for each host whose monitor was seen before but has not beaten for silent_s."""
    from dashboard.services import monitor_heartbeats

    silent_s = conf.MONITOR_SILENT_S if silent_s is None else silent_s
    now = time.time()
    beating = {b["host"]: b["time"] for b in monitor_heartbeats()}
    for host, seen in beating.items():
        redis_client.hset(KNOWN_HOSTS_KEY, host, seen)
    for raw_host, raw_seen in (redis_client.hgetall(KNOWN_HOSTS_KEY) or {}).items():
        host = raw_host.decode() if isinstance(raw_host, bytes) else raw_host
        seen = float(raw_seen)
        if host in beating:
            raise_event("host_offline", resolved=True, host=host,
                        subject=_("The monitor on %(host)s reports again") % {"host": host})
        elif now - seen > forget_after_s:
            redis_client.hdel(KNOWN_HOSTS_KEY, host)
        elif now - seen >= silent_s:
            raise_event("host_offline", host=host, link=reverse("monitoring"),
                        subject=_("The monitor on %(host)s has been silent for %(s)d s: the host may be offline") % {
                            "host": host, "s": now - seen},
                        details={"last_seen": time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(seen))})


class HostAgent(threading.Thread):
    """The monitor's alert thread, never the sampling loop: sends what this monitor raised at
    once (a worker may claim it first), the backstop for what nobody sent, the host checks."""

    def __init__(self, host: str, *, every_s: float = 2.0, checks_every_s: float | None = None,
                 worker_check: bool = True):
        super().__init__(name="kiln-alert-agent", daemon=True)
        self.host = host
        self.every_s = every_s
        self.checks_every_s = conf.HOST_CHECK_EVERY_S if checks_every_s is None else checks_every_s
        self.worker_check = worker_check
        self.stopping = threading.Event()

    def stop(self):
        self.stopping.set()
        delivery.listen_locally().put([])  # wake the thread

    def run(self):
        # Sending what this monitor just raised is the latency that matters, so it has this
        # thread to itself: the backstop (which may wait on a slow or dead receiver) and the host
        # checks (the worker check waits up to 1.5 s for Celery's answers) run on a second one.
        # With both on one thread an event that arrived during a check waited for it (p99 1.7 s).
        sweeper = threading.Thread(target=self._sweep, name="kiln-alert-sweeper", daemon=True)
        sweeper.start()
        local = delivery.listen_locally()
        while not self.stopping.is_set():
            ids = local.get()  # stop() puts [] to wake this
            if self.stopping.is_set():
                break
            close_old_connections()
            for pk in ids:  # raised in this process just now: send at once
                try:
                    delivery.deliver(pk)
                except Exception:  # noqa: BLE001 - the backstop or a worker tries again
                    log.exception("alert delivery %s failed", pk)
        # The thread ends: close its connection whatever CONN_MAX_AGE says (close_old_connections
        # keeps a PostgreSQL connection open for reuse, here until the garbage collector finds it).
        connections.close_all()
        sweeper.join(10)

    def _sweep(self):
        """Every ``every_s``: the backstop for what nobody sent; every ``checks_every_s``: the host checks."""
        from dashboard.services import redis_client

        last_checks = float("-inf")
        # Give the host's worker (started together with the monitor) a moment before the first check.
        first = time.monotonic() + min(15.0, self.checks_every_s)
        outage = Outage("the database (alerts)", "alerts wait in this process")
        wait_s = self.every_s
        while not self.stopping.wait(wait_s):
            close_old_connections()
            wait_s = self.every_s
            try:
                delivery.deliver_due(stop=self.stopping)
                outage.over()
            except DB_UNREACHABLE as exc:  # a cut link: said once, retried less often, checks skipped
                wait_s = max(self.every_s, outage.failed(exc))
                continue
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("alert backstop failed")
            now = time.monotonic()
            if now >= first and now - last_checks >= self.checks_every_s:
                last_checks = now
                for check in (lambda: check_disk(self.host), services.prune_history,
                              lambda: check_worker(self.host) if self.worker_check else None,
                              lambda: check_monitors(redis_client())):
                    if self.stopping.is_set():
                        break
                    try:
                        check()
                    except DB_UNREACHABLE as exc:
                        outage.failed(exc)
                        break
                    except Exception:  # noqa: BLE001 - one failing check must not stop the others
                        log.exception("alert host check failed")
        connections.close_all()  # the thread ends (see run)
