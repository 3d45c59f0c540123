"""Library integer kernels (core/engines/fast/kernels/library.py) on the GPU, on the torch engine's own integer
storage (core/engines/torch/quant.py, as intlinears.IntWeight holds it):

    PYTHONUNBUFFERED=1 python3 -m pytest -q tests/gpu/test_int_library_gpu.py -s

- gemlite INT4 / INT8 weight-only: one-hot rows read back the weights the kernel multiplies with: the torch engine's
  bf16 weights bit for bit, at 1 row (gemlite's GEMV) and 8 rows (its split-K tensor-core GEMM).
- tinygemm (torch's `_weight_int4pack_mm`): its weights are what library.tinygemm_params says (bf16 scale and zero,
  one FMA rounding), which are NOT the torch engine's bit for bit; the share that differ and by how much is printed.
- INT4 AWQ folded into the activations: the codes read back bit for bit; the product close to the torch engine's.
- W8A8: gemlite's dynamic INT8 against torch._int_mm's result (printed: not required bit for bit, not routed).
- The decode step reads a library's own float32 output (no copy into its bf16 buffers) and INT4 AWQ's row blocks,
  and writes AWQ's divided rows in the producing kernels: bit for bit what the copies and the division launch gave;
  a small Llama's decode graph with its linears on gemlite agrees with its torch-op path.
"""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA (torch.cuda.is_available() is False)", allow_module_level=True)
pytest.importorskip("triton")

from core.engines.fast import int_weight as IL  # noqa: E402
from core.engines.fast.kernels import library  # noqa: E402
from core.engines.fast.methods import method_for  # noqa: E402
from core.precision import Precision  # noqa: E402

SHAPES = [(6144, 4096, (4096, 1024, 1024)), (4096, 14336, (4096,))]  # q|k|v and down of Llama-3-8B
needs_gemlite = pytest.mark.skipif(not library.gemlite_available(), reason="gemlite is not installed "
                                   "(requirements-gpu.txt)")


def _storage(mode, n, k, rows, seed=3):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(torch.bfloat16)
    method = method_for(Precision(mode))
    if mode != "int4-awq":
        return method.quantize(w)
    scales = [torch.exp(torch.randn(k, device="cuda", generator=g) * 0.7) for _ in rows]
    return method.quantize(w, ([s / (s.max() * s.min()).sqrt() for s in scales], list(rows)))


def _read_back(kern, k: int, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """m one-hot rows: (the columns read, the kernel's weights at those columns [m, N])."""
    cols = torch.randperm(k, device="cuda")[:m]
    e = torch.zeros(m, k, device="cuda", dtype=torch.bfloat16)
    e[torch.arange(m), cols] = 1.0
    return cols, kern(e)


def _plain(iw: IL.IntWeight) -> IL.IntWeight:
    """The AWQ storage's codes as plain INT4 (what the folded kernels multiply with)."""
    return IL.IntWeight(IL.MODE_INT4, iw.n, iw.k, iw.w, iw.scale, iw.zero)


@needs_gemlite
@pytest.mark.parametrize("n,k,rows", SHAPES)
@pytest.mark.parametrize("mode,cls", [("int4", "GemliteInt4"), ("int8-wo", "GemliteInt8")])
def test_gemlite_weights_are_the_torch_engines_bit_for_bit(mode, cls, n, k, rows):
    iw = _storage(mode, n, k, rows)
    kern = getattr(library, cls)(iw)
    ref_w = IL.reference_dequantized(iw)
    for m in (1, 8):
        cols, got = _read_back(kern, k, m)
        assert torch.equal(got.view(torch.int16), ref_w[:, cols].t().contiguous().view(torch.int16)), (mode, m)
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw).float()
        rel = float((kern(x).float() - ref).norm() / ref.norm())
        assert rel < 5e-3, (m, rel)  # same weights; float32 sums in another order, bf16 output
        print(f"{cls} {n}x{k} M={m}: weights bit for bit, output rel err {rel:.1e}")


@pytest.mark.parametrize("n,k,rows", SHAPES)
def test_tinygemm_weights_are_its_own_format(n, k, rows):
    """tinygemm multiplies with round_bf16((q - 8) * scale + zero) from library.tinygemm_params: read back, that
    exactly; against the torch engine's weights, close (a fraction of a quantization step) but not bit for bit."""
    iw = _storage("int4", n, k, rows)
    kern = library.TinyGemmInt4(iw)
    codes = library.unpack_codes(iw).float()
    p = library.tinygemm_params(iw.scale, iw.zero).float()
    for m in (1, 8):
        cols, got = _read_back(kern, k, m)
        g = cols // library.GROUP
        theirs = ((codes[:, cols] - 8) * p[g, :, 0].t() + p[g, :, 1].t()).to(torch.bfloat16)
        assert torch.equal(got.view(torch.int16), theirs.t().contiguous().view(torch.int16)), m
    err = library.tinygemm_weight_error(iw)
    assert err["max_diff_steps"] < 0.125, err
    print(f"tinygemm {n}x{k}: {100 * err['equal_share']:.1f}% of weights equal to the torch engine's, largest "
          f"difference {err['max_diff_steps']:.3f} of a quantization step")


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("n,k,rows", SHAPES)
@pytest.mark.parametrize("kernel", ["TinyGemmInt4", "GemliteInt4"])
def test_awq_folded_into_the_activations(kernel, n, k, rows, split):
    if kernel == "GemliteInt4" and not library.gemlite_available():
        pytest.skip("gemlite is not installed")
    iw = _storage("int4-awq", n, k, rows)
    cls = getattr(library, kernel)
    fold = library.AwqFold(iw, cls, split=split)
    if cls.exact:  # the codes the parts multiply with are the torch engine's (before its division by s)
        cols, got = _read_back(cls(_plain(iw)), k, 8)
        ref_plain = IL.reference_dequantized(_plain(iw))
        assert torch.equal(got.view(torch.int16), ref_plain[:, cols].t().contiguous().view(torch.int16))
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw).float()
        rel = float((fold(x).float() - ref).norm() / ref.norm())
        # the same product in another rounding order (x / s rounded to bf16 where the reference rounds W / s);
        # tinygemm adds its own weight differences (test_tinygemm_weights_are_its_own_format)
        assert rel < (1.5e-2 if kernel == "TinyGemmInt4" else 1e-2), (m, rel)
        print(f"{kernel} + AWQ {'split' if split else 'fold'} {n}x{k} M={m}: output rel err {rel:.1e} against the torch engine's")


@needs_gemlite
@pytest.mark.parametrize("n,k,rows", SHAPES)
def test_gemlite_w8a8_against_int_mm(n, k, rows):
    iw = _storage("int8", n, k, rows)
    kern = library.GemliteW8A8(iw)
    for m in (1, 8):
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        ref = IL.reference_linear(x, iw)
        out = kern(x)
        rel = float((out.float() - ref.float()).norm() / ref.float().norm())
        equal = float((out.view(torch.int16) == ref.view(torch.int16)).float().mean())
        assert rel < 1e-2, (m, rel)
        print(f"gemlite W8A8 {n}x{k} M={m}: rel err {rel:.1e}, {100 * equal:.1f}% of outputs equal to "
              "torch._int_mm's")


def test_the_step_reads_library_outputs_as_their_bf16_copies():
    """kernels/norm.py and rope.py on the hardware: a float32 delta, gate|up (also in AWQ's two row blocks, or two
    tensors) and q|k|v (also in three blocks, or three tensors) give bit for bit what their bf16 copies (torch's
    round to nearest even) gave; the producers' AWQ-divided rows are AwqFold's own division launch's, bit for bit."""
    from core.engines.fast import kernels as K

    g = torch.Generator(device="cuda").manual_seed(7)
    M, N, I = 8, 4096, 14336
    x0 = torch.randn(M, N, device="cuda", generator=g).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(N, device="cuda", generator=g)).to(torch.bfloat16)
    delta = torch.randn(M, N, device="cuda", generator=g)
    xa, xb, ha, hb = x0.clone(), x0.clone(), torch.empty_like(x0), torch.empty_like(x0)
    iw = _storage("int4-awq", 6144, N, (4096, 1024, 1024))
    fold = library.AwqFold(iw, library.TinyGemmInt4)
    hdiv = torch.empty(3 * M, N, device="cuda", dtype=torch.bfloat16)
    K.add_rmsnorm(xa, delta, w, 1e-5, ha, div=fold.divisors, div_out=hdiv)
    K.add_rmsnorm(xb, delta.to(torch.bfloat16), w, 1e-5, hb)
    assert torch.equal(xa, xb) and torch.equal(ha, hb)
    assert torch.equal(hdiv, fold.divide(ha))

    gu = torch.randn(2 * M, 2 * I, device="cuda", generator=g)
    flat = torch.cat([gu[:M, :I], gu[M:, I:]], dim=1).to(torch.bfloat16)
    down = library.AwqFold(_storage("int4-awq", N, I, (N,)), library.TinyGemmInt4)
    a1, a2, a3, adiv = (torch.empty(M, I, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    K.silu_mul(gu, a1, div=down.divisors, div_out=adiv)
    K.silu_mul(flat, a2)
    K.silu_mul((gu[:M, :I].contiguous(), gu[M:, I:].contiguous()), a3)
    assert torch.equal(a1, a2) and torch.equal(a3, a2) and torch.equal(adiv, down.divide(a2))

    HQ, HKV, D, T = 32, 8, 128, 64
    qkv = torch.randn(3 * M, (HQ + 2 * HKV) * D, device="cuda", generator=g)
    q_end, k_end = HQ * D, (HQ + HKV) * D
    gathered = torch.cat([qkv[:M, :q_end], qkv[M:2 * M, q_end:k_end], qkv[2 * M:, k_end:]], dim=1)
    pos = torch.randint(0, T, (M,), device="cuda", generator=g)
    ang = torch.arange(T, device="cuda")[:, None] * torch.rand(D // 2, device="cuda", generator=g)[None]
    cos, sin = ang.cos().to(torch.bfloat16).float(), ang.sin().to(torch.bfloat16).float()
    parts = (qkv[:M, :q_end].contiguous(), qkv[M:2 * M, q_end:k_end].contiguous(), qkv[2 * M:, k_end:].contiguous())
    got = []
    for src in (qkv, gathered, gathered.to(torch.bfloat16), parts):
        q = torch.empty(M, HQ, D, device="cuda", dtype=torch.bfloat16)
        kc, vc = (torch.zeros(M, HKV, T, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        K.rope_store(src, pos, cos, sin, q, kc, vc, None, None, HQ, HKV, D)
        got.append((q, kc, vc))
    assert all(torch.equal(a, b) and torch.equal(a, c) and torch.equal(a, d) for a, b, c, d in zip(*got))


def _copied(lin):
    """Linear.fast with its product copied into the step's bf16 buffer (what the step did before it read library
    outputs as they are); AWQ's folded row blocks, which cannot be copied as one, are left as they are."""
    fast = lin.fast

    def run(x, x_scale, out, silu_x=False, x16=None, x_div=None):
        got = fast(x, x_scale, out, silu_x, x16, x_div)
        if isinstance(got, tuple):
            start = 0
            for part in got:
                out[:, start:start + part.shape[1]].copy_(part)
                start += part.shape[1]
            return out
        return out.copy_(got) if got is not out and got.shape == out.shape else got
    return run


@needs_gemlite
@pytest.mark.parametrize("mode,kernel,batch", [("int4", "gemlite", 1), ("int4", "gemlite", 4),
                                               ("int4-awq", "gemlite+split", 1), ("int4-awq", "gemlite+fold", 4)])
def test_decode_graph_reads_library_outputs_as_their_copies(mode, kernel, batch, monkeypatch):
    """A small Llama's decode graph with every integer linear on a gemlite launch (the tuning table set to it): its
    outputs read as they are (float32, AWQ's divided rows from the producers, one-row GEMVs on gemlite's output
    rings) against the same graph copying each output into the step's buffer first: the same function (gemlite's
    float32 atomics add in any order, so not bit for bit); and against the torch-op step within gemlite's own
    difference (its one-row GEMV multiplies the float32 weight unrounded: 2.5e-3 a linear)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from core.engines.fast import check as C
    from core.engines.fast.methods import tuning
    from core.engines.fast.methods.tuner import model_shapes
    from core.engines.fast.model import Dims, FastLlama

    torch.manual_seed(5)
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
    prompt = torch.randint(0, cfg.vocab_size, (batch, 32), device="cuda")
    cont = torch.randint(0, cfg.vocab_size, (batch, 12), device="cuda")
    model = FastLlama.from_hf(hf, mode, calibration_ids=torch.randint(0, cfg.vocab_size, (64,)).tolist())
    for _, n, k, _ in model_shapes(Dims.from_config(cfg)):
        monkeypatch.setitem(tuning.TUNED, tuning.key(Precision(mode), batch, n, k), {"kernel": kernel})
    ref = C.fast_logprobs(model, prompt, cont, "auto", "ref")
    direct = C.fast_logprobs(model, prompt, cont, "auto", "graph")
    with monkeypatch.context() as m:
        for L in model.layers:
            for name in ("qkv", "o", "gu", "down"):
                m.setattr(L[name], "fast", _copied(L[name]))
        copied = C.fast_logprobs(model, prompt, cont, "auto", "graph")
    same, vs_ref = C.agreement(copied, direct), C.agreement(ref, direct)
    print(f"{mode} {kernel} batch {batch}: read as they are vs copied top1 {same['top1']:.3f} KL "
          f"{same['kl_mean']:.2e}; vs the torch-op step top1 {vs_ref['top1']:.3f} KL {vs_ref['kl_mean']:.2e}")
    assert torch.isfinite(direct).all()
    assert same["kl_mean"] <= 5e-4 and same["top1"] >= 0.9
    assert vs_ref["kl_mean"] <= 5e-3 and vs_ref["top1"] >= 0.8
