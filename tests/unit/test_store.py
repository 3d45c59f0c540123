"""core/store.py on real SQLite files: round trips, schema and migrations, bad files, threads, processes, crashes."""
from __future__ import annotations

import enum
import json
import math
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from core import store
from core.store import Store, StoreError

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def db(tmp_path) -> Store:
    s = Store(tmp_path / "h.sqlite")
    yield s
    s.close()


def test_save_get_list_delete_round_trip(db):
    a = db.save_run("generate", "The capital\nof France", {"prompt": "x", "ids": [1, 2]}, {"ttft_s": 0.1})
    b = db.save_run("compare", "fp32 vs fp8", {"k": "v"}, None)
    assert a != b
    run = db.get_run(a)
    assert run.kind == "generate" and run.status == "finished" and run.title == "The capital of France"
    assert run.payload == {"prompt": "x", "ids": [1, 2]} and run.summary == {"ttft_s": 0.1}
    assert run.duration_s is None and run.created_iso[:4].isdigit()  # saved without a start time
    assert [r.id for r in db.list_runs()] == [b, a]  # newest first
    assert [r.id for r in db.list_runs("compare")] == [b]
    assert db.list_runs()[0].payload is None  # lists stay light
    assert db.delete_run(a) is True and db.delete_run(a) is False
    assert db.get_run(a) is None and db.count() == 1


def test_a_start_time_gives_a_duration_and_orders_the_list(db):
    later = db.save_run("bench", "quick", {})
    timed = db.get_run(db.save_run("bench", "timed", {}, started_at=time.time() - 2.5))
    assert 2.4 < timed.duration_s < 60
    assert [r.id for r in db.list_runs()] == [later, timed.id]  # ordered by start


def test_wal_schema_version_and_file_layout(db):
    with sqlite3.connect(db.path) as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("SELECT MAX(version) FROM schema_version").fetchone()[0] == store.SCHEMA_VERSION
    assert db.schema_version() == store.SCHEMA_VERSION


def test_reopening_does_not_migrate_twice(tmp_path):
    p = tmp_path / "h.sqlite"
    Store(p).save_run("bench", "one", {})
    s = Store(p)
    with sqlite3.connect(p) as raw:
        assert raw.execute("SELECT COUNT(*) FROM schema_version").fetchone()[0] == len(store.MIGRATIONS)
    assert s.count() == 1


def test_empty_legacy_file_is_migrated(tmp_path):
    p = tmp_path / "old.sqlite"
    sqlite3.connect(p).close()  # an empty SQLite file (version 0)
    assert Store(p).schema_version() == store.SCHEMA_VERSION


def test_newer_schema_is_refused_with_advice(tmp_path):
    p = tmp_path / "new.sqlite"
    Store(p).close()
    with sqlite3.connect(p) as raw:
        raw.execute("INSERT INTO schema_version VALUES (?)", (store.SCHEMA_VERSION + 5,))
    with pytest.raises(StoreError, match="newer version.*TRIAGE_DB"):
        Store(p)


def test_a_file_that_is_not_a_database_gives_a_clear_error(tmp_path):
    p = tmp_path / "notes.sqlite"
    p.write_bytes(b"this is a text file, not SQLite\n" * 100)
    with pytest.raises(StoreError, match="not a database.*TRIAGE_DB"):
        Store(p)
    assert p.read_bytes().startswith(b"this is a text file")  # never overwritten


def test_a_directory_path_gives_a_clear_error(tmp_path):
    with pytest.raises(StoreError, match="is a directory"):
        Store(tmp_path)


def test_unwritable_location_gives_a_clear_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="TRIAGE_DB"):
        Store(blocker / "sub" / "h.sqlite")  # parent is a file


def test_env_var_sets_the_path(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "env.sqlite"))
    assert store.default_path() == tmp_path / "env.sqlite"
    rid = store.save_run("probe", "server", {"n": 1})
    assert (tmp_path / "env.sqlite").is_file() and store.get_run(rid).payload == {"n": 1}
    monkeypatch.delenv("TRIAGE_DB")
    assert store.default_path() == Path.home() / ".cache" / "triage-console" / "history.sqlite"


class Colour(enum.Enum):
    RED = "red"


@dataclass
class Point:
    x: float
    c: Colour


def test_payloads_become_plain_json(db):
    rid = db.save_run("bench", "odd values", {"nan": math.nan, "inf": -math.inf, "p": Point(1.5, Colour.RED),
                                              "path": Path("/x"), "set": {3}, 7: "int key", "t": (1, 2)},
                      {"tok_s": 12.5, "bad": math.nan})
    run = db.get_run(rid)
    assert run.payload == {"nan": None, "inf": None, "p": {"x": 1.5, "c": "red"}, "path": "/x", "set": [3],
                           "7": "int key", "t": [1, 2]}
    assert run.summary == {"tok_s": 12.5, "bad": None}
    json.loads(db.export_runs([rid]))  # strict JSON: no NaN


def test_unknown_kind_and_bad_status_are_refused(db):
    with pytest.raises(ValueError, match="Unknown run kind"):
        db.save_run("nonsense", "t", {})
    with pytest.raises(ValueError):
        db.save_run("bench", "t", {}, status="running")
    with pytest.raises(ValueError):
        db.finish_run(db.begin_run("bench", "t"), status="interrupted")


def test_titles_are_cleaned_and_bounded(db):
    rid = db.save_run("generate", "  <script>alert(1)</script>\n\n" + "x" * 1000, {})
    title = db.get_run(rid).title
    assert title.startswith("<script>alert(1)</script> x") and len(title) == store.TITLE_MAX  # stored as text
    assert db.get_run(db.save_run("generate", "   ", {})).title == "(untitled)"


def test_oversized_payload_is_refused_not_truncated(db, monkeypatch):
    monkeypatch.setattr(store, "PAYLOAD_MAX_BYTES", 1000)
    with pytest.raises(StoreError, match="at most"):
        db.save_run("generate", "big", {"text": "x" * 5000})
    assert db.count() == 0


def test_begin_update_finish(db):
    rid = db.begin_run("longdoc", "ramp", {"lengths": [256, 512]})
    assert db.get_run(rid).status == "running"  # this process is alive: still running, not interrupted
    db.update_run(rid, payload={"lengths": [256, 512], "done": [256]})
    assert db.get_run(rid).payload["done"] == [256]
    db.finish_run(rid, summary={"ttft_s": 0.2})
    run = db.get_run(rid)
    assert run.status == "finished" and run.summary == {"ttft_s": 0.2} and run.payload["done"] == [256]
    assert run.duration_s >= 0
    failed = db.begin_run("bench", "will fail")
    db.finish_run(failed, status="failed", error="Out of memory")
    assert db.get_run(failed).status == "failed" and db.get_run(failed).error == "Out of memory"


def test_finishing_a_deleted_run_says_so(db):
    rid = db.begin_run("bench", "t")
    db.delete_run(rid)
    with pytest.raises(StoreError, match="not in the history"):
        db.finish_run(rid)


def test_a_run_owned_by_a_dead_process_is_interrupted(db):
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        owner = store._owner(proc.pid)
        rid = db.begin_run("bench", "owned by a child")
        db._write("UPDATE runs SET owner = ? WHERE id = ?", (owner, rid))
        assert store.owner_alive(owner) is True
        assert db.get_run(rid).status == "running"
    finally:
        proc.kill()
        proc.wait()
    assert store.owner_alive(owner) is False
    run = db.get_run(rid)
    assert run.status == "interrupted" and "ended before it finished" in run.error
    assert [r.id for r in db.list_runs(status="interrupted")] == [rid]


def test_reused_pid_is_not_mistaken_for_the_owner():
    pid = os.getpid()
    host = store._owner().split(":")[0]
    assert store.owner_alive(f"{host}:{pid}:{store._start_ticks(pid)}") is True
    assert store.owner_alive(f"{host}:{pid}:1") is False  # same PID, another start time
    assert store.owner_alive("some-other-host:1:1") is None  # cannot tell: left as running
    assert store.owner_alive(None) is False


def test_threads_share_one_store_safely(db):
    errors, ids = [], []
    lock = threading.Lock()

    def work(n):
        try:
            for i in range(25):
                rid = db.save_run("generate", f"thread {n} run {i}", {"n": n, "i": i})
                got = db.get_run(rid)
                assert got.payload == {"n": n, "i": i}
                db.list_runs(limit=5)
                with lock:
                    ids.append(rid)
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors and len(set(ids)) == 200 and db.count() == 200


WRITER = """
import sys
sys.path.insert(0, {root!r})
from core.store import Store
s = Store({path!r})
for i in range(40):
    s.save_run("bench", "proc {n} run %d" % i, {{"i": i}})
"""


def test_processes_write_concurrently_without_losing_rows(tmp_path):
    p = tmp_path / "shared.sqlite"
    procs = [subprocess.Popen([sys.executable, "-c", WRITER.format(root=str(ROOT), path=str(p), n=n)])
             for n in range(3)]
    for proc in procs:
        assert proc.wait(120) == 0
    assert Store(p).count() == 120


KILLED = """
import sys, time
sys.path.insert(0, {root!r})
from core.store import Store
s = Store({path!r})
s.save_run("checklist", "finished before the kill", {{"findings": [1, 2, 3]}}, {{"pass": 3}})
rid = s.begin_run("bench", "killed mid-run", {{"done": []}})
s.update_run(rid, payload={{"done": [1]}})
print(rid, flush=True)
time.sleep(120)
"""


def test_sigkill_mid_run_keeps_earlier_runs_and_marks_the_killed_one(tmp_path):
    p = tmp_path / "k.sqlite"
    proc = subprocess.Popen([sys.executable, "-c", KILLED.format(root=str(ROOT), path=str(p))],
                            stdout=subprocess.PIPE, text=True)
    try:
        rid = int(proc.stdout.readline())
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    s = Store(p)
    runs = {r.title: r for r in s.list_runs()}
    done = s.get_run(runs["finished before the kill"].id)
    assert done.status == "finished" and done.payload == {"findings": [1, 2, 3]} and done.summary == {"pass": 3}
    killed = s.get_run(rid)
    assert killed.status == "interrupted" and killed.payload == {"done": [1]}  # the checkpoint survived


def test_export_is_one_json_document(db):
    a = db.save_run("compare", "A", {"x": 1}, {"kld": 0.01})
    b = db.save_run("compare", "B", {"x": 2}, {"kld": 0.02})
    doc = json.loads(db.export_runs([a, b, 999]))
    assert doc["format"] == store.EXPORT_FORMAT and doc["schema_version"] == store.SCHEMA_VERSION
    assert [r["id"] for r in doc["runs"]] == [a, b]
    assert doc["runs"][0]["payload"] == {"x": 1} and doc["runs"][1]["summary"] == {"kld": 0.02}


def test_damaged_row_json_does_not_break_listing(db):
    rid = db.save_run("bench", "ok", {"a": 1}, {"b": 2})
    db._write("UPDATE runs SET summary = '{broken', payload = 'also broken' WHERE id = ?", (rid,))
    assert "damaged" in db.list_runs()[0].summary["unreadable"]
    assert db.get_run(rid).payload is None


def test_record_never_raises(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))  # a directory: cannot be opened
    assert store.record("generate", "t", {}) is None
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "ok.sqlite"))
    assert isinstance(store.record("generate", "t", {"a": 1}, {"ttft_s": 0.1}), int)


def test_numeric_diff_of_two_summaries():
    rows = store.numeric_diff({"ttft_s": 0.2, "tok_s": 10, "model": "x", "nested": {"kld": 0.1}, "flag": True},
                              {"ttft_s": 0.1, "tok_s": 15, "model": "y", "nested": {"kld": 0.1}, "only_b": 3})
    by = {r["field"]: r for r in rows}
    assert set(by) == {"ttft_s", "tok_s", "nested.kld", "only_b"}  # strings and booleans are not numbers
    assert by["tok_s"]["B - A"] == 5 and by["tok_s"]["change %"] == 50.0
    assert by["ttft_s"]["change %"] == pytest.approx(-50.0)
    assert by["only_b"]["A"] is None and by["only_b"]["B - A"] is None
    assert store.numeric_diff(None, None) == []


def test_limit_and_kind_filter(db):
    for i in range(30):
        db.save_run("generate" if i % 2 else "bench", f"run {i}", {"i": i})
    assert len(db.list_runs(limit=7)) == 7
    assert len(db.list_runs("bench", limit=1000)) == 15
    assert db.list_runs(limit=1)[0].title == "run 29"


def test_a_version_1_file_keeps_its_runs_and_learns_cancelled(tmp_path):
    p = tmp_path / "v1.sqlite"
    with sqlite3.connect(p) as raw:  # a history written by the first schema, with one finished run in it
        raw.execute("CREATE TABLE schema_version (version INTEGER NOT NULL)")
        for statement in store.MIGRATIONS[0][1]:
            raw.execute(statement)
        raw.execute("INSERT INTO schema_version VALUES (1)")
        raw.execute("INSERT INTO runs (kind, title, status, created_at, finished_at, payload) "
                    "VALUES ('bench', 'old run', 'finished', 1.0, 2.0, '{\"x\": 1}')")
        with pytest.raises(sqlite3.IntegrityError):  # why version 2 exists
            raw.execute("INSERT INTO runs (kind, title, status, created_at, payload) "
                        "VALUES ('bench', 'x', 'cancelled', 1.0, '{}')")
    s = Store(p)
    assert s.schema_version() == store.SCHEMA_VERSION >= 2
    (old,) = s.list_runs()
    assert old.title == "old run" and old.status == "finished" and s.get_run(old.id).payload == {"x": 1}
    rid = s.begin_run("longdoc", "cancelled one", {})
    s.finish_run(rid, {"cancelled": True}, status="cancelled", error="Cancelled; 0 result(s) kept.")
    assert s.get_run(rid).status == "cancelled" and rid > old.id


def test_speeds_give_the_median_of_the_last_five_and_keep_fifty(db):
    assert db.recent_speed("prefill", "BF16") is None
    for v in (900.0, 100.0, 200.0, 300.0, 400.0, 500.0):
        db.add_speed("prefill", "BF16", v)
    db.add_speed("prefill", "BF16", float("nan"))  # a run that measured nothing leaves no speed
    assert db.recent_speed("prefill", "BF16") == 300.0 and db.recent_speed("prefill", "FP32") is None
    for _ in range(60):
        db.add_speed("decode", "BF16", 10.0)
    assert len(db._read("SELECT * FROM speeds WHERE what = 'decode'")) == 50


def test_a_cancelled_run_is_dated_to_its_stop(db):
    rid = db.begin_run("longdoc", "stopped")
    stop = time.time() - 5
    db.finish_run(rid, status="cancelled", at=stop)
    run = db.get_run(rid)
    assert run.status == "cancelled" and run.finished_at == stop


def test_a_run_saved_whole_after_its_stop_is_cancelled_and_dated_to_the_stop(db):
    # the Model page saves a stopped generation in one call, once the engine has handed itself back
    stop = time.time() - 3
    rid = db.save_run("generate", "stopped", {"text": "so far"}, status="cancelled", started_at=stop - 4,
                      finished_at=stop)
    run = db.get_run(rid)
    assert run.status == "cancelled" and run.finished_at == stop and run.created_at == stop - 4
