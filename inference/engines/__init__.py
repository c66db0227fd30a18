"""Inference engine plugins (vLLM, llama.cpp, SGLang) behind one interface.

    from inference.engines import get_engine, LaunchSpec, Runtime
    engine = get_engine("vllm")
    argv = engine.build_argv(spec, runtime)
"""

from inference.engines.base import (  # noqa: F401
    ENGINES,
    PHASES,
    Engine,
    EngineError,
    InvalidLaunch,
    LaunchSpec,
    LogEvent,
    Runtime,
    UnknownEngine,
    VersionInfo,
    get_engine,
    load_all,
    parse_extra_args,
)

load_all()  # fill ENGINES with every plugin
