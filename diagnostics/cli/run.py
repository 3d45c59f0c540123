"""`python -m diagnostics run`: the three-minute checklist from the command line. Exit 0 whenever it ran."""
from __future__ import annotations

import argparse
import signal
import sys
import threading
import time

from core.precision import Precision
from diagnostics.cli.fleet import add_prometheus_args, print_run, window_and_at
from diagnostics.runner import DEFAULT_S, MAX_S


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "run", help="sample GPU, host and vLLM for a window and run the diagnostic checklist",
        description="Samples GPU (NVML/GPM), host memory (psutil) and optionally a vLLM server's /metrics for a "
                    "window, then runs every check. Exit status 0 whenever the checklist ran, whatever it found; "
                    "Ctrl-C ends the window early and still runs the checks.")
    p.add_argument("--duration", type=float, default=DEFAULT_S, metavar="S",
                   help=f"window in seconds (default {DEFAULT_S:g}, at most {MAX_S:g})")
    p.add_argument("--vllm-url", metavar="URL", help="vLLM server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--launch-cmd", metavar="CMD", help='the server\'s launch command, e.g. "vllm serve MODEL ..."')
    p.add_argument("--precision", choices=[x.value for x in Precision],
                   help="the precision you asked for, when the launch command does not say")
    p.add_argument("--golden", metavar="FILE", help="with --vllm-url: a golden set (`golden record` writes one) "
                   "replayed on the server after the window; golden.agreement says whether it still answers the same")
    p.add_argument("--json", action="store_true", help="print the JSON report on stdout")
    p.add_argument("--quick", action="store_true",
                   help="with --vllm-url: a first answer within seconds from the server's counters since it started, "
                        "beside a 5 s window's own, before the full window refines it (and says what it revised)")
    add_prometheus_args(p, required=False)  # given: the fleet checklist from Prometheus instead of this host
    p.add_argument("--report-dir", metavar="D", help="also write Markdown, JSON and HTML reports into D "
                   "(HTML needs plotly; without it the other two are written and the run still exits 0)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from core import store
    from diagnostics import report, runner

    if args.prometheus_url:
        from core.fleet.prom import Prometheus
        from diagnostics import fleet

        window, at = window_and_at(args)
        print_run(fleet.run(Prometheus(args.prometheus_url), args.selector, args.replica_label, window, at=at),
                  args.json)
        return 0

    cancel = threading.Event()
    # First Ctrl-C ends the window early (the checks still run); a second one stops the program.
    previous = signal.getsignal(signal.SIGINT)

    def on_sigint(signum, frame):
        cancel.set()
        signal.signal(signal.SIGINT, previous)
        print("\nStopping the window early; running the checks on what was sampled...", file=sys.stderr)

    signal.signal(signal.SIGINT, on_sigint)
    last = [-1]

    def progress(fraction: float, message: str) -> None:
        step = int(fraction * 10)
        if step != last[0]:  # a line per 10%, on stderr so --json output stays clean
            last[0] = step
            print(f"[{fraction:4.0%}] {message}", file=sys.stderr)

    started = time.time()
    first = _first_answer(args) if args.quick and args.vllm_url else None
    try:
        result = runner.run(args.duration, vllm_url=args.vllm_url, launch_cmd=args.launch_cmd,
                            requested_precision=args.precision, progress=progress, cancel=cancel, golden=args.golden)
    finally:
        signal.signal(signal.SIGINT, previous)
    if first is not None:
        from diagnostics.quick import revisions

        for line in revisions(first, result.findings, result.window_s):
            print(line, file=sys.stderr if args.json else sys.stdout, flush=True)
    store.record("checklist", report.history_title(result.inputs, args.duration), result.to_dict(),
                 report.history_summary(result), started_at=started)
    if args.report_dir:
        paths, not_written = report.write_all(result, args.report_dir)
        for ext, path in paths.items():
            print(f"wrote {ext}: {path}", file=sys.stderr)
        for ext, why in not_written.items():  # the run itself succeeded: say what is missing, exit as usual
            print(f"not written {ext}: {why}", file=sys.stderr)
    if args.json:
        print(report.to_json(result))
    else:
        print(report.to_text(result))
    return 0


def _first_answer(args: argparse.Namespace):
    """Print the quick answer (on stderr with --json, so the JSON stays whole) and return it, for the full window to
    revise; a failure is said, not raised (None)."""
    from core.errors import TriageError
    from diagnostics.quick import first_answer, format_first_answer

    t0 = time.monotonic()
    out = sys.stderr if args.json else sys.stdout
    try:
        answer = first_answer(args.vllm_url, launch_cmd=args.launch_cmd)
    except (TriageError, ValueError) as exc:
        print(f"No first answer: {exc}", file=out, flush=True)
        return None
    print(format_first_answer(answer, time.monotonic() - t0), file=out, flush=True)
    return answer
