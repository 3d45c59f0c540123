"""The checklist over a fleet, from Prometheus: the single-server checks' ids, decided per replica from PromQL over
the window, plus what only a fleet shows (a replica down, one much slower than its peers, load unevenly spread, XID
errors). Each check decides on a FleetSnapshot (core/fleet) and names the replicas it flags; its evidence carries
the PromQL its numbers came from, so a user can paste it into their own Prometheus or Grafana.
"""
from __future__ import annotations

from typing import Callable

from core.fleet.fleet import FleetSnapshot, Replica, ratio_floor
from core.fleet.promql import PEER_MIN_FINISHED, host_of
from core.fleet.table import bucket_text, golden_cell
from core.fmt import fmt_s, fmt_share, fmt_times
from core.stats import median
from core.telemetry.base import ASSUMED_ACHIEVABLE_DRAM_BW_PCT, BW_BOUND_SHARE, BW_LIKELY_SHARE, GPU_IDLE_UTIL_PCT
from core.deployment.remedies import Facts, remedies
from core.deployment.server_config import ServerConfig
from core.telemetry.vllm_anatomy import (KV_ROOM, QUEUE_SHARE_SATURATED, SATURATION_REMEDY, busy_prefilling,
                                         prefill_judgement, saturation_reason)
from diagnostics.checks.vllm import KV_FULL, KV_HIGH
from diagnostics.findings import Check, Outcome, Severity, fail, passed, skip, warn

SLOW_RATIO = 2.0  # p99 latency at least this many times the fleet median, and a robust outlier: "much slower"
IMBALANCE_RATIO = 3.0  # a replica with this many times (or 1/this) the median token rate: badly balanced
SHOW = 10  # replicas named in a verdict; the evidence lists them all
TOKENS_FLOOR = 1.0  # tokens/s: a median replica this idle gives no ratio worth saying (the rates are said instead)


def _names(rows: list[Replica]) -> str:
    names = ", ".join(r.name or "(no label)" for r in rows[:SHOW])
    return names + (f" and {len(rows) - SHOW} more" if len(rows) > SHOW else "")


def _promql(snap: FleetSnapshot, *cols: str) -> str:
    return "\n".join(snap.promql[c] for c in cols if c in snap.promql)


def _evidence(snap: FleetSnapshot, rows: list[Replica], cols: tuple[str, ...], *promql_cols: str) -> dict:
    ev = {"replicas_checked": len(snap.replicas), "window": snap.window,
          "promql": _promql(snap, *(promql_cols or cols))}
    for r in rows[:50]:
        for c in cols:
            v = r.value(c)
            ev[f"{r.name} {c}"] = None if v is None else round(v, 4)
    return ev


def _verdict(flagged: list, problem: Callable[..., Outcome], found: str, remedy: str, clean: str,
             evidence: dict) -> Outcome:
    """How a check that flags replicas (or targets) ends: `problem` (fail or warn) with what was found and what to
    do when it flagged any, else passed with `clean`; the evidence either way."""
    return problem(found, remedy, evidence=evidence) if flagged else passed(clean, evidence=evidence)


def decide_down(snap: FleetSnapshot) -> Outcome:
    known = [r for r in snap.replicas if r.up is not None]
    if not known:
        return skip("scrape health: none of the replicas' targets is in /api/v1/targets (data federated or "
                    "remote-written into this Prometheus)")
    down = [r for r in known if not r.up]
    ev = {"replicas_checked": len(known), "down": [r.name for r in down],
          "last_errors": {r.name: r.last_error for r in down if r.last_error}, "source": "/api/v1/targets"}
    return _verdict(
        down, fail, found=f"{len(down)} of {len(known)} replicas are down (their last scrape failed): {_names(down)}.",
        remedy="Look at the last scrape error of each (Prometheus Status > Targets): refused means the server is not "
               "running; a timeout means it is hung or overloaded. Restart it or take it out of the load balancer.",
        clean=f"All {len(known)} replicas answered their last scrape.", evidence=ev)


def decide_metrics_off(snap: FleetSnapshot) -> Outcome:
    off = snap.no_stats_targets
    ev = {"targets_without_vllm_series": off, "promql": snap.promql.get("members", "")}
    names = ", ".join(t["instance"] for t in off[:SHOW])
    return _verdict(
        off, fail, found=f"{len(off)} healthy target(s) in the vLLM scrape jobs export no vllm:* series: {names}. "
                         "They were started with --disable-log-stats, so the fleet view cannot see them.",
        remedy="Restart them without --disable-log-stats (the stats cost next to nothing; vllm#11987).",
        clean="Every healthy target of the vLLM scrape jobs exports vllm:* series.", evidence=ev)


def decide_kv_pressure(snap: FleetSnapshot) -> Outcome:
    rows = [r for r in snap.replicas if r.values.get("kv_peak") is not None]
    if not rows:
        return skip("KV cache usage: no vllm:kv_cache_usage_perc (or gpu_cache_usage_perc) series")
    window = snap.window_s
    pre = {r.name: (r.values.get("preemptions_s") or 0.0) * window for r in rows}
    full = [r for r in rows if r.values["kv_peak"] >= KV_FULL and pre[r.name] > 0]
    preempting = [r for r in rows if pre[r.name] > 0 and r not in full]
    high = [r for r in rows if r.values["kv_peak"] >= KV_HIGH and r not in full and r not in preempting]
    ev = _evidence(snap, full + preempting + high, ("kv_peak", "preemptions_s"))
    remedy = ("Give the KV cache more room or ask less of it on those replicas: --kv-cache-dtype fp8, a higher "
              "--gpu-memory-utilization, a lower --max-num-seqs or --max-model-len, or more GPUs; preempted requests "
              "are recomputed, which shows up as TTFT and inter-token latency spikes.")
    if full:
        return fail(f"KV cache at {100 * KV_FULL:.0f}%+ with preemptions during {snap.over()}: "
                    f"{_names(full)}.", remedy, evidence=ev)
    if preempting:
        return warn(f"Preemptions during {snap.over()}: {_names(preempting)}.", remedy, evidence=ev)
    if high:
        return warn(f"KV cache usage peaked at {100 * KV_HIGH:.0f}%+ without preemptions: {_names(high)}.", remedy,
                    evidence=ev)
    peak = max(r.values["kv_peak"] for r in rows)
    return passed(f"KV cache usage peaked at {fmt_share(peak)} on the fullest of {len(rows)} replicas, with no "
                  f"preemptions in {snap.over()}.", evidence=ev)


def _no_gpu_match(snap: FleetSnapshot, what: str, names: str, run: str) -> Outcome:
    """Why a GPU check has nothing to judge: no GPU exporter at all (run one), or one that is scraped but whose
    hosts (or pods) are not the replicas' (running another would not help)."""
    if not snap.gpu_keys:
        return skip(f"{what}: no {names} series in this Prometheus ({run}, and let Prometheus scrape it)")
    key = "pod" if snap.replica_label == "pod" else "host"
    mine = sorted({r.name if key == "pod" else host_of(i) for r in snap.replicas for i in (r.instances or [r.name])})
    return skip(f"{what}: {snap.gpu_source or 'a GPU exporter'} is scraped, but none of its {key}s "
                f"({', '.join(snap.gpu_keys[:5])}) is a replica's ({', '.join(mine[:5])}). The GPU series are matched "
                f"to replicas by {key}: relabel the exporter's instance (or the vLLM targets') to the same host name, "
                "or use --replica-label pod where both carry pod")


def decide_gpu_idle(snap: FleetSnapshot) -> Outcome:
    rows = [r for r in snap.replicas if r.gpu.get("gpu_util_pct") is not None]
    if not rows:
        return _no_gpu_match(snap, "GPU utilization", "DCGM_FI_DEV_GPU_UTIL or triage_gpu_util_percent",
                             "run dcgm-exporter, or `python -m diagnostics exporter`")
    busy = [r for r in rows if (r.values.get("running_avg") or 0) > 0]
    if not busy:
        return skip(f"load: no replica with GPU series had requests running in {snap.over()}")
    idle = [r for r in busy if r.gpu["gpu_util_pct"] < GPU_IDLE_UTIL_PCT]
    ev = _evidence(snap, idle or busy, ("gpu_util_pct", "running_avg"), "gpu:gpu_util_pct", "running_avg")
    return _verdict(
        idle, fail, found=f"GPU util below {GPU_IDLE_UTIL_PCT:.0f}% while requests ran: {_names(idle)}.",
        remedy="Those GPUs wait on the host: the server's CPU (tokenizer, sampling, one core at 100%), the network "
               "between client and server, or too little batching.",
        clean=f"GPU util at or above {GPU_IDLE_UTIL_PCT:.0f}% on all {len(busy)} replicas with requests running.",
        evidence=ev)


def decide_bandwidth(snap: FleetSnapshot) -> Outcome:
    rows = [r for r in snap.replicas if r.gpu.get("dram_bw_pct") is not None]
    if not rows:
        return _no_gpu_match(snap, "DRAM bandwidth", "DCGM_FI_PROF_DRAM_ACTIVE or triage_gpu_dram_bw_util_percent",
                             "dcgm-exporter with profiling metrics, or the console's exporter on Hopper+")
    peak = ASSUMED_ACHIEVABLE_DRAM_BW_PCT  # GPU models are not known from these series; the H200's pure copy
    bound = [r for r in rows if r.gpu["dram_bw_pct"] > BW_BOUND_SHARE * peak]
    likely = [r for r in rows if BW_LIKELY_SHARE * peak < r.gpu["dram_bw_pct"] <= BW_BOUND_SHARE * peak]
    ev = _evidence(snap, bound + likely, ("dram_bw_pct",), "gpu:dram_bw_pct")
    ev["achievable_dram_bw_pct"] = peak
    remedy = ("Fewer bytes per token: FP8 weights (--quantization fp8), --kv-cache-dtype fp8, and a larger batch so "
              "each weight read serves more tokens.")
    if bound:
        return fail(f"DRAM bandwidth above {BW_BOUND_SHARE:.0%} of the achievable {peak:.0f}%: {_names(bound)}.",
                    remedy, evidence=ev)
    if likely:
        return warn(f"DRAM bandwidth above {BW_LIKELY_SHARE:.0%} of the achievable {peak:.0f}%: {_names(likely)}.",
                    remedy, evidence=ev)
    return passed(f"No replica's GPUs above {BW_LIKELY_SHARE:.0%} of the achievable DRAM bandwidth.", evidence=ev)


# What a replica's users waited, exact (_sum / _count), is judged first; the p99s are interpolated inside a histogram
# bucket, so they speak only where the means do not, and never between two p99s of one bucket.
MEAN_COLS = ("ttft_mean_s", "queue_mean_s", "e2e_mean_s")
TAIL_COLS = ("ttft_p99_s", "itl_p99_s")
WHAT = {"ttft_mean_s": "mean TTFT", "queue_mean_s": "mean queue time", "e2e_mean_s": "mean end-to-end latency",
        "ttft_p99_s": "p99 TTFT", "itl_p99_s": "p99 inter-token latency"}


def _quantile(r: Replica, col: str) -> str:
    """A p99 as the table shows it: the histogram bucket it fell in ('in the 10-20 s bucket'), never the interpolated
    point (which can stand above every request measured); that point only where the bounds are unknown, said so."""
    b = r.buckets.get(col)
    if b:
        return f"in the {bucket_text(b)} bucket"
    return f"about {fmt_s(r.values.get(col))} (interpolated; its bucket is unknown)"


def _at_least(slow: list | None, fast: list | None, col: str) -> str:
    """', at least 2.0x' where the slower bucket's floor stands that far above the faster bucket's ceiling: the only
    ratio two p99 buckets support."""
    times = fmt_times(slow[0], fast[1], ratio_floor(col)) if slow and fast and fast[1] else None
    return f", at least {times}" if times and slow[0] >= SLOW_RATIO * fast[1] else ""


def _median_bucket(snap: FleetSnapshot, col: str) -> list | None:
    """The bucket (or span of two) that the fleet median of a p99 column lies in: the middle replicas' buckets."""
    rows = sorted((r for r in snap.replicas if r.values.get(col) is not None), key=lambda r: r.values[col])
    mid = [r.buckets.get(col) for r in rows[(len(rows) - 1) // 2: len(rows) // 2 + 1]]
    if not mid or not all(mid):
        return None
    uppers = [b[1] for b in mid]
    return [min(b[0] for b in mid), None if None in uppers else max(uppers)]


def _mean_gap(col: str, hi: float, lo: float, slow: str, fast: str) -> str:
    """'{slow} 16.16 s is 7.9x {fast} 2.04 s', with no ratio against a value under the noise floor."""
    times = fmt_times(hi, lo, ratio_floor(col))
    return f"{slow} {fmt_s(hi)} is {times} {fast} {fmt_s(lo)}" if times else \
        f"{slow} {fmt_s(hi)} against {fast} {fmt_s(lo)}"


def decide_slow(snap: FleetSnapshot) -> Outcome:
    cols = MEAN_COLS + TAIL_COLS
    rows = [r for r in snap.replicas if any(r.values.get(c) is not None for c in cols)]
    if len(rows) == 2:
        return _decide_pair(snap, rows)
    if len(rows) < 3:
        return skip(f"latency across replicas: {len(rows)} replica(s) with TTFT or ITL observations in "
                    f"{snap.over()}; comparing needs 2")

    def much_slower(r: Replica, col: str) -> bool:
        med = snap.fleet_median.get(col)
        return col in r.outliers and bool(med) and (r.values.get(col) or 0) >= SLOW_RATIO * med

    def apart(r: Replica, col: str) -> bool:  # a p99 in the median's own bucket cannot be told from it
        b, med = r.buckets.get(col), snap.fleet_median.get(col)
        return not (b and med is not None and b[0] < med <= (b[1] if b[1] is not None else float("inf")))

    means = {r.name: [c for c in MEAN_COLS if much_slower(r, c)] for r in rows}
    tails = {r.name: [c for c in TAIL_COLS if much_slower(r, c) and apart(r, c)] for r in rows}
    slow = [r for r in rows if means[r.name]] or [r for r in rows if tails[r.name]]
    by_mean = any(means[r.name] for r in slow)
    tail_only = [r for r in rows if tails[r.name] and not means[r.name]] if by_mean else []
    ev = _evidence(snap, slow + tail_only, cols)
    ev.update({f"fleet median {c}": snap.fleet_median.get(c) for c in cols})
    ev.update({f"{r.name} {c} bucket": r.buckets[c] for r in slow + tail_only for c in TAIL_COLS if c in r.buckets})

    def how(r: Replica) -> str:
        c = (means if by_mean else tails)[r.name][0]
        if c in MEAN_COLS:
            return f"{r.name} ({_mean_gap(c, r.values[c], snap.fleet_median[c], WHAT[c], 'the median')})"
        mb = _median_bucket(snap, c)
        median = f"the fleet median's {bucket_text(mb)}" if mb else "the fleet median's bucket"
        return f"{r.name} ({WHAT[c]} {_quantile(r, c)}, above {median}{_at_least(r.buckets.get(c), mb, c)})"

    also = (" Only in the tail: " + ", ".join(f"{r.name}'s {WHAT[tails[r.name][0]]}" for r in tail_only[:SHOW])
            + " stands out while its means do not (a few slow requests, not its users' usual wait)."
            if tail_only else "")
    basis = ("on the exact means of what users waited" if by_mean else
             "on p99 only: no replica's mean TTFT, queue or end-to-end latency stands out")
    return _verdict(
        slow, fail, found=f"{'; '.join(how(r) for r in slow[:SHOW])} {'is' if len(slow) == 1 else 'are'} much slower "
                          f"than the rest of the fleet ({SLOW_RATIO:g}x+ the fleet median and a robust outlier, "
                          f"{basis}).{also}",
        remedy=SLOW_REMEDY,
        clean=f"No replica's mean TTFT, queue or end-to-end latency, nor a p99 in a bucket of its own, stands out "
              f"from the fleet median ({len(rows)} replicas).{also}",
        evidence=ev)


SLOW_REMEDY = ("Drill into that replica: its KV cache and preemptions, its queue time (fleet.saturation), its GPU "
               "(util, bandwidth, clock events, XID), and what else runs on its host. Same flags and model everywhere?")
# Two replicas: flagged only when the gap is also large in absolute terms (vLLM's histogram buckets are 10-20 ms
# apart at the bottom, so 5 ms against 15 ms is the buckets' resolution, not a slow replica).
PAIR_MIN_DIFF_S = {"ttft_mean_s": 0.25, "queue_mean_s": 0.25, "e2e_mean_s": 0.5, "ttft_p99_s": 0.25,
                   "itl_p99_s": 0.025}


def _decide_pair(snap: FleetSnapshot, rows: list[Replica]) -> Outcome:
    """Two replicas: no median to stand out from, so one against the other, on the means first; their p99s only
    where no mean tells them apart, and never two p99s of one histogram bucket. One sentence per fact: a tail gap
    of the replica whose means are slower backs them up; one of the other replica is its tail only."""
    gaps: dict[str, list[tuple[Replica, str]]] = {"mean": [], "tail": []}
    same_bucket = []
    for c in MEAN_COLS + TAIL_COLS:
        a, b = (r.values.get(c) for r in rows)
        if a is None or b is None:
            continue
        slow, fast = (rows[0], rows[1]) if a >= b else (rows[1], rows[0])
        hi, lo = max(a, b), min(a, b)
        if c in TAIL_COLS and slow.buckets.get(c) and slow.buckets.get(c) == fast.buckets.get(c):
            same_bucket.append(f"both replicas' {WHAT[c]} falls in the {bucket_text(slow.buckets[c])} bucket, so it "
                               "cannot tell them apart")
            continue
        if hi - lo >= PAIR_MIN_DIFF_S[c] and (lo <= 0 or hi / lo >= SLOW_RATIO):
            if c in MEAN_COLS:
                gaps["mean"].append((slow, _mean_gap(c, hi, lo, f"{slow.name}'s {WHAT[c]}", f"{fast.name}'s")))
            else:
                apart = _at_least(slow.buckets.get(c), fast.buckets.get(c), c)
                gaps["tail"].append((slow, f"{slow.name}'s {WHAT[c]} is {_quantile(slow, c)}, {fast.name}'s "
                                           f"{_quantile(fast, c)}{apart}"))
    found = gaps["mean"] or gaps["tail"]
    ev = _evidence(snap, rows, MEAN_COLS + TAIL_COLS)
    ev["compared"] = "the two replicas with each other (no fleet median with 2), means first"
    ev["min_difference_s"] = dict(PAIR_MIN_DIFF_S)
    ev.update({f"{r.name} {c} bucket": r.buckets[c] for r in rows for c in TAIL_COLS if c in r.buckets})
    tail_note = ""
    if gaps["mean"] and gaps["tail"]:
        by_mean = {id(r) for r, _ in gaps["mean"]}
        backs = [g for r, g in gaps["tail"] if id(r) in by_mean]
        other = [(r, g) for r, g in gaps["tail"] if id(r) not in by_mean]
        tail_note = (" Its tail is slower too: " + "; ".join(backs) + "." if backs else "") + (
            " In the tail only (its means are not slower): " + "; ".join(g for _, g in other) + "." if other else "")
    note = "; ".join(same_bucket)
    note = f" {note[:1].upper()}{note[1:]}." if note else ""  # not capitalize(): it would lower "TTFT"
    slow = list({id(r): r for r, _ in found}.values())
    head = ("Of the two replicas, one is much slower: " if len(slow) == 1 else
            "Each of the two replicas is much slower than the other in something: ")
    return _verdict(
        slow, fail, found=head + "; ".join(g for _, g in found) + "." + tail_note + note,
        remedy=SLOW_REMEDY,
        clean=f"The two replicas' mean TTFT, queue and end-to-end latency and their p99s are within {SLOW_RATIO:g}x "
              "of each other (or closer than " + ", ".join(f"{fmt_s(v)} for {k}" for k, v in PAIR_MIN_DIFF_S.items())
              + ")." + note,
        evidence=ev)


def decide_imbalance(snap: FleetSnapshot) -> Outcome:
    rate = {r.name: (r.values.get("prompt_tok_s") or 0) + (r.values.get("generation_tok_s") or 0)
            for r in snap.replicas if r.up is not False}
    if len(rate) < 2:
        return skip(f"load across replicas: {len(rate)} replica(s) up; balance needs 2")
    med = median(list(rate.values()))
    if not med:
        return skip(f"load: the median replica processed no tokens in {snap.over()}")
    odd = [r for r in snap.replicas if r.name in rate and
           (rate[r.name] > IMBALANCE_RATIO * med or rate[r.name] < med / IMBALANCE_RATIO)]
    ev = _evidence(snap, odd, ("prompt_tok_s", "generation_tok_s", "first_seen_t"),
                   "prompt_tok_s", "generation_tok_s", "first_seen_t")
    ev["fleet median tokens_s"] = round(med, 3)

    def how(r: Replica) -> str:
        ratio, above = rate[r.name] / med, fmt_times(rate[r.name], med, TOKENS_FLOOR)
        if ratio > 1:
            way = f"{above} the median (above)" if above else f"{rate[r.name]:.1f} tokens/s (above)"
        else:
            way = f"{ratio:.2f}x the median (below: {rate[r.name]:.1f} tokens/s)" if ratio > 0 else "no tokens (below)"
        age = snap.younger_than_window(r)
        if age is not None:
            way += (f"; its first sample is {age:.0f} s old, inside the {snap.window} window (a new replica, or "
                    "Prometheus started then), so its rate is averaged over time it was not there and reads low")
            ev[f"{r.name} age_s"] = round(age, 1)
        return f"{r.name} {way}"

    found = "; ".join(how(r) for r in odd[:SHOW]) + (f"; and {len(odd) - SHOW} more" if len(odd) > SHOW else "")
    young_only = odd and all(snap.younger_than_window(r) is not None and rate[r.name] < med for r in odd)
    return _verdict(
        odd, warn, found=f"Load is badly balanced (beyond {IMBALANCE_RATIO:g}x or 1/{IMBALANCE_RATIO:g} of the median "
                         f"{_rate(med)} tokens/s): {found}.",
        remedy=("Wait a window and look again: a replica younger than the window reads low until it has run for a "
                "whole one." if young_only else
                "Check the load balancer's policy and health checks (a replica kept out, or sticky sessions piling "
                "onto one), and whether every replica serves the same models."),
        clean=f"Token throughput within {IMBALANCE_RATIO:g}x of the median ({_rate(med)} tokens/s) on all {len(rate)} "
              "replicas up.", evidence=ev)


def decide_saturation(snap: FleetSnapshot) -> Outcome:
    rows = [r for r in snap.replicas if r.values.get("queue_share_ttft") is not None]
    if not rows:
        if not snap.names.get("queue"):
            return skip("queueing: no vllm:request_queue_time_seconds series under this selector (vLLM before 0.6 "
                        "has no per-phase histograms); the share of TTFT spent queueing is unknown")
        return skip(f"queueing: no replica finished a request in {snap.over()}")
    flagged: dict[str, str] = {}
    elsewhere: dict[str, str] = {}  # queueing 50%+ of TTFT, but not for a slot: another check's case
    for r in rows:
        v = r.values
        kv = v.get("kv_peak", v.get("kv"))
        in_prefill = None if v.get("finished_s") is None or v.get("prefill_mean_s") is None else \
            v["finished_s"] * v["prefill_mean_s"]
        behind = busy_prefilling(in_prefill, v.get("prefill_mean_s"), v.get("decode_mean_s"))
        why = saturation_reason(v["queue_share_ttft"], v.get("waiting_capacity"), kv, behind_prefills=behind)
        if why:
            flagged[r.name] = (f"{r.name}: mean queue time {fmt_s(v.get('queue_mean_s'))} of "
                               f"{fmt_s(v.get('ttft_mean_s'))} mean TTFT; {why}")
        elif v["queue_share_ttft"] >= QUEUE_SHARE_SATURATED:
            elsewhere[r.name] = (f"{r.name} queues {100 * v['queue_share_ttft']:.0f}% of its mean TTFT behind "
                                 "prefills (vllm.prefill)" if behind else
                                 f"{r.name} queues {100 * v['queue_share_ttft']:.0f}% of its mean TTFT with its KV "
                                 "cache full (vllm.kv_pressure)")
    bad = [r for r in rows if r.name in flagged]
    cols = ("queue_mean_s", "ttft_mean_s", "queue_share_ttft", "waiting_capacity", "kv_peak")
    ev = _evidence(snap, bad or rows, cols)
    ev.update(queue_share_saturated=QUEUE_SHARE_SATURATED, kv_room=KV_ROOM)
    top = max(rows, key=lambda r: r.values["queue_share_ttft"])
    clean = (f"Queueing under {100 * QUEUE_SHARE_SATURATED:.0f}% of the mean TTFT on all {len(rows)} replicas with "
             f"requests in {snap.over()} (highest: {top.name}, {100 * top.values['queue_share_ttft']:.0f}%).")
    if elsewhere:
        clean = (f"No replica waits for a slot in {snap.over()} ({len(rows)} with requests): "
                 + "; ".join(elsewhere.values()) + ".")
    return _verdict(
        bad, fail, found="Capacity-bound (requests wait for a slot while the KV cache has room): "
                         + " | ".join(flagged[r.name] for r in bad[:SHOW])
                         + (f" | and {len(bad) - SHOW} more" if len(bad) > SHOW else ""),
        remedy=SATURATION_REMEDY, clean=clean, evidence=ev)


def decide_prefill(snap: FleetSnapshot) -> Outcome:
    """vllm.prefill per replica: the single server's rule (vllm_anatomy.prefill_judgement) on each replica's exact
    means over the window and its finished requests per second."""
    judged = [(r, pj) for r in snap.replicas if (pj := prefill_judgement(
        r.values.get("queue_mean_s"), r.values.get("prefill_mean_s"), r.values.get("ttft_mean_s"),
        r.values.get("finished_s"), decode_mean_s=r.values.get("decode_mean_s"))) is not None]
    if not judged:
        if not snap.names.get("prefill"):
            return skip("prefill's share of TTFT: no vllm:request_prefill_time_seconds series under this selector "
                        "(vLLM before 0.6 has no per-phase histograms)")
        return skip(f"prefill: no replica finished a request in {snap.over()}")
    bound = [(r, pj) for r, pj in judged if pj.bound]
    cols = ("prefill_mean_s", "ttft_mean_s", "queue_mean_s", "decode_mean_s", "finished_s")
    ev = _evidence(snap, [r for r, _ in bound] or [r for r, _ in judged], cols)
    # The fleet's Prometheus does not say which flags each replica runs with: the remedies are all named, and the
    # single-server check (run --vllm-url on that replica) leaves out those already in force.
    text = " ".join(x["text"] for x in remedies("prefill-bound", Facts(prefill_lone_s=None), ServerConfig()))
    found = " | ".join(f"{r.name}: {pj.reason}"  # a wait behind prefills says so itself
                       for r, pj in bound[:SHOW]) + (f" | and {len(bound) - SHOW} more" if len(bound) > SHOW else "")
    return _verdict(
        bound, warn, found=f"Prefill-bound (prompts hold up the first token): {found}.",
        remedy=text + " `python -m diagnostics run --vllm-url REPLICA` leaves out what that replica already sets.",
        clean=f"No replica prefill-bound over {snap.over()} ({len(judged)} with requests).", evidence=ev)


def decide_xid(snap: FleetSnapshot) -> Outcome:
    if not any("xid" in r.gpu for r in snap.replicas) or all(r.gpu.get("xid") is None for r in snap.replicas):
        if snap.gpu_source == "dcgm-exporter":
            return _no_gpu_match(snap, "XID errors", "DCGM_FI_DEV_XID_ERRORS", "run dcgm-exporter")
        return skip("XID errors: no DCGM_FI_DEV_XID_ERRORS series (dcgm-exporter) on the replicas' hosts")
    bad = [r for r in snap.replicas if (r.gpu.get("xid") or 0) > 0]
    ev = _evidence(snap, bad, ("xid",), "gpu:xid")
    return _verdict(
        bad, fail, found=f"GPU XID errors in {snap.over()}: {_names(bad)}.",
        remedy="Look the XID up in NVIDIA's XID catalogue (13/31/43: the application; 48/63/64/94/95: memory errors; "
               "79: the GPU fell off the bus) and drain the host if it is hardware.",
        clean=f"No XID errors in {snap.over()}.", evidence=ev)


def decide_quality_outlier(snap: FleetSnapshot) -> Outcome:
    """The quality watch's last round per replica (its gauges, scraped by the same Prometheus): a replica whose answers
    left the golden set's bands, drifted, or did not answer while the others did is named."""
    watched = [r for r in snap.replicas if r.golden]
    if not watched:
        return skip("quality watch: no triage_golden_* series for these replicas (run `python -m diagnostics golden "
                    "watch --metrics-port PORT --rounds 0` and add it to Prometheus's scrape config)")
    ev = {"replicas_checked": len(snap.replicas), "replicas_watched": len(watched),
          "promql": '{__name__=~"triage_golden_(status|same_top_ratio|kld_mean|drift)"}',
          **{f"{r.name} golden": golden_cell(r) for r in watched[:50]}}
    broken = [r for r in watched if r.golden["status"] in ("low agreement", "broken")]
    odd = [r for r in watched if r not in broken and (r.golden.get("drift") or r.golden["status"] != "fine")]
    remedy = ("Compare the named replica's setup with the golden set's and with its peers' (model path and revision, "
              "--dtype, --kv-cache-dtype, --quantization, vLLM version) and undo what differs; `python -m diagnostics "
              "golden watch --url http://REPLICA --golden FILE` names the round it changed in and what its server "
              "reports as changed.")
    unwatched = len(snap.replicas) - len(watched)
    tail = f" ({unwatched} replica(s) not watched)" if unwatched else ""
    if broken:
        named = "; ".join(f"{r.name} {golden_cell(r)}" for r in broken[:SHOW])
        return fail(f"No longer answering like the golden set: {named}{tail}.", remedy, evidence=ev)
    if odd:
        rest = len(watched) - len(odd)
        named = "; ".join(f"{r.name} {golden_cell(r)}" for r in odd[:SHOW])
        others = f"; the other {rest} watched replica(s) fine" if rest else ""
        return warn(f"Quality watch: {named}{others}{tail}.", remedy, evidence=ev)
    return passed(f"All {len(watched)} watched replica(s) answer like the golden set in its last round{tail}.",
                  evidence=ev)


# What to do with a stalled replica: the single-server liveness remedies (core/deployment/liveness.py's
# engine_stopped and no_progress), restated here since feature packages do not import each other.
STALL_REMEDY = ("On that replica's host, find its engine core (`ps -eo pid,stat,args | grep EngineCore`). State T: "
                "something paused it (SIGSTOP, a debugger, a cgroup freezer); `kill -CONT PID` resumes it if that was "
                "on purpose. Otherwise take its stack with `py-spy dump --pid PID` (add --native for the C++/CUDA "
                "frames) to see where it waits, then restart the replica. `python -m diagnostics watch --url "
                "http://REPLICA` names the kind of stall (hung kernel, deadlock, admission). Restart on this rule, "
                "not on /health: the API server answers /health and /metrics while the engine is stuck.")
SILENT_REMEDY = ("Either the load balancer sends it nothing (readiness probe failing, taken out of the Service, "
                 "sticky sessions elsewhere) or its engine is wedged with the gauges at 0 (vllm#37729). Send it one "
                 "request directly (`curl http://REPLICA/v1/completions` with max_tokens 1): no token back means "
                 "stalled; then as for a stall: `py-spy dump --pid PID` of its engine core, and restart.")


def decide_stalled(snap: FleetSnapshot) -> Outcome:
    if "stalled" not in snap.promql:
        return skip("progress: no vllm:generation_tokens_total, prompt_tokens_total, request_success_total or "
                    "num_requests_running series under this selector")
    judged = [r for r in snap.replicas if r.values.get("progress") is not None]
    stalled = [r for r in snap.replicas if snap.stalled(r) == "stalled"]
    silent = [r for r in snap.replicas if snap.stalled(r) == "silent"]
    ev = _evidence(snap, stalled + silent, ("running", "waiting", "work_min", "progress"), "stalled")
    ev["stall_window"] = snap.stall_window
    ev["promql_silent"] = snap.promql.get("silent", "")
    for r in stalled + silent:
        s, more = snap.no_progress_s(r)
        ev[f"{r.name} no_progress_s"] = f"more than {s:.0f}" if more else round(s)

    def how(r: Replica) -> str:
        s, more = snap.no_progress_s(r)
        since = f"{'more than ' if more else 'about '}{s:.0f} s"
        if snap.stalled(r) == "silent":
            return f"{r.name}: no progress for {since}"
        return (f"{r.name}: no token and no finished request for {since} with {_count(r.values.get('running'))} "
                f"running and {_count(r.values.get('waiting'))} waiting (gauges frozen at those values)")

    def listed(rows: list[Replica]) -> str:
        return "; ".join(how(r) for r in rows[:SHOW]) + (f"; and {len(rows) - SHOW} more" if len(rows) > SHOW else "")

    if stalled:
        return fail(f"Stalled while /health may still answer 200 (nothing moved over {snap.over(snap.stall_window)} "
                    f"with requests in flight): {listed(stalled)}.", STALL_REMEDY, evidence=ev)
    if silent:
        return warn(f"Silent while the fleet serves (no progress over {snap.over(snap.stall_window)} while the median "
                    f"replica finished {PEER_MIN_FINISHED}+ requests): {listed(silent)}.", SILENT_REMEDY, evidence=ev)
    return passed(f"No replica stalled over {snap.over(snap.stall_window)}: {_not_stalled(snap, judged, ev)}.",
                  evidence=ev)


def _not_stalled(snap: FleetSnapshot, judged: list[Replica], ev: dict) -> str:
    """Why none of the replicas is stalled, each said as it is: progress, no work in flight, or too young to judge
    (first seen inside the stall window: the stall query needs a whole window of it, so it had none to show)."""
    young = {r.name: age for r in snap.replicas if (age := snap.younger_than_stall_window(r)) is not None}
    busy = [r for r in judged if (r.values.get("progress") or 0) > 0 and r.name not in young]
    idle = [r for r in judged if r not in busy and r.name not in young and not r.values.get("work_min")]
    other = [r for r in judged if r not in busy and r not in idle and r.name not in young]
    parts = [f"{len(busy)} of {len(judged)} made progress"]
    if idle:
        parts.append(f"{len(idle)} had no requests in flight")
    if young:
        ev["too_young_s"] = {n: round(a) for n, a in young.items()}
        parts.append(f"{_names([r for r in snap.replicas if r.name in young])} too young to judge (first seen "
                     f"{min(young.values()):.0f} s ago, inside the {snap.stall_window} stall window)")
    if other:
        parts.append(f"{_names(other)} not scraped for a whole stall window yet")
    return ", ".join(parts)


def _rate(v: float) -> str:
    """Tokens/s to one decimal, or two significant digits below 1 (a median of 0.001 is not "0.0")."""
    return f"{v:,.1f}" if v >= 1 else f"{v:.2g}"


def _count(v: float | None) -> str:
    return "?" if v is None else f"{v:.0f}"


CHECKS = (
    Check("fleet.replica_down", "Replica down", Severity.HIGH,
          "a replica's scrape target is not up (/api/v1/targets)", decide_down),
    Check("fleet.stalled", "Replica stalled (no progress with requests in flight)", Severity.HIGH,
          "increase() of generation and prompt tokens and finished requests all 0 over the stall window while "
          "min_over_time(running + waiting) > 0, per replica", decide_stalled),
    Check("vllm.metrics_off", "vLLM stats logging off", Severity.MEDIUM,
          "a healthy target of the vLLM jobs exports no vllm:* series (--disable-log-stats)", decide_metrics_off),
    Check("vllm.kv_pressure", "KV cache full and preempting", Severity.HIGH,
          f"max_over_time(kv_cache_usage_perc) >= {KV_FULL:.2f} while rate(num_preemptions_total) > 0, per replica",
          decide_kv_pressure),
    Check("gpu.idle", "GPU idle while requests run", Severity.HIGH,
          f"GPU util (DCGM or the console's exporter) below {GPU_IDLE_UTIL_PCT:.0f}% while the replica had requests",
          decide_gpu_idle),
    Check("gpu.bandwidth_bound", "GPU memory-bandwidth bound", Severity.MEDIUM,
          "DCGM_FI_PROF_DRAM_ACTIVE (or the exporter's GPM DRAM BW util) against what a pure copy reaches",
          decide_bandwidth),
    Check("fleet.slow_replica", "One replica much slower than the rest", Severity.HIGH,
          f"mean TTFT, queue or end-to-end latency (exact, _sum/_count), else a p99 TTFT or ITL in a bucket of its "
          f"own, {SLOW_RATIO:g}x+ the fleet median and a median/MAD outlier", decide_slow),
    Check("fleet.load_imbalance", "Load badly balanced", Severity.MEDIUM,
          f"a replica's tokens/s above {IMBALANCE_RATIO:g}x or below 1/{IMBALANCE_RATIO:g} of the median",
          decide_imbalance),
    Check("fleet.saturation", "Requests queue for capacity", Severity.HIGH,
          f"mean queue time (rate of _sum over _count) {100 * QUEUE_SHARE_SATURATED:.0f}%+ of the mean TTFT while the "
          f"KV cache stays under {100 * KV_ROOM:.0f}%, per replica, with requests waiting for capacity",
          decide_saturation),
    Check("vllm.prefill", "vLLM prefill-bound (prompts hold up the first token)", Severity.MEDIUM,
          "per replica: mean prefill time of a second or more is half or more of the mean TTFT, or requests wait 30%+ "
          "of it outside their own prefill while its finished requests/s x mean prefill keep 0.8+ requests in "
          "prefill at once and prefill is 40%+ of their time in the engine", decide_prefill),
    Check("fleet.xid", "GPU XID errors", Severity.HIGH, "max_over_time(DCGM_FI_DEV_XID_ERRORS) > 0", decide_xid),
    Check("fleet.quality_outlier", "A replica answers unlike the golden set", Severity.HIGH,
          "the quality watch's last round per replica (triage_golden_status, _drift, _same_top_ratio): low agreement "
          "or broken fails; watch, inconclusive, no answer, refused or drift warns", decide_quality_outlier),
)
