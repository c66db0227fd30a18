"""Settings for the test run: a throw-away DATA_DIR and a Redis port of our own.

The session fixture `redis_server` starts a real redis-server on that port;
subprocesses (worker, web server) get the same values through their environment.
"""
import os
import socket
import tempfile

os.environ.setdefault("DATA_DIR", tempfile.mkdtemp(prefix="kiln-test-"))
if "KILN_TEST_REDIS_PORT" not in os.environ:
    with socket.socket() as _sock:
        _sock.bind(("127.0.0.1", 0))
        os.environ["KILN_TEST_REDIS_PORT"] = str(_sock.getsockname()[1])
os.environ["REDIS_URL"] = f"redis://127.0.0.1:{os.environ['KILN_TEST_REDIS_PORT']}/0"
os.environ.setdefault("KILN_HOST_NAME", "testhost")

from dashboard.settings import *  # noqa: E402,F401,F403

