"""The quality watch's command line as the golden-set tests run it, and the prompts they record: shared by
tests/vllm/test_golden.py and tests/vllm/test_watch_rolled_replica.py (test modules never import each other)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from core.compare.prompts import default_prompts
from tests.vllm.servers import REPO

# Eight short prompts of the built-in set (48, one of them a long document): a round of them proves every property
# here at a sixth of the built-in set's cost (7,078 tokens a replica a round), in the suite's time.
PROMPTS = [p for p in default_prompts() if len(p.text) < 400][:8]


def cli(*args: str) -> subprocess.CompletedProcess:
    """`python -m diagnostics golden ARGS --no-history`; its output stays in the test log."""
    # --timeout 600: the servers share one core with whatever else runs on this machine
    res = subprocess.run([sys.executable, "-m", "diagnostics", "golden", *args, "--no-history", "--timeout", "600"],
                         cwd=REPO, capture_output=True, text=True, timeout=1800)
    print(res.stdout, res.stderr)  # the lines a user sees, kept in the test log
    return res


def record(url: str, directory: Path, prompts: list = PROMPTS) -> Path:
    """A golden set of `prompts` recorded from the server at `url` by `golden record`, as a user records one."""
    out = directory / "golden.json"
    file = directory / "prompts.jsonl"
    file.write_text("".join(json.dumps({"name": p.name, "prompt": p.text}) + "\n" for p in prompts))
    res = cli("record", "--url", url, "--prompts", str(file), "--out", str(out))
    assert res.returncode == 0, res.stderr
    return out
