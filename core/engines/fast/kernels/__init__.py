"""Triton kernels for one decode step of a Llama-family model on CUDA, one module per family: launch.py (PDL and
the launch options), scratch.py (the linears' split-K scratch), rounding.py (the roundings and activation loads every
linear family shares), norm.py, linears.py (BF16 and FP8), the integer linears int_tile.py, int_gemv.py and
int_prompt.py (over the storage of core/engines/fast/int_weight.py), rope.py, attention.py (with attn_e4m3.py and attn_e4m3.cu).
This package names what the rest of the fast engine calls; the linears are launched through their precision's
method (core/engines/fast/methods/), which owns their tuning.

Each kernel reproduces, rounding for rounding where it matters, what the eager reference does (HF LlamaRMSNorm, the
FP8Linear of core/engines/torch/fp8.py, quantize_rows for FP8 KV), so the fast path computes the same function as the eager path
at the same precision. What is fused, and why:

- `add_rmsnorm`: residual add + RMSNorm (+ for W8A8 the per-token E4M3 quantization of its output): one pass.
- `linear`: a skinny GEMM in "swap AB" form (W tile is the wide operand of tl.dot, the few activation rows the
  narrow one), so weights stream from HBM once with the loads software-pipelined; bf16, FP8 weight-only (E4M3
  and the bf16 activations converted to f16 in registers, f16 dot) and FP8 W8A8 (E4M3 activations from the
  producing kernel, fp8 x fp8 dot).
  An optional SiLU(gate) * up prologue lets the down projection read the gate/up output directly (used at batch 1;
  with several rows the computed dot operand stalled the tensor-core pipeline, ~3x slower on the H200).
  With SPLIT_K (several rows, narrow outputs) K is cut into slices whose float32 sums the tile's last program adds
  in slice order.
- `gemv`: the same for one activation row without tensor cores (plain FMA reduction), kept if it measures faster.
- `gemv_prologue`: one row with the whole of K in one tile and the kernel before it folded in (add + RMSNorm, W8A8's
  activation quantization): the batch-1 step's q|k|v, o, gate|up and lm_head; for gate|up optionally silu_mul
  folded in behind too (gate and up rows taken in pairs, SiLU(gate) * up written).
- `rope_store`: RoPE on q and k, and the K/V write into the static cache (quantized per token and head for FP8 KV);
  `rope_store_prompt` runs the same kernel over a prompt's tokens in the prompt pass.
- `decode_attention`: split-KV ("flash-decoding") attention that reads only the valid length of the static cache,
  bf16 or E4M3 K/V with their scales, then a combine kernel over the splits; launched per K/V dtype
  (`AttnWorkspace.CONFIG`). Over an E4M3 cache the split runs as attn_e4m3.py's CUDA C++ kernel where it can.

Importing this package needs triton; core/engines/fast/model.py imports it only on CUDA.
"""
from __future__ import annotations

from core.engines.fast.kernels.attention import AttnWorkspace, decode_attention
from core.engines.fast.kernels.launch import HAVE_GDC, launch_options, pdl_available, pdl_scope
from core.engines.fast.kernels.linears import (
    E4M3_MAX,
    MODE_BF16,
    MODE_W8A8,
    MODE_WO,
    MODES,
    PROLOGUE_CFG,
    PROLOGUE_DEFAULT,
    PROLOGUE_MAX_K,
    block_m_for,
    default_config,
    gemv_prologue,
    linear,
    linear_torch,
    linear_triton,
)
from core.engines.fast.kernels.norm import add_rmsnorm, row_quant, silu_mul
from core.engines.fast.kernels.rope import rope_store, rope_store_prompt
from core.engines.fast.kernels.scratch import split_scratch_scope

__all__ = [
    "AttnWorkspace", "decode_attention", "HAVE_GDC", "launch_options", "pdl_available", "pdl_scope", "E4M3_MAX",
    "MODE_BF16", "MODE_W8A8", "MODE_WO", "MODES", "PROLOGUE_CFG", "PROLOGUE_DEFAULT", "PROLOGUE_MAX_K",
    "block_m_for", "default_config", "gemv_prologue", "linear", "linear_torch", "linear_triton", "split_scratch_scope", "add_rmsnorm", "row_quant", "silu_mul", "rope_store",
    "rope_store_prompt",
]
