"""`python -m diagnostics watch --url URL`: a vLLM server's liveness, one line per change of state, until stopped."""
from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import signal
import sys
import time

from core.deployment.liveness import CANARY_GAP_FACTOR, CANARY_MIN_GAP_S
from core.errors import InputError
from core.fmt import fmt_liveness


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "watch", help="watch one vLLM server: serving, idle, stalled, degraded or checking, a line per change",
        description="Checks a vLLM server every interval (counters on /metrics, /health, and on this host its "
                    "processes and GPU; a 1-token canary only where the counters cannot speak, at most one every "
                    f"{CANARY_MIN_GAP_S:g} s or {CANARY_GAP_FACTOR:g}x the server's time to first token, whichever is "
                    "longer) and prints a line whenever its state changes: serving, idle (a canary got its token "
                    "after the last progress), stalled (which kind, with the evidence and what to do), degraded, or "
                    "checking (the evidence fits both a live and a stopped engine until the next rounds decide). "
                    "Runs until Ctrl-C or --max-seconds; exits 0 then.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--interval", type=float, default=2.0, metavar="S", help="seconds between checks (default 2)")
    p.add_argument("--max-seconds", type=float, metavar="S", help="stop after S seconds (default: run until Ctrl-C)")
    p.add_argument("--canary-timeout", type=float, default=5.0, metavar="S",
                   help="seconds the 1-token canary may take (default 5)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="the server's --api-key (default: $VLLM_API_KEY)")
    p.add_argument("--json", action="store_true", help="one JSON object per line")
    p.set_defaults(func=run)


def _line(verdict, t_s: float, as_json: bool) -> str:
    stamp = dt.datetime.now().astimezone().isoformat(timespec="seconds")
    if as_json:
        return json.dumps({"time": stamp, "t_s": round(t_s, 1), **verdict.to_dict()}, default=str)
    text = f"{stamp} +{t_s:.0f}s {fmt_liveness(verdict.state, verdict.kind)}: {verdict.headline}"
    return text + (f"\n    do: {verdict.remedy}" if verdict.remedy else "")


def run(args: argparse.Namespace) -> int:
    from core.deployment.liveness import Tracker
    from core.deployment.observe import Observer

    if not 0.2 <= args.interval <= 300:
        raise InputError(f"--interval must be 0.2 to 300 s; got {args.interval:g}.")
    if args.max_seconds is not None and args.max_seconds <= 0:
        raise InputError(f"--max-seconds must be positive; got {args.max_seconds:g}.")
    if not 0.5 <= args.canary_timeout <= 120:
        raise InputError(f"--canary-timeout must be 0.5 to 120 s; got {args.canary_timeout:g}.")
    observer = Observer(args.url, args.api_key, args.canary_timeout)
    model = observer.connect()  # a URL that is no vLLM server fails here, with the reason, before any verdict
    print(f"watching {observer.base_url} (model {model}) every {args.interval:g} s; canaries only where the counters "
          f"cannot speak, at most one every {CANARY_MIN_GAP_S:g} s or {CANARY_GAP_FACTOR:g}x the server's time to "
          "first token" + ("" if observer.processes else "; not on this host, so its processes are not read"),
          file=sys.stderr)
    tracker, t0, shown = Tracker(), time.monotonic(), None
    # Ctrl-C ends a watch even where it was started with SIGINT ignored (a background job), and so does SIGTERM (a
    # service manager's stop): both end it cleanly, with exit code 0.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        while args.max_seconds is None or time.monotonic() - t0 < args.max_seconds:
            started = time.monotonic()
            verdict = tracker.add(observer.observe())
            if (verdict.state, verdict.kind) != shown:
                shown = (verdict.state, verdict.kind)
                print(_line(verdict, started - t0, args.json), flush=True)
            left = float("inf") if args.max_seconds is None else args.max_seconds - (time.monotonic() - t0)
            time.sleep(max(0.0, min(left, args.interval - (time.monotonic() - started))))
    except KeyboardInterrupt:
        pass  # Ctrl-C is how a watch ends
    finally:
        observer.close()
    return 0
