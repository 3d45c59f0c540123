"""Quality runs saved to the history (core.store, kind "quality") while they run: stored as "running" before the
reference pass, checkpointed after every precision's row, finished (or failed / cancelled, with what finished) at the
end. A store failure never stops a run: it becomes one warning line for the page or the CLI.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable

from core import store
from core.engines.base import Cancelled

KIND = "quality"
KEEP_KLD_VALUES = 4000  # per precision in the payload: enough for the distribution chart, bounded in size


def title(model: str, params: dict) -> str:
    """Short enough to read whole in History's table; the model and the stride are in the run's details."""
    return (f"Quality {', '.join(params['candidates'])} vs {params['reference']} · {params['document']} · "
            f"window {params['window']:,}")


_OLD_TITLE = re.compile(r"Quality: (?P<cands>.+) vs (?P<ref>\S+) on (?P<doc>.+) \(window (?P<window>[\d,]+), "
                        r"stride [\d,]+\) · .*")


def short_title(stored: str) -> str:
    """The title to list for a stored run: older versions put the model and the stride in it, too long to read
    whole in History's table; those are in the run's details."""
    m = _OLD_TITLE.fullmatch(stored)
    return (f"Quality {m['cands']} vs {m['ref']} · {m['doc']} · window {m['window']}" if m else stored)


def slim(row: dict) -> dict:
    """A row as stored: per-position KL values thinned to KEEP_KLD_VALUES (evenly), rounded."""
    vals = row.get("kld_values")
    if not vals:
        return row
    step = max(1, -(-len(vals) // KEEP_KLD_VALUES))
    return {**row, "kld_values": [round(v, 6) for v in vals[::step]]}


def summary(rows: list[dict]) -> dict:
    """Headline numbers for the history list and its numeric comparison of two runs."""
    out: dict[str, Any] = {"rows": len(rows)}
    for r in rows:
        out[f"ppl_{r['name']}"] = r["perplexity"]
        if r.get("kld"):
            out[f"kld_mean_{r['name']}"] = r["kld"]["mean"]
            out[f"same_top_{r['name']}"] = r["same_top"]["share"]
    return out


@dataclass
class Recorder(store.RunRecorder):
    model: str
    params: dict
    rows: list[dict] = field(default_factory=list)
    kind = KIND

    def _title(self) -> str:
        return title(self.model, self.params)

    def _payload(self, **extra) -> dict:
        return {"model": self.model, "params": self.params, "rows": [slim(r) for r in self.rows], **extra}

    def _summary(self) -> dict:
        return summary(self.rows)

    def add(self, row: dict) -> None:
        self.rows.append(row)
        self.checkpoint()

    def finish(self, result: dict | None = None, error: str | None = None, cancelled: bool = False) -> None:
        """`result` goes into the payload beside the rows kept as they came (its own rows left out)."""
        if self.run_id is None:
            return
        super().finish(error, cancelled, extra={k: v for k, v in (result or {}).items() if k != "rows"})


@dataclass
class Outcome:
    status: str  # "finished", "cancelled" or "failed"
    result: dict | None
    message: str | None
    warning: str | None
    run_id: int | None


def run_recorded(model: str, params: dict, fn: Callable[[Callable[[dict], None]], dict],
                 on_result: Callable[[dict], None] = lambda r: None, reraise: tuple = ()) -> Outcome:
    """fn(keep) under a Recorder; every row goes to on_result and to the history at once. A TriageError (refused
    input, a model that cannot load) is stored as failed with its message; anything in `reraise` is re-raised after
    it is stored; a stop that is not an error (Streamlit ending the script, Ctrl-C) is stored and re-raised."""
    from core.errors import TriageError

    rec = Recorder(model, params)
    rec.begin()

    def keep(row: dict) -> None:
        on_result(row)
        rec.add(row)

    try:
        result = fn(keep)
    except Cancelled:
        rec.finish(error=f"Cancelled; {len(rec.rows)} row(s) kept.", cancelled=True)
        return Outcome("cancelled", None, "Cancelled.", rec.warning, rec.run_id)
    except TriageError as exc:
        rec.finish(error=str(exc))
        if isinstance(exc, reraise):
            raise
        return Outcome("failed", None, str(exc), rec.warning, rec.run_id)
    except Exception as exc:
        rec.finish(error=f"The run failed: {type(exc).__name__}: {exc}")
        raise
    except BaseException:
        rec.finish(error=f"Stopped before the end; {len(rec.rows)} row(s) kept.", cancelled=True)
        raise
    rec.finish(result)
    return Outcome("finished", result, None, rec.warning, rec.run_id)
