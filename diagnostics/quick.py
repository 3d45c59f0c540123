"""A first answer about a vLLM server within seconds, that says what it rests on: the server's cumulative counters
since it started, and a short window of scrapes on its own, each judged by the checklist's own vLLM checks. The full
window (`run --duration`) then refines it, and a first answer it disagrees with is revised in words.

The lifetime verdict sees the server's whole life as one window (a baseline of zeros at its start, read from
process_start_time_seconds): a server that has been queueing or prefilling for an hour says so at once, and so does
one whose earlier workload was unlike today's. It is said as "since the server started (N min ago, M requests)",
beside what the short window alone shows, so the past is never read as now.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

from diagnostics.context import CheckContext
from diagnostics.findings import Finding, Status

QUICK_WINDOW_S = 5.0
SCRAPE_EVERY_S = 1.0
QUICK_CHECKS = ("vllm.metrics_off", "vllm.kv_pressure", "vllm.saturation", "vllm.prefill")
# A check of a gauge's peak has no reading since the start: only the window's scrapes saw the gauge, and a lifetime
# line saying "KV cache usage peaked at 0%" after an hour of full caches would be false. The window alone says it.
WINDOW_ONLY = ("vllm.kv_pressure",)
_JUDGED = (Status.PASS, Status.WARN, Status.FAIL)  # a verdict; SKIP and ERROR decide nothing to revise


@dataclass(frozen=True)
class FirstAnswer:
    lifetime: tuple[Finding, ...]  # since the server started; empty where it publishes no start time
    window: tuple[Finding, ...]  # over the short window alone
    window_s: float
    uptime_s: float | None = None
    lifetime_requests: float | None = None  # requests finished since the start (its e2e histogram's count)

    @property
    def since(self) -> str:
        """'since the server started (14.9 min ago, 161 requests)'."""
        if self.uptime_s is None:
            return "since the server started (its start time unknown)"
        n = "" if self.lifetime_requests is None else f", {self.lifetime_requests:.0f} requests"
        return f"since the server started ({self.uptime_s / 60:.1f} min ago{n})"

    def first(self, check_id: str) -> tuple[Finding, str] | None:
        """The finding the first answer leads with for a check, and what it rests on."""
        for findings, basis in ((self.lifetime, self.since), (self.window, f"over the first {self.window_s:.0f} s "
                                                                             "window")):
            f = next((f for f in findings if f.check_id == check_id), None)
            if f is not None and f.status in _JUDGED:
                return f, basis
        return None


def first_answer(vllm_url: str, window_s: float = QUICK_WINDOW_S, launch_cmd: str | None = None) -> FirstAnswer:
    """The QUICK_CHECKS since the server started and over a short window. Raises TriageError when /metrics cannot
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


def judge(snaps: list, now: float, url: str, launch_cmd: str | None = None) -> FirstAnswer:
    """The QUICK_CHECKS over scrapes (t relative to the first) taken up to the Unix time `now`: once over the scrapes
    alone, and once from a baseline of zero counters at the server's start where the server says when it started."""
    from core.telemetry.vllm_metrics import VllmSnapshot
    from diagnostics.registry import all_checks
    from diagnostics.runner import evaluate

    checks = [c for c in all_checks() if c.id in QUICK_CHECKS]

    def over(series: list, judged: list) -> tuple[Finding, ...]:
        ctx = CheckContext(window_s=round(series[-1].t - series[0].t, 3), vllm_url=url, vllm_snapshots=tuple(series),
                           vllm_scrapes=len(series), launch_cmd=launch_cmd,
                           vllm_liveness_reason="not looked at in the first answer")
        return tuple(evaluate(ctx, judged))

    last = snaps[-1]
    window = over(snaps, checks)
    uptime = now - last.process_start_time_s if last.process_start_time_s else None
    if not (uptime and uptime > 0 and last.has_vllm_series):
        return FirstAnswer((), window, last.t - snaps[0].t)
    base = VllmSnapshot(t=last.t - uptime, has_vllm_series=True)  # zero counters at the server's start
    e2e = last.histograms.get("e2e")
    lifetime = over([base, *snaps], [c for c in checks if c.id not in WINDOW_ONLY])
    return FirstAnswer(lifetime, window, last.t - snaps[0].t, uptime, e2e.count if e2e else None)


def _said(f: Finding) -> str:
    return f"{f.status.value.upper()} {f.verdict or f.missing}"


def format_first_answer(answer: FirstAnswer, took_s: float) -> str:
    lines = [f"First answer in {took_s:.1f} s: each check {answer.since}, then over the "
             f"{answer.window_s:.0f} s window alone."]
    if not answer.lifetime:
        lines[0] = (f"First answer in {took_s:.1f} s, over a {answer.window_s:.0f} s window only (the server "
                    "publishes no start time to count from).")
    for f in answer.window:
        life = next((x for x in answer.lifetime if x.check_id == f.check_id), None)
        if life is not None:
            lines.append(f"  {life.status.value.upper():5} {f.check_id} {answer.since}: {life.verdict or life.missing}")
            lines.append(f"        the {answer.window_s:.0f} s window alone: {_said(f)}")
        else:
            lines.append(f"  {f.status.value.upper():5} {f.check_id}: {f.verdict or f.missing}")
    lines.append("Refining over the full window; a first answer it disagrees with is revised.")
    return "\n".join(lines)


def revisions(answer: FirstAnswer, full: list[Finding] | tuple[Finding, ...], full_window_s: float) -> list[str]:
    """'revised: ...' for each check whose full-window verdict disagrees with the first answer, with both."""
    out = []
    for f in full:
        first = answer.first(f.check_id)
        if first is None or f.status not in _JUDGED or f.status == first[0].status:
            continue
        out.append(f"revised: {f.check_id}: {first[1]} it read {_said(first[0])} Over the {full_window_s:.0f} s "
                   f"window it reads {_said(f)}")
    return out
