#!/usr/bin/env bash
# On a GPU host without the console's environment: load GPU 0 with a copy loop, leave the others idle, run the
# checklist for 20 s and the Live monitor page under AppTest, and print what they found per GPU. Writes the
# checklist's JSON to $OUT (default: a temp folder). Streamlit, if missing there, is installed from wheels in .whl/
# (pip download streamlit==1.67.0 and what it needs that the host lacks).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-$(mktemp -d)}
export OUT NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if ! python3 -c "import streamlit" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/triage-site/site-packages \
    .whl/*.whl || exit 3
  export PYTHONPATH=/tmp/triage-site/site-packages:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv
python3 - <<'PY' &
import time, torch
a = torch.empty(2**30, dtype=torch.uint8, device="cuda:0"); b = torch.empty_like(a)
t = time.time()
while time.time() - t < 45:
    b.copy_(a)
torch.cuda.synchronize()
PY
LOAD=$!
sleep 8
python3 -m diagnostics run --duration 20 --json > "$OUT/run.json" 2> "$OUT/run.err"; echo "checklist rc=$?"
python3 - <<'PY'
import json, os
for f in json.load(open(os.environ["OUT"] + "/run.json"))["findings"]:
    if f["id"].startswith("gpu."):
        print(f["id"], f["status"], "|", f["verdict"][:400])
        print("   ", f["evidence"])
PY
python3 - <<'PY'
import re
from streamlit.testing.v1 import AppTest
at = AppTest.from_file("views/monitor.py", default_timeout=60).run()
print("exceptions:", [e.value for e in at.exception])
print("headings:", [h.value for h in at.subheader])
table = [m.value for m in at.markdown if "data-gpu-table" in m.value]
for row in re.findall(r"<tr>(.*?)</tr>", table[0]) if table else []:
    print("  ", " | ".join(t.strip() for t in re.split(r"<[^>]+>", row) if t.strip()))
gauges = [m.value for m in at.markdown if "data-gauge" in m.value]
print("gauges:", re.findall(r'aria-label="([^"]+)"', gauges[0]) if gauges else None)
print("pace:", [c.value for c in at.caption if c.value.startswith("Refreshing")])
PY
wait $LOAD
