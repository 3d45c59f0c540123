"""The registry of local servers the console launched, with real process groups (a `sleep` stands in for the server's
group: what is tested is the bookkeeping and the signals, not vLLM), and the refusals before anything starts."""
from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from core.deployment import servers
from core.engines.vllm_engine import group_members


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_CACHE_DIR", str(tmp_path))
    return tmp_path


def dead_pid() -> int:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def entry(proc: subprocess.Popen, port: int, owner: int) -> servers.LocalServer:
    return servers.LocalServer(port=port, pgid=proc.pid, model="embedded", flags=["--max-num-seqs", "2"],
                               log_path="/dev/null", started_at=time.time(), owner_pid=owner)


def test_an_orphan_is_listed_and_stopped_with_its_whole_group(cache):
    # a group of two processes whose console is gone
    proc = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    servers._register(entry(proc, 18001, dead_pid()))
    time.sleep(0.2)
    (found,) = servers.list_servers()
    assert found.port == 18001 and found.orphaned and not found.owned_here and found.alive
    assert found.flag_value("--max-num-seqs") == "2" and found.base_url == "http://127.0.0.1:18001"
    assert servers.find_server("http://localhost:18001/") == found
    assert len(group_members(proc.pid)) >= 2  # the shell and its sleeps
    assert servers.stop_server(18001, grace_s=5) is True
    proc.wait(timeout=5)
    assert not group_members(proc.pid) and servers.list_servers() == []
    assert servers.stop_server(18001) is False


def test_entries_of_servers_that_are_gone_are_dropped_and_a_damaged_registry_is_not_fatal(cache):
    proc = subprocess.Popen(["true"], start_new_session=True)
    proc.wait()
    servers._register(entry(proc, 18002, os.getpid()))
    assert servers.list_servers() == []
    servers.registry_path().write_text("{not json")
    assert servers.list_servers() == []


def test_refusals_come_before_any_start(cache):
    with pytest.raises(servers.ServerError, match="not a local directory"):
        servers.start_server("meta-llama/Llama-3-8B", [])
    with pytest.raises(servers.ServerError, match="vLLM would refuse these flags: --max-num-seq-typo"):
        servers.start_server(None, ["--max-num-seq-typo", "3"], check_flags=lambda f: [f"{f[0]} is not a flag."])
    from diagnostics.cli.serve import flag_errors

    errors = flag_errors(["--max-num-seqs", "8", "--fp8-kv-cache"])
    assert len(errors) == 1 and "--fp8-kv-cache" in errors[0], errors
    assert flag_errors(["--max-num-seqs", "8", "--max-num-batched-tokens", "2048"]) == []


def test_another_consoles_server_is_named_as_such_and_its_stop_asks_first():
    """A server another console started (its pid and start time said) is not stopped by one click: that console may
    be using it. A real process group stands in for it; it must still run after the first click."""
    from streamlit.testing.v1 import AppTest

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        def script(pgid: int, owner: int):
            import time

            from core.deployment.servers import LocalServer
            from views.common.local_servers import _listing

            _listing([LocalServer(port=1, pgid=pgid, model="embedded", flags=["--max-num-seqs", "2"],
                                  log_path="server.log", started_at=time.time(), owner_pid=owner)])

        at = AppTest.from_function(script, args=(proc.pid, os.getppid()), default_timeout=60).run()
        assert not at.exception, at.exception
        assert any(f"started by another console (pid {os.getppid()}) at" in m.value.replace("\\", "")
                   for m in at.markdown)
        at.button(key="loc_stop_1").click().run()
        assert any("Stop it anyway?" in w.value for w in at.warning)
        assert proc.poll() is None  # still running: nothing is stopped before the confirmation
        at.button(key="loc_keep_1").click().run()
        assert not at.warning and proc.poll() is None
    finally:
        proc.kill()
