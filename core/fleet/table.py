"""The fleet table as rows of text, shared by the page and the CLI: one row per replica, worst first.

A cell is "N/A" where the column's series is absent (no GPU exporter, no histogram observations in the window, an old
vLLM without the per-phase histograms); an outlier's cell (median/MAD, see core/fleet/fleet.py) is marked "▲" with
its ratio to the fleet median. A quantile is shown as the histogram bucket it fell in, never as an interpolated point
that can stand above every request in it; TTFT, e2e, queue, prefill and decode are exact means (_sum / _count), the
phases with their share of the mean end-to-end latency.
"""
from __future__ import annotations

from core.fleet.fleet import MEANS, FleetSnapshot, Replica, instant_text, ratio_floor
from core.fleet.promql import PEER_MIN_FINISHED
from core.fmt import fmt_bytes, fmt_s, fmt_times
from core.telemetry.nvml import decode_throttle


def _pct(v: float | None) -> str:
    return "N/A" if v is None else f"{100 * v:.0f}%"


def _num(v: float | None, digits: int = 1) -> str:
    return "N/A" if v is None else f"{v:,.{digits}f}"


# (key, header, format); keys are Replica.value() columns
COLUMNS = (
    ("running", "running", lambda v: _num(v, 0)),
    ("waiting", "waiting", lambda v: _num(v, 0)),
    ("waiting_capacity", "waiting (capacity)", lambda v: _num(v, 0)),
    ("kv", "KV cache", _pct),
    ("preemptions_s", "preempt/s", lambda v: _num(v, 2)),
    ("ttft_mean_s", "TTFT mean", fmt_s),
    ("e2e_mean_s", "e2e mean", fmt_s),
    ("ttft_p50_s", "TTFT p50", fmt_s),
    ("ttft_p99_s", "TTFT p99", fmt_s),
    ("queue_mean_s", "queue", fmt_s),
    ("prefill_mean_s", "prefill", fmt_s),
    ("decode_mean_s", "decode", fmt_s),
    ("queue_share_ttft", "queue/TTFT", _pct),
    ("itl_p50_s", "ITL p50", fmt_s),
    ("itl_p99_s", "ITL p99", fmt_s),
    ("prompt_tok_s", "prompt tok/s", _num),
    ("generation_tok_s", "gen tok/s", _num),
    ("prefix_hit_rate", "prefix hit", _pct),
)
GPU_COLUMNS = (
    ("gpu_util_pct", "GPU util", lambda v: "N/A" if v is None else f"{v:.0f}%"),
    ("dram_bw_pct", "DRAM BW", lambda v: "N/A" if v is None else f"{v:.0f}%"),
    ("fb_used_bytes", "GPU mem used", fmt_bytes),
    ("fb_free_bytes", "GPU mem free", fmt_bytes),
    ("xid", "XID", lambda v: "N/A" if v is None else f"{v:.0f}"),
    ("clock_events", "clock events", lambda v: "N/A" if v is None else decode_throttle(int(v)) or "none"),
)


HELP = {
    "golden set": "The quality watch's last round on this replica (`golden watch --metrics-port`, scraped by this "
                  "Prometheus): its status against the golden set with the compare's bands, the share of positions "
                  "with the golden top token, and drift when it moved beyond the noise floor since its last round.",
    "state": "DOWN: its last scrape failed. STALLED: no token, prompt token or finished request over the stall "
             "window while its running + waiting gauges showed work all along (a stopped engine freezes them; /health "
             "still answers 200), with how long nothing moved. silent: no progress and no work shown while the "
             f"fleet's median replica finished {PEER_MIN_FINISHED}+ requests. An idle replica (no requests) is up, "
             "never stalled.",
    "TTFT mean": "Exact mean time to first token over the window: rate of _sum over rate of _count.",
    "e2e mean": "Exact mean end-to-end latency over the window: rate of _sum over rate of _count.",
    "TTFT p99": "The histogram bucket histogram_quantile answered from over the window: the quantile lies somewhere "
                "inside it (a point value is interpolated and can stand far above the slowest request), so two "
                "replicas in the same bucket cannot be told apart by it. The means are exact.",
    "TTFT p50": "The histogram bucket the median time to first token fell in (see TTFT p99).",
    "ITL p50": "The histogram bucket the median inter-token latency fell in (see TTFT p99).",
    "ITL p99": "The histogram bucket the p99 inter-token latency fell in (see TTFT p99).",
    "queue": "Mean time waiting to be scheduled (vllm:request_queue_time_seconds); in brackets its share of the mean "
             "end-to-end latency.",
    "prefill": "Mean time from scheduling to the first token (vllm:request_prefill_time_seconds); share of e2e.",
    "decode": "Mean time from the first to the last token (vllm:request_decode_time_seconds); share of e2e.",
    "queue/TTFT": "Mean queue time over mean TTFT: 50%+ with room in the KV cache is a capacity-bound replica.",
    "waiting (capacity)": "vllm:num_requests_waiting_by_reason{reason=\"capacity\"}: requests waiting for a "
                          "scheduling slot now.",
}


def bucket_text(b: list) -> str:
    """A histogram bucket as a cell: '20-40 s', '10-20 ms', 'above 40 s'."""
    lo, hi = b
    if hi is None:
        return f"above {1000 * lo:g} ms" if lo < 1 else f"above {lo:g} s"
    if hi < 1:
        return f"{1000 * lo:g}-{1000 * hi:g} ms"
    return f"{lo:g}-{hi:g} s"


def _cell(r: Replica, key: str, fmt) -> str:
    """A quantile is shown as the bucket it fell in, never as the interpolated point (which can stand above every
    request the bucket holds); a phase's mean carries its share of the end-to-end latency."""
    v = r.value(key)
    if v is not None and r.buckets.get(key):
        return bucket_text(r.buckets[key])
    cell = fmt(v)
    share = r.values.get(key.replace("_mean_s", "_share_e2e")) if key.endswith("_mean_s") else None
    return cell + (f" ({100 * share:.0f}% of e2e)" if v is not None and share is not None else "")


def state(r: Replica) -> str:
    """DOWN (scrape failing), STALLED (no progress with requests in flight), silent (no progress while the fleet
    serves), up, or ? (not in /api/v1/targets)."""
    if r.up is False:
        return "DOWN"
    if r.values.get("stalled") is not None:
        return "STALLED"
    if r.values.get("silent") is not None:
        return "silent"
    return {True: "up", None: "?"}[r.up]


def _stalled_for(snap: FleetSnapshot, r: Replica) -> str:
    if snap.stalled(r) is None:
        return ""
    seconds, more = snap.no_progress_s(r)
    return f" ({'>' if more else '~'}{seconds:.0f} s)"


def worst_first(snap: FleetSnapshot) -> list[Replica]:
    """Down first, then stalled, then silent, then outliers in an exact mean (highest z first), then outliers in a
    quantile, then by mean TTFT (what users waited on average) and p99 TTFT."""
    def z_of(r: Replica, means: bool) -> float:
        return max((float("inf") if z is None else z for c, z in r.outliers.items() if (c in MEANS) == means),
                   default=0.0)

    def key(r: Replica):
        return (r.up is not False, r.values.get("stalled") is None, r.values.get("silent") is None, -z_of(r, True),
                -z_of(r, False), -(r.values.get("ttft_mean_s") or 0.0), -(r.values.get("ttft_p99_s") or 0.0), r.name)
    return sorted(snap.replicas, key=key)


def golden_cell(r: Replica) -> str:
    """The quality watch's last round for the replica: "fine, 99.8% same top", "drift: watch, 96.9% same top"."""
    g = r.golden
    if not g:
        return "not watched"
    same = g.get("same_top_ratio")
    text = g.get("status", "?") + ("" if same is None or g.get("status") in ("no answer", "refused") else
                                   f", {100 * same:.1f}% same top")
    many = f" (the worst of {g['watches']} golden sets or watches)" if g.get("watches") else ""
    return ("drift: " if g.get("drift") else "") + text + many


def rows(snap: FleetSnapshot, with_gpu: bool | None = None) -> list[dict[str, str]]:
    gpu = any(r.gpu.get("gpu_util_pct") is not None or r.gpu.get("dram_bw_pct") is not None
              for r in snap.replicas) if with_gpu is None else with_gpu
    errors = any(r.last_error for r in snap.replicas)
    golden = any(r.golden for r in snap.replicas)
    out = []
    for r in worst_first(snap):
        row = {snap.replica_label: r.name, "state": state(r) + _stalled_for(snap, r),
               "last scrape": "N/A" if r.last_scrape_age_s is None else f"{r.last_scrape_age_s:.0f} s ago"}
        if errors:
            row["last error"] = r.last_error
        if golden:
            row["golden set"] = golden_cell(r)
        for key, header, fmt in COLUMNS + (GPU_COLUMNS if gpu else ()):
            cell = _cell(r, key, fmt)
            med, v = snap.fleet_median.get(key), r.value(key)
            if key in r.outliers and v is not None:
                # the ratio to the median reads better than a z-score; none against a median of next to nothing
                times = fmt_times(v, med, ratio_floor(key))
                cell += f" ▲{times}" if times else " ▲"
            row[header] = cell
        out.append(row)
    return out


def as_text(snap: FleetSnapshot, limit: int = 50) -> str:
    """A fixed-width table for the terminal: the worst `limit` replicas."""
    table = rows(snap)[:limit]
    if not table:
        return "(no replicas)"
    headers = list(table[0])
    widths = {h: max(len(h), *(len(r[h]) for r in table)) for h in headers}
    lines = ["  ".join(h.ljust(widths[h]) for h in headers)]
    lines += ["  ".join(r[h].ljust(widths[h]) for h in headers) for r in table]
    more = len(snap.replicas) - len(table)
    return "\n".join(lines) + (f"\n... and {more} more replicas (use --json for all)" if more > 0 else "")


def header_line(snap: FleetSnapshot) -> str:
    when = instant_text(snap.t)
    when = f"as it stood at {when} (a past instant)" if snap.at is not None else when
    down = sum(r.up is False for r in snap.replicas)
    return (f"{len(snap.replicas)} replicas ({down} down) by {snap.replica_label} at {snap.prometheus_url}, "
            f"window {snap.window}, {when}; {snap.cost.requests} requests to Prometheus in {snap.elapsed_s:.2f} s")
