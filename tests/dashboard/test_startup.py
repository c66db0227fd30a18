"""A web worker imports every page and API route when it starts, before its first
connection: one that served only /v1/ and websockets otherwise grew ~23 MiB the first
time a page reached it (bench/soak.py saw it as a step in one worker's RSS)."""
import json
import subprocess
import sys

from tests.helpers import REPO, child_env

PROBE = """
import asyncio, json, sys
from dashboard.asgi import application

VIEWS = ("inference.benchmarks.views", "inference.batches.views", "dashboard.api_routes")
before = [m for m in VIEWS if m in sys.modules]

async def start():
    sent = []
    inbox = asyncio.Queue()
    await inbox.put({"type": "lifespan.startup"})
    await inbox.put({"type": "lifespan.shutdown"})
    async def send(message):
        sent.append(message["type"])
    await application({"type": "lifespan"}, inbox.get, send)
    return sent

sent = asyncio.run(start())
after = [m for m in VIEWS if m in sys.modules]
print(json.dumps({"before": before, "sent": sent, "after": after}))
"""


def test_the_web_app_imports_every_route_at_start_up_not_on_the_first_page(transactional_db):
    done = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, env=child_env(), capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["before"] == []  # importing the app does not load the views yet
    assert seen["sent"] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert len(seen["after"]) == 3, seen  # the start-up loaded all three route modules
