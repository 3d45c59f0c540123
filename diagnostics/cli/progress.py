"""The progress lines of a long command (compare, quality, generate): not a command itself."""
from __future__ import annotations

import sys
import time
from typing import Callable


def eta_text(fraction: float, elapsed_s: float) -> str:
    """"12 s elapsed, about 30 s left": the estimate is this run's own pace so far, once it has run a second and
    done some of the work."""
    text = f"{elapsed_s:.0f} s elapsed"
    if elapsed_s >= 1 and 0 < fraction < 1:
        text += f", about {elapsed_s * (1 - fraction) / fraction:.0f} s left"
    return text


def stderr_progress(json_output: bool, clock: Callable[[], float] = time.monotonic) -> Callable[[float, str], None]:
    """progress(fraction, message) that prints each new message once to stderr as "[ 42%] message (12 s elapsed,
    about 30 s left)", so stdout keeps only the result; silent with --json or when stderr is not a terminal."""
    quiet = json_output or not sys.stderr.isatty()
    last, t0 = [""], clock()

    def progress(f: float, msg: str) -> None:
        if not quiet and msg != last[0]:
            print(f"[{100 * f:3.0f}%] {msg} ({eta_text(f, clock() - t0)})", file=sys.stderr)
            last[0] = msg

    return progress


def prefill_progress(json_output: bool) -> Callable[[int, int], None]:
    """on_prefill(done, total) for core.engines.base.RunControl: the prompt's chunks as progress lines on stderr."""
    progress = stderr_progress(json_output)
    return lambda done, total: progress(done / total, f"prefill: {done:,} of {total:,} prompt tokens")
