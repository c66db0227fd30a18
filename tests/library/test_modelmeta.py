"""Reading model metadata from config.json and GGUF headers."""
import json

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType

from inference.library.modelmeta import ModelMetaError, read_config, read_gguf


def write_config(folder, cfg):
    (folder / "config.json").write_text(json.dumps(cfg))
    return str(folder)


def test_plain_llama_config(tmp_path):
    meta = read_config(write_config(tmp_path, {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
        "num_key_value_heads": 8, "max_position_embeddings": 131072,
        "torch_dtype": "bfloat16", "vocab_size": 128256}))
    assert meta["architecture"] == "LlamaForCausalLM"
    assert (meta["num_layers"], meta["hidden_size"], meta["num_attention_heads"],
            meta["num_kv_heads"], meta["head_dim"]) == (32, 4096, 32, 8, 128)
    assert meta["max_position_embeddings"] == 131072 and meta["torch_dtype"] == "bfloat16"
    assert meta["full_attention_layers"] == 32 and meta["quantization"] is None


def test_nested_text_config_with_layer_types_and_awq(tmp_path):
    # Shaped like Qwen3.6-27B-AWQ: the language model lives under text_config.
    layer_types = (["linear_attention"] * 3 + ["full_attention"]) * 16
    meta = read_config(write_config(tmp_path, {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5",
        "text_config": {"model_type": "qwen3_5_text", "num_hidden_layers": 64,
                        "hidden_size": 5120, "num_attention_heads": 24,
                        "num_key_value_heads": 4, "head_dim": 256,
                        "layer_types": layer_types, "max_position_embeddings": 262144,
                        "dtype": "bfloat16"},
        "vision_config": {"hidden_size": 1152, "num_attention_heads": 16},
        "quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128,
                                "zero_point": True, "modules_to_not_convert": ["visual"]}}))
    assert meta["num_layers"] == 64 and meta["num_kv_heads"] == 4 and meta["head_dim"] == 256
    assert meta["hidden_size"] == 5120  # not the vision tower's
    assert meta["layer_types"] == {"linear_attention": 48, "full_attention": 16}
    assert meta["full_attention_layers"] == 16
    assert meta["torch_dtype"] == "bfloat16" and meta["text_model_type"] == "qwen3_5_text"
    assert meta["quantization"] == {"quant_method": "awq", "bits": 4, "group_size": 128,
                                    "zero_point": True}
    json.dumps(meta)  # storable as JSON in the model row


def test_missing_kv_heads_means_multi_head(tmp_path):
    meta = read_config(write_config(tmp_path, {"num_hidden_layers": 2, "hidden_size": 64,
                                               "num_attention_heads": 4}))
    assert meta["num_kv_heads"] == 4 and meta["head_dim"] == 16


def test_bad_config_files_give_clear_errors(tmp_path):
    with pytest.raises(ModelMetaError, match="does not exist"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ModelMetaError, match="not readable JSON"):
        read_config(str(tmp_path))
    (tmp_path / "config.json").write_text("[1, 2]")
    with pytest.raises(ModelMetaError, match="JSON object"):
        read_config(str(tmp_path))


def make_gguf(path):
    w = GGUFWriter(str(path), "llama")
    w.add_name("Tiny Test")
    w.add_context_length(4096)
    w.add_block_count(2)
    w.add_embedding_length(64)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_file_type(LlamaFileType.MOSTLY_Q8_0)
    w.add_tensor("token_embd.weight", np.ones((16, 64), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones((64,), dtype=np.float32))
    # A Q8_0 tensor: 64x64 elements in blocks of 32 -> 128 blocks of 34 bytes.
    raw = np.zeros((64, 2 * 34), dtype=np.uint8)
    w.add_tensor("blk.0.attn_q.weight", raw, raw_dtype=GGMLQuantizationType.Q8_0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


def test_read_gguf_summary(tmp_path):
    meta = read_gguf(make_gguf(tmp_path / "tiny.gguf"))
    assert meta["architecture"] == "llama" and meta["name"] == "Tiny Test"
    assert (meta["context_length"], meta["num_layers"], meta["embedding_length"],
            meta["num_attention_heads"], meta["num_kv_heads"], meta["head_dim"]) == \
        (4096, 2, 64, 4, 2, 16)
    assert meta["quantization"] == "Q8_0"
    assert meta["tensor_count"] == 3
    assert meta["tensor_types"]["F32"] == {"tensors": 2, "bytes": (16 * 64 + 64) * 4}
    assert meta["tensor_types"]["Q8_0"] == {"tensors": 1, "bytes": 128 * 34}
    assert meta["tensor_bytes"] == (16 * 64 + 64) * 4 + 128 * 34
    assert meta["parameter_count"] == 16 * 64 + 64 + 64 * 64
    json.dumps(meta)


def test_read_gguf_refuses_other_files(tmp_path):
    bad = tmp_path / "x.gguf"
    bad.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(ModelMetaError, match="not a readable GGUF"):
        read_gguf(str(bad))
    with pytest.raises(ModelMetaError, match="does not exist"):
        read_gguf(str(tmp_path / "missing.gguf"))
