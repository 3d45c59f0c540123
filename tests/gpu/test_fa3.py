"""The prompt pass's causal attention through FlashAttention-3 (core/engines/fast/fa3), on a Hopper GPU where its
library is built (scripts/build_fa3.sh): against float32 attention and cuDNN's, reading K/V in place from a cache
laid out as the engine's, and inside the fast engine's prompt pass of a head_dim-128 Llama.

    python3 -m pytest -q -m gpu tests/gpu/test_fa3.py -s
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton")

from torch.nn import functional as F  # noqa: E402

from core.engines.fast import fa3  # noqa: E402
from core.engines.fast.model import FastLlama, causal_attention  # noqa: E402
from core.engines.fast.options import overridden  # noqa: E402

D = 128


@pytest.fixture(scope="module", autouse=True)
def library_loads():
    why = fa3.why_not("cuda", 32, 8, D)
    if why:
        pytest.skip(why)


def cache_views(b, hkv, T, max_len, seed):
    """K and V as [b, T, hkv, D] views of caches [b, hkv, max_len, D], as the prompt pass hands them over."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kc = (torch.randn(b, hkv, max_len, D, device="cuda", generator=g) * 2).bfloat16()
    vc = torch.randn(b, hkv, max_len, D, device="cuda", generator=g).bfloat16()
    return kc[:, :, :T].transpose(1, 2), vc[:, :, :T].transpose(1, 2)


@pytest.mark.parametrize("T", [1, 200, 1000])
def test_bf16_attention_is_as_close_to_float32_as_cudnn(T):
    b, hq, hkv = 2, 8, 2
    q = torch.randn(b, T, hq, D, device="cuda").bfloat16()
    k, v = cache_views(b, hkv, T, T + 40, seed=T)
    ref = F.scaled_dot_product_attention(
        q.float().transpose(1, 2), k.float().transpose(1, 2).repeat_interleave(hq // hkv, 1),
        v.float().transpose(1, 2).repeat_interleave(hq // hkv, 1), is_causal=True).transpose(1, 2)

    def rel(out):
        return ((out.float() - ref).norm() / ref.norm()).item()

    got = fa3.causal_attention_bf16(q, k, v)
    cudnn = causal_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
    print(f"T={T}: FA3 {rel(got):.2e}, SDPA {rel(cudnn):.2e} from float32")
    assert got.shape == q.shape and torch.isfinite(got).all()
    assert rel(got) <= 1.5 * rel(cudnn) + 1e-3


def test_prompt_pass_through_fa3_is_as_close_to_float32_as_through_sdpa():
    """A head_dim-128 Llama's prompt pass (two rows, the second filled on its own) with FA3 and with SDPA, each against
    the HF model in float32 over the same (bf16-rounded) weights: FA3 as close as SDPA, layer 0's cache the same.
    (Two BF16 attention kernels round apart, so they are held to float32, not to each other.)"""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=2, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=D, vocab_size=1024, max_position_embeddings=2048,
                      tie_word_embeddings=False)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
        hf.lm_head.weight.mul_(8.0)
    hf = hf.to(device="cuda", dtype=torch.bfloat16)
    fast = FastLlama.from_hf(hf, "bf16")
    prompt = torch.randint(0, cfg.vocab_size, (2, 700), device="cuda")
    with torch.no_grad():
        ref = torch.log_softmax(hf.float()(prompt).logits.float(), dim=-1)
    res = {}
    for use in ("1", "0"):
        with overridden(fa3=use == "1"):
            cache = fast.new_cache(2, 720, False)
            first = fast.prefill(prompt[:1], cache, rows=slice(0, 1), all_logits=True).float()
            second = fast.prefill(prompt[1:], cache, rows=slice(1, 2), all_logits=True).float()
        lp = torch.log_softmax(torch.cat([first, second]), dim=-1)
        res[use] = dict(kl=(ref.exp() * (ref - lp)).sum(-1).mean().item(),
                        top1=(lp.argmax(-1) == ref.argmax(-1)).float().mean().item(), cache=cache)
    got, sdpa = res["1"], res["0"]
    print(f"prompt pass against float32: FA3 top1 {got['top1']:.4f} KL {got['kl']:.2e}; "
          f"SDPA top1 {sdpa['top1']:.4f} KL {sdpa['kl']:.2e}")
    assert got["kl"] <= 1.5 * sdpa["kl"] + 1e-4 and got["top1"] >= sdpa["top1"] - 0.01
    assert torch.equal(got["cache"].k[0], sdpa["cache"].k[0]) and torch.equal(got["cache"].v[0], sdpa["cache"].v[0])
