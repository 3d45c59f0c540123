"""Compile the one-row integer GEMV (_int_gemv_kernel) for sm_90 on a machine without a GPU (Triton's bundled ptxas):
every mode x DECODE x SILU_X x EVEN variant must build to a cubin; prints each one's PTX instruction counts, the
offline half of the DECODE A/B that the GPU times. Run: python -m bench.fast.int_gemv_compile"""
import collections
import re

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler.compiler import ASTSource

from core.engines.fast.kernels import intlinears as IL

K = 4096  # Llama-3-8B's hidden size


def compile_variant(mode: int, decode: int, silu: bool, even: bool, block_n=64, split=4, warps=4):
    fn = IL._int_gemv_kernel
    sig = {a: "constexpr" for a in fn.arg_names}
    sig.update(x_ptr="*bf16", w_ptr="*i32", ws_ptr="*fp32" if mode == IL.MODE_INT8_WO else "*fp16", wz_ptr="*u8",
               isc_ptr="*fp32", irc_ptr="*fp32", seg_ptr="*i32", out_ptr="*bf16", part_ptr="*fp32",
               count_ptr="*i32", N="i32", stride_wn="i32", stride_sn="i32", stride_isc="i32")
    bk = IL.GROUP if mode in (IL.MODE_INT4, IL.MODE_INT4_AWQ) else 256
    const = dict(K=K, K_PER=triton.cdiv(triton.cdiv(K, bk), split) * bk, MODE=mode, SILU_X=silu, BLOCK_N=block_n,
                 BLOCK_K=bk, SPLIT_K=split, EVEN=even, DECODE=decode, PDL=False)
    # what a launch on the GPU specializes: 16-byte aligned pointers and strides (N is not specialized)
    aligned = {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
               for a, ty in sig.items() if ty.startswith("*") or a in ("stride_wn", "stride_sn", "stride_isc")}
    return triton.compile(ASTSource(fn, sig, const, aligned), target=GPUTarget("cuda", 90, 32),
                          options=dict(num_warps=warps, num_stages=3))


def main() -> None:
    for name, mode in (("int4", IL.MODE_INT4), ("int4-awq", IL.MODE_INT4_AWQ), ("int8-wo", IL.MODE_INT8_WO)):
        for decode in (0, 1, 2) if mode != IL.MODE_INT8_WO else (0, 2):
            for silu, even in ((False, True), (True, True), (False, False)):
                k = compile_variant(mode, decode, silu, even)
                ops = collections.Counter(m.group(1).split(".")[0]
                                          for m in re.finditer(r"^\s+([a-z][\w.]*)", k.asm["ptx"], re.M))
                print(f"{name:8s} DECODE {decode} silu_x {silu!s:5s} even {even!s:5s}: cubin {len(k.asm['cubin'])} B,"
                      f" {sum(ops.values())} PTX ops (cvt {ops['cvt']}, fma {ops['fma']}, ld {ops['ld']})")


if __name__ == "__main__":
    main()
