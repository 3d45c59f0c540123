#!/usr/bin/env bash
# One device call: the integer kernels' GPU tests, then the decode-speed bench with every precision (integer rows
# beside BF16/FP8), the 8K prompt pass per precision. Results and logs under $OUT.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
timeout ${TEST_S:-200} python3 -m pytest -q -x tests/gpu/test_int_kernels_gpu.py ${EXTRA_TESTS:-} -s 2>&1 | tee "$OUT/tests.log" | tail -40
timeout ${BENCH_S:-360} python3 -m bench.fast.fp8_speed --precisions ${PRECISIONS:-bf16,fp8,fp8-wo,int4,int4-awq,int8-wo,int8} \
  --batches 1,8,64 --prompts ${PROMPTS:-512,32768} --kv auto --tuned core/engines/fast/tuned_linears.json \
  --prefill ${PREFILL:-8192} --out "$OUT" --json "$OUT/speed.json" 2>&1 | tee "$OUT/bench.log" | grep -v "^  skip" | tail -80
