"""The compact decoder of core/engines/fast on the CPU: its torch-op path against HF eager (the eager reference the CUDA
graph path is also checked against, on a GPU, in tests/gpu/test_fast_decode.py).

A tiny random Llama (fixed seed, so CI is deterministic), compared as token ids and logprobs, never as strings.
"""
from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from core.engines.fast import fast_decode_unavailable_reasons
from core.engines.fast import check as C
from core.engines.fast.cache import StaticKVCache
from core.engines.fast.model import Dims, FastLlama, unsupported_config_reasons
from core.precision import Device, KVDtype, Precision

B, T, N = 8, 10, 8


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(1234)
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=128,
                      rope_theta=10000.0, tie_word_embeddings=False)
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.08)
            elif "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
        model.lm_head.weight.mul_(6.0)  # peaked distributions: top-1 decided by the model, not by ties
    return model.to(torch.bfloat16)


@pytest.fixture(scope="module")
def data(hf):
    g = torch.Generator().manual_seed(99)
    prompt = torch.randint(0, hf.config.vocab_size, (B, T), generator=g)
    ref = C.eager_reference(hf, "bf16")
    cont = C.eager_greedy(ref, prompt, N, "auto")
    return prompt, cont, C.eager_logprobs(ref, prompt, cont, "auto")


def test_bf16_matches_hf_eager(hf, data):
    prompt, cont, lp_ref = data
    fast = FastLlama.from_hf(hf, "bf16")
    a = C.agreement(lp_ref, C.fast_logprobs(fast, prompt, cont, "auto", "ref"))
    # same precision, same operations; only attention's summation differs (SDPA over the static cache)
    assert a["top1"] >= 0.95
    assert a["kl_mean"] < 3e-3
    # free-running greedy ids start the same
    ids = C.fast_greedy(fast, prompt, N, "auto", "ref")
    assert (ids[:, :3] == cont[:, :3]).float().mean().item() >= 0.9


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("mode", ["fp8-wo", "fp8"])
def test_fp8_matches_eager_fp8(hf, data, mode, kv):
    """Same stored E4M3 weights/KV and scales as core.engines.torch.fp8 on the eager path: much closer to the eager FP8 model
    than either is to BF16, and no worse than it against BF16."""
    prompt, cont, lp_bf16 = data
    ref = C.eager_reference(hf, mode)
    fast = FastLlama.from_hf(hf, mode)
    lp_eager = C.eager_logprobs(ref, prompt, cont, kv)
    lp_fast = C.fast_logprobs(fast, prompt, cont, kv, "ref")
    # Noise floor: the eager model itself with HF's plain attention instead of SDPA. W8A8 re-quantizes activations
    # per token, so rounding-level differences like that one become whole E4M3 steps; the fast path may differ from
    # the eager path by about as much, not by more.
    alt = C.eager_reference(hf, mode)
    alt.set_attn_implementation("eager")
    noise = C.agreement(lp_eager, C.eager_logprobs(alt, prompt, cont, kv))
    same, eager_err, fast_err = (C.agreement(lp_eager, lp_fast), C.agreement(lp_bf16, lp_eager),
                                 C.agreement(lp_bf16, lp_fast))
    print(f"{mode} kv={kv}: fast vs eager {same}, noise {noise}, eager vs bf16 {eager_err}, fast vs bf16 {fast_err}")
    assert same["kl_mean"] <= 3 * noise["kl_mean"] + 2e-3
    assert same["top1"] >= min(noise["top1"], 0.95) - 0.1
    # against BF16 the fast path is no worse than the eager path at this precision (with the same slack)
    assert fast_err["kl_mean"] <= 1.3 * eager_err["kl_mean"] + 3 * noise["kl_mean"] + 2e-3
    assert fast_err["top1"] >= eager_err["top1"] - 0.1


def test_decode_steps_match_one_prefill(hf, data):
    """Step-by-step decode over the static cache (per-row positions, masked reads) gives what one pass gives."""
    prompt, cont, _ = data
    fast = FastLlama.from_hf(hf, "bf16")
    full = torch.cat([prompt, cont], dim=1)
    cache = fast.new_cache(B, T + N + 4, fp8_kv=False)
    lp_once = torch.log_softmax(fast.prefill(full, cache, all_logits=True)[:, T - 1:T + N - 1].float(), -1)
    lp_steps = C.fast_logprobs(fast, prompt, cont, "auto", "ref")
    a = C.agreement(lp_once, lp_steps)
    assert a["top1"] >= 0.95 and a["kl_mean"] < 3e-3


def test_fp8_cache_is_half_the_bytes():
    d = Dims(hidden=64, inter=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=256, eps=1e-5,
             max_positions=128, tie_embeddings=False)
    bf16 = StaticKVCache(d, 1, 8, fp8_kv=False, device="cpu")
    f8 = StaticKVCache(d, 1, 8, fp8_kv=True, device="cpu")
    assert bf16.bytes_per_token() == 2 * 2 * 2 * 16 * 2  # K and V, layers, kv_heads, head_dim, bf16
    assert f8.bytes_per_token() == bf16.bytes_per_token() // 2 + 2 * 2 * 2 * 4  # + a float32 scale per head
    assert f8.k.dtype == torch.float8_e4m3fn


def test_availability_reasons(hf):
    cpu = fast_decode_unavailable_reasons(Device(), Precision.BF16, KVDtype.AUTO)
    assert len(cpu) == 1 and "NVIDIA GPU" in cpu[0]
    a100 = fast_decode_unavailable_reasons(Device("cuda", "NVIDIA A100", (8, 0)), Precision.FP8, KVDtype.AUTO)
    assert any("8.9" in r and "A100" in r for r in a100)
    fp16 = fast_decode_unavailable_reasons(Device("cuda", "NVIDIA H100", (9, 0)), Precision.FP16, KVDtype.AUTO)
    assert any("FP16" in r for r in fp16)
    assert unsupported_config_reasons(hf.config) == []
    gemma = LlamaConfig()
    gemma.model_type = "gemma3_text"
    assert "Llama architecture" in unsupported_config_reasons(gemma)[0]
