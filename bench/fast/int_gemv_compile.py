"""Compile the few-row integer GEMV (_int_gemv_kernel) for sm_90 on a machine without a GPU (Triton's bundled ptxas
and nvdisasm): every mode x DECODE x SILU_X x EVEN variant must build, and for each the main loop's SASS is counted:
instructions a weight (every thread issues them; at batch 1 the H200 has about 33e12 a second for ~7e9 weights of
Llama-3-8B), registers and spills. The offline half of the GEMV's A/B; the GPU times it (int_gemv_run.sh).
Run: python -m bench.fast.int_gemv_compile [--block-n 64 --split 4 --warps 4 --rows 1]"""
import argparse
import collections
import re
import subprocess
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from core.engines.fast import int_weight as IW
from core.engines.fast.kernels import int_gemv

K = 4096  # Llama-3-8B's hidden size
TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"


def compile_variant(mode: int, decode: int, silu: bool, even: bool, block_n=64, split=4, warps=4, rows=1):
    fn = int_gemv._int_gemv_kernel
    sig = {a: "constexpr" for a in fn.arg_names}
    sig.update(x_ptr="*bf16", w_ptr="*i32", ws_ptr="*fp32" if mode == IW.MODE_INT8_WO else "*fp16", wz_ptr="*u8",
               isc_ptr="*fp32", irc_ptr="*fp32", seg_ptr="*i32", out_ptr="*bf16", part_ptr="*fp32",
               count_ptr="*i32", M="i32", N="i32", stride_xm="i32", stride_wn="i32", stride_sn="i32",
               stride_isc="i32", stride_om="i32")
    bk = IW.GROUP  # the GEMV reads one INT4 group, or 128 INT8 codes, a step
    const = dict(K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=mode, SILU_X=silu, BLOCK_N=block_n,
                 BLOCK_M=rows, BLOCK_K=bk, SPLIT_K=split, EVEN=even, DECODE=decode, PDL=False)
    # what a launch on the GPU specializes: 16-byte aligned pointers and strides (N is not specialized)
    aligned = {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
               for a, ty in sig.items()
               if ty.startswith("*") or a in ("stride_xm", "stride_wn", "stride_sn", "stride_isc", "stride_om")}
    return triton.compile(ASTSource(fn, sig, const, aligned), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=3))


def loop_profile(kernel, weights_per_thread: int) -> str:
    """The K loop's SASS (the body of its backward branch): instructions a weight, the most frequent, registers."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(kernel.asm["cubin"])
        f.flush()
        sass = subprocess.run([TOOLS / "nvdisasm", "-c", f.name], capture_output=True, text=True,
                              check=True).stdout.splitlines()
        res = subprocess.run([TOOLS / "cuobjdump", "-res-usage", f.name], capture_output=True, text=True).stdout
    labels = {line.strip()[:-1]: i for i, line in enumerate(sass) if re.match(r"^\.L_x_\d+:$", line.strip())}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(sass)
             if (m := re.search(r"BRA `\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i - 1]
    usage = re.search(r"REG:(\d+).*?STACK:(\d+)", res)
    regs = f"{usage.group(1)} registers, {usage.group(2)} B stack" if usage else "registers unknown"
    if not loops:
        return f"no K loop found; {regs}"
    first, last = max(loops, key=lambda b: b[1] - b[0])
    ops = collections.Counter(m.group(1).split(".")[0] for line in sass[first:last + 1]
                              if (m := re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*(?:\.[A-Z0-9_]+)*)", line)))
    n = sum(ops.values())
    top = ", ".join(f"{o} {c}" for o, c in ops.most_common(6))
    return f"{n / weights_per_thread:.2f} instructions a weight ({top}); {regs}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--block-n", type=int, default=64)
    ap.add_argument("--split", type=int, default=4)
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--rows", type=int, default=1, help="activation rows (BLOCK_M: 1, 2, 4 or 8)")
    args = ap.parse_args()
    per_thread = args.block_n * IW.GROUP // (32 * args.warps)  # weights a thread dequantizes each step
    for name, mode in (("int4", IW.MODE_INT4), ("int4-awq", IW.MODE_INT4_AWQ), ("int8-wo", IW.MODE_INT8_WO)):
        for decode in (0, 1, 2) if mode != IW.MODE_INT8_WO else (0, 2):
            for silu, even in ((False, True), (True, True), (False, False)):
                k = compile_variant(mode, decode, silu, even, args.block_n, args.split, args.warps, args.rows)
                print(f"{name:8s} DECODE {decode} silu_x {silu!s:5s} even {even!s:5s}: {loop_profile(k, per_thread)}")


if __name__ == "__main__":
    main()
