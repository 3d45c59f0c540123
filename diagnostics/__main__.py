"""The CLI: python -m diagnostics <command> ... Each command lives in its own module of diagnostics/cli/."""
from __future__ import annotations

import argparse
import sys

from diagnostics.cli import compare, exporter, fleet, generate, kv, lint_flags, probe, quality, run, serve, sweep, \
    watch
from diagnostics.cli import golden

# Each module defines add_parser(subparsers); the parser it adds sets func(args) -> exit code. This order is the
# order of `--help`.
COMMAND_MODULES = (generate, run, lint_flags, kv, compare, quality, probe, watch, golden, sweep, serve, fleet,
                   exporter)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diagnostics", description="Triage console command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    for module in COMMAND_MODULES:
        module.add_parser(sub)
    args, extra = parser.parse_known_args(fleet.join_time_args(sys.argv[1:] if argv is None else argv))
    if extra and not hasattr(args, "vllm_flags"):  # only `serve` passes the flags it does not know on to vLLM
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if extra:
        args.vllm_flags = [*args.vllm_flags, *extra]
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the user gets one clear line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
