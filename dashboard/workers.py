"""The gunicorn worker class for the web process: uvicorn, without
permessage-deflate on websockets.

Every open tab gets the monitor's ~8 KB sample once a second; compressing it
separately for each tab was the largest share of the web process's cost per
sample and doubled the sample-to-browser p99 with 50 tabs
(bench/monitoring.py). On a LAN the saved bytes are worth less than the CPU.

The master checks the database for unapplied migrations once, before it forks
a worker (check_config). Each worker would refuse too, through the app's
lifespan (dashboard.migrations_check), but gunicorn's arbiter raises a second
HaltServer, with a traceback, when two workers fail to boot at the same moment.
The check runs as a child process so the master never imports Django: workers
forked later (a HUP reload) still load the code as it is on disk then.
"""
import subprocess
import sys
from pathlib import Path

from uvicorn_worker import UvicornWorker as _UvicornWorker

REPO = Path(__file__).resolve().parent.parent
# A PostgreSQL that drops packets holds a connect for minutes (libpq waits as long as TCP does).
# Past this the master starts unchecked, as on a database that cannot be reached
# (migrations_check); each worker's lifespan checks again as it starts.
CHECK_TIMEOUT_S = 60


class UvicornWorker(_UvicornWorker):
    CONFIG_KWARGS = {**_UvicornWorker.CONFIG_KWARGS, "ws_per_message_deflate": False}

    @classmethod
    def check_config(cls, cfg, log):
        parent = getattr(super(), "check_config", None)
        if parent is not None:
            parent(cfg, log)
        try:
            check = subprocess.run([sys.executable, "-m", "dashboard.migrations_check", "the web server"],
                                   cwd=REPO, capture_output=True, text=True, timeout=CHECK_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            log.warning("could not check the database for unapplied migrations: no answer within %s s; "
                        "starting unchecked", CHECK_TIMEOUT_S)
            return
        if check.returncode:
            log.error("%s", (check.stderr or check.stdout).strip())
            raise SystemExit(check.returncode)
