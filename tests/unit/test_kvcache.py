"""KV cache arithmetic against hand-computed values."""
import json

import pytest

from core.long_context import kvcache as kv
from diagnostics.__main__ import main

KiB, MiB, GiB = 2**10, 2**20, 2**30


def test_llama_3_70b_128k_bf16_is_exactly_40_gib():
    r = kv.report(kv.builtin_shape("llama-3-70b"), "bf16", 131072)
    assert r.bytes_per_token == 2 * 80 * 8 * 128 * 2 == 320 * KiB
    assert r.total_bytes == 40 * GiB


def test_llama_3_8b_per_token_and_128k():
    shape = kv.builtin_shape("llama-3-8b")
    assert kv.report(shape, "bf16", 1).bytes_per_token == 128 * KiB
    assert kv.kv_bytes(shape, "bf16", 131072) == 16 * GiB
    assert kv.kv_bytes(shape, "fp16", 131072) == 16 * GiB
    assert kv.kv_bytes(shape, "fp8", 131072) == 8 * GiB


def test_gqa_uses_kv_heads_not_hidden_size():
    # The seed's "128 GB at 128K" for 70B comes from using all 64 query heads; 8 KV heads is 8x less.
    mha = dict(kv.BUILTIN_CONFIGS["llama-3-70b"], num_key_value_heads=64)
    assert kv.kv_bytes(kv.shape_from_config(mha), "bf16", 131072) == 8 * 40 * GiB


def test_embedded_sliding_window_layers_are_capped():
    shape = kv.builtin_shape("embedded")
    assert (shape.layers, shape.sliding_layers, shape.full_layers, shape.sliding_window) == (18, 15, 3, 512)
    per_layer = 2 * 1 * 256 * 2  # K and V, 1 KV head, head_dim 256, bf16
    assert kv.kv_bytes(shape, "bf16", 100) == 18 * 100 * per_layer  # inside the window every layer grows
    assert kv.kv_bytes(shape, "bf16", 512) == 18 * 512 * per_layer
    assert kv.kv_bytes(shape, "bf16", 32768) == (3 * 32768 + 15 * 512) * per_layer
    r = kv.report(shape, "bf16", 4096)
    assert r.bytes_per_token == 18 * KiB and r.bytes_per_token_beyond_window == 3 * KiB
    # growth past the window comes from the 3 global layers only
    assert kv.kv_bytes(shape, "bf16", 4097) - kv.kv_bytes(shape, "bf16", 4096) == 3 * per_layer


def test_sliding_window_from_pattern_and_from_mistral_style_config():
    gemma_old = dict(num_hidden_layers=12, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                     sliding_window=512, sliding_window_pattern=6)
    s = kv.shape_from_config(gemma_old)
    assert (s.sliding_layers, s.full_layers) == (10, 2)
    mistral = dict(num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096,
                   sliding_window=4096)
    s = kv.shape_from_config(mistral)
    assert s.head_dim == 128 and s.sliding_layers == 32
    assert kv.kv_bytes(s, "bf16", 10_000) == kv.kv_bytes(s, "bf16", 4096)
    qwen_off = dict(mistral, use_sliding_window=False)
    assert kv.shape_from_config(qwen_off).sliding_layers == 0


def test_transformers_config_object_and_text_config():
    from transformers import Gemma3TextConfig, LlamaConfig

    llama = LlamaConfig(**kv.BUILTIN_CONFIGS["llama-3-8b"])
    assert kv.shape_from_config(llama) == kv.builtin_shape("llama-3-8b")
    gemma = Gemma3TextConfig(num_hidden_layers=18, num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                             hidden_size=640, sliding_window=512)
    s = kv.shape_from_config(gemma)
    assert (s.sliding_layers, s.sliding_window) == (15, 512)
    assert kv.shape_from_config({"text_config": kv.BUILTIN_CONFIGS["llama-3-8b"]}).layers == 32


def test_blocks_are_ceil_of_tokens_over_block_size():
    assert kv.blocks(0) == 0
    assert kv.blocks(1) == 1
    assert kv.blocks(16) == 1
    assert kv.blocks(17) == 2
    assert kv.blocks(131072, 16) == 8192
    assert kv.blocks(1000, 32) == 32
    r = kv.report(kv.builtin_shape("llama-3-8b"), "bf16", 17)
    assert r.blocks == 2 and r.block_bytes == 16 * 128 * KiB and r.allocated_bytes == 32 * 128 * KiB
    with pytest.raises(ValueError):
        kv.blocks(10, 0)


def test_max_tokens_after_weights():
    shape = kv.builtin_shape("llama-3-8b")
    r = kv.report(shape, "bf16", 1000, gpu_mem_bytes=80 * GiB, weights_bytes=16 * GiB, gpu_memory_utilization=0.9)
    assert r.budget_bytes == pytest.approx(56 * GiB)
    assert r.max_tokens == int(56 * GiB // (128 * KiB))
    assert kv.max_tokens(shape, "fp8", 16 * GiB) == 2 * 131072
    assert kv.max_tokens(shape, "bf16", -1) == 0
    emb = kv.builtin_shape("embedded")
    full = 18 * KiB * 512  # the whole window of every layer
    assert kv.max_tokens(emb, "bf16", full + 3 * KiB * 100) == 512 + 100
    assert kv.max_tokens(emb, "bf16", 18 * KiB * 10) == 10
    every_layer_slides = kv.shape_from_config(dict(num_hidden_layers=2, num_attention_heads=2, head_dim=64,
                                                   sliding_window=128))
    assert kv.max_tokens(every_layer_slides, "bf16", GiB) is None


def test_weight_estimate_matches_known_sizes():
    assert kv.estimate_weight_bytes(kv.BUILTIN_CONFIGS["llama-3-8b"]) / 1e9 == pytest.approx(16.06, abs=0.01)
    # the embedded model's engine reports 536.2 MB of bf16 weights; the formula skips its small q/k norms
    assert kv.estimate_weight_bytes(kv.EMBEDDED_CONFIG) / 1e6 == pytest.approx(536.2, abs=0.5)
    assert kv.estimate_weight_bytes(dict(kv.BUILTIN_CONFIGS["llama-3-8b"], num_local_experts=8)) is None


def test_bad_configs_and_dtypes_say_what_is_missing():
    with pytest.raises(kv.KVConfigError, match="num_hidden_layers"):
        kv.shape_from_config({"model_type": "bert"})
    with pytest.raises(kv.KVConfigError, match="latent"):
        kv.shape_from_config(dict(kv.BUILTIN_CONFIGS["llama-3-8b"], kv_lora_rank=512))
    with pytest.raises(kv.KVConfigError, match="fp8"):
        kv.report(kv.builtin_shape("llama-3-8b"), "int4", 10)


def test_cli_text_and_json(capsys, tmp_path):
    assert main(["kv", "--model", "llama-3-70b", "--tokens", "131072", "--kv-dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "40.00 GiB" in out and "8,192 of 16" in out
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps(kv.BUILTIN_CONFIGS["llama-3-8b"]))
    assert main(["kv", "--config", str(cfg), "--tokens", "131072", "--kv-dtype", "fp8", "--block-size", "32",
                 "--gpu-mem-gib", "80", "--weights-gib", "16", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["total_bytes"] == 8 * GiB and d["blocks"] == 4096 and d["bytes_per_token"] == 64 * KiB
    assert d["max_tokens"] == int((80 * 0.9 - 16) * GiB // (64 * KiB))
    cfg.write_text("{not json")
    assert main(["kv", "--config", str(cfg), "--tokens", "1"]) == 2
    assert "Could not read" in capsys.readouterr().err


def test_gemma2_alternates_sliding_and_global_layers_without_saying_so():
    # Gemma 2 9B's config.json: sliding_window but neither layer_types nor a pattern.
    shape = kv.shape_from_config({"model_type": "gemma2", "num_hidden_layers": 42, "num_attention_heads": 16,
                                  "num_key_value_heads": 8, "head_dim": 256, "sliding_window": 4096})
    assert shape.sliding_layers == 21 and shape.sliding_window == 4096


def test_falcon_kv_heads_come_from_its_own_fields():
    base = {"model_type": "falcon", "num_hidden_layers": 32, "num_attention_heads": 71, "hidden_size": 4544}
    assert kv.shape_from_config({**base, "multi_query": True}).kv_heads == 1  # Falcon 7B
    assert kv.shape_from_config({**base, "new_decoder_architecture": True, "num_kv_heads": 8}).kv_heads == 8  # 40B
    assert kv.shape_from_config({**base, "multi_query": False}).kv_heads == 71
