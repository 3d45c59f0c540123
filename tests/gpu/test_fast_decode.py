"""The fast decode path (Triton kernels in a CUDA graph, static KV cache) against the eager reference, on a GPU.

    PYTHONUNBUFFERED=1 python3 -m pytest -q -m gpu tests/gpu/test_fast_decode.py -s

A small random Llama (GQA 4:1 like Llama-3-8B) with random weights and prompts from a fixed seed (printed;
TRIAGE_TEST_SEED=N draws another), so the bars below are met or missed the same way on every run. For each precision and KV cache dtype, teacher-forced over the BF16 reference's greedy continuation:
- the fast path agrees with the eager path at the same precision (HF model + core.engines.torch.fp8, as TorchEngine runs it)
  much more closely than that precision differs from BF16;
- against BF16, the fast path is no worse than the eager path at the same precision (the issue's bar);
and free-running greedy ids of the fast path match its own torch-op path (same numerics, other kernels).
Assertions are on agreement metrics, never on strings.
"""
from __future__ import annotations

import os

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from core.engines.fast import check as C  # noqa: E402
from core.engines.fast.graph import DecodeGraph  # noqa: E402
from core.engines.fast.model import FastLlama  # noqa: E402
from core.engines.fast.options import overridden  # noqa: E402

# Fixed, so a bar is met or missed deterministically; TRIAGE_TEST_SEED=N tries another draw.
SEED = int(os.environ.get("TRIAGE_TEST_SEED") or 1)
# Graph path against the torch-op path of the same FastLlama at the same precision: (top-1 at least, mean KL below,
# share of the first 3 greedy ids equal at least). Measured on an H200 over seeds 0-4 (2026-12-01): BF16 top-1
# 0.979-1.000, KL <= 5.5e-4, first ids always equal; FP8 weight-only 0.948-1.000, KL <= 2.5e-3; seed 1 (the default)
# gives BF16 0.990 and 1.000, weight-only 0.990 and 0.979. W8A8 re-quantizes activations at every layer, so a
# rounding-level difference between the two paths becomes a whole E4M3 step and can flip a near-tie: 0.823-0.958
# top-1, KL 0.028-0.044 over the same seeds, hence its wider bar.
SAME_PATH_BARS = {"bf16": (0.98, 1e-3, 1.0), "fp8-wo": (0.97, 3e-3, 1.0), "fp8": (0.90, 0.05, 0.75)}
B, T, N = 4, 48, 24


@pytest.fixture(autouse=True)
def promoted_accumulation():
    """The tests here hold each fast path to the torch-op path of the same numerics, so the W8A8 prompt pass promotes
    its FP8 GEMMs' partial sums as the torch-op pass does; fast accumulation (the engine's default) is measured
    against BF16 in its own test."""
    with overridden(fp8_fast_accum=False):
        yield


@pytest.fixture(scope="module")
def setup():
    print(f"\nseed {SEED}")
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
        hf.lm_head.weight.mul_(8.0)  # peaked next-token distributions, so top-1 is not decided by noise
    hf = hf.to(device="cuda", dtype=torch.bfloat16)
    prompt = torch.randint(0, cfg.vocab_size, (B, T), device="cuda")
    bf16 = C.eager_reference(hf, "bf16")
    cont = C.eager_greedy(bf16, prompt, N, "auto")
    return hf, prompt, cont, C.eager_logprobs(bf16, prompt, cont, "auto")


def _fmt(a: dict) -> str:
    return f"top1 {a['top1']:.3f} KL {a['kl_mean']:.2e} (max {a['kl_max']:.2e})"


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_graph_decode_agrees_with_eager(setup, mode, kv):
    hf, prompt, cont, lp_bf16 = setup
    ref = C.eager_reference(hf, mode)
    fast = FastLlama.from_hf(hf, mode)
    lp_eager = C.eager_logprobs(ref, prompt, cont, kv)
    lp_fast = C.fast_logprobs(fast, prompt, cont, kv, "graph")
    # Noise floor: the same eager model with HF's plain "eager" attention instead of SDPA. Rounding differences of
    # that size are all that should separate the fast path from the eager one (FP8 activation quantization turns
    # them into whole-step flips, so the floor is measured, not assumed).
    ref_alt = C.eager_reference(hf, mode)
    ref_alt.set_attn_implementation("eager")
    noise = C.agreement(lp_eager, C.eager_logprobs(ref_alt, prompt, cont, kv))
    same = C.agreement(lp_eager, lp_fast)  # fast vs eager, same precision
    eager_err = C.agreement(lp_bf16, lp_eager)  # what this precision costs on the eager path
    fast_err = C.agreement(lp_bf16, lp_fast)  # what it costs on the fast path
    print(f"{mode:6s} kv={kv:4s} fast vs eager: {_fmt(same)} | noise floor: {_fmt(noise)} | eager vs bf16: "
          f"{_fmt(eager_err)} | fast vs bf16: {_fmt(fast_err)}")
    assert same["positions"] == B * N
    # as close to the eager path as the eager path is to itself under a rounding-level change
    assert same["kl_mean"] <= 3 * noise["kl_mean"] + 2e-3
    assert same["top1"] >= min(noise["top1"], 0.95) - 0.1
    if (mode, kv) != ("bf16", "auto"):
        # the bar: against BF16, not worse than the eager path at this precision
        assert fast_err["kl_mean"] <= 1.3 * eager_err["kl_mean"] + 2e-3
        assert fast_err["top1"] >= eager_err["top1"] - 0.1


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_graph_greedy_matches_torch_path(setup, mode, kv):
    hf, prompt, _, _ = setup
    fast = FastLlama.from_hf(hf, mode)
    ids_graph = C.fast_greedy(fast, prompt, N, kv, "graph")
    ids_ref = C.fast_greedy(fast, prompt, N, kv, "ref")
    lp_graph = C.fast_logprobs(fast, prompt, ids_ref, kv, "graph")
    lp_ref = C.fast_logprobs(fast, prompt, ids_ref, kv, "ref")
    a = C.agreement(lp_ref, lp_graph)
    prefix = C.prefix_match(ids_ref, ids_graph)
    print(f"{mode:6s} kv={kv:4s} graph vs torch ops: {_fmt(a)}, greedy exact-prefix {prefix:.2f}, "
          f"first 3 ids equal {(ids_ref[:, :3] == ids_graph[:, :3]).float().mean().item():.2f}")
    top1, kl, first = SAME_PATH_BARS[mode]
    assert a["top1"] >= top1 and a["kl_mean"] < kl
    assert (ids_ref[:, :3] == ids_graph[:, :3]).float().mean().item() >= first


@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_graph_with_split_k_linears_matches_torch_path(setup, mode, monkeypatch):
    """Every linear of a 4-row decode graph cut in 4 K-slices, some of them empty (K = 256 is two 128-wide tiles),
    each graph with its own scratch, weight-only reading its f16 rows: as close to the torch-op path as the graph
    that does not split (the small model's shapes are not in the tuned table, so this sets them)."""
    from core.engines.fast.methods import tuner, tuning
    from core.precision import Precision

    hf, prompt, _, _ = setup
    fast = FastLlama.from_hf(hf, mode)
    d = fast.dims
    cfg = dict(kernel="dot", BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=3, SPLIT_K=4)
    for _, n, k, _ in tuner.model_shapes(d) + [("lm_head", d.vocab, d.hidden, [d.vocab])]:
        for p in (Precision.BF16, Precision.FP8_WEIGHT_ONLY, Precision.FP8):
            monkeypatch.setitem(tuning.TUNED, tuning.key(p, B, n, k), cfg)
    ids_graph = C.fast_greedy(fast, prompt, N, "auto", "graph")
    ids_ref = C.fast_greedy(fast, prompt, N, "auto", "ref")
    a = C.agreement(C.fast_logprobs(fast, prompt, ids_ref, "auto", "ref"),
                    C.fast_logprobs(fast, prompt, ids_ref, "auto", "graph"))
    print(f"{mode:6s} split-K graph vs torch ops: {_fmt(a)}")
    top1, kl, first = SAME_PATH_BARS[mode]
    assert a["top1"] >= top1 and a["kl_mean"] < kl
    assert (ids_ref[:, :3] == ids_graph[:, :3]).float().mean().item() >= first


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_batch1_folded_step_computes_the_torch_op_step(setup, mode, kv):
    """One row at a time (where DecodeGraph folds the norms and W8A8's activation quantization into the linears):
    the graph with the folds, with SiLU folded too (W8A8 ignores that one), and without any, each against the
    torch-op step over the same continuation."""
    hf, prompt, _, _ = setup
    fast = FastLlama.from_hf(hf, mode)
    from core.engines.fast import kernels as K

    assert DecodeGraph.default_folds(fast, 1) == (fast.method.folds if K.pdl_available() else frozenset())
    assert DecodeGraph.default_folds(fast, 2) == frozenset()
    variants = {"folded": frozenset({"norm", "o"}), "silu": frozenset({"norm", "o", "silu"}), "plain": frozenset()}
    lp = {k: [] for k in ("ref", *variants)}
    for r in range(prompt.shape[0]):
        row = prompt[r:r + 1]
        cont = C.fast_greedy(fast, row, N, kv, "ref")
        lp["ref"].append(C.fast_logprobs(fast, row, cont, kv, "ref"))
        for name, folds in variants.items():
            lp[name].append(C.fast_logprobs(fast, row, cont, kv, "graph", folds=folds))
    ref = torch.cat(lp["ref"])
    a = {name: C.agreement(ref, torch.cat(lp[name])) for name in variants}
    print(f"{mode:6s} kv={kv:4s} batch 1 vs torch ops: " + " | ".join(f"{k} {_fmt(v)}" for k, v in a.items()))
    top1, kl, _ = SAME_PATH_BARS[mode]
    for name in ("folded", "silu"):
        assert a[name]["top1"] >= top1 and a[name]["kl_mean"] < kl, name
        # no further from the torch ops than before
        assert a[name]["kl_mean"] <= 2 * a["plain"]["kl_mean"] + 1e-4, name


@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_silu_fold_computes_the_separate_kernels_bit_for_bit(mode):
    """Fold "silu": the gate|up kernel writing SiLU(gate) * up against the gate|up kernel then silu_mul: the same
    bits (and the same residual sum), for pair tiles of 1, 4 and 8 columns over a ragged width and an outlier."""
    from core.engines.torch import fp8
    from core.engines.fast import kernels as K

    torch.manual_seed(0)
    m, hid, inter = K.MODES[mode], 512, 1000
    gen = (torch.randn(2 * inter, hid, device="cuda") * 0.05).to(torch.bfloat16)
    if mode == "bf16":
        wg, sg = gen, None
    else:
        wg, sg = fp8.quantize_rows(gen)
        sg = sg.reshape(-1).contiguous()
    x = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    delta = torch.randn(1, hid, device="cuda", dtype=torch.bfloat16)
    delta[0, 3] = 40.0
    lnw = (1 + 0.1 * torch.randn(hid, device="cuda")).to(torch.bfloat16)
    for bn, warps in [(2, 4), (8, 4), (16, 8)]:
        xo, xo2 = torch.empty_like(x), torch.empty_like(x)
        gu = torch.empty(1, 2 * inter, device="cuda", dtype=torch.bfloat16)
        K.gemv_prologue(x, wg, sg, gu, m, delta, xo, lnw, 1e-5, cfg=(bn, warps))
        act = torch.empty(1, inter, device="cuda", dtype=torch.bfloat16)
        K.silu_mul(gu, act)
        act2 = torch.full((1, inter), float("nan"), device="cuda", dtype=torch.bfloat16)
        K.gemv_prologue(x, wg, sg, act2, m, delta, xo2, lnw, 1e-5, cfg=(bn, warps), silu_out=True)
        assert torch.equal(xo, xo2) and torch.equal(act, act2), (bn, warps)


@pytest.mark.parametrize("kv", ["auto", "fp8"])
@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
def test_fused_prefill_computes_the_torch_op_prefill(setup, mode, kv):
    """The prompt pass through the fused kernels against the plain torch-op one, every position's logits, and the
    cache each leaves behind (the fused pass writes it from its own RoPE kernel)."""
    hf, prompt, _, _ = setup
    fast = FastLlama.from_hf(hf, mode)
    lps, caches = {}, {}
    for fused in (False, True):
        cache = fast.new_cache(prompt.shape[0], prompt.shape[1] + 8, kv == "fp8")
        lps[fused] = torch.log_softmax(fast.prefill(prompt, cache, all_logits=True, fused=fused).float(), dim=-1)
        caches[fused] = cache
    a = C.agreement(lps[False], lps[True])
    T = prompt.shape[1]
    for layer in (0, fast.dims.layers - 1):
        for ref, got in zip(caches[False].read(layer, slice(None), T), caches[True].read(layer, slice(None), T)):
            assert ((got.float() - ref.float()).norm() / ref.float().norm()).item() < 2e-2, f"layer {layer}"
    print(f"{mode:6s} kv={kv:4s} prefill fused vs torch ops: {_fmt(a)}")
    top1, kl, _ = SAME_PATH_BARS[mode]
    assert a["top1"] >= top1 and a["kl_mean"] < kl


def test_w8a8_prefill_fast_accumulation_against_bf16(setup):
    """Fast accumulation (the engine's default, as vLLM's CUTLASS FP8 GEMMs) moves the W8A8 prompt pass a little from
    the promoted one, and not further from BF16. H200, seed 1 (2026-12-02): against BF16, promoted top-1 0.844 and KL
    0.124, fast 0.839 and 0.121; fast against promoted top-1 0.896, KL 0.034."""
    hf, prompt, _, _ = setup
    bf16 = FastLlama.from_hf(hf, "bf16")
    ref = torch.log_softmax(bf16.prefill(prompt, bf16.new_cache(prompt.shape[0], prompt.shape[1] + 8, False),
                                         all_logits=True).float(), dim=-1)
    w8a8 = FastLlama.from_hf(hf, "fp8")
    lps = {}
    for flag in ("0", "1"):
        with overridden(fp8_fast_accum=flag == "1"):
            cache = w8a8.new_cache(prompt.shape[0], prompt.shape[1] + 8, False)
            lps[flag] = torch.log_softmax(w8a8.prefill(prompt, cache, all_logits=True).float(), dim=-1)
    same, promoted, fast = C.agreement(lps["0"], lps["1"]), C.agreement(ref, lps["0"]), C.agreement(ref, lps["1"])
    print(f"fp8 prefill fast vs promoted accumulation: {_fmt(same)} | vs BF16: promoted {_fmt(promoted)}, "
          f"fast {_fmt(fast)}")
    assert fast["kl_mean"] < 2 * promoted["kl_mean"] and fast["top1"] >= promoted["top1"] - 0.05


def test_engine_synthetic_shape(monkeypatch):
    """FastLlamaEngine on a synthetic config shrunk to test size: token ids, top-k, times, score, memory."""
    from core import models as M
    from core.engines.base import GenerationParams
    from core.engines.fast.engine import FastLlamaEngine
    from core.precision import KVDtype, Precision

    small = dict(M.SYNTHETIC_CONFIGS["llama-3-8b"], hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                 num_attention_heads=8, num_key_value_heads=2, head_dim=32, vocab_size=1024)
    monkeypatch.setitem(M.SYNTHETIC_CONFIGS, "llama-3-8b", small)
    for precision, kv in [(Precision.BF16, KVDtype.AUTO), (Precision.FP8, KVDtype.FP8)]:
        engine = FastLlamaEngine(M.parse_model("llama-3-8b"), precision, kv)
        gens = engine.generate([[5, 6, 7, 8], [9, 10]], GenerationParams(max_new_tokens=12, top_logprobs=4,
                                                                          stop_at_eos=False))
        for g in gens:
            assert len(g.token_ids) == 12 and len(g.token_times) == 12
            assert all(b >= a for a, b in zip(g.token_times, g.token_times[1:]))
            assert all(len(t) == 4 and max(t, key=t.get) == tok for t, tok in zip(g.top_logprobs, g.token_ids))
        # rows of different lengths are prefilled on their own: the short row alone starts the same
        # (later ids may differ: random weights give near-flat logits, and batch 1 runs other kernels than batch 2)
        alone = engine.generate([[9, 10]], GenerationParams(max_new_tokens=12, top_logprobs=0, stop_at_eos=False))
        assert alone[0].token_ids[0] == gens[1].token_ids[0]
        s = engine.score([5, 6, 7, 8], gens[0].token_ids[:6], top_k=4)
        assert max(s.top_logprobs[0], key=s.top_logprobs[0].get) == gens[0].token_ids[0]
        assert abs(s.target_logprobs[0] - gens[0].logprobs[0]) < 1e-3
        assert engine.memory_report().kv_cache_bytes > 0
        engine.unload()


@pytest.mark.parametrize("silu_x, given_f16", [(False, False), (True, False), (False, True)])
def test_weight_only_linear_past_f16_range(silu_x, given_f16):
    """Weight-only FP8 takes its dot in f16: a row with an activation past f16's range (65504) still gets the bf16
    dot's result (the kernel takes such tiles again in bf16, from the bf16 activations also when their f16 copy,
    inf there, was given), the other rows too, and no inf."""
    from core.engines.torch import fp8
    from core.engines.fast import kernels as K

    torch.manual_seed(0)
    q, s = fp8.quantize_rows((torch.randn(256, 512, device="cuda") * 0.02).to(torch.bfloat16))
    s = s.reshape(-1).contiguous()
    x = torch.randn(4, 1024 if silu_x else 512, device="cuda", dtype=torch.bfloat16)
    x[1, 7] = 3e5  # past f16's range; with silu_x, the gate of column 7
    out = torch.empty(4, 256, device="cuda", dtype=torch.bfloat16)
    cfg = dict(kernel="dot", BLOCK_N=32, BLOCK_K=128, num_warps=4, num_stages=3)
    K.linear(x, q, s, None, out, K.MODE_WO, silu_x=silu_x, cfg=cfg, x16=x.to(torch.float16) if given_f16 else None)
    a = x.float()
    if silu_x:
        g, u = a.chunk(2, dim=-1)
        a = (torch.nn.functional.silu(g).to(torch.bfloat16).float() * u).to(torch.bfloat16).float()
    ref = a @ (q.float() * s[:, None]).t()
    assert torch.isfinite(out).all()
    for row in range(4):
        assert ((out[row].float() - ref[row]).norm() / ref[row].norm()).item() < 1e-2, row


@pytest.mark.parametrize("mode", ["bf16", "fp8-wo", "fp8"])
@pytest.mark.parametrize("rows", [8, 64])
def test_split_k_linear_matches_one_slice_and_repeats_bit_for_bit(mode, rows):
    """A linear cut into K slices gives the unsplit kernel's result up to float32 summation order, the same bits
    on every call (the slices are added in slice order, whichever program finishes last), and inside a CUDA graph
    replayed twice (each tile's counter goes back to 0). Sizes that do not divide: 200 columns in 64-wide tiles,
    K = 1000 in 128-wide tiles cut in 4 slices (8 tiles: 2, 2, 2, 2) and in 3 (3, 3, 2)."""
    from core.engines.torch import fp8
    from core.engines.fast import kernels as K

    torch.manual_seed(0)
    n, k = 200, 1000
    w = (torch.randn(n, k, device="cuda") * 0.02).to(torch.bfloat16)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    m = K.MODES[mode]
    ws = xs = None
    if mode != "bf16":
        w, ws = fp8.quantize_rows(w)
        ws = ws.reshape(-1).contiguous()
    if mode == "fp8":
        x, xs = fp8.quantize_rows(x)
        xs = xs.reshape(-1).contiguous()
    base = dict(kernel="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3)
    one = K.linear(x, w, ws, xs, torch.empty(rows, n, device="cuda", dtype=torch.bfloat16), m, cfg=base)
    for split in (3, 4):
        cfg = dict(base, SPLIT_K=split)
        outs = [K.linear(x, w, ws, xs, torch.empty_like(one), m, cfg=cfg) for _ in range(3)]
        assert all(torch.equal(o, outs[0]) for o in outs[1:]), split
        assert ((outs[0].float() - one.float()).norm() / one.float().norm()).item() < 1e-2, split
        out = torch.empty_like(one)
        scratch: dict = {}
        with K.split_scratch_scope(scratch):
            K.linear(x, w, ws, xs, out, m, cfg=cfg)  # scratch made outside the capture, as DecodeGraph's warm-up does
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                K.linear(x, w, ws, xs, out, m, cfg=cfg)
        for _ in range(2):
            out.zero_()
            g.replay()
            torch.cuda.synchronize()
            assert torch.equal(out, outs[0]), split
        assert all(int(c.sum()) == 0 for _, c in scratch.values())


def test_split_k_weight_only_reads_f16_rows_and_falls_back_per_slice():
    """Weight-only in 4 K-slices over whole tiles (EVEN) with the f16 rows given: a row with an activation past
    f16's range (inf in its f16 copy, in the first slice only) is taken again from the bf16 rows in that slice,
    and every row matches the bf16 dot over the same weights."""
    from core.engines.torch import fp8
    from core.engines.fast import kernels as K

    torch.manual_seed(0)
    q, s = fp8.quantize_rows((torch.randn(256, 1024, device="cuda") * 0.02).to(torch.bfloat16))
    s = s.reshape(-1).contiguous()
    x = torch.randn(8, 1024, device="cuda", dtype=torch.bfloat16)
    x[1, 7] = 3e5
    out = torch.empty(8, 256, device="cuda", dtype=torch.bfloat16)
    cfg = dict(kernel="dot", BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=3, SPLIT_K=4)
    K.linear(x, q, s, None, out, K.MODE_WO, cfg=cfg, x16=x.to(torch.float16))
    ref = x.float() @ (q.float() * s[:, None]).t()
    assert torch.isfinite(out).all()
    for row in range(8):
        assert ((out[row].float() - ref[row]).norm() / ref[row].norm()).item() < 1e-2, row
