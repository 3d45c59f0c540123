"""vLLM server checks over /metrics scrapes: reachable, stats on, KV cache pressure, saturation, prefill, liveness."""
from __future__ import annotations

from core.fmt import fmt_liveness, fmt_share
from diagnostics.context import CheckContext, Series
from diagnostics.findings import PCT_RANGE, Chart, Check, Outcome, Severity, fail, passed, skip, warn

KV_FULL = 0.95  # kv_cache_usage_perc (a 0-1 fraction) at or above this is "near 100%"
KV_HIGH = 0.90

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
    return passed(f"KV cache usage peaked at {fmt_share(peak)} with no preemptions during the window.",
                  evidence=evidence, charts=tuple(charts))


def decide_liveness(ctx: CheckContext) -> Outcome:
    from core.deployment.liveness import (CANARY_GAP_FACTOR, CANARY_MIN_GAP_S, CHECKING, DEGRADED, STALLED,
                                          canary_trips, classify)

    if not ctx.vllm_url:
        return skip(NO_URL)
    if not ctx.vllm_liveness:
        return skip(f"liveness of {ctx.vllm_url}: {ctx.vllm_liveness_reason}")
    rounds = list(ctx.vllm_liveness)
    v = classify(rounds)
    trips = canary_trips(rounds)
    span = rounds[-1].t - rounds[0].t
    evidence = {"state": v.state, "kind": v.kind, "rounds": len(rounds), "rounds_span_s": round(span, 1),
                **v.evidence}
    rate = (f" Canaries: {len(trips)} sent over {span:.0f} s ({sum(not c.finished for c in trips)} without a token), "
            f"only where the counters could not speak, at most one every {v.evidence['canary_every_s']:g} s here "
            f"({CANARY_GAP_FACTOR:g}x the server's time to first token, {CANARY_MIN_GAP_S:g} s at least).")
    if v.state == STALLED:
        return fail(f"{fmt_liveness(v.state, v.kind).capitalize()}: {v.headline}{rate}", v.remedy, evidence=evidence)
    if v.state == DEGRADED:
        return warn(f"{fmt_liveness(v.state, v.kind).capitalize()}: {v.headline}{rate}", v.remedy, evidence=evidence)
    if v.state == CHECKING:  # not settled when the window closed: said as such, with what would settle it
        return warn(f"Not settled at the window's end, {fmt_liveness(v.state, v.kind).lower()}: {v.headline}{rate}",
                    v.remedy or f"`python -m diagnostics watch --url {ctx.vllm_url}` follows it until it settles.",
                    evidence=evidence)
    return passed(v.headline + rate, evidence=evidence)


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


def _canary_account(ctx: CheckContext, snaps) -> dict:
    """The console's own canaries against the window's two end scrapes: the server counts each one it finished like
    any request, and none that timed out (it aborted those). A scrape is read by the server up to the slowest
    /metrics answer after it was sent, so a canary near an end may or may not be in the window: `at_most` counts
    those, `surely` does not. `sent` counts the canaries in flight at some time in the window, which takes in one sent
    before the window opened and answered inside it (on a server busy with long prompts a canary waits seconds)."""
    from core.deployment.liveness import canaries_finished_in, canary_trips

    trips = canary_trips(ctx.vllm_liveness)
    t0, t1 = snaps[0].t, snaps[-1].t
    answer_s = ctx.vllm_slowest_answer_s or 0.0
    surely, at_most = canaries_finished_in(trips, t0, t1, answer_s)
    sent = [c for c in trips if c.end_t > t0 and c.sent_t < t1 + answer_s]
    return {"trips": trips, "sent": len(sent), "no_token": sum(not c.finished for c in sent), "surely": surely,
            "at_most": at_most}


def _canary_words(acc: dict, requests: float) -> str:
    """' (2 of the 10 the console's 1-token canaries)', 'at most' where the window's ends leave it open."""
    n = acc["at_most"]
    if not n:
        return ""
    exact = "" if acc["surely"] == n else "at most "
    return f" ({exact}{n} of the {requests:.0f} the console's 1-token {'canary' if n == 1 else 'canaries'})"


def _anatomy_evidence(a, snaps, acc: dict) -> dict:
    ms = (lambda k: None if a.mean(k) is None else round(1000 * a.mean(k), 1))
    pct = (lambda v: None if v is None else round(100 * v, 1))
    kv_peak = max((s.kv_cache_usage for s in snaps if s.kv_cache_usage is not None), default=None)
    return {"requests_finished": a.requests, "console_canaries": acc["at_most"],
            "console_canaries_surely": acc["surely"], "console_canaries_sent": acc["sent"],
            "console_canaries_without_token": acc["no_token"], "load_requests_finished": a.requests - acc["at_most"],
            "queue_mean_ms": ms("queue"),
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


def _load_waiting(ctx: CheckContext, snaps, trips: list) -> tuple[float | None, float | None, int]:
    """(the load's peak of requests waiting for capacity, the gauge at that scrape, the console's canaries that may
    have been in it): a canary outstanding at a scrape is in its gauges, and is no request of the load's."""
    from core.deployment.liveness import canaries_outstanding_at

    if not any(s.waiting_by_reason for s in snaps):
        return None, None, 0
    answer = ctx.vllm_slowest_answer_s or 0.0
    rows = [(max(0.0, s.waiting_by_reason.get("capacity", 0.0) - (k := canaries_outstanding_at(trips, s.t, answer))),
             s.waiting_by_reason.get("capacity", 0.0), k) for s in snaps]
    return max(rows, key=lambda r: (r[0], -r[2]))


def decide_saturation(ctx: CheckContext) -> Outcome:
    """Requests wait for a scheduling slot while the KV cache has room: the anatomy of the window's requests."""
    from core.telemetry.vllm_anatomy import (KV_ROOM, QUEUE_SHARE_SATURATED, SATURATION_REMEDY, busy_prefilling,
                                             saturation_reason)

    got, out = _window_anatomy(ctx)
    if out is not None:
        return out
    a, snaps = got
    acc = _canary_account(ctx, snaps)
    kv_peak = max((s.kv_cache_usage for s in snaps if s.kv_cache_usage is not None), default=None)
    waiting, gauge, in_gauge = _load_waiting(ctx, snaps, acc["trips"])
    evidence = {**_anatomy_evidence(a, snaps, acc), "max_waiting_for_capacity": waiting}
    if in_gauge:
        evidence.update(waiting_for_capacity_gauge_at_peak=gauge, console_canaries_in_gauge_at_peak=in_gauge)
    in_prefill = _in_prefill(a)
    behind = busy_prefilling(in_prefill, a.mean("prefill"), a.mean("decode"))
    why = saturation_reason(a.queue_share_ttft, waiting, kv_peak, behind_prefills=behind)
    over = f"over {a.requests:.0f} request(s){_canary_words(acc, a.requests)}"
    if why:
        if in_gauge and waiting:
            mine = "the console's canary" if in_gauge == 1 else f"the console's {in_gauge} canaries"
            why = why.replace(" waiting for capacity", f" of the load waiting for capacity (the gauge read "
                              f"{gauge:.0f}, less {mine} outstanding then)", 1)
        return fail(f"Saturated {over}: " + why, SATURATION_REMEDY + " `python -m diagnostics sweep --url URL` "
                    "finds the load where it starts and what the server serves within an SLO.", evidence=evidence)
    share = a.queue_share_ttft
    said = "N/A" if share is None else f"{100 * share:.0f}%"
    head = f"Queueing is {said} of the mean time to first token {over}"
    if share is not None and share >= QUEUE_SHARE_SATURATED and behind:
        return passed(f"{head}, but not for a slot: the engine prefills nearly all the time ({in_prefill:.1f} "
                      "request(s) in prefill at once on average, most of their time in the engine), so requests wait "
                      "behind other prompts' prefill. "
                      "That is vllm.prefill's finding.", evidence=evidence)
    if share is not None and share >= QUEUE_SHARE_SATURATED and kv_peak is not None and kv_peak >= KV_ROOM:
        return passed(f"{head}, but not for a slot: the KV cache peaked at {fmt_share(kv_peak)}, so requests wait "
                      "for memory. That is vllm.kv_pressure's finding.", evidence=evidence)
    return passed(f"{head}: requests do not wait for a slot.", evidence=evidence)


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
    acc = _canary_account(ctx, snaps)
    evidence = {**_anatomy_evidence(a, snaps, acc), "in_prefill": _in_prefill(a)}
    pj = prefill_judgement(a.mean("queue"), a.mean("prefill"), a.mean("ttft"),
                           a.requests / a.window_s if a.window_s > 0 else None, decode_mean_s=a.mean("decode"))
    if pj is None:
        return skip("prefill's share of TTFT: this vLLM exports no prefill or TTFT histogram")
    over = f"over {a.requests:.0f} request(s){_canary_words(acc, a.requests)}"
    if not pj.bound:
        return passed(f"Not prefill-bound {over}: {pj.reason}.", evidence=evidence)
    cfg = server_config(snaps[-1], None, flags_of(ctx.launch_cmd))
    rem = remedies("prefill-bound", Facts(prefill_lone_s=None), cfg)
    evidence["remedy_flags"] = [r["flags"] for r in rem if r["flags"]]
    text = " ".join(r["text"] for r in rem) + (" `python -m diagnostics sweep --url URL --prompt-tokens N` measures "
                                               "it at growing load.")
    head = "Requests wait behind prefills" if pj.queued_behind else "Prefill-bound"
    return warn(f"{head} {over}: {pj.reason}.", text, evidence=evidence)


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
          "TTFT, or requests wait 30%+ of it outside their own prefill (queued, or before the queue while a step runs) "
          "while the window's prefill seconds keep 0.8+ requests in prefill at once and prefill is 40%+ of their time "
          "in the engine",
          decide_prefill),
    Check("vllm.liveness", "vLLM engine liveness", Severity.HIGH,
          "counters on /metrics move while requests are in flight, a 1-token canary gets its token, and on this "
          "host the engine processes run", decide_liveness),
)
