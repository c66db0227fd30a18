"""Test helpers for deployments: fake engines as real processes, rows."""
import sys
from pathlib import Path

from inference.models import Deployment, EngineRuntime, LaunchProfile

PY = sys.executable

# A stand-in for llama-server: logs like it, answers /health on --port, and
# behaves as told by the FAKE_MODE environment variable.
FAKE_SERVER = """\
#!{python}
import http.server, os, sys, time
args = sys.argv[1:]
port = int(args[args.index("--port") + 1])
mode = os.environ.get("FAKE_MODE", "serve")
print("build: 1 (fake)", flush=True)
print("llama_model_loader: loaded meta data", flush=True)
if mode == "crash":
    time.sleep(0.2)
    print("error loading something: the fake engine gives up", flush=True)
    sys.exit(1)

class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/health" else 404)
        self.end_headers()
        self.wfile.write(b'{{"status": "ok"}}')
    def log_message(self, *a):
        pass

srv = http.server.HTTPServer(("127.0.0.1", port), H)
print("main: model loaded", flush=True)
srv.serve_forever()
"""


def fake_server(tmp_path) -> str:
    path = Path(tmp_path) / "fake-llama-server"
    path.write_text(FAKE_SERVER.format(python=PY))
    path.chmod(0o755)
    return str(path)


def make_profile(*, host, runtime_path, name="fake", env=None, port=None, model_path="/models/fake.gguf", **kw):
    runtime = EngineRuntime.objects.create(host=host, name=f"{name} runtime", engine="llamacpp", kind="executable",
                                           path=runtime_path)
    return LaunchProfile.objects.create(name=name, host=host, runtime=runtime, model_path=model_path,
                                        env=env or {}, port=port, **kw)


def make_deployment(profile) -> Deployment:
    return Deployment.objects.create(name=profile.name, host=profile.host, profile=profile,
                                     engine_name=profile.runtime.engine, bind_host=profile.bind_host)

