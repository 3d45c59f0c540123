"""Long-context runs saved to the history (core.store, kind "longdoc") while they run.

A run is stored as "running" before its first result, checkpointed after every result (one length of a ramp, one
needle depth, one batch size) and finished at the end, so a crash or a killed server keeps what finished and the
history shows the run as interrupted. The history is a convenience: a store failure never stops or hides a run,
it becomes one warning line (`Recorder.warning`) for the page to show beside the result.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from core import store
from core.engines.base import Cancelled, EngineError, stopped_at

KIND = "longdoc"
TESTS = {"single": "Single run", "ramp": "Length ramp", "needle": "Needle", "batch": "Batch sweep"}


def as_dict(result: Any) -> dict:
    """A RunResult or NeedleResult as the plain dict kept in session state and in the payload."""
    return result if isinstance(result, dict) else result.to_dict()


def _s(ms: float | None) -> float | None:
    return None if ms is None else ms / 1000


def summary(test: str, results: list[dict]) -> dict:
    """Headline numbers for the history list and its numeric comparison of two runs."""
    if not results:
        return {"results": 0}
    if test == "needle":
        control = next((r["answer_logprob"] for r in results if r["depth"] == "none"), None)
        by = {r["depth"]: r for r in results}
        return {"prompt_tokens": results[0]["prompt_tokens"], "answer_tokens": results[0]["answer_tokens"],
                "answer_logprob": {d: r["answer_logprob"] for d, r in by.items()},
                "lift_over_control": {d: r["answer_logprob"] - control for d, r in by.items()
                                      if d != "none" and control is not None},
                "top1_hits": {d: r["top1_hits"] for d, r in by.items()}}
    last = results[-1]
    head = {"prompt_tokens": last["prompt_tokens"], "new_tokens": last["new_tokens"], "batch": last["batch"],
            "ttft_s": _s(last["ttft_ms"]), "itl_p50_s": _s(last["itl_p50_ms"]), "itl_p99_s": _s(last["itl_p99_ms"]),
            "decode_tok_s": last["decode_tok_s"], "peak_bytes": last["peak_bytes"], "kv_bytes": last["kv_bytes"]}
    if test == "single":
        return head
    key = "prompt_tokens" if test == "ramp" else "batch"
    return {**head, "points": len(results),  # the last point's numbers, then each point's for comparing two runs
            "ttft_s_by": {str(r[key]): _s(r["ttft_ms"]) for r in results},
            "decode_tok_s_by": {str(r[key]): r["decode_tok_s"] for r in results}}


def title(test: str, model: str, params: dict) -> str:
    what = {"single": lambda p: f"{p['prompt_tokens']:,} + {p['new_tokens']} tokens",
            "ramp": lambda p: f"{', '.join(f'{n:,}' for n in sorted(p['lengths']))} tokens",
            "needle": lambda p: f"{p['prompt_tokens']:,} tokens, fact at start/middle/end",
            "batch": lambda p: f"batch {'/'.join(map(str, p['batches']))}, {p['prompt_tokens']:,} tokens"}[test]
    return f"Long context, {TESTS[test].lower()}: {what(params)} · {model}"


@dataclass
class Recorder(store.RunRecorder):
    test: str
    model: str
    params: dict
    results: list[dict] = field(default_factory=list)
    kind = KIND

    def _title(self) -> str:
        return title(self.test, self.model, self.params)

    def _payload(self, **extra) -> dict:
        return {"test": self.test, "model": self.model, "params": self.params, "results": self.results, **extra}

    def _summary(self) -> dict:
        return summary(self.test, self.results)

    def add(self, result: dict) -> None:
        self.results.append(result)
        self.checkpoint()


def keep_speeds(setup: str | None, result: dict) -> None:
    """A one-sequence run's prefill and decode speeds, kept for the hints before later runs on the same setup."""
    if setup and result.get("batch") == 1 and result.get("prefill_tok_s"):
        store.add_speed("prefill", setup, result["prefill_tok_s"])
        if result.get("decode_tok_s"):
            store.add_speed("decode", setup, result["decode_tok_s"])


@dataclass
class Outcome:
    status: str  # "finished", "cancelled" or "failed"
    message: str | None  # what to tell the user when it did not finish
    warning: str | None  # the history could not be written


def run_recorded(test: str, model: str, params: dict,
                 fn: Callable[[Callable[[Any], None]], Any], on_result: Callable[[dict], None]) -> Outcome:
    """Run fn(keep) under a Recorder: every result goes to on_result (the page's state) and to the history at once.
    Anything but a clean finish is stored as failed with the reason; a stop that is not an error (Streamlit ending
    the script for a rerun, Ctrl-C) is stored and then re-raised so it still stops the script."""
    rec = Recorder(test, model, params)
    rec.begin()

    def keep(result: Any) -> None:
        d = as_dict(result)
        on_result(d)
        rec.add(d)
        keep_speeds(params.get("setup"), d)

    try:
        fn(keep)
    except Cancelled:
        rec.finish(f"Cancelled; {len(rec.results)} result(s) kept.", cancelled=True, at=stopped_at())
        return Outcome("cancelled", "Cancelled.", rec.warning)
    except (ValueError, EngineError) as exc:  # refused input or an engine limit: the message says what to do
        rec.finish(str(exc))
        return Outcome("failed", str(exc), rec.warning)
    except Exception as exc:  # noqa: BLE001 - any other failure is shown and stored, the page keeps working
        msg = f"The run failed: {type(exc).__name__}: {exc}"
        rec.finish(msg)
        return Outcome("failed", msg, rec.warning)
    except BaseException:
        rec.finish(f"Stopped before the end (Cancel, a widget change or a server stop); "
                   f"{len(rec.results)} result(s) kept.", cancelled=True, at=stopped_at())
        raise
    rec.finish()
    return Outcome("finished", None, rec.warning)
