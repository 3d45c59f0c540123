#!/usr/bin/env bash
# On a GPU host: start `python -m diagnostics exporter`, load GPU 0 with a device-to-device copy loop if torch is
# there, and scrape /metrics twice (idle, then under the copy), printing the bandwidth lines. Needs only python3 with
# prometheus_client and nvidia-ml-py (psutil for host memory); no Streamlit, no torch for the exporter itself.
# Expect triage_gpu_dram_bw_util_percent near 3 idle and ~89 on an H200 under the copy (docs: DOMAIN section 6).
# Writes both scrapes and the exporter's log to $OUT (default: a temp folder).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
PORT=${PORT:-9401}
PY=${PYTHON:-python3}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || echo "(no nvidia-smi)"
"$PY" -m diagnostics exporter --port "$PORT" > "$OUT/exporter.log" 2>&1 &
EXPORTER=$!
trap 'kill $EXPORTER 2>/dev/null; [ -n "${LOAD:-}" ] && kill $LOAD 2>/dev/null' EXIT
for _ in $(seq 1 30); do
  curl -sf "http://127.0.0.1:$PORT/metrics" > /dev/null && break
  sleep 0.5
done
cat "$OUT/exporter.log"
sleep 2
curl -sf "http://127.0.0.1:$PORT/metrics" > /dev/null  # the first scrape opens the GPM window the next one reads
sleep 2
curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/idle.txt" || { echo "exporter did not answer"; exit 2; }
echo "== idle"
grep -E '^triage_gpu_(dram_bw_util|sm_util|util|memory_busy)_percent' "$OUT/idle.txt"
if "$PY" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
  "$PY" - <<'PY' &
import time, torch
a = torch.empty(2**30, dtype=torch.uint8, device="cuda:0"); b = torch.empty_like(a)
t = time.time()
while time.time() - t < 20:
    b.copy_(a)
torch.cuda.synchronize()
PY
  LOAD=$!
  sleep 6
  curl -sf "http://127.0.0.1:$PORT/metrics" > /dev/null  # restart the GPM window inside the copy
  sleep 3
  curl -sf "http://127.0.0.1:$PORT/metrics" > "$OUT/copy.txt"
  echo "== under a device-to-device copy on GPU 0"
  grep -E '^triage_gpu_(dram_bw_util|sm_util|util|memory_busy)_percent' "$OUT/copy.txt"
  wait $LOAD
else
  echo "== no torch with CUDA here: no copy load; idle numbers only"
fi
grep -E '^triage_(gpu_memory_used_bytes|gpu_power_watts|gpu_sm_clock_hertz|gpu_clock_event_reasons|host_memory_available_bytes)' "$OUT/idle.txt"
echo "files in $OUT"
