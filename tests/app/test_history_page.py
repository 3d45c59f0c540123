"""The History page in AppTest on a real SQLite file: empty state, listing and filtering, reopening, comparing,
deleting with confirmation, interrupted runs, hostile titles, bad database paths and out-of-range numbers."""
from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest
from streamlit.testing.v1 import AppTest

from core.store import Store
from tests.conftest import ROOT

PAGE = str(ROOT / "views" / "history.py")
HOSTILE = "<script>alert(1)</script><img src=x onerror=alert(1)>"


@pytest.fixture
def db(tmp_path, monkeypatch):
    path = tmp_path / "history.sqlite"
    monkeypatch.setenv("TRIAGE_DB", str(path))
    s = Store(path)
    yield s
    s.close()


def page() -> AppTest:
    at = AppTest.from_file(PAGE, default_timeout=60).run()
    assert not at.exception, at.exception
    return at


def pick(at: AppTest, *ids: int) -> AppTest:
    at.multiselect(key="hist_sel").set_value(list(ids)).run()
    assert not at.exception, at.exception
    return at


def test_empty_history_says_so(db):
    at = page()
    assert any("No saved runs yet" in i.value for i in at.info)
    assert str(db.path) in at.caption[0].value


def test_runs_are_listed_newest_first_and_filtered_by_kind(db):
    a = db.save_run("generate", "first", {"p": 1}, {"ttft_s": 0.1})
    b = db.save_run("compare", "second", {"p": 2}, {"mean_kld": 0.01})
    at = page()
    table = at.dataframe[-1].value
    assert list(table["id"]) == [b, a] and list(table["title"]) == ["second", "first"]
    at.selectbox(key="hist_kind").set_value("compare").run()
    assert list(at.dataframe[0].value["id"]) == [b]
    at.selectbox(key="hist_kind").set_value("bench").run()
    assert any("No saved runs yet of kind bench" in i.value for i in at.info)


def test_reopening_a_run_shows_its_summary_and_payload(db):
    rid = db.save_run("generate", HOSTILE, {"prompt": HOSTILE, "ids": [1, 2, 3]}, {"ttft_s": 0.25})
    at = pick(page(), rid)
    assert any(t.value == HOSTILE for t in at.text)  # the title as plain text
    bodies = [j.value for j in at.json]
    assert any('"ttft_s"' in v and "0.25" in v for v in bodies) and any(HOSTILE in v for v in bodies)
    for md in at.markdown:
        assert "<script>" not in md.value


def test_two_runs_are_compared_with_a_numeric_diff(db):
    a = db.save_run("compare", "fp32 vs fp8", {}, {"mean_kld": 0.02, "same_top": 0.95, "verdict": "fine"})
    b = db.save_run("compare", "fp32 vs bf16", {}, {"mean_kld": 0.01, "same_top": 0.99, "verdict": "identical"})
    at = pick(page(), a, b)
    assert any(f"#{a} (A) against #{b} (B)" in h.value for h in at.subheader)
    diff = at.dataframe[1].value
    assert list(diff["field"]) == ["mean_kld", "same_top"]
    assert diff.set_index("field").loc["mean_kld", "B - A"] == pytest.approx(-0.01)
    assert diff.set_index("field").loc["same_top", "change %"] == pytest.approx(100 * 0.04 / 0.95)


def test_delete_asks_for_confirmation_and_can_be_cancelled(db):
    a = db.save_run("bench", "doomed", {}, None)
    keep = db.save_run("bench", "kept", {}, None)
    at = pick(page(), a)
    at.button(key="hist_delete").click().run()
    assert any("for good?" in w.value for w in at.warning)
    assert db.get_run(a) is not None  # nothing deleted yet
    at.button(key="hist_confirm_no").click().run()
    assert db.get_run(a) is not None and not any("for good?" in w.value for w in at.warning)
    at.button(key="hist_delete").click().run()
    at.button(key="hist_confirm_yes").click().run()
    assert not at.exception, at.exception
    assert db.get_run(a) is None and db.get_run(keep) is not None
    assert any("Deleted 1 run(s)." in s.value for s in at.success)
    assert list(at.dataframe[0].value["id"]) == [keep]


def test_changing_the_selection_cancels_a_pending_delete(db):
    a = db.save_run("bench", "a", {}, None)
    b = db.save_run("bench", "b", {}, None)
    at = pick(page(), a)
    at.button(key="hist_delete").click().run()
    pick(at, b)
    assert not any("for good?" in w.value for w in at.warning)
    assert db.get_run(a) is not None and db.get_run(b) is not None


def test_a_killed_run_shows_as_interrupted(db):
    code = (f"import sys, time; sys.path.insert(0, {str(ROOT)!r}); from core.store import Store; "
            f"s = Store({str(db.path)!r}); print(s.begin_run('bench', 'killed', {{}}), flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    rid = int(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    at = page()
    table = at.dataframe[-1].value
    assert table.set_index("id").loc[rid, "status"] == "interrupted"
    assert "1 interrupted" in at.caption[1].value
    at = pick(at, rid)
    assert any("ended before it finished" in w.value for w in at.warning)


@pytest.mark.parametrize("limit", [-5, 0, 10**12])
def test_out_of_range_limits_are_harmless(db, limit):
    db.save_run("bench", "one", {}, None)
    at = page()
    at.number_input(key="hist_limit").set_value(limit).run()
    assert not at.exception, at.exception
    assert 1 <= at.number_input(key="hist_limit").value <= 10_000
    assert len(at.dataframe[0].value) == 1


def test_a_directory_as_database_path_gives_a_clear_message(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_DB", str(tmp_path))
    at = page()
    assert any("is a directory" in e.value and "TRIAGE_DB" in e.value for e in at.error)


def test_a_file_that_is_not_a_database_gives_a_clear_message(tmp_path, monkeypatch):
    bad = tmp_path / "notes.sqlite"
    bad.write_bytes(b"not sqlite at all " * 100)
    monkeypatch.setenv("TRIAGE_DB", str(bad))
    at = page()
    assert any("not a database" in e.value for e in at.error)
    assert bad.read_bytes().startswith(b"not sqlite")


def test_a_large_payload_is_shown_as_text_not_a_tree(db):
    rid = db.save_run("longdoc", "big", {"text": "word " * 200_000}, {"tokens": 200_000})
    at = pick(page(), rid)
    assert any("Large payload" in c.value for c in at.caption)
    assert at.code and len(at.code[0].value) <= 500_000


def _sweep_payload(goodput: float, kind: str = "capacity-bound") -> dict:
    """A saved sweep as core.deployment.sweep writes it (SweepResult.to_dict()), two steps."""
    from tests.unit.test_sweep import step

    from core.deployment.sweep import SweepResult

    res = SweepResult("http://127.0.0.1:8000", "gemma-3-270m", "concurrency", 128, 32, None, {"ttft_p99": 2.0}, 120,
                      steps=[step(1, 1.0, 0.1), step(2, 1.8, 0.9, queue=0.8)], knee={"load": 1, "rps": 1.0,
                                                                                     "how": "by hand"},
                      goodput={"rps": goodput, "step": 1, "load": 2}, wall_s=12.0,
                      verdict={"kind": kind, "headline": f"{kind.capitalize()}: <b>numbers</b>", "remedy": "r"})
    return res.to_dict()


def test_a_saved_sweep_reopens_in_its_own_view_and_two_compare(db):
    a = db.save_run("sweep", "Sweep one", _sweep_payload(1.5), {"goodput_rps": 1.5})
    b = db.save_run("sweep", "Sweep two", _sweep_payload(2.07, "decode-bound"), {"goodput_rps": 2.07})
    at = pick(page(), a)
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Knee"] == "1 clients" and metrics["Goodput"] == "1.50 req/s"
    assert any(r"Capacity\-bound\: \<b\>numbers" in w.value for w in at.warning)  # escaped, never HTML
    assert len(at.get("plotly_chart")) == 3
    at = pick(at, a, b)
    table = next(d.value for d in at.dataframe if "goodput (req/s)" in list(d.value.iloc[:, 0]))
    assert round(float(table["change %"][0])) == 38  # goodput +38%


# ---- reopening each kind in the view of the page that made it ------------------------------------------------------
def _json(obj):
    import json

    return json.loads(json.dumps(obj, allow_nan=False))  # what the store hands back


def _compare_payload() -> dict:
    from core.compare.result import history_payload
    from tests.unit.test_compare_render import _result

    return _json(history_payload(_result()))


def _raw_json_closed(at: AppTest) -> bool:
    """The raw JSON is kept, one click away (collapsed)."""
    return any(e.label.startswith("Raw JSON") for e in at.expander)


def test_a_saved_comparison_reopens_with_its_metrics_tokens_and_charts(db):
    from core.compare.result import CompareResult, history_summary
    from tests.unit.test_compare_render import _result

    rid = db.save_run("compare", "Compare FP32 vs FP8", _compare_payload(), _json(history_summary(_result())))
    at = pick(page(), rid)
    labels = [m.label for m in at.metric]
    assert "Mean KLD" in labels and "Same top token" in labels and "vLLM rule" in labels
    assert len(at.get("plotly_chart")) == 2
    (html,) = at.get("html")
    assert "cmp-wrap" in html.proto.body and "&lt;script&gt;" in html.proto.body  # the token diff, escaped
    verdict = CompareResult.from_dict(_compare_payload()).summary.verdict
    assert any(verdict.split(":")[0] in e.value for e in [*at.error, *at.warning, *at.success, *at.info])
    assert any(e.label == "What ran" for e in at.expander) and _raw_json_closed(at)


def test_an_old_comparison_opens_with_what_it_saved_and_a_short_title(db):
    old = _compare_payload()
    for side in ("reference", "candidate"):
        old[side] = {k: v for k, v in old[side].items() if k not in ("ran_short", "short_label")}
        old[side]["ran"] = "torch eager on CPU, FP8 linears through the C kernel (AVX-512), fused RMSNorm"
    old.pop("timings_s")
    summary = {"reference": f"FP32 ({old['reference']['ran']})", "reference_precision": "fp32",
               "candidate": f"FP8 E4M3 (W8A8), FP8 KV cache ({old['candidate']['ran']})", "candidate_precision": "fp8",
               "candidate_kv_dtype": "fp8", "prompts": 1, "total_s": 12.5, "load_s": 4.0}
    rid = db.save_run("compare", f"{summary['reference']} vs {summary['candidate']} · 1 prompt · 4 tokens", old,
                      summary, started_at=None)  # saved with start = finish, as older versions did
    cut = db.save_run("compare", "cut", {"summary": {"verdict": "Fine: <b>x</b>", "mean_kld": 0.01}}, None)
    at = page()
    table = at.dataframe[-1].value.set_index("id")
    assert table.loc[rid, "title"] == "Compare FP32 vs FP8 W8A8 + FP8 KV · torch eager · CPU · 1 prompt"
    assert table.loc[rid, "took (s)"] == pytest.approx(16.5)  # from its timings: no start was stored
    at = pick(at, rid)
    assert len(at.get("plotly_chart")) == 2 and not at.exception
    assert not any("AVX-512" in e.value for e in [*at.error, *at.warning, *at.success])  # the verdict is short...
    assert any("AVX" in m.value for m in at.markdown)  # ...and what ran is one click away
    at = pick(at, cut)
    assert any("only its summary is shown" in c.value for c in at.caption) and not at.exception
    assert not any("<b>" in m.value for m in at.markdown)


def _quality_payload(**extra) -> dict:
    from core.quality.history import Recorder
    from tests.app.test_quality_page import RESULT

    rec = Recorder(RESULT["model"], {"reference": "bf16", "candidates": ["int4"], "document": "pasted document",
                                     "window": 64, "stride": 64}, list(RESULT["rows"]))
    return _json(rec._payload(**{k: v for k, v in {**RESULT, **extra}.items() if k != "rows"}))


def test_a_saved_quality_run_reopens_with_its_table_and_kld_chart(db):
    rid = db.save_run("quality", "Quality int4 vs bf16", _quality_payload(cancelled=False), {"rows": 2})
    at = pick(page(), rid)
    table = at.dataframe[1].value  # [0] is the list of runs
    assert list(table["precision"]) == ["bf16 (ref)", "int4"] and list(table["verdict"]) == ["reference", "broken"]
    assert len(at.get("plotly_chart")) == 1
    assert any(s.value == "Where the candidates differ most" for s in at.subheader) and _raw_json_closed(at)


def test_a_cancelled_quality_run_shows_the_rows_it_kept(db):
    from tests.app.test_quality_page import RESULT

    # What the recorder stores when a run is cancelled after the reference: model, params and the rows so far.
    partial = {"model": "Gemma", "params": {"reference": "bf16", "candidates": ["int4"], "document": "doc",
                                            "window": 64, "stride": 64},
               "rows": [RESULT["rows"][0]], "cancelled": True}
    rid = db.save_run("quality", "Quality int4 vs bf16", partial, {"rows": 1}, status="failed", error="Cancelled")
    at = pick(page(), rid)
    assert not at.exception, at.exception
    assert list(at.dataframe[1].value["precision"]) == ["bf16 (ref)"]
    assert any("document: doc" in c.value.replace("\\", "") for c in at.caption)  # Markdown escapes


def test_a_saved_checklist_reopens_with_its_finding_cards(db):
    from diagnostics import runner

    result = runner.run(duration_s=1.0, launch_cmd="vllm serve some/model --quantization fp8")  # this machine, for real
    rid = db.save_run("checklist", "Checklist", _json(result.to_dict()), {"pass": 1})
    unfinished = db.save_run("checklist", "Checklist that never ran", {"inputs": {"duration_s": 30}}, None)
    at = pick(page(), rid)
    assert not at.exception, at.exception
    assert any(s.value == "Findings" for s in at.subheader)
    assert {m.label for m in at.metric} >= {"PASS", "FAIL", "SKIP"} and _raw_json_closed(at)
    at = pick(at, unfinished)
    assert any("No findings were saved" in i.value for i in at.info) and not at.exception


def test_a_saved_fleet_refresh_reopens_with_its_table(db):
    from diagnostics.checks.fleet import CHECKS
    from diagnostics.findings import RunResult
    from diagnostics.fleet import FleetRun
    from diagnostics.runner import evaluate
    from tests.unit.test_fleet_stall import _replica, _snap

    snap = _snap([_replica("busy", running=2.0, progress=10.0)], prometheus_url="http://127.0.0.1:9")
    result = RunResult("2026-01-01T00:00:00+00:00", 300.0, 300.0, False, "host", {}, tuple(evaluate(snap, CHECKS)), ())
    rid = db.save_run("fleet", "Fleet", _json(FleetRun(snap, result).to_dict()), {"replicas": 1})
    old = db.save_run("fleet", "Fleet, old", {"replicas": 1}, None)
    at = pick(page(), rid)
    assert not at.exception, at.exception
    assert any(s.value == "Replicas, worst first" for s in at.subheader)
    at = pick(at, old)
    assert any("holds no snapshot" in i.value for i in at.info) and not at.exception


def saved_kinds() -> set[str]:
    """Every kind the console saves: store.record("kind", ...) calls and the long-run recorders' KIND."""
    import re

    kinds: set[str] = set()
    for path in [*ROOT.glob("core/**/*.py"), *ROOT.glob("diagnostics/**/*.py"), *ROOT.glob("views/**/*.py")]:
        text = path.read_text()
        kinds |= set(re.findall(r'store\.record\(\s*"([\w-]+)"', text))
        kinds |= set(re.findall(r'^KIND = "([\w-]+)"', text, re.M))
    return kinds


def test_every_kind_the_console_saves_reopens_in_its_view():
    import re

    views = set(re.findall(r'"([\w-]+)": \w+(?:_view)?\.show', (ROOT / "views" / "history.py").read_text()))
    kinds = saved_kinds()
    assert {"generate", "longdoc", "probe", "compare", "quality", "checklist", "golden-record",
            "golden-watch"} <= kinds
    assert kinds <= views, f"saved but reopened as raw JSON: {sorted(kinds - views)}"


def generation_payload(text: str = " Paris, the city of light.") -> dict:
    timing = {"prompt_tokens": 6, "new_tokens": 5, "ttft_s": 0.08, "itl_median_s": 0.03, "itl_p90_s": 0.04,
              "itl_max_s": 0.05, "decode_tok_s": 31.0}
    return {"setup": "Gemma 3 270M at BF16 (torch eager on CPU)", "setup_short": "Gemma 3 270M · BF16 · torch eager · CPU",
            "engine": "torch eager on CPU", "engine_short": "torch eager · CPU", "prompt": "The capital of France is",
            "max_new_tokens": 5, "temperature": 0.0, "text": text, "finish_reason": "length",
            "token_ids": [1, 2, 3, 4, 5], "token_times_s": [0.08, 0.11, 0.14, 0.17, 0.2], "timing": timing}


def test_a_generation_reopens_in_the_model_pages_view(db):
    rid = db.save_run("generate", "Gemma 3 270M · BF16: The capital of France is", generation_payload(), {})
    at = pick(page(), rid)
    assert at.code[0].value == " Paris, the city of light."
    assert {m.label: m.value for m in at.metric}["Tokens"] == "6 in / 5 out"
    assert at.text_area[0].value == "The capital of France is"
    assert not any(e.label.startswith("Raw JSON") and e.proto.expanded for e in at.expander)


def test_a_stopped_generation_reopens_with_its_text_and_says_it_was_stopped(db):
    payload = {**generation_payload(" Paris, the"), "finish_reason": "cancelled", "token_ids": [], "token_times_s": [],
               "timing": {}}
    rid = db.save_run("generate", "Gemma 3 270M · BF16: The capital of France is", payload, {}, status="cancelled")
    at = pick(page(), rid)
    assert at.code[0].value == " Paris, the"
    assert any("Stopped before the end" in w.value for w in at.warning)


def test_long_context_runs_reopen_in_the_long_context_view(db):
    from core.long_context import history as hist
    from core.long_context.runs import NeedleResult, RunResult

    single = RunResult(2048, 4, 1.9, [0.05, 0.06, 0.05], 18.0, 2**30, "sampled RSS", 2**22, 1, 2.1).to_dict()
    params = {"new_tokens": 4, "document_tokens": 2048, "device": "CPU", "engine": "torch eager on CPU",
              "prompt_tokens": 2048}
    a = db.save_run("longdoc", hist.title("single", "BF16", params),
                    {"test": "single", "model": "Gemma 3 270M · BF16", "params": params, "results": [single]}, {})
    needle = [NeedleResult(d, p, 1024, lp, 5, h).to_dict()
              for d, p, lp, h in (("none", -1, -20.0, 0), ("start", 1, -3.0, 4), ("middle", 500, -4.0, 3))]
    b = db.save_run("longdoc", hist.title("needle", "BF16", params),
                    {"test": "needle", "model": "Gemma 3 270M · BF16", "params": params, "results": needle,
                     "cancelled": True}, {})
    at = pick(page(), a)
    assert {m.label for m in at.metric} >= {"TTFT", "ITL p50", "Decode"} and len(at.get("plotly_chart")) == 1
    at = pick(at, b)
    assert list(at.table[0].value["needle"]) == ["none (control)", "start", "middle"]
    assert any("Stopped before the end; 3 result(s)" in w.value for w in at.warning)


def test_each_run_says_who_made_it_and_the_list_filters_to_this_apps(db):
    """A run made in this process is 'this app'; one saved by another process (the CLI, another console) names its
    host and pid, and the toggle hides it."""
    import socket

    here = db.save_run("bench", "made here", {"x": 1}, {"tok_s": 1.0})
    code = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from core.store import Store; "
            f"print(Store({str(db.path)!r}).save_run('bench', 'made elsewhere', {{}}, {{}}), flush=True)")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    there = int(other.stdout.strip())
    at = page()
    table = at.dataframe[-1].value.set_index("id")
    assert table.loc[here, "by"] == "this app"
    assert table.loc[there, "by"].startswith(f"{socket.gethostname()} pid ") and there != here
    at.toggle(key="hist_mine").set_value(True).run()
    assert not at.exception, at.exception
    assert list(at.dataframe[0].value["id"]) == [here]


def test_a_golden_set_and_a_watch_round_reopen_with_their_numbers(db):
    """Real numbers: the golden set and the second server's replay that tests/vllm/test_golden.py recorded."""
    import copy

    from core.compare.golden.golden import GoldenSet
    from core.compare.golden.replay import Replay, judge
    from core.compare.golden.watch import Watch

    real = json.loads((ROOT / "tests" / "fixtures" / "golden-real-replays.json").read_text())
    golden = GoldenSet.from_dict(copy.deepcopy(real["golden"]))
    rec = db.save_run("golden-record", "Golden set", golden.to_dict(), {})
    at = pick(page(), rec)
    body = " ".join(m.value for m in at.markdown)
    assert f"{len(golden.prompts)} prompts x {golden.max_new_tokens} greedy tokens" in body
    assert any("Noise floor" in c.value and "same top token" in c.value for c in at.caption)
    assert len(at.dataframe[-1].value) == len(golden.prompts)  # the first table lists the runs

    url = "http://10.0.0.7:8000"
    first, second = (Replay.from_dict(copy.deepcopy(real[name])) for name in ("main", "second"))
    first.url = second.url = url  # one replica, restarted into the second server's setup between the rounds
    watch = Watch(golden, [url])
    watch.step([judge(golden, first)])
    rnd = watch.step([judge(golden, second)])
    rid = db.save_run("golden-watch", "Golden watch round 2", rnd.to_dict(), {})
    at = pick(page(), rid)
    assert any("Round 2 at " in m.value for m in at.markdown)
    table = at.dataframe[-1].value
    assert list(table["replica"]) == ["http://10.0.0.7:8000"] and list(table["drift"]) == ["yes"]
    assert any("drift in round 2" in w.value for w in at.warning)
    assert any(t.value.startswith("http://10.0.0.7:8000  ") and "same top token" in t.value for t in at.text)
    assert any("drift beyond" in c.value for c in at.caption) and not at.exception
