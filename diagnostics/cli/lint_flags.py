"""`python -m diagnostics lint-flags [--json] -- ARGS...`: check a vLLM launch command. Exit 1 if a flag is unknown."""
from __future__ import annotations

import argparse
import json

from core.errors import InputError


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "lint-flags", help="check a `vllm serve` command line against vLLM's own argument parser",
        description="Checks every flag of a vLLM launch command against vLLM's own parser (read from the vLLM "
                    "environment: .venv-vllm, or $TRIAGE_VLLM_PYTHON) or, without one, against the table kept for "
                    "a named vLLM version. Give the command after --, as words or as one quoted string. "
                    "Exit status 1 when a flag is unknown or removed (vLLM would refuse to start), else 0.")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the command: vllm serve MODEL --flag ...")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from diagnostics.flags import format_text, lint_command

    words = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not words:
        raise InputError("no command given: python -m diagnostics lint-flags -- vllm serve MODEL --flag ...")
    # One quoted argument is a command line as typed; several are argv words already split by the shell.
    result = lint_command(words[0] if len(words) == 1 else words)
    print(json.dumps(result.to_dict(), indent=2) if args.json else format_text(result))
    return 0 if result.ok else 1
