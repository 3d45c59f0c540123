"""The progress lines of a long command (compare, quality): not a command itself."""
from __future__ import annotations

import sys
from typing import Callable


def stderr_progress(json_output: bool) -> Callable[[float, str], None]:
    """progress(fraction, message) that prints each new message once to stderr as "[ 42%] message", so stdout keeps
    only the result; silent with --json or when stderr is not a terminal."""
    quiet = json_output or not sys.stderr.isatty()
    last = [""]

    def progress(f: float, msg: str) -> None:
        if not quiet and msg != last[0]:
            print(f"[{100 * f:3.0f}%] {msg}", file=sys.stderr)
            last[0] = msg

    return progress
