#!/usr/bin/env bash
# Builds FlashAttention-3's Hopper forward kernel for the fast engine's prompt pass (core/engines/fast/fa3) into
# core/engines/fast/fa3/build/libtriage_fa3.so. Optional: without it the prompt pass attends through SDPA (cuDNN).
# Only for NVIDIA Hopper GPUs (H100, H200); the build itself needs no GPU.
#
#   bash scripts/build_fa3.sh                 # sources fetched with git at the pinned commits into .cache/fa3-src
#   bash scripts/build_fa3.sh --src DIR       # DIR holds flash-attention/ and cutlass/ at those commits
#   bash scripts/build_fa3.sh --pip-nvcc      # no CUDA toolkit: CUDA 13.0's nvcc from PyPI, into .cache/cuda-nvcc
#
# Needs git (unless --src), g++, and nvcc 12.3 or later (or --pip-nvcc). About 1.5 minutes on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."

FA3_COMMIT=0251105a2fb19d2957484b7f023cd8c115286ced      # Dao-AILab/flash-attention, 2026-08-15
CUTLASS_COMMIT=7127592069c2fe01b041e174ba4345ef9b279671  # NVIDIA/cutlass, flash-attention's csrc/cutlass there
SRC=.cache/fa3-src
PIP_NVCC=0
while [ $# -gt 0 ]; do
    case "$1" in
        --src) SRC="$2"; shift 2 ;;
        --pip-nvcc) PIP_NVCC=1; shift ;;
        *) echo "unknown option $1 (see the top of $0)" >&2; exit 2 ;;
    esac
done

fetch() {  # fetch REPO COMMIT DIR: one commit, no history
    [ -d "$3/.git" ] && [ "$(git -C "$3" rev-parse HEAD)" = "$2" ] && return
    rm -rf "$3" && mkdir -p "$3"
    git -C "$3" init -q
    git -C "$3" fetch -q --depth 1 "https://github.com/$1" "$2" || {
        echo "could not fetch $1 at $2; without network, give the sources with --src DIR (see the top of $0)" >&2
        exit 1
    }
    git -C "$3" checkout -q FETCH_HEAD
}
if [ ! -d "$SRC/flash-attention/hopper" ] || [ ! -d "$SRC/cutlass/include" ]; then
    fetch Dao-AILab/flash-attention "$FA3_COMMIT" "$SRC/flash-attention"
    fetch NVIDIA/cutlass "$CUTLASS_COMMIT" "$SRC/cutlass"
fi

if [ "$PIP_NVCC" = 1 ]; then
    CUDA=.cache/cuda-nvcc
    if [ ! -x "$CUDA/nvidia/cu13/bin/nvcc" ]; then
        PY=python3
        [ -x .venv/bin/python ] && PY=.venv/bin/python  # the console's own environment has pip
        "$PY" -m pip install -q --target "$CUDA" "nvidia-cuda-nvcc==13.0.*" "nvidia-cuda-runtime==13.0.*" \
            "nvidia-cuda-cccl==13.0.*" "nvidia-cuda-crt==13.0.*" "nvidia-nvvm==13.0.*"
    fi
    export PATH="$PWD/$CUDA/nvidia/cu13/bin:$PATH"
    EXTRA_INC="-I$PWD/$CUDA/nvidia/cu13/include"
    EXTRA_LIB="-L$PWD/$CUDA/nvidia/cu13/lib"
else
    command -v nvcc >/dev/null || { echo "nvcc not found: install the CUDA toolkit, or use --pip-nvcc" >&2; exit 1; }
    EXTRA_INC="" EXTRA_LIB=""
fi

OUT=core/engines/fast/fa3/build
mkdir -p "$OUT"
HOPPER="$SRC/flash-attention/hopper"
# FA3's own flags (hopper/setup.py) and torch's --expt-relaxed-constexpr; sm_90a for wgmma and TMA
FLAGS=(-O3 -std=c++17 --use_fast_math --expt-relaxed-constexpr --expt-extended-lambda
       -DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED -DCUTLASS_ENABLE_GDC_FOR_SM90 -DCUTLASS_DEBUG_TRACE_LEVEL=0 -DNDEBUG
       -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC -I"$HOPPER" -I"$SRC/cutlass/include" $EXTRA_INC)
nvcc "${FLAGS[@]}" -c core/engines/fast/fa3/fa3_shim.cu -o "$OUT/fa3_shim.o" &
shim=$!
nvcc "${FLAGS[@]}" -c "$HOPPER/flash_prepare_scheduler.cu" -o "$OUT/prepare_scheduler.o" &
scheduler=$!
wait $shim || { kill $scheduler 2>/dev/null; exit 1; }
wait $scheduler
nvcc -shared -gencode arch=compute_90a,code=sm_90a "$OUT/fa3_shim.o" "$OUT/prepare_scheduler.o" $EXTRA_LIB \
    -o "$OUT/libtriage_fa3.so"
rm -f "$OUT"/*.o
echo "built $OUT/libtriage_fa3.so (FlashAttention-3 at $FA3_COMMIT, CUTLASS at $CUTLASS_COMMIT)"
