"""The CLI: python -m diagnostics <command> ... Each command lives in its own diagnostics/cli_*.py module."""
from __future__ import annotations

import argparse
import importlib
import sys

# Each module defines add_parser(subparsers); the parser it adds sets func(args) -> exit code.
COMMAND_MODULES = ["diagnostics.cli_generate", "diagnostics.cli_run", "diagnostics.cli_lint", "diagnostics.cli_kv", "diagnostics.cli_compare",
                   "diagnostics.cli_probe"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m diagnostics", description="Triage console command line.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMAND_MODULES:
        importlib.import_module(name).add_parser(sub)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # the user gets one clear line, not a traceback
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
