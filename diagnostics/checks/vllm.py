"""vLLM server checks over /metrics scrapes: reachable, stats on, KV cache pressure, saturation, prefill, liveness."""
from __future__ import annotations

from core.fmt import fmt_liveness
from diagnostics.context import CheckContext, Series
from diagnostics.findings import PCT_RANGE, Chart, Check, Outcome, Severity, fail, passed, skip, warn

KV_FULL = 0.95  # kv_cache_usage_perc (a 0-1 fraction) at or above this is "near 100%"
KV_HIGH = 0.90

CANARY_SLACK_S = 5.0  # a liveness round's scrape and /health before its canary: a busy server answers them late
SLOW_ANSWER_S = 1.0  # a /metrics answer slower than the checklist's scrape interval is worth a word

NO_URL = "vLLM URL: none given (--vllm-url, or the URL field on the page)"


def _unreachable(ctx: CheckContext) -> Outcome | None:
    if not ctx.vllm_url:
        return skip(NO_URL)
    if not ctx.vllm_snapshots:
        return skip(f"vLLM /metrics: not readable at {ctx.vllm_url} (see vllm.reachable)")
    return None


def decide_reachable(ctx: CheckContext) -> Outcome:
    if not ctx.vllm_url:
        return skip(NO_URL)
    ok, tried = len(ctx.vllm_snapshots), ctx.vllm_scrapes
    evidence = {"url": ctx.vllm_url, "scrapes_ok": ok, "scrapes": tried, "last_error": ctx.vllm_error or ""}
    if ctx.vllm_slowest_answer_s is not None:
        evidence["slowest_answer_s"] = round(ctx.vllm_slowest_answer_s, 3)
    remedy = ("Give the server's base URL (http://HOST:PORT, the one clients use); check it is up with "
              "`curl URL/metrics`, and that no proxy or firewall is in between.")
    if ok == 0:
        return fail(f"vLLM /metrics at {ctx.vllm_url} could not be read: {ctx.vllm_error or 'no answer'}", remedy,
                    evidence=evidence)
    if ok < tried:
        return warn(f"{tried - ok} of {tried} scrapes of {ctx.vllm_url}/metrics failed (last: {ctx.vllm_error}).",
                    "An overloaded or restarting server answers late; " + remedy, evidence=evidence)
    slow = ctx.vllm_slowest_answer_s
    late = (f" The slowest took {slow:.1f} s: the API server answers /metrics on the event loop that streams "
            "tokens, so a busy server answers late.") if slow is not None and slow >= SLOW_ANSWER_S else ""
    return passed(f"{ctx.vllm_url}/metrics answered all {tried} scrapes.{late}", evidence=evidence)


def decide_metrics_off(ctx: CheckContext) -> Outcome:
    flag = ctx.launch_has_flag("--disable-log-stats")
    remedy = ("Restart the server without --disable-log-stats: the stats cost next to nothing, and without them "
              "this checklist, Prometheus and Grafana see no vllm:* series (the page still answers 200, vllm#11987).")
    if not ctx.vllm_url:
        if ctx.launch_cmd is None:
            return skip(NO_URL + ", and no launch command to read instead")
        if flag:
            return fail("The launch command has --disable-log-stats: /metrics will carry no vllm:* series.", remedy,
                        evidence={"from": "launch command"})
        return passed("The launch command keeps vLLM's stats on (no --disable-log-stats).",
                      evidence={"from": "launch command"})
    if (out := _unreachable(ctx)) is not None:
        return out
    last = ctx.vllm_snapshots[-1]
    evidence = {"from": f"{ctx.vllm_url}/metrics", "has_vllm_series": last.has_vllm_series,
                "fields_found": ", ".join(sorted(last.sources)) or "none"}
    if not last.has_vllm_series:
        return fail("/metrics answers but carries no vllm:* series: the server was started with "
                    "--disable-log-stats.", remedy, evidence=evidence)
    if flag:
        return warn("The launch command given has --disable-log-stats, yet the server exports vllm:* series: "
                    "the command is not the one this server runs.",
                    "Check which command started the server (ps -o args -p PID).", evidence=evidence)
    return passed("/metrics carries vllm:* series: stats logging is on.", evidence=evidence)


def decide_kv_pressure(ctx: CheckContext) -> Outcome:
    if (out := _unreachable(ctx)) is not None:
        return out
    snaps = [s for s in ctx.vllm_snapshots if s.kv_cache_usage is not None]
    if len(snaps) < 2:
        why = "no vllm:* series (stats off)" if not ctx.vllm_snapshots[-1].has_vllm_series else \
            f"{len(snaps)} scrape(s) with vllm:kv_cache_usage_perc"
        return skip(f"KV cache usage over the window: need 2 scrapes that have it, got {why}")
    usage = [s.kv_cache_usage for s in snaps]
    pre = [s.preemptions for s in snaps if s.preemptions is not None]
    # A restarted server resets its counters; count from zero after a reset.
    new_preemptions = sum(b - a if b >= a else b for a, b in zip(pre, pre[1:])) if len(pre) > 1 else 0.0
    peak, last = max(usage), usage[-1]
    evidence = {"kv_cache_usage_peak_pct": round(100 * peak, 1), "kv_cache_usage_last_pct": round(100 * last, 1),
                "preemptions_in_window": new_preemptions, "scrapes": len(snaps),
                "metric": snaps[-1].sources.get("kv_cache_usage", "")}
    kv = Series("KV cache usage", "%", "vLLM /metrics", tuple(s.t for s in snaps), tuple(100 * u for u in usage))
    charts = [Chart("vLLM KV cache usage", (kv,), "% of KV blocks",
                    ((100 * KV_FULL, f"{100 * KV_FULL:.0f}% near full"),), PCT_RANGE)]
    if len(pre) > 1:
        pts = [s for s in snaps if s.preemptions is not None]
        charts.append(Chart("vLLM preemptions (cumulative)", (Series("preemptions", "count", "vLLM /metrics",
                            tuple(s.t for s in pts), tuple(s.preemptions for s in pts)),), "preemptions"))
    remedy = ("Give the KV cache more room or ask less of it: --kv-cache-dtype fp8 halves bytes per token, a higher "
              "--gpu-memory-utilization gives it more of the GPU, a lower --max-num-seqs or --max-model-len caps "
              "demand, more GPUs (--tensor-parallel-size) add memory. Preempted requests are recomputed, which "
              "shows up as TTFT and inter-token latency spikes.")
    if peak >= KV_FULL and new_preemptions > 0:
        return fail(f"KV cache usage reached {100 * peak:.0f}% and {new_preemptions:.0f} request(s) were preempted "
                    "during the window: the cache is too small for this load.", remedy,
                    evidence=evidence, charts=tuple(charts))
    if new_preemptions > 0:
        return warn(f"{new_preemptions:.0f} preemption(s) during the window with KV cache usage peaking at "
                    f"{100 * peak:.0f}%.", remedy, evidence=evidence, charts=tuple(charts))
    if peak >= KV_HIGH:
        return warn(f"KV cache usage peaked at {100 * peak:.0f}% without preemptions: near full; more load will "
                    "start preempting.", remedy, evidence=evidence, charts=tuple(charts))
    return passed(f"KV cache usage peaked at {100 * peak:.0f}% with no preemptions during the window.",
                  evidence=evidence, charts=tuple(charts))


def decide_liveness(ctx: CheckContext) -> Outcome:
    from core.deployment.liveness import DEGRADED, STALLED, classify

    if not ctx.vllm_url:
        return skip(NO_URL)
    if not ctx.vllm_liveness:
        return skip(f"liveness of {ctx.vllm_url}: {ctx.vllm_liveness_reason}")
    rounds = list(ctx.vllm_liveness)
    v = classify(rounds)
    evidence = {"state": v.state, "kind": v.kind, "rounds": len(rounds),
                "rounds_span_s": round(rounds[-1].t - rounds[0].t, 1), **v.evidence}
    if v.state == STALLED:
        return fail(f"{fmt_liveness(v.state, v.kind).capitalize()}: {v.headline}", v.remedy, evidence=evidence)
    if v.state == DEGRADED:
        return warn(f"{fmt_liveness(v.state, v.kind).capitalize()}: {v.headline}", v.remedy, evidence=evidence)
    return passed(v.headline, evidence=evidence)


def _window_anatomy(ctx: CheckContext):
    """(anatomy of the window's requests, scrapes with vllm:* series) or (None, the SKIP saying why)."""
    from core.telemetry.vllm_anatomy import anatomy

    if (out := _unreachable(ctx)) is not None:
        return None, out
    snaps = [s for s in ctx.vllm_snapshots if s.has_vllm_series]
    if len(snaps) < 2:
        return None, skip(f"request anatomy over the window: need 2 scrapes with vllm:* series, got {len(snaps)}")
    a = anatomy(snaps[0], snaps[-1])
    if a.missing and "queue" not in a.phases:
        return None, skip("request anatomy: this vLLM does not export " + ", ".join(a.missing))
    if a.requests == 0:
        return None, skip("request anatomy: no request finished during the window (nothing to split into queue, "
                          "prefill and decode)")
    return (a, snaps), None


def _canaries(ctx: CheckContext, t0: float, t1: float) -> list:
    """The liveness rounds that sent the console's own 1-token canary between two scrapes: real requests, counted in
    the server's histograms and gauges like any other."""
    return [o for o in ctx.vllm_liveness if o.canary is not None and t0 <= o.t <= t1]


def _canary_at(ctx: CheckContext, t: float) -> bool:
    """A canary may have been in flight at a scrape at `t` (its round started before and ended after)."""
    rounds = list(ctx.vllm_liveness)
    for o, nxt in zip(rounds, rounds[1:] + [None]):
        end = o.t + (o.canary.seconds if o.canary else 0.0) + CANARY_SLACK_S
        if o.canary is not None and o.t <= t <= (end if nxt is None else min(end, nxt.t)):
            return True
    return False


def _anatomy_evidence(a, snaps, canaries: list) -> dict:
    ms = (lambda k: None if a.mean(k) is None else round(1000 * a.mean(k), 1))
    pct = (lambda v: None if v is None else round(100 * v, 1))
    kv_peak = max((s.kv_cache_usage for s in snaps if s.kv_cache_usage is not None), default=None)
    return {"requests_finished": a.requests, "console_canaries": len(canaries), "queue_mean_ms": ms("queue"),
            "prefill_mean_ms": ms("prefill"), "decode_mean_ms": ms("decode"), "ttft_mean_ms": ms("ttft"),
            "queue_share_of_ttft_pct": pct(a.queue_share_ttft), "prefill_share_of_ttft_pct": pct(a.prefill_share_ttft),
            "before_engine_share_of_ttft_pct": pct(a.before_engine_share_ttft),
            "kv_cache_usage_peak_pct": pct(kv_peak),
            "from": "vllm:request_queue_time_seconds, _prefill_, _decode_, time_to_first_token (_sum/_count)"}


def _in_prefill(a) -> float | None:
    """Requests in prefill at once on average: the window's prefill seconds over its length (Little's law). A sum,
    so the console's short canaries add next to nothing where they would dilute a mean."""
    p = a.phases.get("prefill")
    return p.mean_s * p.count / a.window_s if p is not None and p.mean_s is not None and a.window_s > 0 else None


def decide_saturation(ctx: CheckContext) -> Outcome:
    """Requests wait for a scheduling slot while the KV cache has room: the anatomy of the window's requests."""
    from core.telemetry.vllm_anatomy import SATURATION_REMEDY, saturation_reason

    got, out = _window_anatomy(ctx)
    if out is not None:
        return out
    a, snaps = got
    canaries = _canaries(ctx, snaps[0].t, snaps[-1].t)
    kv_peak = max((s.kv_cache_usage for s in snaps if s.kv_cache_usage is not None), default=None)
    waiting, peak_t = None, None
    if any(s.waiting_by_reason for s in snaps):
        peak = max(snaps, key=lambda s: s.waiting_by_reason.get("capacity", 0.0))
        waiting, peak_t = peak.waiting_by_reason.get("capacity", 0.0), peak.t
    evidence = {**_anatomy_evidence(a, snaps, canaries), "max_waiting_for_capacity": waiting}
    why = saturation_reason(a.queue_share_ttft, waiting, kv_peak, in_prefill=_in_prefill(a))
    if why:
        if waiting and peak_t is not None and _canary_at(ctx, peak_t):
            why = why.replace(" waiting for capacity", " waiting for capacity (1 of them may be the console's "
                              "canary)", 1)
            evidence["canary_in_flight_at_peak"] = True
        return fail("Saturated: " + why, SATURATION_REMEDY + " `python -m diagnostics sweep --url URL` finds the "
                    "load where it starts and what the server serves within an SLO.", evidence=evidence)
    share = "N/A" if a.queue_share_ttft is None else f"{100 * a.queue_share_ttft:.0f}%"
    own = f" ({len(canaries)} of them the console's canary)" if canaries else ""
    return passed(f"Queueing is {share} of the mean time to first token over {a.requests:.0f} request(s){own}: "
                  "requests do not wait for a slot.", evidence=evidence)


def decide_prefill(ctx: CheckContext) -> Outcome:
    """Prefill holds most of TTFT, or requests queue behind other prompts' prefill (vllm_anatomy.prefill_judgement,
    which the Fleet applies per replica)."""
    from core.deployment.remedies import Facts, remedies
    from core.deployment.server_config import flags_of, server_config
    from core.telemetry.vllm_anatomy import prefill_judgement

    got, out = _window_anatomy(ctx)
    if out is not None:
        return out
    a, snaps = got
    canaries = _canaries(ctx, snaps[0].t, snaps[-1].t)
    evidence = {**_anatomy_evidence(a, snaps, canaries), "in_prefill": _in_prefill(a)}
    pj = prefill_judgement(a.mean("queue"), a.mean("prefill"), a.mean("ttft"),
                           a.requests / a.window_s if a.window_s > 0 else None)
    if pj is None:
        return skip("prefill's share of TTFT: this vLLM exports no prefill or TTFT histogram")
    own = (f" ({len(canaries)} of the {a.requests:.0f} request(s) the console's 1-token "
           f"{'canary' if len(canaries) == 1 else 'canaries'})") if canaries else ""
    if not pj.bound:
        return passed(f"Not prefill-bound over {a.requests:.0f} request(s){own}: {pj.reason}.", evidence=evidence)
    cfg = server_config(snaps[-1], None, flags_of(ctx.launch_cmd))
    rem = remedies("prefill-bound", Facts(prefill_lone_s=None), cfg)
    evidence["remedy_flags"] = [r["flags"] for r in rem if r["flags"]]
    text = " ".join(r["text"] for r in rem) + (" `python -m diagnostics sweep --url URL --prompt-tokens N` measures "
                                               "it at growing load.")
    head = "Requests queue behind prefills" if pj.queued_behind else "Prefill-bound"
    return warn(f"{head}{own}: {pj.reason}.", text, evidence=evidence)


CHECKS = (
    Check("vllm.reachable", "vLLM /metrics reachable", Severity.MEDIUM,
          "GET <vLLM URL>/metrics answers with Prometheus text on every scrape", decide_reachable),
    Check("vllm.metrics_off", "vLLM stats logging off", Severity.MEDIUM,
          "/metrics has no vllm:* series (--disable-log-stats), or the launch command has the flag",
          decide_metrics_off),
    Check("vllm.kv_pressure", "KV cache full and preempting", Severity.HIGH,
          f"vllm:kv_cache_usage_perc >= {KV_FULL:.2f} while vllm:num_preemptions_total rises", decide_kv_pressure),
    Check("vllm.saturation", "vLLM saturated (requests queue for a slot)", Severity.HIGH,
          "mean queue time is half or more of the mean TTFT (vllm:request_queue_time_seconds) while the KV cache "
          "stays under 90%", decide_saturation),
    Check("vllm.prefill", "vLLM prefill-bound (prompts hold up the first token)", Severity.MEDIUM,
          "mean prefill time (vllm:request_prefill_time_seconds) of a second or more is half or more of the mean "
          "TTFT, or queueing is while the window's prefill seconds keep 0.8+ requests in prefill at once",
          decide_prefill),
    Check("vllm.liveness", "vLLM engine liveness", Severity.HIGH,
          "counters on /metrics move while requests are in flight, a 1-token canary gets its token, and on this "
          "host the engine processes run", decide_liveness),
)
