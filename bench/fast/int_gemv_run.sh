#!/usr/bin/env bash
# One device call for the one-row integer GEMV: its GPU kernel tests (every DECODE variant bit for bit), then
# the GEMV's candidates tuned against the shipped batch-1 winners and the decode speed at batch 1 and 8 beside BF16.
# Results and logs under $OUT (tuned_int.json: the table with the winners).
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
timeout ${TEST_S:-200} python3 -m pytest -q tests/gpu/test_int_kernels_gpu.py -k "gemv or kernels_match" 2>&1 \
  | tee -a "$OUT/tests.log" | tail -15
timeout ${BENCH_S:-330} python3 -m bench.fast.fp8_speed --precisions ${PRECISIONS:-bf16,int4,int4-awq,int8-wo} \
  --batches 1,8 --prompts 512 --kv auto --tuned core/engines/fast/tuned_h200.json \
  --int-tuned core/engines/fast/tuned_int_h200.json --int-gemv --out "$OUT" --json "$OUT/speed.json" 2>&1 \
  | tee "$OUT/bench.log" | grep -v "^  skip" | tail -60
