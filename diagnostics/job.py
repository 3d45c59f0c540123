"""A checklist run in a background thread, so a page can show progress and offer Cancel while the window runs.

Streamlit reruns the page script on every click; a run that lived in the script would die with the rerun. The
job lives in the session's state instead, and the page only reads it.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from diagnostics.findings import RunResult


@dataclass
class Job:
    duration_s: float
    cancel: threading.Event = field(default_factory=threading.Event)
    fraction: float = 0.0
    message: str = "Starting"
    result: RunResult | None = None
    error: str | None = None
    reports: dict[str, str] = field(default_factory=dict)  # "md" | "json" | "html" -> text, rendered once
    thread: threading.Thread | None = None
    run_id: int | None = None  # its row in History (None when history could not be written)

    @property
    def done(self) -> bool:
        return self.result is not None or self.error is not None

    def _progress(self, fraction: float, message: str) -> None:
        self.fraction, self.message = fraction, message

    def _work(self, kwargs: dict[str, Any]) -> None:
        from core import store
        from diagnostics import report, runner

        # Saved as "running" first: if the app dies mid-window, History lists the run as interrupted.
        self.run_id = store.quietly(store.begin_run, "checklist", report.history_title(kwargs, self.duration_s),
                                    {"inputs": kwargs, "requested_s": self.duration_s})
        try:
            result = runner.run(self.duration_s, progress=self._progress, cancel=self.cancel, **kwargs)
            self._progress(1.0, "Writing the reports")
            self.reports = {"md": report.to_markdown(result), "json": report.to_json(result),
                            "html": report.to_html(result)}
            if self.run_id is not None:
                store.quietly(store.finish_run, self.run_id, result.to_dict(), report.history_summary(result))
            self.result = result  # last: `done` flips only once the reports exist
        except Exception as exc:  # shown on the page; the thread must not die silently
            self.error = f"{type(exc).__name__}: {exc}"
            if self.run_id is not None:
                store.quietly(store.finish_run, self.run_id, status="failed", error=self.error)


def start(duration_s: float, vllm_url: str | None = None, launch_cmd: str | None = None,
          requested_precision: str | None = None, golden: str | None = None) -> Job:
    """Validate the inputs now (ValueError with a sentence to show), then run in a daemon thread."""
    from diagnostics.collect import vllm_base_url
    from diagnostics.runner import check_duration, load_golden

    check_duration(duration_s)
    if vllm_url and vllm_url.strip():
        load_golden(golden, vllm_base_url(vllm_url))  # a bad golden set is refused here, before the window
    job = Job(duration_s)
    kwargs = {"vllm_url": vllm_url, "launch_cmd": launch_cmd, "requested_precision": requested_precision,
              **({"golden": golden} if golden else {})}
    job.thread = threading.Thread(target=job._work, args=(kwargs,), name="diagnostics-run", daemon=True)
    job.thread.start()
    return job
