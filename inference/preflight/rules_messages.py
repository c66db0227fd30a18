"""The wording of every rule in rules.toml, for makemessages (it reads Python, not
TOML). rules.check() translates a rule's message and fix before filling in
{gpu}, {cc} and the rest. Regenerate after editing rules.toml:

    .venv/bin/python -m inference.preflight.rules_messages > inference/preflight/rules_messages.py

tests/i18n/test_catalogues.py fails when this list and rules.toml differ.
"""
from django.utils.translation import gettext_noop

MESSAGES = [
    gettext_noop('bfloat16 needs compute capability 8.0; {gpu} is {cc}.'),
    gettext_noop('use --dtype half'),
    gettext_noop('FP8 weights have no kernel on {gpu} (compute capability {cc}).'),
    gettext_noop('use an AWQ or GPTQ checkpoint of this model'),
    gettext_noop('FP8 weights run weight-only (Marlin) on {gpu}: no FP8 tensor cores below compute capability 8.9.'),
    gettext_noop('fine for serving; a GPU with compute capability 8.9+ runs FP8 natively'),
    gettext_noop('an FP8 KV cache needs compute capability 8.9 (the attention kernels refuse it below SM89); {gpu} is {cc}.'),
    gettext_noop('use --kv-cache-dtype auto'),
    gettext_noop("vLLM's AWQ kernels need compute capability 7.5; {gpu} is {cc}."),
    gettext_noop('use the 1Cat-vLLM fork, which has AWQ kernels for SM70 (built from source, see the engine catalog on the Runtimes page), or a GPTQ checkpoint'),
    gettext_noop("vLLM's GPTQ kernels need compute capability 6.0; {gpu} is {cc}."),
    gettext_noop('use a GGUF checkpoint with llama.cpp'),
    gettext_noop('this vLLM has no NVFP4 kernel for {sm} (ModelOpt NVFP4 needs compute capability 7.5).'),
    gettext_noop('use the 1Cat-vLLM fork, which runs NVFP4 on SM70 (built from source, see the engine catalog on the Runtimes page), or a GPTQ checkpoint'),
    gettext_noop('NVFP4 weights on {gpu} go through a dequantizing emulation kernel: expect lower throughput than AWQ.'),
    gettext_noop('prefer an AWQ checkpoint on V100 when speed matters'),
    gettext_noop('NVFP4 runs weight-only (Marlin FP4 W4A16) on {gpu}; native FP4 needs compute capability 10.0.'),
    gettext_noop('none needed'),
    gettext_noop('the {backend} attention backend needs compute capability 8.0; {gpu} is {cc}.'),
    gettext_noop('use --attention-backend TRITON_ATTN (or FLASH_ATTN_V100 on 1Cat-vLLM)'),
    gettext_noop('FlashInfer needs compute capability 7.5; {gpu} is {cc}.'),
    gettext_noop('use --attention-backend TRITON_ATTN'),
    gettext_noop('the FLASH_ATTN_V100 backend exists only in sm70 builds such as 1Cat-vLLM; vLLM {version} does not have it.'),
    gettext_noop('register the 1Cat-vLLM build, or drop --attention-backend'),
    gettext_noop('this vLLM build has no {sm} kernels (its CUDA arch list leaves {gpu} out).'),
    gettext_noop('this vLLM build has no {sm} kernels: register an sm70 build such as 1Cat-vLLM'),
    gettext_noop('stock vLLM {version} wheels carry no sm_70 code (they require compute capability 7.5); {gpu} is {cc}.'),
    gettext_noop('register an sm70 build such as 1Cat-vLLM, or an older vLLM built for sm70'),
    gettext_noop("this {engine} build has no kernels for {sm} ({gpu}): it would fail with 'no kernel image is available'."),
    gettext_noop('register a build whose CUDA arch list includes {sm}'),
    gettext_noop('the NVIDIA driver supports CUDA {driver_cuda}, but this {engine} build needs CUDA {runtime_cuda}.'),
    gettext_noop('upgrade the NVIDIA driver, or register a build for CUDA {driver_cuda}'),
    gettext_noop("DFlash drafts reuse the target model's LM head, and this checkpoint quantized it ({quant})."),
    gettext_noop('use a checkpoint that keeps lm_head unquantized (listed in ignore / modules_to_not_convert)'),
    gettext_noop('llama.cpp has no DFlash speculative decoding.'),
    gettext_noop('serve with vLLM (--speculative-config method dflash) or SGLang (--speculative-algorithm DFLASH)'),
    gettext_noop('{heads} attention heads do not split evenly over tensor parallel size {tp}.'),
    gettext_noop('use a tensor parallel size that divides {heads} (1, 2, 4 or 8 usually)'),
    gettext_noop("a context length of {max_model_len} tokens is more than this model's maximum of {model_max}."),
    gettext_noop("set --max-model-len to {model_max} or less, or leave it empty for the model's maximum"),
    gettext_noop('--ctx-size {max_model_len} over {slots} slot(s) gives each request {slot_context} tokens, more than the {model_max} this model was trained for: llama.cpp warns of a possible training context overflow and llama-server caps each slot at {model_max}, leaving the rest of the cache unused.'),
    gettext_noop("set --ctx-size to {ctx_for_slots} or less ({model_max} per slot), or raise --parallel (max_num_seqs) so that each slot's share is {model_max} or less"),
]


def from_rules():
    """The messages and fixes of rules.toml, in file order, each once."""
    import tomllib
    from inference.preflight.rules import RULES_PATH

    with open(RULES_PATH, "rb") as f:
        rules = tomllib.load(f).get("rule", [])
    return list(dict.fromkeys(text for rule in rules for text in (rule.get("message"), rule.get("fix")) if text))


if __name__ == "__main__":  # print this module with the current rules
    head = open(__file__).read().split("MESSAGES = [")[0]
    tail = open(__file__).read().split("\n]\n", 1)[1]
    print(head + "MESSAGES = [")
    for text in from_rules():
        print(f"    gettext_noop({text!r}),")
    print("]\n" + tail, end="")
