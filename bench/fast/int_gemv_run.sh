#!/usr/bin/env bash
# The few-row integer GEMV on the GPU machine: its GPU kernel tests (every DECODE variant, 1 and 8 rows, bit for bit),
# then its candidates tuned against the shipped winners at batch 1 and 8 and the decode speed beside BF16.
# `bash bench/fast/int_gemv_run.sh [tests|bench|all]` (default all; one call each where a call's time is short).
# Results and logs under $OUT (tuned_linears.json: this GPU's section of the table with the winners, to merge into core/engines/fast/tuned_linears.json).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
STEP=${1:-all}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
if [ "$STEP" != bench ]; then
  timeout ${TEST_S:-240} python3 -m pytest -q tests/gpu/test_int_kernels_gpu.py -k "gemv or kernels_match" 2>&1 \
    | tee -a "$OUT/tests.log" | tail -15
fi
if [ "$STEP" != tests ]; then
  timeout ${BENCH_S:-540} python3 -m bench.fast.fp8_speed --precisions ${PRECISIONS:-bf16,int4,int4-awq,int8-wo} \
    --batches 1,8 --prompts 512 --kv auto --tuned core/engines/fast/tuned_linears.json --int-gemv \
    --out "$OUT" --json "$OUT/speed.json" 2>&1 \
    | tee "$OUT/bench.log" | grep -v "^  skip" | tail -60
fi
