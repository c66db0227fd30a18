"""Make a tiny Llama that a real vLLM can serve, with no download.

Run with a Python that has torch and transformers (the vLLM runtime's own):

    <engine venv>/bin/python tests/vllm/tiny_llama.py OUT_DIR

Random weights (seeded), hidden size 128, 2 layers, 4 attention heads of 32
(vLLM's CPU attention takes head sizes 32, 64, 80 and up only), a byte-level
BPE tokenizer trained here on a few sentences with the `tokenizers` package,
and a chat template, so /v1/chat/completions works. The text it writes is
noise; the process, its log and its metrics are real.

with_positions() copies a made model claiming a longer context, LONG_POSITIONS, so
that a request of that length does not fit the KV cache vLLM gets on CPU.
"""
import json
import shutil
import sys
from pathlib import Path

SENTENCES = [
    "Kiln starts and stops language models on a team's own GPUs.",
    "The quick brown fox jumps over the lazy dog.",
    "Say hi. Hello! What is the capital of France? Paris is the capital of France.",
    "user assistant system: you are a helpful assistant.",
    "0 1 2 3 4 5 6 7 8 9 10 100 1000, a b c d e f g h i j k l m n o p q r s t u v w x y z.",
]
SPECIAL = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
MAX_POSITIONS = 2048
# KV cache a token: 2 layers x (K, V) x 4 kv heads x 32 x 2 bytes (bf16) = 1 KiB, so the 1 GiB of
# VLLM_CPU_KVCACHE_SPACE=1 holds 1,048,576 tokens; 4x that cannot start ("the estimated maximum model length").
LONG_POSITIONS = 4 * 1024 * 1024


def make(out: Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM

    out.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(SENTENCES * 4, trainer)
    tok.save(str(out / "tokenizer.json"))
    vocab = tok.get_vocab_size()
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|im_end|>",
        "unk_token": "<unk>", "pad_token": "</s>", "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }, indent=1))
    (out / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": "<s>", "eos_token": "<|im_end|>", "unk_token": "<unk>", "pad_token": "</s>"}))
    config = LlamaConfig(
        vocab_size=vocab, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=MAX_POSITIONS,
        bos_token_id=tok.token_to_id("<s>"), eos_token_id=tok.token_to_id("<|im_end|>"),
        pad_token_id=tok.token_to_id("</s>"), tie_word_embeddings=True, torch_dtype="bfloat16",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def with_positions(src: Path, out: Path, positions: int) -> Path:
    """A copy of `src` whose config claims `positions` max positions. The weights are the same
    (RoPE has none); stdlib only, so any Python can make it."""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in ("config.json", "tokenizer_config.json"):
            shutil.copy2(f, out / f.name)
    for name, key in (("config.json", "max_position_embeddings"), ("tokenizer_config.json", "model_max_length")):
        data = json.loads((src / name).read_text())
        data[key] = positions
        (out / name).write_text(json.dumps(data, indent=1))
    return out


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: tiny_llama.py OUT_DIR")
    print(make(Path(sys.argv[1])))
