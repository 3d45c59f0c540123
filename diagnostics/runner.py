"""Run the checklist: sample a window, build the context, run every check, order the findings.

The runner owns everything the checks must not: time, the network, threads, exceptions. A check that raises
becomes an ERROR finding and the others still run; a missing input is the check's own SKIP.
"""
from __future__ import annotations

import datetime as dt
import socket
import threading
import time
import traceback
from typing import Any, Callable, Iterable, Protocol

from core.errors import InputError
from diagnostics.context import CheckContext
from diagnostics.findings import Check, Finding, RunResult, Status
from diagnostics.registry import all_checks

DEFAULT_S = 60.0
MAX_S = 180.0
MIN_S = 1.0
TICK_S = 0.25  # how often progress is reported and cancel is looked at

Progress = Callable[[float, str], None]  # (fraction 0-1, message)


class Cancel(Protocol):
    def is_set(self) -> bool: ...


def check_duration(duration_s: float) -> float:
    if not MIN_S <= duration_s <= MAX_S:
        raise InputError(f"The window must be {MIN_S:g} to {MAX_S:g} s (the checklist is meant to take three "
                         f"minutes at most); got {duration_s:g} s.")
    return float(duration_s)


def evaluate(ctx: CheckContext, checks: Iterable[Check] | None = None) -> list[Finding]:
    """Run every check over one context. Exceptions become ERROR findings; the result is in display order."""
    findings = []
    for check in checks if checks is not None else all_checks():
        try:
            finding = Finding.from_outcome(check, check.decide(ctx))
        except Exception as exc:  # a broken check must not hide what the others found
            tb = traceback.format_exception(type(exc), exc, exc.__traceback__)
            finding = Finding(check.id, check.title, check.severity, Status.ERROR,
                              f"The check itself failed: {type(exc).__name__}: {exc}",
                              "This is a bug in the console, not a finding about your server; the other checks "
                              "ran. Report it with the JSON report attached.",
                              evidence={"exception": f"{type(exc).__name__}: {exc}",
                                        "traceback": "".join(tb[-3:]).strip()}, hint=check.hint)
        findings.append(finding)
    return sorted(findings, key=lambda f: f.sort_key)


def lint_launch(launch_cmd: str | None) -> tuple[Any, str | None]:
    """(LintResult or None, error). Run after the window, not during it: the first read of vLLM's parser imports
    vLLM in a subprocess (~20 s, ~1 GB), which would show up in the very host-memory series being judged."""
    if not launch_cmd:
        return None, None
    from diagnostics.flags import lint_command

    try:
        return lint_command(launch_cmd), None
    except Exception as exc:  # the unknown_flags check then SKIPs; the note says why
        return None, f"{type(exc).__name__}: {exc}"


def load_golden(path: str | None, url: str | None):
    """The golden set at `path` (None when none is given or there is no server to replay it on)."""
    if not path or not url:
        return None
    from core.compare.golden.golden import GoldenSet

    return GoldenSet.load(path)  # InputError (a ValueError) for a missing, foreign or sampled file


def run(duration_s: float = DEFAULT_S, vllm_url: str | None = None, launch_cmd: str | None = None,
        requested_precision: str | None = None, progress: Progress | None = None, cancel: Cancel | None = None,
        sampler: Any = None, checks: Iterable[Check] | None = None, golden: str | None = None) -> RunResult:
    """Sample for `duration_s` (1-180 s), then run the checks. Cancelling ends the window early; the checks still
    run over what was sampled. `golden`: a golden set's path, replayed on the vLLM server after the window (its
    requests never fall inside it). Raises ValueError only for bad inputs (duration, URL, golden set)."""
    from diagnostics.collect import WindowCollector, vllm_base_url

    duration_s = check_duration(duration_s)
    url = vllm_base_url(vllm_url) if vllm_url and vllm_url.strip() else None
    golden_set = load_golden(golden, url)  # a bad file is refused before the window, not after it
    launch_cmd = launch_cmd.strip() if launch_cmd and launch_cmd.strip() else None
    report = progress or (lambda fraction, message: None)
    if sampler is None:
        from core.telemetry.sampler import get_sampler

        sampler = get_sampler()  # shared with the pages: never change its rate from here
    started = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    collector = WindowCollector(sampler, url)
    collector.begin()
    cancelled = False
    while True:
        elapsed = collector.elapsed()
        if elapsed >= duration_s:
            break
        if cancel is not None and cancel.is_set():
            cancelled = True
            break
        collector.poll()
        report(min(elapsed / duration_s, 1.0), f"Sampling: {elapsed:.0f} of {duration_s:.0f} s")
        remaining = duration_s - collector.elapsed()
        wait = max(0.0, min(TICK_S, remaining))
        if isinstance(cancel, threading.Event):
            cancel.wait(wait)  # wakes at once on cancel
        else:
            time.sleep(wait)
    collector.poll(final=True)
    collector.end()
    if launch_cmd:
        report(1.0, "Checking the launch command against vLLM's parser")
    lint, lint_error = lint_launch(launch_cmd)
    replayed = {}
    if golden_set is not None and not cancelled:
        from core.compare.golden.watch import Watch

        report(1.0, f"Replaying the golden set's {len(golden_set.prompts)} prompts on {url}")
        replayed["golden_round"] = Watch(golden_set, [url]).step().replicas[0].to_dict()
    elif golden:
        replayed["golden_reason"] = ("the window was cancelled: the golden set was not replayed" if cancelled else
                                     "no vLLM URL to replay the golden set on (--vllm-url)")
    report(1.0, "Running the checks")
    ctx = collector.context(launch_cmd=launch_cmd, requested_precision=requested_precision, flag_lint=lint,
                            golden_file=golden, **replayed)
    findings = evaluate(ctx, checks)
    notes = collector.notes()
    if lint_error:
        notes.append(f"Flag linter failed: {lint_error}")
    elif lint is not None:
        notes.append(f"Launch command checked against {lint.table_source}.")
    report(1.0, "Done")
    return RunResult(
        started_at=started, requested_s=duration_s, window_s=ctx.window_s, cancelled=cancelled,
        host=socket.gethostname(),
        inputs={"vllm_url": url, "launch_cmd": launch_cmd, "requested_precision": requested_precision,
                **({"golden": golden} if golden else {})},
        findings=tuple(findings), collector_notes=tuple(notes))
