#!/usr/bin/env bash
# One device call for the integer linears' library kernels (core/engines/fast/kernels/library.py):
#   bash bench/fast/int_library_run.sh [tests|bench|suite|all]     (default all: tests, then bench)
# tests: their GPU tests and the project's integer-kernel GPU tests; suite: the whole GPU suite (pytest tests/gpu);
# bench: python -m bench.fast.int_library_bench (every candidate per linear shape and batch, the whole decode step per
# precision, against BF16 in the same run). gemlite comes as a wheel in .whl/ (built with
# `pip wheel --no-deps gemlite==0.6.0.post2 -w .whl`; it needs numpy, tqdm and triton >= 3.6, already there).
# Results and logs under $OUT: int_library.json (the recorded table's layout, for core/data/fp8_speed_<device>.json).
# BENCH_ARGS: more bench arguments (no spaces inside one); TABLE_DEVICE: the tuning table's section to run with.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
STEP=${1:-all}
if ls .whl/gemlite-*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv | tee "$OUT/gpu.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$OUT/gpu.txt"
case "$STEP" in
  tests|all)
    timeout ${TEST_S:-240} python3 -m pytest -q -p no:cacheprovider ${TESTS:-tests/gpu/test_int_library_gpu.py \
      tests/gpu/test_int_kernels_gpu.py} -s 2>&1 | tee "$OUT/tests.log" | grep -E "bit for bit|rel err|equal|KL|passed|failed|Error" | tail -40 ;;
esac
case "$STEP" in
  suite)
    timeout ${SUITE_S:-400} python3 -m pytest -q -p no:cacheprovider tests/gpu 2>&1 | tee "$OUT/suite.log" | tail -15 ;;
esac
case "$STEP" in
  bench|all|suite)
    [ "$STEP" = suite ] && [ -z "$BENCH_AFTER_SUITE" ] && exit 0
    timeout ${BENCH_S:-420} python3 -m bench.fast.int_library_bench --out "$OUT" ${BENCH_ARGS:-} \
      ${TABLE_DEVICE:+--table-device "$TABLE_DEVICE"} 2>&1 \
      | tee "$OUT/bench.log" | grep -v "^  skip" | tail -n ${TAIL:-150} ;;
esac
