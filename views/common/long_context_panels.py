"""Two panels of the Long context page (views/long_context.py) that stand on their own: the KV cache calculator,
which sizes vLLM's cache for any config on any memory, and the H200 measurements of FP8 against BF16 at long
context, shown beside this machine's own runs."""
from __future__ import annotations

import streamlit as st

from core import speedup
from core.fmt import GIB
from core.long_context import kvcache as kv
from views.common import inputs
from views.common.runs import metrics


def kv_calculator(own_config, own: str, run_tokens: int, device) -> None:
    """vLLM's KV cache arithmetic: `own` names the model whose config is `own_config` (beside the built-in ones),
    `run_tokens` is what a run here holds in its cache, and `device` (the one present, not an assumed GPU) gives the
    memory's default size."""
    with st.expander("KV cache calculator (vLLM arithmetic)", expanded=True):
        k = [*st.columns(3), *st.columns(3)]  # two rows: six in one cut the choices short
        src = k[0].selectbox("Config", [own, *kv.BUILTIN_CONFIGS])
        config = own_config if src == own else kv.BUILTIN_CONFIGS[src]
        dtype = k[1].selectbox("KV dtype", list(kv.DTYPE_BYTES))
        block = inputs.number("Block size", 1, 256, kv.DEFAULT_BLOCK_SIZE, where=k[2], help="vLLM --block-size")
        tokens = inputs.number("Tokens", 1, 10**7, run_tokens, where=k[3], key=f"lc_kv_{run_tokens}")
        cap_bytes, cap_what = kv.default_capacity(device)
        gpu = inputs.number(f"Memory (GiB): {cap_what}", 0.1, 4096.0, round(cap_bytes / GIB, 1) or 80.0, where=k[4],
                            help=f"Default: this machine's {cap_what}. Set another size to size a different device.")
        est = round((kv.estimate_weight_bytes(config) or 0) / GIB, 2)
        weights = inputs.number("Weights (GiB)", 0.0, 2048.0, est, where=k[5], key=f"lc_w_{src}",
                                help="Default: estimated from the config at 2 bytes per parameter")
        try:
            if not inputs.refused(block, tokens, gpu, weights):
                r = kv.report(kv.shape_from_config(config), dtype, int(tokens.value), int(block.value),
                              gpu.value * GIB, weights.value * GIB, gpu_memory_utilization=0.9,  # vLLM's default
                              memory_kind=cap_what)
                metrics(kv.headline(r))
                st.caption(kv.formula(r))
        except kv.KVConfigError as exc:
            st.error(str(exc))


def h200_measurements(kv_dtype: str, device_name: str) -> None:
    """FP8 against BF16 decode at long context and time to first token, as measured on an H200, each in an expander
    that says so; `device_name` is where this page's own runs are measured."""
    if (ctx := speedup.by_context(kv_dtype)) is not None:
        short, long, rows, notes = ctx
        with st.expander(f"FP8 vs BF16 decode at {short:,} and {long:,} tokens of context: H200 measurements, "
                         "not this machine's", expanded=False):
            st.dataframe(rows, hide_index=True)
            st.caption(" ".join([speedup.source_line(context=True), *(n[0].upper() + n[1:] + "." for n in notes),
                                 "At long context the KV cache is read every step, so FP8 weights save a smaller "
                                 f"share of the bytes. This page's own runs are measured on {device_name}."]))
    if ttft := speedup.prefill_rows():
        with st.expander(f"Time to first token at {ttft[0]['prompt tokens']} to {ttft[-1]['prompt tokens']} tokens, "
                         "FP8 vs BF16: H200 measurements, not this machine's"):
            st.dataframe(ttft, hide_index=True)
            st.caption(speedup.prefill_source_line() + " The prompt pass is compute-bound: FP8 W8A8 halves the "
                       "linears' time, but causal attention (BF16 in both) grows with the square of the prompt, so "
                       "the gain shrinks on long prompts. FlashAttention-3 is built by scripts/build_fa3.sh (Hopper "
                       "only).")
