"""Host checks: is MemAvailable falling steadily? A leak is a trend over the window, not one low reading."""
from __future__ import annotations

from dataclasses import dataclass, field

from core.fmt import GIB
from core.stats import linear_fit
from diagnostics.context import CheckContext, Series
from diagnostics.findings import Chart, Check, Outcome, Severity, fail, passed, skip, warn

MIB = 1024**2
LEAK_MIB_PER_MIN = 10.0  # slower declines are noise from page cache and allocator churn at this window length
STEADY_R2 = 0.8  # the line explains >= 80% of the variance: a steady decline
TREND_R2 = 0.5  # a decline, but noisy
URGENT_MIN = 60.0  # MemAvailable reaches zero within an hour at this rate: act now
MIN_READINGS = 5
MIN_SPAN_S = 2.0
SHORT_WINDOW_S = 30.0
DIP_MIB = 64  # a dip this deep that recovers is worth naming, so nobody reads it as a leak
SHOW = 5  # processes named per part in a verdict; the evidence lists 20


def decide_mem_leak(ctx: CheckContext) -> Outcome:
    s = ctx.host_mem_available
    if s is None:
        return skip(f"host memory: {ctx.host_reason}")
    pts = s.points()
    span = pts[-1][0] - pts[0][0] if pts else 0.0
    if len(pts) < MIN_READINGS or span < MIN_SPAN_S:
        return skip(f"enough host memory readings: need {MIN_READINGS} over {MIN_SPAN_S:.0f} s, "
                    f"got {len(pts)} over {span:.1f} s")
    fit = linear_fit(pts)
    per_min_mib = fit.slope * 60 / MIB
    values = [v for _, v in pts]
    end = fit.at(pts[-1][0])
    evidence = {
        "slope_mib_per_min": round(per_min_mib, 2),
        "r2": round(fit.r2, 3),
        "available_start_bytes": values[0],
        "available_end_bytes": values[-1],
        "available_min_bytes": min(values),
        "readings": len(pts),
        "span_s": round(span, 1),
    }
    if ctx.host_mem_total_bytes:
        evidence["total_bytes"] = ctx.host_mem_total_bytes
    to_gib = lambda v: v / GIB  # noqa: E731  charts read better in GiB than in raw bytes
    fitted = Series("linear fit", "GiB", "least squares", (pts[0][0], pts[-1][0]),
                    (to_gib(fit.at(pts[0][0])), to_gib(end)))
    avail = Series("MemAvailable", "GiB", s.source, tuple(t for t, _ in pts), tuple(to_gib(v) for v in values))
    charts = (Chart("Host MemAvailable", (avail, fitted), "GiB"),)
    short = (f" A {span:.0f} s window only shows fast leaks; run 60-180 s for slow ones."
             if span < SHORT_WINDOW_S else "")
    falling = per_min_mib <= -LEAK_MIB_PER_MIN
    who = attribute(ctx, span)
    evidence.update(who.evidence)
    if not falling or fit.r2 < TREND_R2:
        dip = min(values[0], values[-1]) - min(values)
        low = _dip(ctx, dip) if dip >= DIP_MIB * MIB else ""
        return passed(f"No steady decline of MemAvailable: {per_min_mib:+.1f} MiB/min, R² {fit.r2:.2f} over "
                      f"{span:.0f} s.{low}{short}{who.grew_note if who.named else ''}", evidence=evidence, charts=charts)
    trend = f"MemAvailable falls {-per_min_mib:.0f} MiB/min (R² {fit.r2:.2f} over {span:.0f} s)"
    if who.elsewhere:
        return passed(f"{trend}, but not from the deployment under test: {who.elsewhere}", evidence=evidence,
                      charts=charts)
    return _decline(trend, fit, end, span, short, who, evidence, charts)


def _dip(ctx: CheckContext, dip: float) -> str:
    """What a dip that MemAvailable rose back from was: one low reading, unless processes that are still running
    kept what they grew by (memory another process freed, a server that exited, made up for it: the growth is
    hidden, not gone)."""
    if ctx.host_growth is None:
        return (f" MemAvailable dipped {dip / MIB:.0f} MiB and rose again; without the processes' memory "
                f"({ctx.host_growth_reason}) a low reading cannot be told from growth that memory freed elsewhere "
                "made up for.")
    held = [g for g in ctx.host_growth if not g.exited and g.growth >= DIP_MIB * MIB]
    kept = sum(g.growth for g in held)
    if kept < dip / 2:
        return f" A dip of {dip / MIB:.0f} MiB came back: a low reading, not a leak."
    return (f" MemAvailable dipped {dip / MIB:.0f} MiB and rose again, but not because that memory came back: "
            f"{len(held)} running process{'es' if len(held) > 1 else ''} kept the {kept / MIB:.0f} MiB "
            f"{'they' if len(held) > 1 else 'it'} grew by (named below), and memory freed elsewhere (a process that "
            "exited) made up for it. "
            "Watch that growth over a longer window.")


REMEDY = ("Find the process whose RSS grows (`ps -o pid,rss,cmd --sort=-rss | head`, or psutil): usually the client's "
          "or server's tokenizer / data loader keeping references (caches keyed by request, lists of outputs). "
          "Restarting it buys time; a heap profile (tracemalloc, memray) of that process finds the owner.")


def _decline(trend: str, fit, end: float, span: float, short: str, who: "Attribution", evidence: dict,
             charts: tuple) -> Outcome:
    """A steady or noisy fall the deployment's own processes may explain: warn, or fail when it is fast and steady."""
    remedy = (f"The processes that grew: {who.named}. " if who.named else "") + REMEDY
    trend += who.grew_note
    # A process starting up or loading a model falls just as steadily as a leak for seconds on end: extrapolating a
    # short window to "minutes to exhaustion" reads a load as a leak, so under 30 s no such number is given.
    if span < SHORT_WINDOW_S:
        return warn(f"{trend}; but {span:.0f} s is too short to tell a leak from a load (a process starting up or "
                    f"loading a model falls just as steadily), so no time to exhaustion is estimated.{short}",
                    remedy, evidence=evidence, charts=charts)
    minutes_left = end / (-fit.slope * 60) if fit.slope < 0 else float("inf")
    evidence["minutes_to_exhaustion"] = round(minutes_left, 1)
    if fit.r2 >= STEADY_R2 and minutes_left < URGENT_MIN:
        return fail(f"{trend}: a steady leak; at this rate host memory runs out in about {minutes_left:.0f} min.",
                    remedy, evidence=evidence, charts=charts)
    if fit.r2 >= STEADY_R2:
        return warn(f"{trend}: a steady decline, about {minutes_left:.0f} min from exhaustion at this rate; a "
                    "leak if it keeps going.", remedy, evidence=evidence, charts=charts)
    return warn(f"{trend}: falling, but noisily; watch it over a longer window.", remedy,
                evidence=evidence, charts=charts)


@dataclass(frozen=True)
class Attribution:
    """Whose resident memory grew over the window, split into the deployment (the server under test and the
    console) and the rest of the host."""

    named: str = ""  # who grew, largest first, by part: "server under test: ...; console: ...; other: ..."
    grew_note: str = ""  # a sentence naming them, for a verdict
    elsewhere: str = ""  # set when the fall is not the deployment's: why, naming who grew instead
    evidence: dict = field(default_factory=dict)


def attribute(ctx: CheckContext, span_s: float) -> Attribution:
    growth = ctx.host_growth
    if growth is None:
        return Attribution(grew_note=f" Which process grew is not known ({ctx.host_growth_reason}).",
                           evidence={"process_growth": f"not read: {ctx.host_growth_reason}"})
    parts = {"server under test": [g for g in growth if g.pid in ctx.server_pids],
             "console": [g for g in growth if g.pid in ctx.console_pids and g.pid not in ctx.server_pids]}
    parts["other"] = [g for g in growth if g.pid not in ctx.server_pids and g.pid not in ctx.console_pids]
    named = "; ".join(f"{part}: " + ", ".join(g.describe() for g in rows[:SHOW])
                      for part, rows in parts.items() if rows)
    evidence = {"process_growth_mib": {f"{g.name} (pid {g.pid})": round(g.growth / MIB, 1) for g in growth[:20]},
                "server_pids": sorted(ctx.server_pids), "console_pids": sorted(ctx.console_pids)}
    own = sum(max(0, g.growth) for part in ("server under test", "console") for g in parts[part])
    evidence["deployment_growth_mib"] = round(own / MIB, 1)
    note = f" Grew over the window: {named}." if named else " No process's resident memory grew by 32 MiB or more."
    # The deployment leaks when its own processes grow at the leak rate; with a server under test named (--vllm-url),
    # a fall that its processes and the console's do not explain is another process's, never the deployment's.
    own_rate = own / MIB / max(span_s, 1e-9) * 60
    elsewhere = ""
    if ctx.vllm_url and own_rate < LEAK_MIB_PER_MIN:
        who = ("the server under test's processes and the console's grew" if ctx.server_pids else
               "the console's processes grew (the server under test is not on this host)")
        elsewhere = (f"{who} {own / MIB:+.0f} MiB in all.{note} Another process starting up, installing or loading "
                     "a model takes memory from the host, not from this deployment.")
    return Attribution(named, note, elsewhere, evidence)


CHECKS = (
    Check("host.mem_leak", "Host memory leak", Severity.HIGH,
          f"MemAvailable falls steadily: regression slope <= -{LEAK_MIB_PER_MIN:.0f} MiB/min with R² >= {TREND_R2}",
          decide_mem_leak),
)
