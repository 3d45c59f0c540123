"""The FP8/BF16 speedups the pages show, read from the H200 results recorded in core/data/fp8_speed_h200.json (decode)
and core/data/prefill_h200.json (the prompt pass)."""
import pytest

from core import speedup


def test_h200_speedups_by_context_come_from_the_recorded_results():
    short, long, rows, notes = speedup.by_context("auto")  # core/data/fp8_speed_h200.json, as recorded
    assert (short, long) == (512, 32768)
    fp8 = next(r for r in rows if r["precision"] == "fp8" and r["batch"] == 1)
    bf16 = next(r for r in rows if r["precision"] == "bf16" and r["batch"] == 1)
    assert fp8["x BF16 at 512"] == pytest.approx(fp8["tok/s at 512"] / bf16["tok/s at 512"], rel=0.01)
    # the KV cache is read every step at length, so the FP8 weights' share of the win shrinks there
    assert fp8["x BF16 at 32,768"] < fp8["x BF16 at 512"]
    assert {r["batch"] for r in rows} == {1, 8} and any("batch 64" in n and "does not fit" in n for n in notes)


def test_source_line_names_the_machine_and_the_launch_mode():
    line = speedup.source_line()
    assert "H200" in line and "programmatic dependent launch at batch 1" in line
    assert "norms folded into the linears at batch 1" in line


def test_time_to_first_token_rows_come_from_the_recorded_prompt_passes():
    rows = speedup.prefill_rows()  # core/data/prefill_h200.json, as recorded
    assert [r["prompt tokens"] for r in rows] == ["8,192", "32,768", "125,000"]
    for r in rows:
        assert r["x BF16"] == pytest.approx(r["BF16 s"] / r["FP8 W8A8 s"], rel=0.01)
        assert r["BF16 s"] < r["BF16 s, cuDNN attention"]  # FlashAttention-3 measured faster than cuDNN
    line = speedup.prefill_source_line()
    assert "H200" in line and "FlashAttention-3 (BF16)" in line


def test_a_missing_or_broken_results_file_shows_no_table(tmp_path, monkeypatch):
    broken = tmp_path / "prefill.json"
    broken.write_text("{not json")
    monkeypatch.setattr(speedup, "PREFILL", broken)
    assert speedup.prefill_rows() == [] and speedup.prefill_source_line() == ""
    monkeypatch.setattr(speedup, "PREFILL", tmp_path / "missing.json")
    assert speedup.prefill_rows() == []


def test_the_table_of_the_gpu_present_is_shown_with_what_ran(monkeypatch):
    """An H100 present: core/data/fp8_speed_h100.json, each row naming its engine and kernel (integer rows: gemlite
    where the H100's tuning section picks it); no GPU: the H200 table."""
    monkeypatch.setattr(speedup, "present_gpu", lambda: "NVIDIA H100 80GB HBM3")
    assert speedup.recorded_here() and speedup.recorded_on()[0] == "NVIDIA H100 80GB HBM3"
    rows = speedup.measured_speedups()
    int4 = [r for r in rows if r["precision"] == "int4" and r["batch"] == 1]
    assert int4 and all("gemlite" in r["kernel"] for r in int4)  # the H100's tuning section routes it there
    assert all(r["engine"] and r["speedup_vs_bf16"] > 0 for r in rows)
    assert "int_library_bench" in speedup.source_line() and "H200" in speedup.source_line(context=True)
    monkeypatch.setattr(speedup, "present_gpu", lambda: None)
    assert not speedup.recorded_here() and speedup.recorded_on()[0] == "NVIDIA H200"
