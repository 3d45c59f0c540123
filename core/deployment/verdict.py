"""The sweep's verdict: what limits the server, judged from where each step's time goes, with the numbers it used.

Time to first token is split into queue, prefill and the part before the engine saw the request (the API server's
HTTP and tokenization); end-to-end time into those and decode. The rules, in order:

- prefill-bound: prefill is most of TTFT at the judged step, or at the lightest load while the heavier steps queue
  behind prefills (core.telemetry.vllm_anatomy.prefill_judgement), or prefill grows with load and is most of TTFT;
- memory-bound / capacity-bound: queueing is most of TTFT; memory when the KV cache is (nearly) full, slots otherwise;
- front-end-bound: the time before the engine is most of TTFT;
- decode-bound: the inter-token latency grows with the sequences running;
- saturated: a knee with none of the above (a knee is a knee whatever the cause); else not saturated.

The judged step is the one just past the knee, or the heaviest. Remedies come from core.deployment.remedies.
"""
from __future__ import annotations

from core.deployment.remedies import Facts, remedies
from core.deployment.server_config import ServerConfig
from core.deployment.step import Step
from core.telemetry.vllm_anatomy import (KV_ROOM, PREFILL_BUSY, PREFILL_SHARE_BOUND, PREFILL_SLOW_S,
                                         QUEUE_SHARE_SATURATED, prefill_judgement)

GROWTH = 1.5  # a phase that grew by half from the lightest step to the judged one "grows"; less is "flat"
FRONT_END_SHARE = 0.5  # the API server's own time (before the engine) holding this much of TTFT is what limits
SMALL_SAMPLE = 20  # a p99 over fewer requests is their slowest one or two: an SLO verdict on it says so


def _ms(s: float | None) -> str:
    return "N/A" if s is None else f"{1000 * s:.0f} ms"


def _pct(x: float | None) -> str:
    return "N/A" if x is None else f"{100 * x:.0f}%"


def unit(mode: str) -> str:
    return "clients" if mode == "concurrency" else "req/s"


def step_shares(step: "Step") -> dict[str, float | None]:
    """Where the step's mean TTFT went (queue, prefill, before the engine) and decode's share of mean e2e."""
    srv = step.server or {}
    return {"queue": srv.get("queue_share_ttft"), "prefill": srv.get("prefill_share_ttft"),
            "before_engine": srv.get("before_engine_share_ttft"),
            "decode_of_e2e": (srv.get("share_e2e") or {}).get("decode")}


def judged_step(steps: list["Step"], knee: dict | None) -> "Step":
    if knee and knee["step"] + 1 < len(steps):
        return steps[knee["step"] + 1]
    return max(steps, key=lambda s: s.load)


def _grows(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a > 0 and b / a >= GROWTH


def _evidence(steps: list["Step"], judged: "Step") -> dict:
    r1 = (lambda x: None if x is None else round(x, 3))
    ms = (lambda x: None if x is None else round(1000 * x, 1))
    return {"lightest_load": steps[0].load, "judged_load": judged.load, "heaviest_load": max(s.load for s in steps),
            "ttft_p50_ms": [ms(s.ttft_p50) for s in steps], "achieved_rps": [round(s.achieved_rps, 3) for s in steps],
            "shares": [{k: r1(v) for k, v in step_shares(s).items()} for s in steps],
            "queue_share_ttft": [s.queue_share for s in steps],
            "prefill_mean_ms": [ms(s.server_mean("prefill")) for s in steps],
            "queue_mean_ms": [ms(s.server_mean("queue")) for s in steps],
            "ttft_mean_ms": [ms(s.server_mean("ttft")) for s in steps],
            "itl_p50_ms": [ms(s.client["itl"]["p50"]) for s in steps],
            "max_running": [s.busiest.get("running") for s in steps],
            "max_waiting_capacity": [s.busiest.get("waiting_capacity") for s in steps],
            "max_kv_cache_usage": [s.busiest.get("kv_cache_usage") for s in steps],
            "requests": [s.ok for s in steps]}


def _prefill_rule(first: "Step", judged: "Step") -> tuple[str, dict] | None:
    pj = prefill_judgement(judged.server_mean("queue"), judged.server_mean("prefill"), judged.server_mean("ttft"),
                           judged.achieved_rps, decode_mean_s=judged.server_mean("decode"))
    pf0, pf1 = first.server_mean("prefill"), judged.server_mean("prefill")
    lone = first.server_mean("ttft")
    lone_share = pf0 / lone if pf0 is not None and lone else None
    used = {"prefill_mean_ms": [None if pf0 is None else round(1000 * pf0), None if pf1 is None else round(1000 * pf1)],
            "prefill_share_lightest": lone_share, "prefill_share_judged": step_shares(judged)["prefill"],
            "in_prefill": None if pj is None else pj.numbers["in_prefill"]}
    if pj is not None and pj.bound:
        return pj.reason, used
    # Alone, prefill is most of TTFT; under load the engine is busy prefilling others' prompts (at the lone prefill
    # time, so chunking's interleaving cannot inflate it).
    busy = judged.achieved_rps * pf0 if pf0 is not None else None
    if lone_share is not None and lone_share >= PREFILL_SHARE_BOUND and pf0 >= PREFILL_SLOW_S \
            and busy is not None and busy >= PREFILL_BUSY:
        used["in_prefill_at_lone_time"] = busy
        return (f"at the lightest load prefill is {_pct(lone_share)} of the mean time to first token ({_ms(pf0)}), "
                f"and at {judged.load:g} {unit(judged.mode)} {judged.achieved_rps:.2f} req/s x {pf0:.2f} s = "
                f"{busy:.1f} request(s) in prefill at once: requests queue behind prefills"), used
    share = step_shares(judged)["prefill"]
    if share is not None and share >= PREFILL_SHARE_BOUND and _grows(pf0, pf1):
        return (f"prefill is {_pct(share)} of the mean time to first token and grew {pf1 / pf0:.1f}x "
                f"({_ms(pf0)} -> {_ms(pf1)}) as prompts were batched together"), used
    return None


def _classify(steps: list["Step"], judged: "Step", knee: dict | None) -> tuple[str, str, dict]:
    first = steps[0]
    where = f"at {judged.load:g} {unit(judged.mode)}"
    sh = step_shares(judged)
    itl0, itl1 = first.client["itl"]["p50"], judged.client["itl"]["p50"]
    pf0, pf1 = first.server_mean("prefill"), judged.server_mean("prefill")
    if (pre := _prefill_rule(first, judged)) is not None:
        return "prefill-bound", f"Prefill-bound: {where} {pre[0]}.", pre[1]
    q = sh["queue"]
    kv = judged.busiest.get("kv_cache_usage")
    used = {"queue_share_ttft": q, "max_running": judged.busiest.get("running"), "max_kv_cache_usage": kv,
            "max_waiting_capacity": judged.busiest.get("waiting_capacity")}
    if q is not None and q >= QUEUE_SHARE_SATURATED:
        if kv is not None and kv >= KV_ROOM:
            return "memory-bound", (f"Memory-bound: {where} queueing is {_pct(q)} of the mean time to first token "
                                    f"while the KV cache was {_pct(kv)} full: requests wait for KV blocks."), used
        running = judged.busiest.get("running")
        slots = "" if running is None else f" at most {running:.0f} sequence(s) ran at once and"
        flat = "stay flat" if not _grows(pf0, pf1) and not _grows(itl0, itl1) else "grow too"
        return "capacity-bound", (f"Capacity-bound: {where}{slots} queueing is {_pct(q)} of the mean time to first "
                                  f"token (KV cache {_pct(kv)} used), while prefill ({_ms(pf0)} -> {_ms(pf1)}) and "
                                  f"decode (ITL p50 {_ms(itl0)} -> {_ms(itl1)}) {flat}."), used
    fe = sh["before_engine"]
    if fe is not None and fe >= FRONT_END_SHARE:
        ttft = judged.server_mean("ttft")
        return "front-end-bound", (f"Front-end-bound: {where} {_pct(fe)} of the mean time to first token "
                                   f"({_ms(None if ttft is None else fe * ttft)} of {_ms(ttft)}) passed before the "
                                   "engine saw the request (the API server's HTTP and tokenization)."), \
            {"before_engine_share_ttft": fe}
    if _grows(itl0, itl1):
        return "decode-bound", (f"Decode-bound: {where} the inter-token latency grew {itl1 / itl0:.1f}x "
                                f"({_ms(itl0)} -> {_ms(itl1)}) with more sequences running, while queueing "
                                f"stays {_pct(q or 0)} of TTFT."), {"itl_p50_ms": [itl0, itl1], "queue_share_ttft": q}
    if knee:
        return "saturated", (f"Saturated {where}: no one phase dominates (queue {_pct(q)}, prefill "
                             f"{_pct(sh['prefill'])}, before the engine {_pct(sh['before_engine'])} of TTFT), but "
                             "throughput stopped growing."), {"shares": sh}
    return "not saturated", (f"Not saturated up to {judged.load:g} {unit(judged.mode)}: throughput "
                             f"{judged.achieved_rps:.2f} req/s, TTFT p50 {_ms(first.ttft_p50)} -> "
                             f"{_ms(judged.ttft_p50)}, queueing {_pct(q or 0)} of TTFT."), {"shares": sh}


def _slo_sentence(steps: list["Step"], slo: dict, goodput: dict | None) -> str:
    if not slo:
        return ""
    u = unit(steps[0].mode)
    slos = ", ".join(f"{k.replace('_', ' ')} <= {v:g} s" for k, v in slo.items())
    out = (f" At {slos} this server serves {goodput['rps']:.2f} req/s (at {goodput['load']:g} {u})." if goodput
           else " No step met the SLO: even the lightest load breaks it.")
    few = [s for s in steps if s.ok < SMALL_SAMPLE]
    if few:
        out += (f" The SLO was judged on fewer than {SMALL_SAMPLE} requests at {len(few)} step(s) (as few as "
                f"{min(s.ok for s in few)}): a p99 over so few is their slowest, so the verdict is tentative.")
    return out


def verdict(steps: list["Step"], slo: dict[str, float], knee: dict | None, goodput: dict | None,
            config: ServerConfig | None, tokens_per_request: int | None, prompt_tokens: int | None = None) -> dict:
    """{"kind", "headline", "evidence", "remedies": [{"text", "flags", "kind"}], "remedy": their text joined}."""
    config = config or ServerConfig()
    if not steps:
        return {"kind": "no data", "headline": "No step finished.", "evidence": {}, "remedy": "", "remedies": []}
    first, judged = steps[0], judged_step(steps, knee)
    evidence = _evidence(steps, judged)
    if first.server is None or judged.server is None:
        kind = "unknown (no server metrics)"
        headline = (f"Latency seen by the client: TTFT p50 {_ms(first.ttft_p50)} at {first.load:g} "
                    f"{unit(first.mode)}, {_ms(judged.ttft_p50)} at {judged.load:g}. The server exports no vllm:* "
                    "histograms (--disable-log-stats?), so where the time goes is unknown.")
    else:
        kind, headline, evidence["used"] = _classify(steps, judged, knee)
        sh = step_shares(judged)
        headline += (f" Mean TTFT at {judged.load:g} {unit(judged.mode)}: queue {_pct(sh['queue'])}, prefill "
                     f"{_pct(sh['prefill'])}, before the engine {_pct(sh['before_engine'])}.")
    if knee:
        headline += f" The knee: above {knee['load']:g} {unit(first.mode)} ({knee['how']})."
    facts = Facts(peak_running=max((s.busiest.get("running") or 0 for s in steps), default=0) or None,
                  tokens_per_request=tokens_per_request, prompt_tokens=prompt_tokens,
                  prefill_lone_s=first.server_mean("prefill"), judged_rps=judged.achieved_rps)
    rem = remedies(kind, facts, config)
    return {"kind": kind, "headline": headline + _slo_sentence(steps, slo, goodput), "evidence": evidence,
            "remedies": rem, "remedy": " ".join(r["text"] for r in rem)}
