"""Integer linears through kernels that torch and its ecosystem ship, built FROM the torch engine's own integer storage
(core/engines/torch/quant.py, held by the fast engine as int_weight.IntWeight), so that the Quality table and the
speed table describe the same weights:

- `TinyGemmInt4`: torch's `_weight_int4pack_mm` (tinygemm, the kernel torchao and gpt-fast use). Its weight is
  `(q - 8) * scale + zero` with a bf16 scale and a bf16 zero, one rounding (an FMA); ours is `(q - zp) * s16` (s16
  float16) rounded once to bf16. The conversion takes scale = bf16(s16) and zero = bf16((8 - zp) * s16): exact only
  where s16 has at most 8 significant bits and (8 - zp) * s16 fits bf16, which is rare (`tinygemm_weight_error`
  measures it). NOT the torch engine's weights bit for bit: a candidate that is timed and reported, not routed.
- `GemliteInt4`: gemlite's A16Wn kernel (pure Python + Triton) with float32 metadata: `(q - zp) * s16` computed in
  float32 (exact: a 5-bit integer times an 11-bit scale), rounded to bf16 where it enters a tensor-core dot, which is
  the torch engine's weight bit for bit. gemlite's one-row GEMVs multiply that float32 weight unrounded (they
  accumulate in float32 from the float32 weight), so at one row the weight is the exact value the bf16 weight rounds.
- `GemliteInt8`: gemlite's A16W8 (per output channel) with the float32 scale applied to the weight before the dot
  ("pre-scale"), as Int8Linear.dequantized does: q * s in float32, then bf16.
- `GemliteW8A8`: gemlite's A8W8 INT8 dynamic (activations quantized per token by gemlite, int8 dots, scales after).
- INT4 AWQ (`AwqFold`): the codes are plain INT4 codes of W * diag(s); the activations are divided by s once per
  projection (one elementwise op) instead of a division per weight, then any INT4 kernel above runs. The weights are
  the torch engine's codes bit for bit; the product differs from its `x @ (W_q / s)^T` only in rounding order.

`candidates(iw)` lists what can run a weight. Every candidate takes bf16 x [M, K]: `raw(x)` returns its own output
([M, N], float32 for gemlite, whose split-K adds partial sums with atomics: in float32, not its default bf16, so the
sums round once), `__call__(x)` that as bf16, `into(x, out)` writes it into a bf16 buffer, and `product(x)` is what
the decode step reads: the kernel's own output, not copied (the step's next kernel rounds a float32 value to bf16 as
it loads it, which is what the copy did; for INT4 AWQ one row block per projection, or one tensor per projection:
kernels/norm.py and rope.py read them as they are). Inside the step's CUDA graph that output is the library's own
tensor, allocated once at capture, so its address is fixed like the step's buffers. gemlite's one-row INT4 GEMV adds
into a zeroed output: captured in `graph_outputs` it takes its outputs from gemlite's ring of zeroed rows
(KERNEL_CACHE), one zeroing per shape and step instead of one per call.
Importing this module needs CUDA torch; gemlite is optional (requirements-gpu.txt) and its candidates are left out
where it is not installed.
"""
from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl

from core.engines.fast import int_weight as IL

GROUP = IL.GROUP
TINYGEMM_INNER_K_TILES = 8  # the packing torchao and gpt-fast use for g128 (K a multiple of 1024)


def unpack_codes(iw: IL.IntWeight) -> torch.Tensor:
    """INT4 codes uint8 [N, K] (0..15) from the packed storage (input 2j in the low nibble, 2j + 1 in the high)."""
    p = iw.w
    return torch.stack([p & 0xF, p >> 4], dim=-1).reshape(iw.n, -1)[:, :iw.k].contiguous()


class _Kernel:
    """raw / __call__ / into / product for a kernel whose raw(x) returns [M, N]."""

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.raw(x).to(torch.bfloat16)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return out.copy_(self.raw(x))

    def product(self, x: torch.Tensor, x_div: torch.Tensor | None = None) -> torch.Tensor:
        """The decode step's read of the product: the kernel's own output (x_div: AwqFold's only)."""
        return self.raw(x)


def tinygemm_params(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """tinygemm's scales_and_zeros [groups, N, 2] bf16 for codes q with zero point zp: the weight (q - 8) * scale +
    zero nearest to (q - zp) * s16 that bf16 parameters give (each rounded once from its exact float32 value)."""
    s = scale.float()
    z = (8.0 - zero.float()) * s  # exact in float32: a 5-bit integer times an 11-bit scale
    return torch.stack([s.t().to(torch.bfloat16), z.t().to(torch.bfloat16)], dim=-1).contiguous()


def tinygemm_cuda_pack(codes: torch.Tensor) -> torch.Tensor:
    """torch's CUDA int4 packing from codes uint8 [N, K]: two codes a byte, the even input in the HIGH nibble."""
    u8 = (codes[:, ::2] << 4 | codes[:, 1::2]).contiguous()
    return torch.ops.aten._convert_weight_to_int4pack(u8, TINYGEMM_INNER_K_TILES)


def tinygemm_cpu_weights(codes: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    """The weights [N, K] torch's CPU int4 kernel (`_weight_int4pack_mm_for_cpu`, the same format and arithmetic as
    the CUDA one) multiplies with, read back through one-hot rows: lets the CPU check the format conversion."""
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes.int().cpu(), 1)
    eye = torch.eye(codes.shape[1], dtype=torch.bfloat16)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(eye, packed, GROUP, params.cpu()).t().contiguous()


def tinygemm_weight_error(iw: IL.IntWeight) -> dict:
    """How far tinygemm's weights (`tinygemm_params`, computed here as its FMA rounds them) are from the torch
    engine's bf16 weights: share of weights equal, largest difference in quantization steps (scale units)."""
    codes = unpack_codes(iw).float()
    params = tinygemm_params(iw.scale, iw.zero).float()  # [G, N, 2]
    g = torch.arange(iw.k, device=codes.device) // GROUP
    s, z = params[..., 0].t()[:, g], params[..., 1].t()[:, g]
    theirs = ((codes.double() - 8) * s.double() + z.double()).float().to(torch.bfloat16)  # fp32 sum exact here
    ours = ((codes - iw.zero.float()[:, g]) * iw.scale.float()[:, g]).to(torch.bfloat16)
    diff = (theirs.float() - ours.float()).abs() / iw.scale.float()[:, g]
    return {"equal_share": float((theirs == ours).float().mean()), "max_diff_steps": float(diff.max())}


class TinyGemmInt4(_Kernel):
    """torch's tinygemm INT4 g128 (`_weight_int4pack_mm`) on a converted copy of an INT4 storage."""

    name = "tinygemm"
    label = "torch._weight_int4pack_mm (tinygemm INT4 g128; bf16 scale and zero converted from ours)"
    exact = False  # see the module docstring and tinygemm_weight_error

    def __init__(self, iw: IL.IntWeight):
        self.n, self.k = iw.n, iw.k
        self.packed = tinygemm_cuda_pack(unpack_codes(iw))
        self.params = tinygemm_params(iw.scale, iw.zero)

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm(x, self.packed, GROUP, self.params)


@functools.lru_cache(maxsize=None)
def gemlite_available() -> bool:
    try:
        import gemlite  # noqa: F401
    except Exception:  # not installed, or no GPU it knows
        return False
    return True


def _gemlite_layer(bits: int, n: int, k: int, group: int, input_dtype=None, scaled_activations=False):
    """A gemlite layer with float32 output: its split-K kernels add partial sums with atomics in the output dtype
    (bf16 on Hopper by default, which measured 1.9e-2 relative error at one row); in float32 they round once."""
    from gemlite.core import DType, GemLiteLinearTriton

    return GemLiteLinearTriton(bits, group_size=group, in_features=k, out_features=n,
                               input_dtype=input_dtype or DType.BF16, output_dtype=DType.FP32,
                               scaled_activations=scaled_activations)


class _Gemlite(_Kernel):
    name = "gemlite"

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x)


class GemliteInt4(_Gemlite):
    """gemlite A16W4 g128 asymmetric on our codes, float32 scale and zero point: `(q - zp) * s16` in float32."""

    label = "gemlite A16W4 g128 (Triton; float32 scale and zero point: the torch engine's weights)"
    exact = True

    def __init__(self, iw: IL.IntWeight):
        self.n, self.k = iw.n, iw.k
        self.layer = _gemlite_layer(4, iw.n, iw.k, GROUP)
        # fma_mode=False: W = (q - zeros) * scales (W_group_mode 3); float32 metadata keeps that product exact
        self.layer.pack(unpack_codes(iw), iw.scale.float().contiguous(), iw.zero.float().contiguous(),
                        fma_mode=False)


class GemliteInt8(_Gemlite):
    """gemlite A16W8 on our int8 codes and float32 per-row scales, the scale applied to each weight before the dot."""

    label = "gemlite A16W8 per channel (Triton; q * scale in float32, as Int8Linear.dequantized)"
    exact = True

    def __init__(self, iw: IL.IntWeight):
        self.n, self.k = iw.n, iw.k
        self.layer = _gemlite_layer(8, iw.n, iw.k, iw.k)
        self.layer.pack(iw.w, iw.scale.reshape(-1, 1).float(), zeros=None)
        self.layer.W_group_mode, self.layer.channel_scale_mode = 2, 0  # pre-scale (A16W8's default)


class GemliteW8A8(_Gemlite):
    """gemlite A8W8 INT8 dynamic: gemlite quantizes the activations per token, int8 dots, both scales after."""

    label = "gemlite A8W8 INT8 dynamic (Triton int8 dots; activations quantized per token by gemlite)"
    exact = False  # its activation rounding is gemlite's own: tests/gpu/test_int_library_gpu.py measures it

    def __init__(self, iw: IL.IntWeight):
        from gemlite.core import DType

        self.n, self.k = iw.n, iw.k
        self.layer = _gemlite_layer(8, iw.n, iw.k, iw.k, input_dtype=DType.INT8, scaled_activations=True)
        self.layer.pack(iw.w, iw.scale.reshape(-1, 1).float(), zeros=None)
        self.layer.W_group_mode, self.layer.channel_scale_mode = 0, 3  # both scales after the int32 sums


@triton.jit
def _awq_divide_kernel(x_ptr, s_ptr, out_ptr, M, K, stride_xm, BLOCK: tl.constexpr):
    """out[seg * M + m] = bf16(x[m] / s[seg]), the division correctly rounded in float32 as torch's."""
    row = tl.program_id(0)
    seg, m = row // M, row % M
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < K
    x = tl.load(x_ptr + m * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    s = tl.load(s_ptr + seg * K + offs, mask=mask, other=1.0)
    tl.store(out_ptr + row * K + offs, tl.math.div_rn(x, s).to(tl.bfloat16), mask=mask)


@triton.jit
def _awq_gather_kernel(y_ptr, seg_ptr, out_ptr, M, N, stride_ym, stride_om, BLOCK: tl.constexpr):
    """out[m, n] = y[seg[n] * M + m, n]: each output column from the rows its own projection's scales made."""
    m = tl.program_id(0)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    seg = tl.load(seg_ptr + offs, mask=mask, other=0)
    v = tl.load(y_ptr + (seg * M + m) * stride_ym + offs, mask=mask, other=0.0)
    tl.store(out_ptr + m * stride_om + offs, v.to(out_ptr.dtype.element_ty), mask=mask)


class AwqFold(_Kernel):
    """INT4 AWQ through a plain INT4 kernel: x / s once (s the float16 input scale the torch engine divides its
    weights by; `_awq_divide_kernel`, one launch for every projection), then the codes. A fused weight (q|k|v,
    gate|up) holds projections with their own s. split=False: the kernel runs once over all of it with one row of
    x / s per projection (S x M rows, the weights still read once) and each output column is taken from its
    projection's row (`_awq_gather_kernel`); split=True: one kernel per projection on its own rows, each written
    into its slice of the output. Which is faster depends on the kernel and the batch (the tuner times both)."""

    def __init__(self, iw: IL.IntWeight, kernel_cls, split: bool = False):
        self.n, self.k, self.split = iw.n, iw.k, split
        # exact: the weights multiplied are the torch engine's codes bit for bit (its division by s moved to x)
        self.name, self.exact = kernel_cls.name + ("+split" if split else "+fold"), kernel_cls.exact
        self.label = kernel_cls.label + "; AWQ input scales divided out of the activations once per projection"
        self.divisors = iw.in_scale[:, :iw.k].float().contiguous()  # [S, K]
        self.row_seg = iw.row_seg
        sizes = IL._segment_sizes(iw.row_seg) if split else [iw.n]
        self.parts, start = [], 0
        for size in sizes:
            rows = slice(start, start + size)
            self.parts.append((rows, kernel_cls(IL.IntWeight(IL.MODE_INT4, size, iw.k, iw.w[rows].contiguous(),
                                                             iw.scale[rows].contiguous(),
                                                             iw.zero[rows].contiguous()))))
            start += size

    def divide(self, x: torch.Tensor) -> torch.Tensor:
        """[S * M, K] bf16: x / s of each projection in a row block of its own (one launch)."""
        m, segs = x.shape[0], self.divisors.shape[0]
        xs = torch.empty(segs * m, self.k, dtype=torch.bfloat16, device=x.device)
        _awq_divide_kernel[(segs * m, triton.cdiv(self.k, 1024))](x, self.divisors, xs, m, self.k, x.stride(0),
                                                                  BLOCK=1024, num_warps=4)
        return xs

    def product(self, x: torch.Tensor, x_div: torch.Tensor | None = None):
        """x_div: `divide(x)` as the producing kernel wrote it (kernels/norm.py's `div`), else divided here. The
        kernels' own outputs, which the step's next kernel reads as they are: folded (or one projection) one
        [S * M, N] in row blocks (projection j's columns valid in block j); split a tuple of each projection's
        [M, N_j] (kernels/rope.py's qkv_sources, norm.py's gate_up_sources)."""
        m = x.shape[0]
        xs = self.divide(x) if x_div is None else x_div
        if not self.split or len(self.parts) == 1:
            return self.parts[0][1].raw(xs)
        return tuple(kern.raw(xs[i * m:(i + 1) * m]) for i, (_, kern) in enumerate(self.parts))

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        m = x.shape[0]
        y = self.product(x)
        if isinstance(y, tuple):
            for (rows, _), part in zip(self.parts, y):
                out[:, rows].copy_(part)
            return out
        if y.shape[0] == m:
            return out.copy_(y)
        _awq_gather_kernel[(m, triton.cdiv(self.n, 1024))](y, self.row_seg, out, m, self.n, y.stride(0),
                                                           out.stride(0), BLOCK=1024, num_warps=4)
        return out

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        return self.into(x, torch.empty(x.shape[0], self.n, dtype=torch.bfloat16, device=x.device))


class IntMmW8A8(_Kernel):
    """INT8 W8A8 with the torch engine's own ops (quant.int8_rows, torch._int_mm with rows padded to 17, the float32
    rescale), captured in the decode step's CUDA graph: the labelled eager path's numbers, by construction."""

    name = "torch._int_mm"
    label = "INT8 W8A8 through torch._int_mm (the torch engine's ops: per-token int8 rows, int32 sums, rescale)"
    exact = True

    def __init__(self, iw: IL.IntWeight):
        self.iw, self.n, self.k = iw, iw.n, iw.k

    def raw(self, x: torch.Tensor) -> torch.Tensor:
        return IL.reference_linear(x, self.iw)


def candidates(iw: IL.IntWeight) -> dict[str, type | object]:
    """Name -> a builder (called with the weight) of every kernel that can run this integer weight here."""
    have_gemlite = gemlite_available()
    out: dict = {}
    if iw.mode == IL.MODE_INT4:
        out["tinygemm"] = TinyGemmInt4
        if have_gemlite:
            out["gemlite"] = GemliteInt4
    elif _awq(iw.mode):
        kinds = [TinyGemmInt4] + ([GemliteInt4] if have_gemlite else [])
        for cls in kinds:
            out[cls.name + "+fold"] = lambda w, cls=cls: AwqFold(w, cls)
            out[cls.name + "+split"] = lambda w, cls=cls: AwqFold(w, cls, split=True)  # one projection: the same
    elif iw.mode == IL.MODE_INT8_WO and have_gemlite:
        out["gemlite"] = GemliteInt8
    elif iw.mode == IL.MODE_INT8:
        out["torch._int_mm"] = IntMmW8A8
        if have_gemlite:
            out["gemlite"] = GemliteW8A8
    return out


def _awq(mode: int) -> bool:
    """The INT4 mode with input scales (AWQ)."""
    return mode in IL.INT4_MODES and mode != IL.MODE_INT4


def _engine_builders(mode: int) -> dict:
    if mode == IL.MODE_INT4:
        return {"gemlite": GemliteInt4}
    if _awq(mode):
        return {"gemlite+fold": lambda w: AwqFold(w, GemliteInt4),
                "gemlite+split": lambda w: AwqFold(w, GemliteInt4, split=True)}
    return {"gemlite": GemliteInt8} if mode == IL.MODE_INT8_WO else {}


def _built(weights: IL.IntWeight, name: str, build):
    """The library's copy of a weight (repacked once, kept on it): made on the step's warm-up, never in a capture."""
    made = weights.__dict__.setdefault("library", {})
    if name not in made:
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError(f"the {name} copy of an integer weight must be made before graph capture: run the "
                               "step once first")
        made[name] = build(weights)
    return made[name]


def engine_launches(mode: int) -> dict:
    """name -> (run(weights, x, out, cfg, silu_x, **inputs), product(weights, x, cfg, silu_x, x_div=None, **inputs))
    of the library launches the integer weight-only method offers its tuner (methods/integer.py wraps them as
    Launches; `product` is what the decode step reads, `linear_product`): only kernels whose weights are the torch
    engine's bit for bit (gemlite; tinygemm's are not: module docstring), only where gemlite is installed."""
    if not gemlite_available():
        return {}

    def launch(name, build):
        def run(w, x, out, cfg, silu_x, **_):
            return linear_into(_built(w, name, build), x, out, silu_x)

        def product(w, x, cfg, silu_x, x_div=None, **_):
            return linear_product(_built(w, name, build), x, silu_x, x_div)
        return run, product

    return {name: launch(name, build) for name, build in _engine_builders(mode).items()}


def engine_divisors(weights: IL.IntWeight, name: str) -> torch.Tensor | None:
    """INT4 AWQ through the library launch `name`: its input scales [S, K] float32, which the kernel producing its
    input divides by (kernels/norm.py's `div`); None for any other launch."""
    if not (_awq(weights.mode) and gemlite_available()) or name not in _engine_builders(weights.mode):
        return None
    return _built(weights, name, _engine_builders(weights.mode)[name]).divisors


LINEAR_CALLS_PER_LAYER = 7  # the most library calls a layer makes: q, k, v split, o, gate, up split, down


@contextlib.contextmanager
def graph_outputs(keep: dict, layers: int):
    """Around a CUDA graph's capture: gemlite's one-row GEMVs take their outputs from rings of rows zeroed once per
    replay (its KERNEL_CACHE: one memset per shape and step instead of one per call), fresh for this graph and held
    in `keep` for the graph's life (the captured kernels write there on every replay). A ring is zeroed whole when
    its pointer wraps, which would clear an output not yet read (AWQ's split k and v are two live outputs of one
    shape): so only where a step of `layers` layers cannot wrap one; elsewhere, and outside the capture, gemlite
    allocates as before."""
    if not gemlite_available():
        yield
        return
    from gemlite.triton_kernels.config import KERNEL_CACHE

    if LINEAR_CALLS_PER_LAYER * layers >= KERNEL_CACHE.CACHE_SIZE:
        yield
        return

    before, KERNEL_CACHE.CACHE, KERNEL_CACHE.ENABLE = (KERNEL_CACHE.CACHE, KERNEL_CACHE.ENABLE), {}, True
    try:
        yield
    finally:
        keep.update(KERNEL_CACHE.CACHE)
        KERNEL_CACHE.CACHE, KERNEL_CACHE.ENABLE = before


def engine_label(mode: int, kernels: set[str]) -> str:
    """What the tuning table's library winners add to the method's `ran` line."""
    picked = sorted(k for k in kernels if k and k.startswith("gemlite"))
    if not picked or not gemlite_available():
        return ""
    fold = " (AWQ's input scales divided out of the activations first)" if _awq(mode) else ""
    return (f"; gemlite's Triton kernels{fold} where the tuning table picks them ({', '.join(picked)}; the same "
            "weights bit for bit)")


def _silu_input(x: torch.Tensor) -> torch.Tensor:
    """SiLU(gate) * up of the [M, 2K] gate|up output (kernels.silu_mul: HF's bf16 roundings)."""
    from core.engines.fast import kernels as K

    return K.silu_mul(x, torch.empty(x.shape[0], x.shape[1] // 2, dtype=torch.bfloat16, device=x.device))


def linear_into(kernel, x: torch.Tensor, out: torch.Tensor, silu_x: bool = False) -> torch.Tensor:
    """A method launch's calling convention (methods/base.py's Launch.run): the product written into `out`; with
    silu_x, x is the [M, 2K] gate|up output and the input is SiLU(gate) * up."""
    return kernel.into(_silu_input(x) if silu_x else x, out)


def linear_product(kernel, x: torch.Tensor, silu_x: bool = False, x_div: torch.Tensor | None = None):
    """The decode step's calling convention (Linear.fast): the kernel's own output, not copied (`_Kernel.product`,
    `AwqFold.product`); x_div: AWQ's divided rows where the producing kernel wrote them."""
    return kernel.product(_silu_input(x) if silu_x else x, x_div)
