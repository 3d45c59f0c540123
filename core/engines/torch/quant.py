"""Integer weight quantization for the torch engine: INT8 W8A8 (int8 products), INT8 weight-only, INT4 weight-only in
groups of 128 along the input (asymmetric, zero point: the AWQ/GPTQ layout, two weights packed in a byte) and INT4
after AWQ's activation-aware per-input-channel scaling, searched on a calibration text.

Weights are really stored as int8 / packed uint8 (memory reports count those bytes). lm_head and embeddings stay at
the base dtype, as for FP8 (fp8.py). Each layer records which kernel really ran (`kernel`), so a label never
claims a kernel that fell back.

Also the per-layer error analysis (`layer_errors`): each linear's relative output error under a quantizer, measured on
calibration activations, with the activation statistics behind it.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
from torch import nn
from torch.nn import functional as F

from core.engines.torch import cbuild, fp8, int_cpu
from core.precision import Precision

GROUP = 128  # INT4 group size along the input dimension
INT8_MAX = 127
INT4_MAX = 15  # unsigned 4-bit codes 0..15 with a zero point
AWQ_GRID = 11  # alpha in 0, 0.1, ..., 1.0 (alpha 0 is plain group-wise INT4)
CALIBRATION_TOKENS = 256  # tokens of the calibration text AWQ searches on
AWQ_ERROR_ROWS = 64  # of those, the rows whose output error picks alpha (mean|x| uses them all)
_EPS = 1e-12
# INT4 storage beside the packed codes: a float16 scale and a uint8 zero point per group of GROUP weights.
INT4_GROUP_BYTES = 2 + 1


def weight_bytes(quantizable_params: int, precision: Precision) -> int:
    """Bytes of the quantized linears' storage at an integer precision (codes + per-channel or per-group scales;
    AWQ's per-input-channel scales, a few KiB, are left out of this estimate)."""
    if precision.is_int4:
        return quantizable_params // 2 + math.ceil(quantizable_params / GROUP) * INT4_GROUP_BYTES
    return quantizable_params  # int8: one byte a weight (the per-row float32 scales are < 1%)


# ---- INT8 ------------------------------------------------------------------------------------------------------

def int8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one float32 scale per row (per output channel for weights, per token for activations)."""
    amax = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_EPS)
    scale = amax / INT8_MAX
    return (x.float() / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


def int8_tensor(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 with one scale for the whole tensor (the per-tensor baseline of the layer analysis)."""
    scale = x.abs().amax().float().clamp(min=_EPS) / INT8_MAX
    return (x.float() / scale).round().clamp(-INT8_MAX, INT8_MAX).to(torch.int8), scale


# int8 x int8 products summed over this many inputs stay below 2^24 (127^2 * 1024 = 16,516,096): every partial sum
# a float32 GEMM forms, in any order, is an integer it holds exactly
EXACT_FLOAT32_K = 1024
FLOAT32_ROUTE = "torch._int_mm for one row, exact float32 GEMMs for several (this CPU has no int8 dot products)"


def cpu_has_int8_dot() -> bool:
    """Whether this CPU has int8 dot-product instructions (AVX-512 VNNI, AVX-VNNI, AMX-INT8; aarch64 asimddp/i8mm).
    Without them torch._int_mm runs a plain loop: [128 x 640] x [640 x 2048] took 94.7 ms on an AVX2-only AMD EPYC,
    where the same int8 values as float32 took 3.0 ms (docs/perf-log/fp8-cpu.md, "INT8 W8A8 on a CPU without VNNI")."""
    flags = cbuild.cpu_flags()
    return flags is None or any(f in flags for f in ("avx512_vnni", "avx_vnni", "amx_int8", "asimddp", "i8mm"))


def int_mm_in_float32(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """int8 [m, k] @ int8 [k, n] -> int32 [m, n] through float32 GEMMs over chunks of EXACT_FLOAT32_K inputs, each
    exact (see EXACT_FLOAT32_K), summed in int32: torch._int_mm's result bit for bit."""
    acc = None
    for start in range(0, a.shape[1], EXACT_FLOAT32_K):
        part = (a[:, start:start + EXACT_FLOAT32_K].float() @ b[start:start + EXACT_FLOAT32_K].float()).to(torch.int32)
        acc = part if acc is None else acc + part
    return acc


def int_mm(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, str]:
    """int8 [m, k] @ int8 [k, n] -> int32 [m, n], and the kernel that ran. torch._int_mm runs on the CPU for every
    shape tried (torch 2.13), but without int8 dot products (`cpu_has_int8_dot`) it is slower than exact float32
    GEMMs from two rows on; on CUDA it needs m > 16 (rows are zero-padded to 17) and k, n multiples of 8. Where it
    cannot run, the product is computed in floating point (exact on the CPU in float64) and the name says so."""
    m = a.shape[0]
    if not a.is_cuda and not _CPU_INT8_DOT:  # one row: torch._int_mm's loop is a little faster (0.80 against 0.98 ms)
        return (torch._int_mm(a, b) if m == 1 else int_mm_in_float32(a, b)), FLOAT32_ROUTE
    try:
        if a.is_cuda and m <= 16:
            padded = torch.cat([a, a.new_zeros((17 - m, a.shape[1]))])
            return torch._int_mm(padded, b)[:m], "torch._int_mm (rows padded to 17)"
        return torch._int_mm(a, b), "torch._int_mm"
    except RuntimeError:
        if a.is_cuda:
            return (a.float() @ b.float()).round().to(torch.int32), "float32 matmul (torch._int_mm refused the shape)"
        return (a.double() @ b.double()).to(torch.int32), "float64 matmul (torch._int_mm refused the shape)"


_CPU_INT8_DOT = cpu_has_int8_dot()


def _cpu_kernel_label(layer: nn.Module, gemv: bool) -> str:
    """What a weight-only layer on the CPU runs, once `_weight_only_cpu` has taken its bf16 activations."""
    if not int_cpu.available():
        return layer.TORCH_KERNEL
    gemm = "float32 GEMMs of those values (this CPU has no bf16 GEMM)" if not cbuild.packs_bf16() else "F.linear"
    if not gemv:
        return f"weights dequantized in C + {gemm}"
    return f"C GEMV from the codes for up to {int_cpu.GEMV_ROWS} rows; for more, weights dequantized in C + {gemm}"


def _weight_only_cpu(layer: nn.Module, x: torch.Tensor, gemv: Callable[[torch.Tensor], torch.Tensor] | None,
                     weights: Callable[[bool], torch.Tensor]) -> torch.Tensor | None:
    """A weight-only layer's product on the CPU through int_cpu.py, or None where that kernel does not apply
    (not bf16, not on the CPU, not built). Up to GEMV_ROWS rows (decode steps): `gemv(x2d)`, which multiplies from
    the codes without writing the weights (None: this layer cannot, e.g. it has a bias). More rows (a prompt):
    `weights(as_float32)`, the very bf16 values `dequantized(bf16)` gives, into a GEMM; on a CPU without bf16 GEMMs
    those values as float32 and the product rounded once, which is a bf16 GEMM's arithmetic (float32 accumulation)
    at float32 speed, as cpu_fast.Float32PackedLinear does for BF16's linears."""
    if x.dtype is not torch.bfloat16 or x.device.type != "cpu" or not int_cpu.available():
        layer.kernel = layer.TORCH_KERNEL
        return None
    layer.kernel = _cpu_kernel_label(layer, gemv is not None)
    rows = x.numel() // x.shape[-1]
    if rows <= int_cpu.GEMV_ROWS and gemv is not None:
        return gemv(x.reshape(rows, -1).contiguous()).reshape(*x.shape[:-1], -1)
    if not cbuild.packs_bf16():
        bias = None if layer.bias is None else layer.bias.float()
        return F.linear(x.float(), weights(True), bias).to(x.dtype)
    return F.linear(x, weights(False), layer.bias)


class Int8Linear(nn.Module):
    """A Linear whose weight lives in int8 with per-output-channel float32 scales.

    w8a8=True: activations are quantized per token on the fly (dynamic scales) and multiplied in int8 (`int_mm`).
    w8a8=False: weight-only; the weight is upcast to the activation dtype for each matmul (in C on the CPU).
    """

    TORCH_KERNEL = "int8 dequantize + F.linear"

    def __init__(self, linear: nn.Linear, w8a8: bool):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.w8a8 = w8a8
        q, scale = int8_rows(linear.weight.data)
        self.register_buffer("weight_int8", q)  # [out, in]
        self.register_buffer("weight_scale", scale)  # [out, 1] float32
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)
        on_cpu_loop = not q.is_cuda and not _CPU_INT8_DOT
        if not w8a8:
            self.kernel = self.TORCH_KERNEL if q.is_cuda else _cpu_kernel_label(self, self._gemv_fits())
        else:
            self.kernel = FLOAT32_ROUTE if on_cpu_loop else "torch._int_mm"  # what int_mm returns once it ran

    def _gemv_fits(self) -> bool:
        """int_cpu.int8_gemv takes no bias, and 16 inputs at a time."""
        return self.bias is None and self.in_features % 16 == 0

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        return (self.weight_int8.float() * self.weight_scale).to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.w8a8:
            gemv = ((lambda x2: int_cpu.int8_gemv(x2, self.weight_int8, self.weight_scale)) if self._gemv_fits()
                    else None)
            out = _weight_only_cpu(self, x, gemv, lambda as_float32: int_cpu.int8_weights(
                self.weight_int8, self.weight_scale, as_float32))
            return F.linear(x, self.dequantized(x.dtype), self.bias) if out is None else out
        shape = x.shape
        xq, xs = int8_rows(x.reshape(-1, shape[-1]))
        acc, self.kernel = int_mm(xq, self.weight_int8.t())
        out = (acc.float() * xs * self.weight_scale.t()).to(x.dtype)
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        mode = "W8A8 per-token/per-channel" if self.w8a8 else "weight-only"
        return f"in={self.in_features}, out={self.out_features}, int8 {mode}, kernel={self.kernel}"


# ---- INT4 ------------------------------------------------------------------------------------------------------

def quantize_int4(w: torch.Tensor, group: int = GROUP) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Asymmetric 4-bit codes per group of `group` input columns: (packed uint8 [out, in_padded / 2], float16 scales
    [out, groups], uint8 zero points [out, groups]). The input dimension is zero-padded to a whole group."""
    out, n_in = w.shape
    wf = F.pad(w.float(), (0, (-n_in) % group)).reshape(out, -1, group)
    lo, hi = wf.amin(dim=-1), wf.amax(dim=-1)
    scale = ((hi - lo).clamp(min=1e-5) / INT4_MAX).half().float()  # the float16 that is stored is the one used
    zero = (-lo / scale).round().clamp(0, INT4_MAX)
    q = ((wf / scale[..., None]).round() + zero[..., None]).clamp(0, INT4_MAX).to(torch.uint8).reshape(out, -1)
    packed = q[:, 0::2] | (q[:, 1::2] << 4)
    return packed.contiguous(), scale.half(), zero.to(torch.uint8)


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, n_in: int,
                    dtype: torch.dtype = torch.float32) -> torch.Tensor:
    out = packed.shape[0]
    q = torch.stack([packed & 0xF, packed >> 4], dim=-1).reshape(out, scale.shape[1], -1).float()
    w = (q - zero[..., None].float()) * scale[..., None].float()
    return w.reshape(out, -1)[:, :n_in].to(dtype)


class Int4Linear(nn.Module):
    """A Linear whose weight lives as 4-bit codes, two a byte, with a float16 scale and a uint8 zero point per group
    of 128 inputs; dequantized to the activation dtype for each matmul (weight-only, W4A16).

    `input_scale` (AWQ): the codes hold W * diag(s); the dequantized weight is divided by s again, which is the same
    as scaling the activations by 1/s (AWQ folds that into the previous op)."""

    TORCH_KERNEL = "int4 unpack + dequantize + F.linear"

    def __init__(self, linear: nn.Linear, input_scale: torch.Tensor | None = None):
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        w = linear.weight.data.float()
        if input_scale is not None:
            input_scale = input_scale.float().to(w.device)
            w = w * input_scale[None, :]
        packed, scale, zero = quantize_int4(w)
        self.register_buffer("weight_packed", packed)
        self.register_buffer("weight_scales", scale)
        self.register_buffer("weight_zeros", zero)
        self.register_buffer("input_scale", None if input_scale is None else input_scale.half())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.data.clone(), requires_grad=False)
        self.kernel = self.TORCH_KERNEL if packed.is_cuda else _cpu_kernel_label(self, self.bias is None)

    def dequantized(self, dtype: torch.dtype) -> torch.Tensor:
        w = dequantize_int4(self.weight_packed, self.weight_scales, self.weight_zeros, self.in_features)
        if self.input_scale is not None:
            w = w / self.input_scale.float()[None, :]
        return w.to(dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        codes = (self.weight_packed, self.weight_scales, self.weight_zeros, self.input_scale, self.in_features)
        gemv = (lambda x2: int_cpu.int4_gemv(x2, *codes)) if self.bias is None else None  # the GEMV takes no bias
        out = _weight_only_cpu(self, x, gemv, lambda as_float32: int_cpu.int4_weights(*codes, as_float32))
        return F.linear(x, self.dequantized(x.dtype), self.bias) if out is None else out

    def extra_repr(self) -> str:
        awq = ", AWQ input scales" if self.input_scale is not None else ""
        return f"in={self.in_features}, out={self.out_features}, int4 g{GROUP} asymmetric{awq}"


def int4_roundtrip(w: torch.Tensor, s: torch.Tensor | None = None) -> torch.Tensor:
    """W as INT4 storage gives it back (float32), with optional AWQ input scales s."""
    ws = w if s is None else w * s[None, :]
    packed, scale, zero = quantize_int4(ws)
    back = dequantize_int4(packed, scale, zero, w.shape[1])
    return back if s is None else back / s[None, :]


def awq_search(w: torch.Tensor, x: torch.Tensor, grid: int = AWQ_GRID) -> dict:
    """AWQ's scale search for one linear: s = mean|x|^alpha per input channel (normalized so max*min = 1), alpha
    from `grid` points in [0, 1] chosen by the output's mean squared error on the calibration activations x [n, in]
    (on AWQ_ERROR_ROWS of them, evenly spaced).
    alpha 0 is plain INT4, so the chosen error is never above plain INT4's on the calibration text."""
    w, x = w.float(), x.float()
    mean_abs = x.abs().mean(dim=0).clamp(min=1e-4)  # from every calibration token
    if x.shape[0] > AWQ_ERROR_ROWS:  # the output error on evenly spaced rows: a quarter of the cost, same choice
        x = x[torch.linspace(0, x.shape[0] - 1, AWQ_ERROR_ROWS).long()]
    ref = x @ w.t()
    best = None
    for i in range(grid):
        alpha = i / (grid - 1)
        s = mean_abs.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        err = float(((x @ int4_roundtrip(w, s).t() - ref) ** 2).mean())
        if alpha == 0:
            plain = err
        if best is None or err < best["mse"]:
            best = {"alpha": alpha, "scale": s, "mse": err}
    best["plain_mse"] = plain
    return best


# ---- the model ---------------------------------------------------------------------------------------------------

def target_linears(model: nn.Module, skip: tuple[str, ...] = ("lm_head",)) -> list[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, full name, linear) for every nn.Linear to quantize (lm_head stays at the base dtype)."""
    out = []
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and not any(s in full for s in skip):
                out.append((module, child_name, full, child))
    return out


def calibration_ids(tokenizer, text: str | None = None, max_tokens: int = CALIBRATION_TOKENS) -> list[int]:
    """BOS + the first max_tokens tokens of the calibration text (default: the shipped sample prose)."""
    if text is None:
        from core.textfile import source_text

        text = source_text()
    if callable(tokenizer):
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        ids = tokenizer.encode(text)
    bos = getattr(tokenizer, "bos_token_id", None)
    return ([bos] if bos is not None else []) + list(ids[:max_tokens])


@torch.inference_mode()
def capture_inputs(model: nn.Module, names: list[str], ids: list[int]) -> dict[str, torch.Tensor]:
    """The float32 input rows [tokens, in] of each named linear in one forward pass over `ids`."""
    modules = dict(model.named_modules())
    got: dict[str, torch.Tensor] = {}
    fp8.forward_with_input_hooks(model, ids, {n: modules[n] for n in names},
                                 lambda n, x: got.__setitem__(n, x.reshape(-1, x.shape[-1]).float()))
    return got


@torch.inference_mode()
def quantize_model(model: nn.Module, precision: Precision, calibration: list[int] | None = None,
                   progress: Callable[[float, str], None] | None = None) -> dict:
    """Replace every nn.Linear but lm_head with its integer layer. INT4 AWQ first captures each linear's inputs on
    the calibration ids (the base model's activations) and searches its scales. Returns what was done."""
    if not precision.is_int:
        raise ValueError(f"{precision.label} is not an integer precision")
    targets = target_linears(model)
    acts = {}
    if precision is Precision.INT4_AWQ:
        if not calibration:
            raise ValueError("INT4 AWQ needs calibration token ids")
        acts = capture_inputs(model, [t[2] for t in targets], calibration)
    info = {"linears": len(targets), "awq": {}}
    for i, (parent, attr, name, linear) in enumerate(targets):
        if progress:
            progress(i / len(targets), f"Quantizing {name}")
        if precision in (Precision.INT8, Precision.INT8_WEIGHT_ONLY):
            layer = Int8Linear(linear, w8a8=precision is Precision.INT8)
        elif precision is Precision.INT4:
            layer = Int4Linear(linear)
        else:
            found = awq_search(linear.weight.data, acts.pop(name))
            info["awq"][name] = {"alpha": found["alpha"], "mse": found["mse"], "plain_mse": found["plain_mse"]}
            layer = Int4Linear(linear, found["scale"])
        setattr(parent, attr, layer)
    if precision is Precision.INT4_AWQ:
        info["calibration_tokens"] = len(calibration)
    return info


def kernels(model: nn.Module) -> list[str]:
    """The kernels the quantized layers really ran (or will run) with, once each, in model order."""
    seen: list[str] = []
    for m in model.modules():
        k = getattr(m, "kernel", None)
        if isinstance(m, (Int8Linear, Int4Linear)) and k not in seen:
            seen.append(k)
    return seen


# ---- which layer broke it ----------------------------------------------------------------------------------------

LAYER_QUANTIZERS = ("fp8", "int8", "int8 per-tensor", "int8-wo", "int4", "int4-awq")
OUTLIER_RATIO = 20.0  # an input channel whose max|x| is this many times the median channel's is an outlier


def _rel(yq: torch.Tensor, y: torch.Tensor) -> float:
    return float((yq - y).norm() / y.norm().clamp(min=_EPS))


@torch.inference_mode()
def layer_errors(model: nn.Module, ids: list[int], bins: int = 40) -> list[dict]:
    """Per linear (lm_head aside), on the unquantized model's own activations over `ids`: the relative output error
    ||x W_q^T - x W^T|| / ||x W^T|| of each quantizer in LAYER_QUANTIZERS (W8A8 ones quantize x too: FP8 and INT8 per
    token with per-channel weights, and INT8 per-tensor for both, the article's baseline), and the activation
    statistics behind it: max|x|, outlier input channels, a histogram of log10|x|."""
    targets = target_linears(model)
    acts = capture_inputs(model, [t[2] for t in targets], ids)
    rows = []
    for _parent, _attr, name, lin in targets:
        x, w = acts.pop(name), lin.weight.data.float()
        y = x @ w.t()
        errs = {}
        qw, sw = fp8.quantize_rows(w)
        qx, sx = fp8.quantize_rows(x)
        errs["fp8"] = _rel((qx.float() * sx) @ (qw.float() * sw).t(), y)
        wq, ws = int8_rows(w)
        xq, xs = int8_rows(x)
        errs["int8"] = _rel((xq.float() * xs) @ (wq.float() * ws).t(), y)
        tw, tws = int8_tensor(w)
        tx, txs = int8_tensor(x)
        errs["int8 per-tensor"] = _rel((tx.float() * txs) @ (tw.float() * tws).t(), y)
        errs["int8-wo"] = _rel(x @ (wq.float() * ws).t(), y)
        errs["int4"] = _rel(x @ int4_roundtrip(w).t(), y)
        errs["int4-awq"] = _rel(x @ int4_roundtrip(w, awq_search(w, x)["scale"]).t(), y)
        ch = x.abs().amax(dim=0)
        med = float(ch.median().clamp(min=_EPS))
        logs = x.abs().clamp(min=1e-6).log10().flatten()
        hist = torch.histc(logs, bins=bins, min=-6.0, max=float(logs.max()) + 1e-6)
        rows.append({"layer": name, "errors": errs, "max_abs": float(ch.max()),
                     "median_channel_max": med, "outlier_channels": int((ch > OUTLIER_RATIO * med).sum()),
                     "top_channels": [int(i) for i in ch.topk(min(3, ch.numel())).indices],
                     "hist_log10_abs": {"min": -6.0, "max": float(logs.max()), "counts": [int(c) for c in hist]}})
    return rows
