"""The fast engine's integer linears (core/engines/fast/methods/integer.py over kernels/int_tile.py, int_gemv.py and
int_prompt.py) on the GPU, against the torch engine's
integer layers (core/engines/torch/quant.py), which stay the reference.

    PYTHONUNBUFFERED=1 python3 -m pytest -q tests/gpu/test_int_kernels_gpu.py -s

Kernels at Llama-3-8B's shapes and the batch sizes the decode graph runs (1, 8, 64): the weights the kernels build in
registers are the reference's bf16 weights bit for bit (one-hot rows read them back), the prompt pass's dequantized
weights too, W8A8's result is torch._int_mm's bit for bit; then a small random Llama whose decode graph agrees with
the eager engine at the same precision (top-1 and KL on a fixed seed), as tests/gpu/test_fast_decode.py holds BF16/FP8.
"""
from __future__ import annotations

import copy
import os

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton")

from core.engines.fast import check as C  # noqa: E402
from core.engines.fast import int_weight as IW  # noqa: E402
from core.engines.fast.kernels import int_prompt  # noqa: E402
from core.engines.fast.methods import method_for  # noqa: E402
from core.engines.fast.model import FastLlama  # noqa: E402
from core.engines.torch import quant  # noqa: E402
from core.precision import Precision  # noqa: E402

SEED = int(os.environ.get("TRIAGE_TEST_SEED") or 1)
SHAPES = [(6144, 4096, (4096, 1024, 1024)), (4096, 14336, (4096,))]  # q|k|v and down of Llama-3-8B
MODES = ["int4", "int4-awq", "int8-wo", "int8"]
# Compiled on the H200, W8A8's result is close to torch._int_mm's but not yet bit for bit, which is why the fast
# path does not take INT8 W8A8 (core/engines/fast/support.py); these stay, expected to fail, until it is.
W8A8_NOT_EXACT = pytest.mark.xfail(reason="W8A8 GPU rounding differs from torch._int_mm (not routed)", strict=False)
KERNEL_MODES = [m if m != "int8" else pytest.param(m, marks=W8A8_NOT_EXACT) for m in MODES]


def _storage(mode, n, k, rows, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    method = method_for(Precision(mode))
    if not method.needs_calibration:
        return method.quantize(w)
    scales = [torch.exp(torch.randn(k, device="cuda", generator=g) * 0.7) for _ in rows]
    return method.quantize(w, ([s / (s.max() * s.min()).sqrt() for s in scales], list(rows)))


def int_linear(mode, x, iw, out, cfg=None):
    """The decode product as the engine runs it (the tuning table's launch), or through the launch `cfg` names."""
    method = method_for(Precision(mode))
    return method.decode(iw, x, out) if cfg is None else method.launch(iw, x, out, cfg)


@pytest.mark.parametrize("n,k,rows", SHAPES)
@pytest.mark.parametrize("mode", KERNEL_MODES)
def test_kernels_match_the_torch_engines_layers(mode, n, k, rows):
    iw = _storage(mode, n, k, rows, seed=SEED)
    ref_w = IW.reference_dequantized(iw) if mode != "int8" else None
    if ref_w is not None:
        assert torch.equal(int_prompt.dequantize(iw).view(torch.int16), ref_w.view(torch.int16)), "prompt-pass weights"
    for m in (1, 8, 64):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
        int_linear(mode, x, iw, out)
        torch.cuda.synchronize()
        ref = IW.reference_linear(x, iw)
        if mode == "int8":
            assert torch.equal(out.view(torch.int16), ref.view(torch.int16)), f"W8A8 at {m} rows"
        else:
            rel = float((out.float() - ref.float()).norm() / ref.float().norm())
            assert rel < 5e-3, (m, rel)  # same weights; float32 sums in another order, bf16 output
            if method_for(Precision(mode)).config(m, n, k).get("kernel", "").startswith("gemlite+"):
                continue  # AWQ's scales divided out of x, not the weights: codes read back in test_int_library_gpu
            # one-hot rows: the weights built in registers, bit for bit
            cols = torch.randperm(k, device="cuda")[:m]
            e = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
            e[torch.arange(m), cols] = 1.0
            int_linear(mode, e, iw, out)
            assert torch.equal(out.view(torch.int16), ref_w[:, cols].t().contiguous().view(torch.int16)), m
        print(f"{mode:8s} {n}x{k} M={m}: cfg {method_for(Precision(mode)).config(m, n, k)}")


@pytest.mark.parametrize("split,decode,rows", [(1, 0, 1), (1, 1, 1), (1, 2, 1), (4, 0, 1), (4, 1, 1), (4, 2, 1),
                                               (1, 1, 8), (4, 1, 8), (4, 2, 8)])
@pytest.mark.parametrize("n,k,rows_of", SHAPES)
@pytest.mark.parametrize("mode", ["int4", "int4-awq", "int8-wo"])
def test_few_row_gemv_matches_the_torch_engines_layers(mode, n, k, rows_of, split, decode, rows):
    """The batch 1-8 GEMV (compiled: LOP3 codes, the paired bf16 conversion, _div_rn and the activations read in
    pairs on the hardware) builds the reference's weights bit for bit: one-hot rows over every code position of a
    word and a group's ends, for each DECODE variant the tuner may pick, one row at a time or eight (the last block
    of four: masked rows)."""
    iw = _storage(mode, n, k, rows_of, seed=SEED)
    ref_w = IW.reference_dequantized(iw)
    cfg = dict(kernel="gemv", BLOCK_N=32 if split == 1 else 64, BLOCK_K=128, SPLIT_K=split, num_warps=4,
               num_stages=3, DECODE=decode)
    cols = [0, 1, 2, 3, 4, 5, 6, 7, 127, 128, 255, k - 1] + torch.randperm(k)[:8].tolist()
    for i in range(0, len(cols), rows):
        chunk = cols[i:i + rows]
        e = torch.zeros(len(chunk), k, device="cuda", dtype=torch.bfloat16)
        e[torch.arange(len(chunk)), chunk] = 1.0
        out = torch.full((len(chunk), n), float("nan"), device="cuda", dtype=torch.bfloat16)
        int_linear(mode, e, iw, out, cfg=cfg)
        assert torch.equal(out.view(torch.int16), ref_w[:, chunk].t().contiguous().view(torch.int16)), chunk
    x = torch.randn(rows, k, device="cuda").to(torch.bfloat16)
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    int_linear(mode, x, iw, out, cfg=cfg)
    ref = IW.reference_linear(x, iw)
    assert float((out.float() - ref.float()).norm() / ref.float().norm()) < 5e-3


@W8A8_NOT_EXACT
def test_w8a8_prompt_pass_is_the_reference_bit_for_bit():
    iw = _storage("int8", 4096, 4096, (4096,), seed=SEED)
    x = torch.randn(3, 100, 4096, device="cuda").to(torch.bfloat16)
    assert torch.equal(int_prompt.prompt_linear(x, iw).view(torch.int16), IW.reference_linear(x, iw).view(torch.int16))


@pytest.fixture(scope="module")
def small_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
                      num_key_value_heads=2, head_dim=32, vocab_size=1024, max_position_embeddings=512,
                      rope_theta=500000.0, tie_word_embeddings=False)
    hf = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for n, p in hf.named_parameters():
            if p.dim() > 1:
                p.normal_(0, 0.05)
            elif "norm" in n:
                p.copy_(1 + 0.1 * torch.randn_like(p))
        hf.lm_head.weight.mul_(8.0)
    hf = hf.to(device="cuda", dtype=torch.bfloat16)
    B, T, N = 4, 48, 24
    prompt = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    calib = torch.randint(0, cfg.vocab_size, (96,)).tolist()
    bf16 = C.eager_reference(hf, "bf16")
    cont = C.eager_greedy(bf16, prompt, N, "auto")
    return hf, prompt, cont, C.eager_logprobs(bf16, prompt, cont, "auto"), calib


def _fmt(a: dict) -> str:
    return f"top1 {a['top1']:.3f} KL {a['kl_mean']:.2e} (max {a['kl_max']:.2e})"


@pytest.mark.parametrize("mode", MODES)
def test_decode_graph_agrees_with_the_eager_integer_engine(small_llama, mode):
    """The whole model: the fast path's decode graph (batch 4) against quant.quantize_model's eager model."""
    hf, prompt, cont, lp_bf16, calib = small_llama
    ref = copy.deepcopy(hf).eval()
    quant.quantize_model(ref, Precision(mode), calib)
    fast = FastLlama.from_hf(hf, mode, calibration_ids=calib)
    lp_eager = C.eager_logprobs(ref, prompt, cont, "auto")
    lp_fast = C.fast_logprobs(fast, prompt, cont, "auto", "graph")
    ref_alt = copy.deepcopy(ref)
    ref_alt.set_attn_implementation("eager")
    noise = C.agreement(lp_eager, C.eager_logprobs(ref_alt, prompt, cont, "auto"))
    same = C.agreement(lp_eager, lp_fast)
    eager_err, fast_err = C.agreement(lp_bf16, lp_eager), C.agreement(lp_bf16, lp_fast)
    one = C.fast_logprobs(fast, prompt[:1], cont[:1], "auto", "graph")  # batch 1: the GEMV shapes, SiLU folded
    one_vs = C.agreement(lp_eager[:1], one)
    print(f"{mode:8s} fast vs eager: {_fmt(same)} | batch 1: {_fmt(one_vs)} | noise floor: {_fmt(noise)} | "
          f"eager vs bf16: {_fmt(eager_err)} | fast vs bf16: {_fmt(fast_err)}")
    assert same["kl_mean"] <= 3 * noise["kl_mean"] + 2e-3 and one_vs["kl_mean"] <= 3 * noise["kl_mean"] + 2e-3
    assert same["top1"] >= min(noise["top1"], 0.95) - 0.1 and one_vs["top1"] >= min(noise["top1"], 0.95) - 0.1
    assert fast_err["kl_mean"] <= 1.3 * eager_err["kl_mean"] + 2e-3
