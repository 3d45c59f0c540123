"""The load sweep: raise the load on a running vLLM server step by step, time every request from the client, read the
server's own anatomy (queue, prefill, decode) over exactly each step's window, and say where and why it breaks.

A step is either a closed loop of C clients that each send their next request when the last one ends (concurrency),
or an open loop of Poisson arrivals at R requests/s (rate), as GuideLLM and AIPerf do. "auto" starts from one
request at a time and doubles the load until an SLO breaks, the knee shows (twice the load for under 15% more
throughput while latency grows; under 30% when the server's queue holds most of TTFT, or prefill does while requests
prefill all the time), the server fails, or the time
budget would be spent; it never runs open-ended.

What limits the server is judged in core.deployment.verdict. Everything the verdict says is measured here: client
percentiles by nearest rank over the step's requests (with their count and a bootstrap interval), server phase means
exact from the histograms' _sum/_count, the busiest scheduler state from scrapes once a second.
"""
from __future__ import annotations

import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Callable

from core.deployment.probe import client_itl, exact_prompts
from core.engines.base import Generation, GenerationParams
from core.engines.factory import connect_remote
from core.engines.remote import RemoteEngine
from core.errors import InputError, TriageError
from core.fmt import fmt_change
from core.stats import bootstrap_intervals, nearest_rank_percentiles
from core.deployment.server_config import ServerConfig, server_config
from core.deployment.step import Step
from core.deployment.verdict import unit, verdict
from core.telemetry.vllm_anatomy import PREFILL_BUSY, PREFILL_SHARE_BOUND, QUEUE_SHARE_SATURATED, anatomy

MODES = ("concurrency", "rate")
AUTO_CONCURRENCY = (1, 2, 4, 8, 16, 32, 64)
KNEE_GAIN = 1.15  # twice the load for less than 15% more throughput: the server is full
KNEE_LATENCY = 1.5  # ... while TTFT p50 grew by half or more
# With the server's own evidence that requests wait for a slot (queueing is most of TTFT), twice the clients for under
# 30% more throughput is the knee too: a small step's throughput is noisy (a client's gap between one request's end
# and its next is idle server time that a queue fills), and the queue says what the ratio alone cannot.
KNEE_GAIN_QUEUED = 1.3
KEEP_UP = 0.8  # an open loop finishing under this share of its arrivals has fallen behind them
MAX_STEPS = 12
SCRAPE_EVERY_S = 1.0
Progress = Callable[[float, str], None]


class SweepError(InputError):
    """Bad sweep settings, or a server that cannot be swept; the message says what to do."""


@dataclass
class SweepResult:
    base_url: str
    model: str
    mode: str
    prompt_tokens: int | None  # None with a dataset
    max_new_tokens: int
    dataset: str | None
    slo: dict[str, float]  # "ttft_p99"/"itl_p99" -> seconds
    max_seconds: float
    steps: list[Step] = field(default_factory=list)
    knee: dict | None = None  # {"step": i, "load": x, "how": sentence}
    goodput: dict | None = None  # {"rps": x, "step": i, "load": x} at the best step meeting every SLO
    # {"kind", "headline", "evidence", "remedies": [{"text", "flags", "kind"}], "remedy": the remedies' text joined}
    verdict: dict = field(default_factory=dict)
    stopped: str = ""  # why the sweep ended
    status: str = "finished"  # "finished", "cancelled", "failed" (server died mid-sweep: steps so far kept)
    kv_capacity_tokens: int | None = None
    server_config: dict = field(default_factory=dict)  # ServerConfig.to_dict(): the settings known to be in force
    wall_s: float = 0.0

    def to_dict(self) -> dict:
        d = asdict(self)
        return d

    def summary(self) -> dict:
        best = max(self.steps, key=lambda s: s.achieved_rps, default=None)
        return {"model": self.model, "mode": self.mode, "steps": len(self.steps),
                "knee_load": self.knee["load"] if self.knee else None,
                "goodput_rps": self.goodput["rps"] if self.goodput else None,
                "max_rps": best.achieved_rps if best else None, "verdict": self.verdict.get("kind"),
                "slo": self.slo, "status": self.status}

    def record(self, started_at: float | None = None) -> int | None:
        from core import store

        loads = ", ".join(f"{s.load:g}" for s in self.steps)
        title = f"Sweep {self.base_url} ({self.mode} {loads}): {self.verdict.get('kind', 'no verdict')}"
        return store.record("sweep", title, self.to_dict(), self.summary(), started_at=started_at,
                            status="failed" if self.status == "failed" else "finished")


def parse_steps(text: str | None, mode: str) -> list[float] | None:
    """'auto' (None) or a comma list of positive numbers; whole numbers of clients for concurrency."""
    if text is None or text.strip().lower() in ("", "auto"):
        return None
    try:
        values = [float(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise SweepError(f"Steps {text!r} are not numbers: give 'auto' or a list such as 1,2,4,8.") from None
    if not values or any(v <= 0 for v in values) or len(values) > MAX_STEPS:
        raise SweepError(f"Steps must be 1 to {MAX_STEPS} positive numbers (got {text!r}).")
    if mode == "concurrency" and any(v != int(v) or v > 256 for v in values):
        raise SweepError("Concurrency steps are whole numbers of clients, 1 to 256.")
    if mode == "rate" and any(v > 1000 for v in values):
        raise SweepError("Rate steps are requests per second, at most 1000.")
    return values


def check_slo(name: str, value: float | None) -> float | None:
    if value is None:
        return None
    if not isinstance(value, (int, float)) or not value > 0 or value != value or value == float("inf"):
        raise SweepError(f"The SLO {name} must be a positive number of seconds (got {value!r}); leave it out for none.")
    return float(value)


def read_dataset(path: str) -> list[str]:
    """Prompts from a text file: one per line, or JSON lines with a "prompt" field. Empty lines are skipped."""
    import json
    from pathlib import Path

    from core.textfile import DocumentError, decode_bytes

    try:
        data = Path(path).expanduser().read_bytes()
    except OSError as exc:
        raise SweepError(f"Cannot read the dataset {path}: {exc.strerror or exc}. Give a text file with one prompt "
                         "per line.") from None
    try:
        text = decode_bytes(data, Path(path).name, extensions=None)
    except DocumentError as exc:
        raise SweepError(f"The dataset cannot be used: {exc} A dataset is a text file with one prompt per line.") \
            from None
    prompts = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                line = str(json.loads(line).get("prompt", "")).strip()
            except (ValueError, AttributeError):
                pass
        if line:
            prompts.append(line)
    if not prompts:
        raise SweepError(f"The dataset {path} has no prompts: give one prompt per line (or JSON lines with 'prompt').")
    return prompts


# --- one step -------------------------------------------------------------------------------------------------------

class _Busiest:
    """Scrapes /metrics once a second during a step and keeps the busiest state seen (a scrape only at the step's
    ends would find the server drained)."""

    def __init__(self, base_url: str, api_key: str | None):
        self.base_url, self.api_key = base_url, api_key
        self.max = {"running": None, "waiting": None, "waiting_capacity": None, "kv_cache_usage": None}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from core.telemetry.vllm_metrics import scrape

        while not self._stop.wait(SCRAPE_EVERY_S):
            try:
                s = scrape(self.base_url, timeout_s=5.0, api_key=self.api_key)
            except TriageError:
                continue
            for k, v in (("running", s.running), ("waiting", s.waiting), ("kv_cache_usage", s.kv_cache_usage),
                         ("waiting_capacity", s.waiting_by_reason.get("capacity"))):
                if v is not None:
                    self.max[k] = v if self.max[k] is None else max(self.max[k], v)

    def __enter__(self) -> "_Busiest":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _send_all(eng: RemoteEngine, prompts: list, params: GenerationParams, mode: str, load: float,
              should_stop: Callable[[], bool], seed: int,
              tick: Callable[[], None]) -> tuple[list[Generation | None], list[str], float]:
    """Send the step's requests; returns (generation or None per request, error messages, wall seconds).

    The calling thread only waits and calls tick() a few times a second: a page's Cancel (or Ctrl-C) lands there,
    and then every request still streaming is cut at its next chunk instead of running to its end."""
    gens: list[Generation | None] = [None] * len(prompts)
    errors: list[str] = []
    abandon = threading.Event()
    stop = (lambda: abandon.is_set() or should_stop())

    def one(i: int) -> None:
        if stop():
            return
        try:
            gens[i] = eng.stream_completion(prompts[i], params, should_stop=stop)
        except TriageError as exc:
            errors.append(str(exc))

    def arrivals() -> None:  # open loop: arrivals do not wait for answers
        rng = random.Random(seed)
        due = 0.0
        for i in range(len(prompts)):
            due += rng.expovariate(load)
            while not stop() and (delay := t0 + due - time.perf_counter()) > 0:
                time.sleep(min(delay, 0.2))
            if stop():
                return
            futures.append(pool.submit(one, i))

    # exactly C workers for C clients; an open loop gets one more, for the thread that schedules the arrivals
    workers = int(load) if mode == "concurrency" else min(256, max(8, len(prompts))) + 1
    futures: list = []
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        try:
            if mode == "concurrency":
                futures += [pool.submit(one, i) for i in range(len(prompts))]
            else:
                futures.append(pool.submit(arrivals))
            while not all(f.done() for f in list(futures)):
                time.sleep(0.25)
                tick()
        except BaseException:
            abandon.set()
            raise
    return gens, errors, time.perf_counter() - t0


def client_quantiles(values: list[float]) -> dict:
    """p50/p90/p99 by nearest rank, with the sample count `n` and a 95% bootstrap interval per quantile (`ci95`,
    None under core.stats.BOOTSTRAP_MIN samples): a p99 over 6 requests is their maximum, and the interval says so."""
    # thousands of inter-token gaps need fewer resamples for a steady interval; keep the work bounded
    resamples = max(100, min(1000, 200_000 // max(1, len(values))))
    ci = bootstrap_intervals(values, resamples=resamples)
    return {**nearest_rank_percentiles(values), "n": len(values),
            "ci95": {k: None if v is None else [round(v[0], 6), round(v[1], 6)] for k, v in ci.items()}}


def run_step(eng: RemoteEngine, prompts: list, params: GenerationParams, mode: str, load: float,
             should_stop: Callable[[], bool], api_key: str | None, seed: int = 0,
             tick: Callable[[], None] = lambda: None) -> Step:
    from core.telemetry.vllm_metrics import MetricsError, scrape

    def snap():
        try:
            s = scrape(eng.base_url, timeout_s=10.0, api_key=api_key)
            return s if s.has_vllm_series else None
        except (MetricsError, TriageError):
            return None

    before = snap()
    with _Busiest(eng.base_url, api_key) as busiest:
        gens, errors, wall = _send_all(eng, prompts, params, mode, load, should_stop, seed, tick)
    after = snap() if before is not None else None
    done = [g for g in gens if g is not None and g.token_times and g.finish_reason != "cancelled"]
    tokens = sum(len(g.token_ids) for g in done)
    return Step(
        mode=mode, load=load, requests=len(prompts), ok=len(done), errors=len(errors), wall_s=wall,
        achieved_rps=len(done) / wall if wall > 0 else 0.0, output_tok_s=tokens / wall if wall > 0 else 0.0,
        client={"ttft": client_quantiles([g.ttft_s for g in done]),
                "itl": client_quantiles([x for g in done for x in client_itl(g)]),
                "e2e": client_quantiles([g.token_times[-1] for g in done])},
        server=anatomy(before, after).to_dict() if before is not None and after is not None else None,
        busiest=busiest.max, error=errors[0] if errors else "")


# --- the sweep --------------------------------------------------------------------------------------------------------

def _requests_for(mode: str, load: float, min_requests: int) -> int:
    # Enough requests that every client sends a few (a step's p99 over 2 requests says nothing), and for an open
    # loop about 8 s of arrivals (with fewer, the last requests' drain makes the achieved rate read low).
    return int(max(min_requests, 2 * load if mode == "concurrency" else 8 * load))


def _contended(step: Step) -> bool:
    """The server's own evidence that the engine is busy with others' prompts: prefill holds most of TTFT while
    requests are in prefill nearly all the time (finished/s x mean prefill, Little's law)."""
    share, prefill = (step.server or {}).get("prefill_share_ttft"), step.server_mean("prefill")
    return share is not None and prefill is not None and share >= PREFILL_SHARE_BOUND \
        and step.achieved_rps * prefill >= PREFILL_BUSY


def _knee(steps: list[Step]) -> dict | None:
    """The last step before throughput stops growing while latency turns up."""
    for i in range(1, len(steps)):
        a, b = steps[i - 1], steps[i]
        if a.achieved_rps <= 0 or a.ttft_p50 is None or b.ttft_p50 is None:
            continue
        gain, slower = b.achieved_rps / a.achieved_rps, b.ttft_p50 / a.ttft_p50
        if b.mode == "rate":  # an open loop: the server falls behind the arrivals and the wait grows
            queued = (b.queue_share or 0.0) >= QUEUE_SHARE_SATURATED
            if b.achieved_rps < KEEP_UP * b.load and (slower >= KNEE_LATENCY or queued):
                return {"step": i - 1, "load": a.load, "rps": a.achieved_rps,
                        "how": (f"at {b.load:g} req/s of arrivals the server finished only {b.achieved_rps:.2f} req/s "
                                f"while TTFT p50 {_ttft_change(slower)} ({1000 * a.ttft_p50:.0f} -> "
                                f"{1000 * b.ttft_p50:.0f} ms)" + (f" and queueing was {100 * b.queue_share:.0f}% of "
                                                                  "TTFT" if queued else ""))}
            continue
        queued, contended = (b.queue_share or 0.0) >= QUEUE_SHARE_SATURATED, _contended(b)
        if b.load / a.load >= 1.5 and slower >= KNEE_LATENCY \
                and gain < (KNEE_GAIN_QUEUED if queued or contended else KNEE_GAIN):
            why = (f" and queueing was {100 * b.queue_share:.0f}% of TTFT" if queued else
                   f" and prefill was {100 * b.server['prefill_share_ttft']:.0f}% of TTFT" if contended else "")
            return {"step": i - 1, "load": a.load, "rps": a.achieved_rps,
                    "how": (f"from {a.load:g} to {b.load:g} {unit(a.mode)} throughput "
                            f"{fmt_change(100 * (gain - 1), only=True)} ({a.achieved_rps:.2f} -> "
                            f"{b.achieved_rps:.2f} req/s) while "
                            f"TTFT p50 grew {slower:.1f}x ({1000 * a.ttft_p50:.0f} -> {1000 * b.ttft_p50:.0f} ms)"
                            + why)}
    return None


def _ttft_change(ratio: float) -> str:
    # a queued open loop is a knee even where TTFT held or fell: then say so, never "grew 0.8x"
    return f"grew {ratio:.1f}x" if ratio >= KNEE_LATENCY else fmt_change(100 * (ratio - 1))


def _meets(step: Step, slo: dict[str, float]) -> bool | None:
    if not slo:
        return None
    checks = {"ttft_p99": step.client["ttft"]["p99"], "itl_p99": step.client["itl"]["p99"]}
    return step.ok > 0 and step.errors == 0 and all(checks[k] is not None and checks[k] <= v for k, v in slo.items())


def _goodput(steps: list[Step]) -> dict | None:
    good = [(i, s) for i, s in enumerate(steps) if s.meets_slo]
    if not good:
        return None
    i, s = max(good, key=lambda x: x[1].achieved_rps)
    return {"rps": s.achieved_rps, "step": i, "load": s.load, "output_tok_s": s.output_tok_s}


def _validate(mode: str, slo_ttft_p99: float | None, slo_itl_p99: float | None, min_requests: int,
              max_seconds: float, max_new_tokens: int, prompt_tokens: int) -> dict[str, float]:
    """The settings checked before anything is sent; returns the SLO dict."""
    if mode not in MODES:
        raise SweepError(f"Mode {mode!r} is not one of {', '.join(MODES)}.")
    slo = {k: v for k, v in (("ttft_p99", check_slo("--slo-ttft-p99", slo_ttft_p99)),
                             ("itl_p99", check_slo("--slo-itl-p99", slo_itl_p99))) if v is not None}
    if not 1 <= min_requests <= 10_000:
        raise SweepError(f"--min-requests must be 1 to 10000 (got {min_requests}).")
    if not 5 <= max_seconds <= 3600:
        raise SweepError(f"--max-seconds must be 5 to 3600 (got {max_seconds:g}).")
    if not 1 <= max_new_tokens <= 4096 or not 1 <= prompt_tokens <= 32768:
        raise SweepError("max_new_tokens must be 1-4096 and prompt_tokens 1-32768.")
    return slo


def _plan(eng: RemoteEngine, mode: str, steps: list[float] | None, prompt_tokens: int, texts: list | None,
          params: GenerationParams, stop: Callable[[], bool], api_key: str | None, progress: Progress) -> list[float]:
    if steps:
        return list(steps)
    if mode == "concurrency":
        return [float(c) for c in AUTO_CONCURRENCY]
    # auto rate: from half of what one client at a time achieves, doubling
    progress(0.0, "Measuring one request at a time to choose the first rate")
    one = run_step(eng, exact_prompts(eng, 2, prompt_tokens, texts), params, "concurrency", 1, stop, api_key)
    first = max(0.1, round(one.achieved_rps / 2, 2))
    return [first * 2 ** k for k in range(MAX_STEPS)]


@dataclass
class _Run:
    """One sweep's moving parts, passed between its stages."""

    eng: RemoteEngine
    res: SweepResult
    plan: list[float]
    explicit: bool  # steps were listed: they all run (no early stop at the SLO or the knee)
    prompt_tokens: int
    texts: list | None
    params: GenerationParams
    min_requests: int
    api_key: str | None
    progress: Progress
    stop: Callable[[], bool]
    on_step: Callable[[SweepResult], None] | None
    t0: float = 0.0


def _ended(r: _Run, i: int, load: float, step: Step) -> str | None:
    """Why the sweep ends after step i (None: go on); a step that does not count is not appended."""
    res, u, max_seconds = r.res, unit(r.res.mode), r.res.max_seconds
    if r.stop():
        res.status = "cancelled"
        return f"Cancelled during step {i + 1}; the steps before it are kept."
    if time.monotonic() - r.t0 > max_seconds:  # a step cut short has biased percentiles: dropped, not shown
        return f"--max-seconds {max_seconds:g} ran out during step {i + 1} ({load:g} {u}); that step is left out."
    if step.ok == 0:
        res.status = "failed"
        return (f"Every request of step {i + 1} failed ({step.error}); the server may have died. The "
                f"{len(res.steps)} step(s) before it are kept.")
    step.meets_slo = _meets(step, res.slo)
    res.steps.append(step)
    res.knee = _knee(res.steps)
    if r.on_step:
        r.on_step(res)
    if res.slo and step.meets_slo is False and not r.explicit:  # an explicit list runs whole
        return f"The SLO broke at {load:g} {u}."
    if res.knee and not r.explicit:
        return "The knee was found: " + res.knee["how"] + "."
    # The next step sends about twice the requests at twice the load: it takes about as long as this one on a
    # server that keeps up, longer on one that does not. Stop before the budget would be overrun.
    elapsed = time.monotonic() - r.t0
    if i + 1 < len(r.plan) and elapsed + step.wall_s * max(1.0, r.plan[i + 1] / load) * 1.2 > max_seconds:
        return (f"Stopped before {r.plan[i + 1]:g} {u}: it would run past --max-seconds {max_seconds:g} "
                f"({elapsed:.0f} s used).")
    return None


def _run_steps(r: _Run) -> None:
    res, mode = r.res, r.res.mode
    deadline = r.t0 + res.max_seconds
    step_stop = (lambda: r.stop() or time.monotonic() > deadline)
    for i, load in enumerate(r.plan[:MAX_STEPS]):
        n = _requests_for(mode, load, r.min_requests)
        msg = f"Step {i + 1}: {load:g} {unit(mode)}, {n} requests"
        tick = (lambda: r.progress(min(0.99, (time.monotonic() - r.t0) / res.max_seconds), msg))
        tick()
        try:
            step = run_step(r.eng, exact_prompts(r.eng, n, r.prompt_tokens, r.texts), r.params, mode, load,
                            step_stop, r.api_key, seed=i, tick=tick)
        except KeyboardInterrupt:  # Ctrl-C in the CLI: what finished is kept
            res.status, res.stopped = "cancelled", f"Interrupted during step {i + 1}; the steps before it are kept."
            return
        except TriageError as exc:  # the server went away between steps (tokenize or /metrics failed)
            if not res.steps:
                raise
            res.status, res.stopped = "failed", f"The server stopped answering before step {i + 1}: {exc}"
            return
        if (why := _ended(r, i, load, step)) is not None:
            res.stopped = why
            return


def sweep(base_url: str, mode: str = "concurrency", steps: list[float] | None = None, *, prompt_tokens: int = 128,
          max_new_tokens: int = 32, dataset: str | None = None, slo_ttft_p99: float | None = None,
          slo_itl_p99: float | None = None, max_seconds: float = 120.0, min_requests: int = 6,
          api_key: str | None = None, timeout_s: float = 120.0, progress: Progress | None = None,
          should_stop: Callable[[], bool] | None = None, on_step: Callable[[SweepResult], None] | None = None,
          engine: RemoteEngine | None = None, launch_flags: dict[str, str] | None = None) -> SweepResult:
    """Sweep `steps` (None: auto) and return every finished step, the knee, goodput and the verdict. A server that
    stops answering ends the sweep with the steps so far (status "failed"), never an exception after step one.
    `launch_flags` ({--flag: value}) are the server's launch flags where the caller knows them: no remedy proposes
    one already in force."""
    slo = _validate(mode, slo_ttft_p99, slo_itl_p99, min_requests, max_seconds, max_new_tokens, prompt_tokens)
    texts = read_dataset(dataset) if dataset else None
    progress = progress or (lambda f, m: None)
    stop = should_stop or (lambda: False)
    eng = engine or connect_remote(base_url, api_key, timeout_s=timeout_s, connect_timeout_s=timeout_s)
    info = eng.info  # a given engine is connected already: one connection for the page and its sweep
    if not texts and info.max_model_len and prompt_tokens + max_new_tokens > info.max_model_len:
        raise SweepError(f"prompt_tokens + max_new_tokens = {prompt_tokens + max_new_tokens} exceeds the server's "
                         f"max_model_len {info.max_model_len}.")
    res = SweepResult(base_url=eng.base_url, model=eng.model, mode=mode, prompt_tokens=None if texts else prompt_tokens,
                      max_new_tokens=max_new_tokens, dataset=dataset, slo=slo, max_seconds=max_seconds)
    params = GenerationParams(max_new_tokens=max_new_tokens, top_logprobs=0, stop_at_eos=False)
    r = _Run(eng, res, [], bool(steps), prompt_tokens, texts, params, min_requests, api_key, progress, stop, on_step,
             t0=time.monotonic())
    r.plan = _plan(eng, mode, steps, prompt_tokens, texts, params, stop, api_key, progress)
    _run_steps(r)
    res.stopped = res.stopped or "All steps ran."
    res.wall_s = time.monotonic() - r.t0
    res.goodput = _goodput(res.steps)
    config = _server_config(eng.base_url, api_key, info.max_model_len, launch_flags)
    res.server_config, res.kv_capacity_tokens = config.to_dict(), config.kv_capacity_tokens
    per_request = (prompt_tokens + max_new_tokens) if not texts else None
    res.verdict = verdict(res.steps, slo, res.knee, res.goodput, config, per_request,
                          prompt_tokens if not texts else None)
    progress(1.0, "Done")
    return res


def _server_config(base_url: str, api_key: str | None, max_model_len: int | None,
                   launch_flags: dict[str, str] | None) -> ServerConfig:
    """What the server says of its settings (*_config_info on /metrics, /v1/models) and the flags the caller knows."""
    from core.telemetry.vllm_metrics import scrape

    try:
        snap = scrape(base_url, timeout_s=10.0, api_key=api_key)
    except TriageError:
        snap = None
    return server_config(snap, max_model_len, launch_flags)


def compare_sweeps(before: dict, after: dict) -> dict:
    """Two saved sweeps (to_dict payloads) side by side: goodput, peak throughput and the knee, with % change."""
    def best(d: dict) -> float | None:
        return max((s["achieved_rps"] for s in d.get("steps", [])), default=None)

    def change(a, b):
        return None if a is None or b is None or a == 0 else 100.0 * (b - a) / a

    rows = {}
    for key, get in (("goodput_rps", lambda d: (d.get("goodput") or {}).get("rps")), ("max_rps", best),
                     ("knee_load", lambda d: (d.get("knee") or {}).get("load"))):
        a, b = get(before), get(after)
        rows[key] = {"before": a, "after": b, "change_pct": change(a, b)}
    same = before.get("mode") == after.get("mode") and before.get("prompt_tokens") == after.get("prompt_tokens") \
        and before.get("max_new_tokens") == after.get("max_new_tokens") and before.get("slo") == after.get("slo")
    return {"rows": rows, "same_workload": same,
            "verdicts": {"before": (before.get("verdict") or {}).get("kind"),
                         "after": (after.get("verdict") or {}).get("kind")}}
