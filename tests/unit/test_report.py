"""Reports: hostile text from outside (launch command, URL, errors, metric labels) stays text in HTML and Markdown;
the HTML file is self-contained with its charts; the JSON carries everything."""
from __future__ import annotations

import json
import re

from diagnostics import flags, report
from diagnostics.context import CheckContext, Series
from diagnostics.findings import Chart, Finding, RunResult, Severity, Status
from diagnostics.runner import evaluate

XSS = '<script>alert("x")</script>'
IMG = '<img src=x onerror=alert(1)>'
MD_LINK = "[click](javascript:alert(1))"


def hostile_result() -> RunResult:
    cmd = f'vllm serve m --"{XSS}" --fp8-w8a16 {IMG}'
    ctx = CheckContext(launch_cmd=cmd, flag_lint=flags.lint_command(cmd, flags.committed_table()),
                       host_mem_available=Series(f"Mem{XSS}", "bytes", f"psutil{IMG}", tuple(range(10)),
                                                 tuple(16e9 - i * 1e8 for i in range(10))))
    findings = evaluate(ctx)
    chart = Chart(f"chart {XSS}", (Series(f"series {XSS}", "%", f"src {IMG}", (0.0, 1.0), (1.0, 2.0)),),
                  f"y {XSS}", ((50.0, f"line {XSS}"),))
    handmade = Finding("test.hostile", f"Title {XSS}", Severity.HIGH, Status.WARN, f"Verdict {XSS} {MD_LINK}",
                       f"Remedy {IMG} | pipe", evidence={f"key {XSS}": f"value {IMG}", "n_pct": 42.0},
                       charts=(chart,), hint=f"hint {XSS}")
    return RunResult("2026-01-01T00:00:00+00:00", 5.0, 5.0, False, f"host{XSS}",
                     {"vllm_url": f"http://127.0.0.1:8000/{XSS}", "launch_cmd": cmd, "requested_precision": None},
                     tuple(sorted([*findings, handmade], key=lambda f: f.sort_key)), (f"note {XSS}",))


def test_html_escapes_every_piece_of_hostile_text():
    page = report.to_html(hostile_result())
    assert XSS not in page and IMG not in page
    assert "alert(&quot;x&quot;)" in page or "&lt;script&gt;" in page
    assert "&lt;img src=x onerror=alert(1)&gt;" in page
    # the flag linter's finding about the hostile flag is in the page, escaped
    assert "--fp8-w8a16" in page
    assert "<script" not in page  # the charts are SVG: the page runs no script at all


def test_html_is_self_contained_small_with_inline_svg_charts():
    page = report.to_html(hostile_result())
    assert page.startswith("<!DOCTYPE html>") and page.rstrip().endswith("</html>")
    assert not re.search(r"<(script|link|img|iframe)\b|<[^>]*\b(src|href)=", page)  # nothing to fetch: opens offline
    assert page.count("<svg") == 2 and page.count("<polyline") >= 2  # the host memory chart and the hand-made one
    assert len(page.encode()) < 100_000  # no charting library inside


def test_svg_chart_draws_clock_times_gaps_and_thresholds():
    import datetime as dt

    from diagnostics.charts import svg

    chart = Chart("util", (Series("GPU 0", "%", "NVML", (0.0, 1.0, 2.0, 3.0, 4.0), (10.0, 20.0, None, 40.0, 50.0)),),
                  "%", ((30.0, "idle below"),), (0.0, 105.0))
    t0 = dt.datetime(2026, 1, 1, 13, 5, 0, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    out = svg(chart, t0)
    assert out.count("<polyline") == 2  # the missed reading breaks the line
    assert "13:05:00" in out and "13:05:04" in out and "PM" not in out and "UTC+01:00" in out
    assert "idle below" in out and 'stroke-dasharray="2 3"' in out
    assert "seconds since the window started" in svg(chart)
    assert "no readings" in svg(Chart("empty", (Series("x", "%", "NVML"),), "%"))


def test_identical_skips_say_their_reason_once_in_every_report():
    """A CPU host skips every GPU check for one reason: each report says the missing driver once, in one line that
    stands for the group, and still names every check (the JSON keeps a finding per check, pointing at the group)."""
    ctx = CheckContext(gpu_reason="No NVIDIA driver here: libnvidia-ml.so.1 was not found.")
    result = RunResult("t", 1.0, 1.0, False, "h", {"vllm_url": None, "launch_cmd": None}, tuple(evaluate(ctx)))
    no_gpu = [f for f in result.findings if f.missing.startswith("no GPU")]
    assert len(no_gpu) >= 7
    groups = [g for g in report.group_skips(result.findings) if isinstance(g, report.SkipGroup)]
    gpu_group = next(g for g in groups if g.input == "no GPU")
    title = f"{len(no_gpu)} GPU checks skipped: no NVIDIA driver here"
    assert gpu_group.findings == tuple(no_gpu) and gpu_group.title == title
    assert gpu_group.detail == "libnvidia-ml.so.1 was not found."
    assert "docker run --gpus all" in gpu_group.remedy
    text, md, page = report.to_text(result), report.to_markdown(result), report.to_html(result)
    data = json.loads(report.to_json(result))
    for out in (text, md, page, json.dumps(data)):
        assert out.count("libnvidia-ml.so.1") == 1, out
        assert out.count("docker run --gpus all") <= 1
        assert all(f.check_id in out for f in result.findings)  # every check is still named
    assert text.count(title) == 1 and page.count(title) == 1
    assert md.count(title) == 2  # its table row and its section
    assert all(f'id="{f.check_id}"' in page for f in result.findings)  # every check still has its anchor
    assert len(data["findings"]) == len(result.findings)
    gpu_index = next(i for i, g in enumerate(data["skip_groups"]) if g["title"] == title)
    pointed = [f for f in data["findings"] if f.get("skip_group") == gpu_index]
    assert [f["id"] for f in pointed] == data["skip_groups"][gpu_index]["checks"] == [f.check_id for f in no_gpu]
    assert all(f["missing"] == "no GPU" and f["status"] == "SKIP" for f in pointed)  # the input, for machines
    assert json.dumps(data).count("NVIDIA driver") == 2  # the group's title and its reason


def test_markdown_escapes_links_html_and_table_pipes():
    md = report.to_markdown(hostile_result())
    assert MD_LINK not in md and "\\[click\\](javascript:alert(1))" in md  # no [ ], no link
    # Outside code spans nothing is raw; inside them CommonMark shows HTML as text, so it stays as typed.
    prose = re.sub(r"`[^`\n]+`", "", md)
    assert XSS not in prose and IMG not in prose and "\\<script\\>" in prose
    table = [line for line in md.splitlines() if line.startswith("| WARN | test.hostile")]
    assert len(table) == 1 and table[0].count(" | ") == 2  # the verdict's own pipes cannot add columns


def test_markdown_keeps_code_spans_and_lists_remedies():
    md = report.markdown_safe("use `vllm serve MODEL [flags]` not [this]")
    assert "`vllm serve MODEL [flags]`" in md and "\\[this\\]" in md
    assert report.remedy_markdown("- a\n- b").startswith("**What to do:**\n\n- a")


def test_json_round_trips_with_series_and_ids():
    result = hostile_result()
    data = json.loads(report.to_json(result))
    assert data["schema"] == "triage-console/diagnostics-run/1"
    ids = [f["id"] for f in data["findings"]]
    assert "vllm.unknown_flags" in ids and "test.hostile" in ids
    assert sum(data["counts"].values()) == len(ids)
    leak = next(f for f in data["findings"] if f["id"] == "host.mem_leak")
    assert leak["charts"][0]["series"][0]["v"]  # the time series the verdict used
    assert next(f for f in data["findings"] if f["id"] == "vllm.unknown_flags")["status"] == "FAIL"


def test_write_all(tmp_path):
    paths, not_written = report.write_all(hostile_result(), str(tmp_path / "out"))
    assert set(paths) == {"md", "json", "html"} and not_written == {}
    for p in paths.values():
        assert open(p, encoding="utf-8").read()


def test_markdown_escapes_only_what_markdown_needs():
    from markdown_it import MarkdownIt

    gpu = "GPU 0 (NVIDIA H200, CC 9.0)"
    f = Finding("test.plain", f"Sees {gpu}", Severity.LOW, Status.PASS, f"{gpu}: 3.5 of 141 GB used (2%) #1!",
                f"Nothing to do on {gpu}.", evidence={"gpu": gpu}, hint="NVML (GPM)")
    result = RunResult("2026-01-01T00:00:00+00:00", 5.0, 5.0, False, "host", {"vllm_url": None, "launch_cmd": None},
                       (f,), (f"Sampled {gpu}",))
    md = report.to_markdown(result)
    assert "\\(" not in md and "\\)" not in md and "\\#" not in md and "\\!" not in md and "\\." not in md
    assert md.count(gpu) >= 5  # title, verdict, remedy, evidence, note: all as written
    # Rendered, the text reads as written; hostile text still renders as neither link, image nor HTML.
    renderer = MarkdownIt("commonmark").enable("table")
    assert f"{gpu}: 3.5 of 141 GB used (2%) #1!" in renderer.render(md)
    hostile = renderer.render(report.to_markdown(hostile_result()))
    assert "<a " not in hostile and "<img" not in hostile and "<script" not in hostile
    assert "[click](javascript:alert(1))" in hostile
    # "#" makes a heading only at the start of a line
    assert report.markdown_safe("# not a heading\n  #2 nor this") == "\\# not a heading\n  \\#2 nor this"


def test_run_without_plotly_writes_every_report(tmp_path):
    # A host without plotly: the checklist still runs and writes all three reports (the HTML charts are SVG).
    import os
    import subprocess
    import sys
    from pathlib import Path

    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['plotly'] = None  # import plotly fails\n")
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim), str(root)]),
           "TRIAGE_DB": str(tmp_path / "history.sqlite")}
    probe = subprocess.run([sys.executable, "-c", "import plotly"], env=env, capture_output=True, text=True)
    assert probe.returncode != 0  # the shim works: plotly cannot be imported
    out = tmp_path / "reports"
    proc = subprocess.run([sys.executable, "-m", "diagnostics", "run", "--duration", "1", "--report-dir", str(out),
                           "--json"], cwd=root, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["findings"]
    written = sorted(p.suffix for p in out.iterdir())
    assert written == [".html", ".json", ".md"]
    assert "not written" not in proc.stderr
    assert "No module named" not in proc.stderr and "error:" not in proc.stderr


def test_html_of_the_longest_window_on_eight_gpus_stays_small():
    """180 s at 10 Hz on 8 GPUs, three such charts: the lines are thinned to what a 760 px chart can show (lowest and
    highest reading per 2 px, spikes kept), so the report stays far under 500 kB."""
    import dataclasses
    import re as _re

    from diagnostics.charts import svg

    t = tuple(i / 10 for i in range(1800))
    big = Chart("GPU utilization", tuple(Series(f"GPU {g}", "%", "NVML", t, tuple(float((i * 7 + g) % 100) for i in
                                                                                  range(1800))) for g in range(8)),
                "%", ((70.0, "idle"),), (0.0, 105.0))
    base = hostile_result()
    spiky = dataclasses.replace(base.findings[0], charts=(big, big, big))
    page = report.to_html(dataclasses.replace(base, findings=(spiky, *base.findings[1:])))
    assert len(page.encode()) < 500_000
    one = Chart("spike", (Series("s", "%", "NVML", t, tuple(100.0 if i == 900 else 1.0 for i in range(1800))),), "%")
    ys = [float(y) for y in _re.findall(r",([0-9.]+)", svg(one).split("<polyline")[1].split('"/>')[0])]
    assert min(ys) < 40  # the one 100% reading out of 1800 is still drawn (the y axis grows downward)
    labels = _re.findall(r'text-anchor="end" fill="#555">([^<]+)<', svg(Chart("mem", (Series("m", "GiB", "psutil",
                                                                                     (0.0, 1.0), (124.25, 124.36)),),
                                                                              "GiB")))
    assert len(labels) == len(set(labels)) > 2  # narrow ranges keep their decimals: no "124, 124, 124"
