"""Killing mid-run loses no earlier saved run.

A writer process saves a finished run, begins a long one and checkpoints it; the app is started on the same
history database and set to work (its first visit loads the embedded model). Both are killed with SIGKILL mid-run.
Reopened, the database is intact: the finished run is unchanged, the killed one is listed as interrupted with its
checkpoint, and an app restarted on the same file serves again (and lists both on the History page when that page is
registered)."""
import os
import signal
import sqlite3
import subprocess
import sys

import pytest

from tests.e2e.helpers import ARTIFACTS, ROOT, AppServer, goto, new_page, page_registered, screenshot

pytestmark = pytest.mark.e2e

WRITER = """
import sys, time
sys.path.insert(0, {root!r})
from core.store import Store
s = Store({db!r})
done = s.save_run("checklist", "finished before the crash", {{"findings": ["gpu.idle: PASS"] * 50}}, {{"pass": 50}})
rid = s.begin_run("bench", "long run killed mid-way", {{"lengths": [256, 512, 1024], "done": []}})
s.update_run(rid, payload={{"lengths": [256, 512, 1024], "done": [256]}}, summary={{"ttft_s_256": 0.05}})
print(done, rid, flush=True)
while True:  # a long run: keeps checkpointing until it is killed
    s.update_run(rid, summary={{"ttft_s_256": 0.05, "heartbeat": time.time()}})
    time.sleep(0.05)
"""


def test_sigkill_mid_run_keeps_saved_runs_and_marks_the_killed_one_interrupted(tmp_path, browser, dialogs):
    db = tmp_path / "history.sqlite"
    writer = subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), db=str(db))],
                              stdout=subprocess.PIPE, text=True)
    server = AppServer(os.environ.get("TRIAGE_E2E_APP", "app.py"), db, ARTIFACTS / "e2e-crash-server.log")
    ctx = None
    try:
        done_id, killed_id = map(int, writer.stdout.readline().split())
        server.start()
        ctx, page = new_page(browser, dialogs)
        page.goto(server.url + "/", wait_until="domcontentloaded", timeout=120_000)
        page.get_by_text("Loading").first.wait_for(timeout=120_000)  # the app is busy loading the model
    finally:
        writer.send_signal(signal.SIGKILL)  # both die mid-run, without any chance to clean up
        if server.proc is not None:
            os.killpg(server.proc.pid, signal.SIGKILL)
            server.proc.wait(30)
        writer.wait(30)
        if ctx is not None:
            ctx.close()

    with sqlite3.connect(db) as raw:
        assert raw.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    from core.store import Store

    s = Store(db)
    done = s.get_run(done_id)
    assert done.status == "finished" and done.summary == {"pass": 50}
    assert done.payload == {"findings": ["gpu.idle: PASS"] * 50}
    killed = s.get_run(killed_id)
    assert killed.status == "interrupted", killed
    assert killed.payload["done"] == [256] and killed.summary["ttft_s_256"] == 0.05  # its checkpoint survived
    assert [r.id for r in s.list_runs(status="interrupted")] == [killed_id]
    s.close()

    restarted = AppServer(server.app, db, ARTIFACTS / "e2e-crash-restart.log").start()
    try:
        assert restarted.healthy()
        if page_registered("views/history.py"):
            ctx, page = new_page(browser, dialogs)
            goto(page, restarted, "history")
            cells = page.locator('[data-testid="stDataFrame"] [role="gridcell"]')
            cells.first.wait_for(state="attached")
            texts = cells.all_text_contents()
            assert "finished before the crash" in texts and "long run killed mid-way" in texts, texts
            assert "interrupted" in texts and "finished" in texts
            screenshot(page, "flow-history-after-crash")
            ctx.close()
    finally:
        restarted.stop()
