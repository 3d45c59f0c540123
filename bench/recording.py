"""What every recording script shares (bench/record_demo.py, bench/record_incident.py, bench/remedy_grid.py): the
log line, the UTC time stamp, the machine a recording says it ran on, how its file is written, and the load that
keeps a vLLM server busy while it is recorded."""
from __future__ import annotations

import json
import os
import platform
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def log_changes(prefix: str):
    """A progress callback that logs a message once, not at every tick."""
    last = [None]

    def report(fraction: float, message: str) -> None:
        if message != last[0]:
            last[0] = message
            log(f"{prefix}{message}")
    return report


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_description() -> str:
    return f"{os.cpu_count()}-core {cpu_model()}"


def vllm_description() -> str:
    from core.engines.vllm_engine import vllm_flavor, vllm_python

    flavor, version = vllm_flavor(str(vllm_python()))
    return f"{flavor} {version}" if flavor else "vLLM"


def server_machine() -> str:
    """The machine of a recording taken from vLLM servers started here: the host and the vLLM that served."""
    return f"{host_description()}, {vllm_description()}"


def write_recording(out: Path, name: str, kind: str, title: str, machine: str, recorded_at: str, captured_by: str,
                    payload: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    rec = {"kind": kind, "title": title, "machine": machine, "recorded_at": recorded_at, "captured_by": captured_by,
           "payload": payload}
    path.write_text(dumps(rec))
    log(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")
    return path


def load_until(url: str, until: float, clients: int, prompt: int, new: int, errors: list) -> None:
    """The console's own probe, over and over: `clients` streamed requests at a time until `until`."""
    from core.deployment.probe import probe

    while time.time() < until:
        try:
            probe(url, n=clients, prompt_tokens=prompt, max_new_tokens=new, concurrency=clients, timeout_s=180)
        except Exception as exc:  # keep loading; the snapshot shows what the server did
            errors.append(f"{url}: {type(exc).__name__}: {str(exc)[:160]}")
            time.sleep(1)


# --- derived text, again from a recording's raw data ----------------------------------------------------------------
# A recording keeps what was measured (a Fleet snapshot, a sweep's steps, a remedy's before/after sweeps) and the
# sentences the console wrote from it then. The sentences belong to the code, not to the run: `python -m
# bench.record_demo regenerate` writes them again with the code as it is now, and tests/unit/test_recordings.py fails
# while a recording still holds an older sentence.

REGENERATE = "python -m bench.record_demo regenerate"
# The fleet command sweeps one of its servers after the Fleet snapshot: that sweep's banner names the fleet command.
FLEET_SWEEP_CAPTURED_BY = ("python -m bench.record_demo fleet (after its Fleet snapshot, core.deployment.sweep of the "
                           "server started without --max-num-seqs)")
CHECKLIST_NOTE = ("The checklist's findings are as it wrote them during the capture: the window's scrapes and "
                  "samples they were judged from are not saved, so no code can derive them again.")
# said where both findings are there: their counts of waiting requests differ because they read different moments
WAITING_NOTE = (" The waiting count in vllm.saturation is the peak over the window; the running and waiting in "
                "vllm.liveness are the gauges at its last round, a different moment.")
NO_CONFIG_NOTE = ("The server's settings were not saved with this sweep: its remedies are derived knowing none of "
                  "them in force.")


def sweep_config(payload: dict):
    """The ServerConfig a saved sweep was judged with: its saved server_config, or none known."""
    from core.deployment.server_config import ServerConfig

    saved = payload.get("server_config")
    return ServerConfig(**saved) if isinstance(saved, dict) and saved else ServerConfig()


def sweep_derived(payload: dict) -> dict:
    """A saved sweep's (SweepResult.to_dict()) knee, goodput and verdict from its steps, SLO, workload and server
    settings, as core.deployment.sweep.sweep derives them."""
    from core.deployment.step import Step
    from core.deployment.sweep import _goodput, _knee
    from core.deployment.verdict import verdict

    steps = [Step(**s) for s in payload.get("steps") or []]
    knee, goodput = _knee(steps), _goodput(steps)
    prompt, new = payload.get("prompt_tokens"), payload.get("max_new_tokens")
    texts = bool(payload.get("dataset"))
    per_request = prompt + new if prompt and new and not texts else None
    return {"knee": knee, "goodput": goodput,
            "verdict": verdict(steps, payload.get("slo") or {}, knee, goodput, sweep_config(payload), per_request,
                               None if texts else prompt)}


def fleet_derived(payload: dict) -> dict:
    """A saved Fleet run's (diagnostics.fleet.FleetRun.to_dict()) outliers, fleet median and checklist from its
    snapshot, as diagnostics.fleet.run derives them."""
    from core.fleet.fleet import FleetSnapshot, rank
    from diagnostics.checks.fleet import CHECKS
    from diagnostics.findings import RunResult
    from diagnostics.runner import evaluate

    snap = FleetSnapshot.from_dict(payload["fleet"])
    for r in snap.replicas:
        r.outliers = {}
    snap.fleet_median = rank(snap.replicas)
    run = replace(RunResult.from_dict(payload["checklist"]), findings=tuple(evaluate(snap, CHECKS)))
    return {"outliers": [r.outliers for r in snap.replicas], "fleet_median": snap.fleet_median,
            "findings": [f.to_dict() for f in run.findings], "counts": run.counts()}


def _trial(t: dict):
    """A saved trial (Trial.to_dict()) as a core.deployment.remedy.Trial, for the rules that rank trials."""
    from core.deployment import remedy as rm

    r = t.get("remedy") or {}
    return rm.Trial(rm.Remedy(r.get("text", ""), dict(t.get("flags_changed") or {}), r.get("kind", "")),
                    t.get("before") or {}, t.get("after"), list(t.get("flags_before") or []),
                    list(t.get("flags_after") or []), t.get("comparison") or {}, t.get("verdict") or {})


def _server(t: dict):
    """The original server of a saved trial, as far as the rules need it: its launch flags."""
    from core.deployment.servers import LocalServer

    return LocalServer(0, 0, "", list(t.get("flags_before") or []), "", 0.0, 0)


def remedy_derived(payload: dict) -> tuple[dict, list[str]]:
    """A saved remedy document's (core.deployment.remedy.result_of) derived parts from its trials' sweeps, as
    core.deployment.remedy.guided and result_of derive them: each sweep's verdict, each trial's remedy text,
    comparison and verdict, the best trial and the summary. The flags each trial ran with are what was measured and
    stay; a remedy whose flags today's verdict would not propose keeps its saved text and is named in the notes."""
    from core.deployment import remedy as rm

    notes: list[str] = []
    trials = []
    for t in payload.get("trials") or []:
        t = dict(t)
        for side in ("before", "after"):
            if isinstance(t.get(side), dict):
                t[side] = {**t[side], **sweep_derived(t[side])}
        trials.append(t)
    for i, t in enumerate(trials):
        # guided(): the first trial follows the original sweep's remedies, a later one the best sweep so far's, on
        # top of the flags that won
        won = [u for u in trials[:i] if (u.get("verdict") or {}).get("kind") == "helped"]
        best = max(won, key=lambda u: _trial(u).score, default=None)
        base = dict((best or {}).get("flags_changed") or {})
        source = best["after"] if best else t.get("before") or {}
        flags = t.get("flags_changed") or {}
        same = next((r for r in rm.remedies_for(source) if r.concrete and {**base, **r.flags} == flags), None)
        if same is None:  # guided()'s fallback where no verdict names a flag: the last helping change once more
            same = rm.one_more_step([_trial(u) for u in trials[:i]], _server(t))
            same = same if same is not None and same.flags == flags else None
        if same is not None:
            t["remedy"] = {"text": same.text, "flags": dict(flags), "kind": same.kind}
        else:
            notes.append(f"Try {i + 1} ran {rm.Remedy('', flags).flag_text()}, which today's verdicts do not "
                         "propose after the tries before it; its remedy text is as saved.")
        if t.get("after") is not None and t.get("comparison"):
            t["comparison"] = rm.compare(t["before"], t["after"])
            rows = t["comparison"]["rows"]
            t["goodput_change"], t["peak_rps_change"] = rows.get("goodput_rps"), rows.get("max_rps")
            t["verdict"] = rm.judge(t["comparison"], (t["before"] or {}).get("slo") or {},
                                    rm.Remedy("", flags).flag_text())
    ran = [t for t in trials if t.get("after") is not None]
    helped = [t for t in ran if (t.get("verdict") or {}).get("kind") == "helped"]
    best = max(helped, key=lambda t: _trial(t).score, default=None)
    shown = best or (ran[0] if ran else trials[0] if trials else None)
    out = {"trials": trials, "best": None if best is None else trials.index(best),
           "summary": (best["verdict"]["headline"] if best else "No remedy tried helped; keep the flags you had."
                       if ran else (shown.get("verdict") or {}).get("headline", "Nothing was tried.") if shown
                       else "Nothing was tried.")}
    if shown is not None:  # result_of(): the shown trial's parts at the top
        out.update({k: shown[k] for k in ("remedy", "before", "after", "flags_changed", "goodput_change",
                                          "peak_rps_change", "comparison", "verdict") if k in shown})
    return out, notes


def regenerated(rec: dict) -> dict:
    """The recording with every part derived from its raw data written again by the code as it is now, its raw data
    and key order kept; a part that cannot be derived again is said in its "note"."""
    out = dict(rec)
    p = dict(rec["payload"])
    notes: list[str] = []
    if rec["kind"] == "fleet":
        d = fleet_derived(p)
        fleet = dict(p["fleet"])
        fleet["replicas"] = [{**r, "outliers": o} for r, o in zip(fleet["replicas"], d["outliers"])]
        fleet["fleet_median"] = d["fleet_median"]
        p["fleet"] = fleet
        p["checklist"] = {**p["checklist"], **{k: d[k] for k in ("counts", "findings")}}
    elif rec["kind"] == "sweep":
        p.update(sweep_derived(p))
        if rec["captured_by"].startswith("python -m bench.record_demo fleet"):
            out["captured_by"] = FLEET_SWEEP_CAPTURED_BY
        if not p.get("server_config"):
            notes.append(NO_CONFIG_NOTE)
    elif rec["kind"] == "remedy":
        d, notes = remedy_derived(p)
        p.update(d)
    elif rec["kind"] == "checklist":
        from diagnostics.findings import RunResult

        p["counts"] = RunResult.from_dict(p).counts()
        ids = {f.get("id") for f in p.get("findings") or [] if f.get("status") != "SKIP"}
        notes.append(CHECKLIST_NOTE + (WAITING_NOTE if {"vllm.saturation", "vllm.liveness"} <= ids else ""))
    out["payload"] = p
    if notes:
        out["note"] = " ".join(notes)
    else:
        out.pop("note", None)
    return out


def dumps(rec: dict) -> str:
    """A recording's file text: compact JSON, the capturing checkout's paths (a vLLM Python the checklist read flags
    through) shown relative to it."""
    return json.dumps(rec, separators=(",", ":"), default=str).replace(f"{ROOT}/", "")
