"""Long-context runs in the history (core/long_context/history.py) on a real SQLite file: checkpoints after every result,
and what is stored when a run fails, is cancelled or is stopped. The runs here are RunResult/NeedleResult values
built from numbers; the faults (an error, a cancel, a stop) are injected by the test's own run function."""
import pytest

from core.engines.base import Cancelled
from core.long_context import history as hist
from core.long_context.runs import NeedleResult, RunResult, needle_row
from core.store import Store


@pytest.fixture
def db(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path / "h.sqlite"))
    s = Store(tmp_path / "h.sqlite")
    yield s
    s.close()


def result(n: int) -> RunResult:
    return RunResult(prompt_tokens=n, new_tokens=3, ttft_s=0.5 * n / 256, itl_s=[0.1, 0.2], decode_tok_s=6.7,
                     peak_bytes=2**30, peak_source="process peak RSS (getrusage)", kv_bytes=18 * 1024 * n, wall_s=1.0)


PARAMS = {"lengths": [256, 512, 1024], "new_tokens": 3}


class InjectedStop(BaseException):
    """Stands in for Streamlit's StopException: a BaseException that ends the script between two results."""


def only_run(db: Store):
    runs = db.list_runs("longdoc")
    assert len(runs) == 1
    return db.get_run(runs[0].id)


def test_a_finished_ramp_has_every_length_and_per_length_numbers(db):
    seen = []
    out = hist.run_recorded("ramp", "Gemma at BF16", PARAMS, lambda keep: [keep(result(n)) for n in (256, 512)],
                            seen.append)
    assert out.status == "finished" and out.message is None and out.warning is None
    run = only_run(db)
    assert run.status == "finished" and "256, 512, 1,024 tokens" in run.title and "Gemma at BF16" in run.title
    assert [r["prompt_tokens"] for r in run.payload["results"]] == [256, 512] == [r["prompt_tokens"] for r in seen]
    assert run.payload["results"][0]["itl_s"] == [0.1, 0.2]
    assert run.summary["points"] == 2 and run.summary["ttft_s"] == pytest.approx(1.0)
    assert run.summary["ttft_s_by"] == {"256": pytest.approx(0.5), "512": pytest.approx(1.0)}
    assert run.summary["peak_bytes"] == 2**30 and run.summary["itl_p99_s"] == pytest.approx(0.199)


def test_a_crash_mid_ramp_keeps_the_finished_lengths(db):
    def crashes(keep):
        keep(result(256))
        db_state.append(db.get_run(db.list_runs("longdoc")[0].id))  # checkpointed before the next length started
        raise RuntimeError("injected fault: out of memory at 512 tokens")

    db_state = []
    out = hist.run_recorded("ramp", "m", PARAMS, crashes, lambda r: None)
    assert out.status == "failed" and "injected fault" in out.message
    assert db_state[0].status == "running" and len(db_state[0].payload["results"]) == 1
    run = only_run(db)
    assert run.status == "failed" and "injected fault" in run.error
    assert [r["prompt_tokens"] for r in run.payload["results"]] == [256]


def test_cancel_and_a_stop_are_stored_with_what_finished(db):
    def cancelled(keep):
        keep(result(256))
        raise Cancelled("Ramp cancelled.")

    out = hist.run_recorded("ramp", "m", PARAMS, cancelled, lambda r: None)
    assert out.status == "cancelled"
    run = only_run(db)
    assert run.status == "cancelled" and run.error.startswith("Cancelled; 1 result(s) kept")
    assert run.payload["cancelled"] is True

    db.delete_run(run.id)

    def stopped(keep):
        keep(result(256))
        raise InjectedStop()

    with pytest.raises(InjectedStop):  # the stop still ends the script
        hist.run_recorded("ramp", "m", PARAMS, stopped, lambda r: None)
    run = only_run(db)
    assert run.status == "cancelled" and "Stopped before the end" in run.error and len(run.payload["results"]) == 1


def test_needle_summary_has_the_lift_over_the_control(db):
    rows = [NeedleResult("none", -1, 512, -30.0, 10, 2), NeedleResult("middle", 250, 512, -2.0, 10, 9)]
    hist.run_recorded("needle", "m", {"prompt_tokens": 512}, lambda keep: [keep(r) for r in rows], lambda r: None)
    run = only_run(db)
    s = run.summary
    assert s["lift_over_control"] == {"middle": pytest.approx(28.0)} and s["top1_hits"] == {"none": 2, "middle": 9}
    table = [needle_row(r) for r in run.payload["results"]]  # the page's table, from the stored dicts
    assert table[0]["at token"] == "none" and table[1]["at token"] == "250" and table[1]["prompt tokens"] == 512
    assert table[1]["answer tokens ranked first"] == "9 of 10" and table[1]["mean per token"] == "-0.200"


def test_a_store_that_cannot_be_opened_gives_one_warning_and_the_run_still_finishes(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))  # a directory: a real store failure
    seen = []
    out = hist.run_recorded("single", "m", {"prompt_tokens": 256, "new_tokens": 3},
                            lambda keep: keep(result(256)), seen.append)
    assert out.status == "finished" and len(seen) == 1
    assert out.warning.startswith("This run was not saved to the history:") and "is a directory" in out.warning



def test_a_checkpoint_that_fails_once_still_leaves_the_whole_run_saved(db, monkeypatch):
    # Injected fault: one checkpoint write finds the database locked (hard to produce on cue for real).
    real, calls = hist.store.update_run, []

    def locked_once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise hist.store.StoreError("database is locked")
        return real(*args, **kwargs)

    monkeypatch.setattr(hist.store, "update_run", locked_once)
    out = hist.run_recorded("ramp", "m", PARAMS, lambda keep: [keep(result(n)) for n in (256, 512, 1024)],
                            lambda r: None)
    run = only_run(db)
    assert out.status == "finished" and out.warning is None and len(calls) == 1  # later checkpoints skipped
    assert run.status == "finished" and [r["prompt_tokens"] for r in run.payload["results"]] == [256, 512, 1024]
