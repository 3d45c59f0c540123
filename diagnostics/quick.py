"""A first answer about a vLLM server within seconds: its cumulative counters since it started plus a short window of
scrapes, judged by the checklist's own vLLM checks. The full window (`run --duration`) then refines it.

The anatomy checks see the server's whole life as one window (a baseline of zeros at its start, read from
process_start_time_seconds), so a server that has been queueing or prefilling for an hour says so at once; the KV
cache check sees the short window's scrapes.
"""
from __future__ import annotations

import dataclasses
import time

from diagnostics.context import CheckContext
from diagnostics.findings import Finding

QUICK_WINDOW_S = 5.0
SCRAPE_EVERY_S = 1.0
QUICK_CHECKS = ("vllm.metrics_off", "vllm.kv_pressure", "vllm.saturation", "vllm.prefill")


def first_answer(vllm_url: str, window_s: float = QUICK_WINDOW_S,
                 launch_cmd: str | None = None) -> tuple[list[Finding], str]:
    """(findings of QUICK_CHECKS, a line saying what they were judged on). Raises TriageError when /metrics cannot
    be read at all (the caller says so and goes on to the full window)."""
    from core.telemetry.vllm_metrics import scrape
    from diagnostics.collect import vllm_base_url

    url = vllm_base_url(vllm_url)
    t0 = time.monotonic()
    snaps = []
    while True:
        s = scrape(url, timeout_s=5.0)
        snaps.append(dataclasses.replace(s, t=s.t - t0))
        if time.monotonic() - t0 + SCRAPE_EVERY_S > window_s:
            break
        time.sleep(SCRAPE_EVERY_S)
    return judge(snaps, time.time(), url, launch_cmd)


def judge(snaps: list, now: float, url: str, launch_cmd: str | None = None) -> tuple[list[Finding], str]:
    """The QUICK_CHECKS over scrapes (t relative to the first) taken up to the Unix time `now`: a baseline of zero
    counters at the server's start goes first where the server says when it started."""
    from core.telemetry.vllm_metrics import VllmSnapshot
    from diagnostics.registry import all_checks
    from diagnostics.runner import evaluate

    last = snaps[-1]
    uptime = now - last.process_start_time_s if last.process_start_time_s else None
    if uptime and uptime > 0 and last.has_vllm_series:
        base = VllmSnapshot(t=last.t - uptime, has_vllm_series=True)  # zero counters at the server's start
        judged = f"the server's counters since it started {uptime / 60:.1f} min ago, and a {last.t:.0f} s window"
        snaps = [base, *snaps]
    else:
        judged = f"a {last.t:.0f} s window (the server publishes no start time to count from)"
    ctx = CheckContext(window_s=round(last.t - snaps[0].t, 3), vllm_url=url, vllm_snapshots=tuple(snaps),
                       vllm_scrapes=len(snaps), launch_cmd=launch_cmd,
                       vllm_liveness_reason="not looked at in the first answer")
    checks = [c for c in all_checks() if c.id in QUICK_CHECKS]
    return evaluate(ctx, checks), judged


def format_first_answer(findings: list[Finding], judged: str, took_s: float) -> str:
    lines = [f"First answer in {took_s:.1f} s, from {judged}:"]
    for f in findings:
        lines.append(f"  {f.status.value.upper():5} {f.check_id}: {f.verdict or f.missing}")
    lines.append("Refining over the full window...")
    return "\n".join(lines)
