"""The integer linear methods: weight-only (INT8, INT4 g128, INT4 g128 with AWQ input scales) and INT8 W8A8, in the
torch engine's storage (core/engines/torch/quant.py: kernels/int_weight.py's IntWeight), multiplied by
kernels/int_tile.py (tensor-core tiles), int_gemv.py (1-8 rows, float32 FMAs) and int_prompt.py (the prompt pass).
The eager numerics are quant.Int4Linear / Int8Linear's (int_weight.reference_linear).

Launches the tuner picks from: "tile" and "gemv". A library's kernel joins as one more entry of `launches()`
(docs/fast-engine.md#adding-a-candidate).
"""
from __future__ import annotations

import torch

from core.engines.fast import int_weight as IW
from core.engines.fast.methods import tuning
from core.engines.fast.methods.base import Launch, LinearMethod
from core.precision import Precision

# The tile kernel's candidates, (BLOCK_N, SPLIT_K, num_warps, num_stages); INT4 tiles are one group (BLOCK_K 128)
TILE_SMALL = [(32, 1, 4, 4), (32, 2, 4, 4), (32, 4, 4, 4), (64, 1, 4, 4), (64, 2, 4, 4), (64, 4, 4, 4),
              (64, 8, 4, 4), (128, 1, 4, 4), (128, 2, 4, 4), (128, 4, 8, 3)]
TILE_LARGE = [(64, 1, 4, 3), (128, 1, 8, 3), (64, 2, 4, 3), (128, 2, 8, 3)]
# The GEMV at one row: (BLOCK_N, SPLIT_K, num_warps, num_stages, DECODE), one INT4 group or 128 INT8 codes a step;
# none spills registers on sm_90 (python -m bench.fast.int_gemv_compile). DECODE 0 and 2 are the A/B of its code
# paths (for INT8 weight-only 1 means 2).
GEMV_ONE = [(32, 4, 4, 3, 1), (64, 2, 4, 3, 1), (64, 4, 4, 3, 1), (64, 8, 4, 3, 1), (64, 4, 2, 3, 1),
            (128, 2, 4, 3, 1), (128, 4, 4, 3, 1), (128, 8, 4, 3, 1), (256, 4, 8, 3, 1), (256, 8, 8, 3, 1),
            (64, 4, 4, 3, 0), (128, 4, 4, 3, 0), (64, 4, 4, 3, 2), (128, 4, 4, 3, 2)]
# The same kernel over 2-8 rows: the accumulators take registers, so 32 rows of weights a program at 4 warps, 64 at
# 8 (64 at 4 warps spills at 8 rows for INT8 and AWQ)
GEMV_ROWS = [(32, 2, 4, 3, 1), (32, 4, 4, 3, 1), (32, 8, 4, 3, 1), (64, 2, 8, 3, 1), (64, 4, 8, 3, 1),
             (32, 4, 4, 3, 2), (64, 4, 8, 3, 2)]


def _k_steps(k: int, block_k: int, split: int) -> int:
    return -(-(-(-k // block_k)) // split)


class _IntMethod(LinearMethod):
    """Shared by the integer methods: the kernel mode of each precision, the storage, its reference."""

    KERNEL_MODES: dict[Precision, int] = {}
    WHAT: dict[Precision, str] = {}
    tune_tolerance = 1e-2

    @property
    def kernel_mode(self) -> int:
        return self.KERNEL_MODES[self.precision]

    def quantize(self, weight, calibration=None) -> IW.IntWeight:
        """calibration (AWQ only): (each projection's input scales, its number of rows), in row order."""
        if self.needs_calibration and calibration is None:
            raise ValueError(f"{self.precision.label} needs each projection's input scales (AWQ's calibration search).")
        return IW.quantize(weight, self.kernel_mode, *(calibration or (None, None)))

    def ref(self, weights, x):
        return IW.reference_linear(x, weights)

    def prompt(self, weights, x):
        """Weight-only: the weights dequantized once (bit for bit the reference's bf16 weights) into a cuBLAS GEMM;
        W8A8: the rows quantized (bit for bit int8_rows) into torch._int_mm, scaled as the reference scales."""
        from core.engines.fast.kernels import int_prompt

        return int_prompt.prompt_linear(x, weights)

    def _tile(self, w, x, out, cfg, silu_x, xs=None, **_):
        from core.engines.fast.kernels import int_tile

        return int_tile.tile_linear(x, w, out, silu_x, cfg, xs)

    def launch(self, weights, x, out, cfg: dict, silu_x: bool = False, **inputs) -> torch.Tensor:
        return super().launch(weights, x, out, IW.fit_config(weights, cfg), silu_x, **inputs)

    def default_config(self, rows, n, k) -> dict:
        from core.engines.fast.kernels import int_tile

        return {"kernel": "tile", **int_tile.default_config(self.kernel_mode, rows, n, k)}

    def _tile_configs(self, rows, n, k) -> list[dict]:
        large = rows > 32  # the tile kernel's BLOCK_M of 64
        bk = IW.GROUP if self.kernel_mode in IW.INT4_MODES else (128 if large else 256)
        return [dict(BLOCK_N=bn, BLOCK_K=bk, SPLIT_K=sk, num_warps=w, num_stages=s)
                for bn, sk, w, s in (TILE_LARGE if large else TILE_SMALL) if _k_steps(k, bk, sk) >= 2]

    def timing_weights(self, n, k, segments, copies, device="cuda") -> list[IW.IntWeight]:
        out = []
        for _ in range(copies):
            w = (torch.randn(n, k, device=device) * 0.02).to(torch.bfloat16)
            calibration = None
            if self.needs_calibration:
                calibration = ([torch.exp(torch.randn(k, device=device) * 0.3) for _ in segments], segments)
            out.append(self.quantize(w, calibration))
        return out

    def expected(self, weights, x, inputs):
        return IW.reference_linear(x, weights)


class IntWeightOnly(_IntMethod):
    """INT8 weight-only, INT4 g128 and INT4 g128 AWQ: weights dequantized in registers to exactly the reference's
    bf16 weights, multiplied with the bf16 activations (tensor-core tiles, or the float32-FMA GEMV at 1-8 rows)."""
    precisions = (Precision.INT8_WEIGHT_ONLY, Precision.INT4, Precision.INT4_AWQ)
    KERNEL_MODES = {Precision.INT4: IW.MODE_INT4, Precision.INT4_AWQ: IW.MODE_INT4_AWQ,
                    Precision.INT8_WEIGHT_ONLY: IW.MODE_INT8_WO}
    WHAT = {Precision.INT4: "INT4 g128", Precision.INT4_AWQ: "INT4 g128 AWQ",
            Precision.INT8_WEIGHT_ONLY: "INT8 weight-only"}

    @property
    def needs_calibration(self) -> bool:
        return self.precision is Precision.INT4_AWQ

    def launches(self) -> dict[str, Launch]:
        from core.engines.fast.kernels import int_gemv

        def gemv(w, x, out, cfg, silu_x, **_):
            return int_gemv.gemv_linear(x, w, out, silu_x, cfg)

        from core.engines.fast.kernels import library

        return {"tile": Launch("tile", self._tile, self._tile_configs),
                "gemv": Launch("gemv", gemv, self._gemv_configs, takes=int_gemv.gemv_takes),
                **{name: Launch(name, run, lambda rows, n, k: [{}], product=product)  # gemlite, where installed
                   for name, (run, product) in library.engine_launches(self.kernel_mode).items()}}

    def product(self, weights, x, out, silu_x: bool = False, **inputs) -> torch.Tensor:
        """A library launch's own output where the tuning table picks one (not copied into `out`), else `out`."""
        n, k = self.shape(weights)
        cfg = IW.fit_config(weights, self.config(x.shape[0], n, k))
        chosen = self.chosen(weights, x.shape[0], cfg)
        if chosen.product is not None:
            return chosen.product(weights, x, cfg, silu_x, **inputs)
        inputs.pop("x_div", None)  # only a library launch asks for divided rows (input_divisors)
        chosen.run(weights, x, out, cfg, silu_x, **inputs)
        return out

    def input_divisors(self, weights, rows: int) -> torch.Tensor | None:
        from core.engines.fast.kernels import library

        if not self.needs_calibration:
            return None
        return library.engine_divisors(weights, self.config(rows, weights.n, weights.k).get("kernel", ""))

    def _gemv_configs(self, rows, n, k) -> list[dict]:
        from core.engines.fast.kernels.int_gemv import GEMV_MAX_ROWS

        if rows > GEMV_MAX_ROWS:
            return []
        return [dict(BLOCK_N=bn, BLOCK_K=IW.GROUP, SPLIT_K=sk, num_warps=w, num_stages=s, DECODE=d)
                for bn, sk, w, s, d in (GEMV_ONE if rows == 1 else GEMV_ROWS) if _k_steps(k, IW.GROUP, sk) >= 2]

    def label(self) -> str:
        from core.engines.fast.kernels import library

        mine = [(b, cfg.get("kernel")) for (p, b, _, _), cfg in tuning.TUNED.items() if p == self.precision.value]
        gemv_rows = {b for b, kernel in mine if kernel == "gemv"}
        where = "" if not gemv_rows else (" or, at one row" if gemv_rows == {1} else " or, at 1-8 rows") + \
            ", float32-FMA GEMVs where the tuning table picks them"
        return (f"{self.WHAT[self.precision]} linears in Triton (weights dequantized in registers into bf16 "
                f"tensor-core dots{where}; prompt GEMMs on weights dequantized once, through cuBLAS)"
                + library.engine_label(self.kernel_mode, {kernel for _, kernel in mine}))


class Int8W8A8(_IntMethod):
    """INT8 weights and per-token INT8 activations: int8 x int8 tensor-core dots summed in int32, bit for bit
    torch._int_mm's result, scaled as the reference scales."""
    precisions = (Precision.INT8,)
    KERNEL_MODES = {Precision.INT8: IW.MODE_INT8}

    def launches(self) -> dict[str, Launch]:
        return {"tile": Launch("tile", self._quantized_tile, self._tile_configs)}

    def _quantized_tile(self, w, x, out, cfg, silu_x, xq=None, xs=None, **_):
        """The rows quantized per token (int_prompt.int8_rows, into xq/xs when given: a graph's own buffers; else
        scratch made before capture), then the tile kernel's int8 dots."""
        from core.engines.fast.kernels import int_prompt
        from core.engines.fast.kernels.scratch import scratch

        M, K = x.shape[0], w.k
        if xq is None:
            xq, xs = scratch(x.device, ("int8 rows", M, K), lambda: (
                torch.empty(M, K, dtype=torch.int8, device=x.device),
                torch.empty(M, dtype=torch.float32, device=x.device)))
        int_prompt.int8_rows(x, xq, xs, silu_x)
        return self._tile(w, xq, out, cfg, False, xs)

    def timing_inputs(self, rows, k, device="cuda"):
        x = torch.randn(rows, k, device=device, dtype=torch.bfloat16)
        return x, {"xq": torch.empty(rows, k, device=device, dtype=torch.int8),
                   "xs": torch.empty(rows, device=device, dtype=torch.float32)}

    def label(self) -> str:
        return ("INT8 W8A8 linears in Triton (activations quantized per token, int8 tensor-core dots with int32 "
                "accumulation; prompt GEMMs through torch._int_mm)")
