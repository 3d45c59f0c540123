"""`python -m diagnostics serve --model M [vLLM flags]`: start a local vLLM server and keep it until Ctrl-C or SIGTERM;
`--list` and `--stop` for the servers the console launched. Also the sweep's `--try-remedy` / `--try-flags`: start
the swept server again with a remedy's flags, run the same sweep, and say whether it helped."""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time

from core.deployment import servers
from core.fmt import fmt_ms_cell


def flag_errors(flags: list[str]) -> list[str]:
    """vLLM's own parser (or the committed table for its version) on the flags: the sentences of what it would
    refuse; empty when it starts with them."""
    from diagnostics.flags import lint_command

    result = lint_command(["vllm", "serve", "MODEL", *flags])
    return [i.message for i in result.issues if i.is_error]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "serve", allow_abbrev=False,
        help="start a local vLLM server with any vLLM flags; list or stop the ones the console started",
        description="Start vLLM's OpenAI server for a model with the vLLM flags that follow (checked against vLLM's "
                    "own parser first) on 127.0.0.1 at a free port, print its URL, and keep it until Ctrl-C or "
                    "SIGTERM, then stop it with its whole process group. --list shows every server the console "
                    "started (also those a killed console left behind); --stop ends one.")
    p.add_argument("--model", default=servers.EMBEDDED,
                   help=f"a local model directory, or '{servers.EMBEDDED}' for the embedded model (default)")
    p.add_argument("--list", action="store_true", help="list the local servers the console started, and exit")
    p.add_argument("--stop", metavar="PORT|all", help="stop the server on this port (or all of them), and exit")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds to wait for a healthy server")
    p.add_argument("--json", action="store_true", help="print JSON (the server once healthy, or the list)")
    p.set_defaults(func=run, vllm_flags=[])


def _line(s: servers.LocalServer) -> str:
    owner = "this console" if s.owned_here else ("orphan: its console exited" if s.orphaned else
                                                 f"console pid {s.owner_pid}")
    return (f"{s.base_url}  pid {s.pgid}  model {s.model}  flags: {' '.join(s.flags) or '(none)'}\n"
            f"    log {s.log_path}  started {time.strftime('%H:%M:%S', time.localtime(s.started_at))}  ({owner})\n"
            f"    command: {s.command_line()}")


def run(args: argparse.Namespace) -> int:
    if args.list:
        found = servers.list_servers()
        if args.json:
            print(json.dumps([s.to_dict() for s in found], indent=2))
        else:
            print("\n".join(_line(s) for s in found) or "No local vLLM server started by the console is running.")
        return 0
    if args.stop:
        ports = [s.port for s in servers.list_servers()] if args.stop == "all" else [_port(args.stop)]
        stopped = [p for p in ports if servers.stop_server(p)]
        print(f"Stopped {len(stopped)} server(s)" + (f" on port {', '.join(map(str, stopped))}." if stopped else "."))
        return 0 if stopped or args.stop == "all" else 1
    say = (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    last = [""]

    def progress(frac: float, msg: str) -> None:
        if msg.split(" (")[0] != last[0]:
            last[0] = msg.split(" (")[0]
            say(msg)

    server = servers.start_server(args.model, args.vllm_flags, check_flags=flag_errors, progress=progress,
                                  start_timeout_s=args.start_timeout)
    print(json.dumps(server.to_dict()) if args.json else "Serving.\n" + _line(server)
          + "\nCtrl-C (or SIGTERM) stops it.", flush=True)
    try:
        while server.alive:
            time.sleep(1.0)
        print(f"The server on port {server.port} exited; its log: {server.log_path}", file=sys.stderr)
        return 1
    finally:
        servers.stop_owned()


def _port(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise servers.ServerError(f"--stop takes a port number or 'all' (got {text!r}); see --list.") from None


# --- the sweep's remedy options ---------------------------------------------------------------------------------------

def add_remedy_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--try-remedy", nargs="?", type=int, const=0, metavar="N",
                   help="after the sweep, start the server again with remedy N's flags (1 = the first; without N: "
                        "each in turn), run the same sweep and compare; for a server the console launched")
    p.add_argument("--try-flags", metavar="FLAGS",
                   help="like --try-remedy with a flag change of your own, e.g. '--max-num-batched-tokens 2048' "
                        "(with --try-remedy too: tried after the verdict's remedies; the best wins)")


def run_remedy(args: argparse.Namespace, res, started: float) -> int | None:
    """The sweep's `--try-remedy` / `--try-flags`; None when neither was given (the sweep prints as usual)."""
    if args.try_remedy is None and not args.try_flags:
        return None
    from core.deployment import remedy

    server = servers.find_server(res.base_url)
    before = res.to_dict()
    chosen = []
    if args.try_remedy is not None:
        found = [r for r in remedy.remedies_for(before, server) if r.concrete]
        if args.try_remedy and not 1 <= args.try_remedy <= len(found):
            raise servers.ServerError(f"--try-remedy {args.try_remedy}: this sweep has {len(found)} remedy(ies) with "
                                      "a flag change" + (": " + "; ".join(f"{i + 1}: {r.flag_text()}" for i, r in
                                                                         enumerate(found)) if found else "."))
        chosen = [found[args.try_remedy - 1]] if args.try_remedy else found
    if args.try_flags:  # tried after the verdict's, in the same turn: the best of all wins
        chosen.append(remedy.Remedy(f"Flags chosen by hand: {args.try_flags}",
                                    remedy.parse_flag_change(args.try_flags), "by hand"))
    if server is None:
        return _not_ours(args, res, chosen)
    say = (lambda m: None) if args.json else (lambda m: print(f"  {m}", file=sys.stderr, flush=True))
    trials = []
    for r in chosen:  # each trial's verdict is printed once, with its numbers, by _print_trials
        say(f"Trying {r.flag_text()}")
        trials.append(remedy.try_remedy(before, server, r, check_flags=flag_errors, api_key=args.api_key,
                                        progress=lambda f, m: None))
    doc = remedy.result_of(trials, server)
    doc["history_id"] = None if args.no_history else remedy.record(doc, started_at=started)
    if args.json:
        print(json.dumps(doc, indent=2, default=str))
    else:
        _print_trials(doc)
    return 0


def launch_with(launch_cmd: str | None, change: dict[str, str]) -> str | None:
    """The user's own launch command with the flag change made (its old values dropped), or None where the console
    was not told how the server is launched (--launch-cmd): then it names the flags to change and no command."""
    from core.deployment.remedy import apply_flags

    if not launch_cmd:
        return None
    try:
        return shlex.join(apply_flags(shlex.split(launch_cmd), change))
    except ValueError:  # a launch command shlex cannot split: the flags alone are said
        return None


def _not_ours(args, res, chosen) -> int:
    """A server the console did not launch: the exact change to make (the whole command line where --launch-cmd
    says how it is launched), and the next sweep of the URL compares."""
    change = "; ".join(r.flag_text() for r in chosen) or "(no remedy names a flag change)"
    commands = [c for r in chosen if r.flags and (c := launch_with(getattr(args, "launch_cmd", None), r.flags))]
    how = (" with " + " or ".join(f"`{c}`" for c in commands) if commands else
           " (give --launch-cmd with the command it runs under, and the whole command line is printed)")
    msg = (f"{res.base_url} was not started by the console, so it is not restarted here. Restart it with this change: "
           f"{change}{how}. Then sweep the same URL again with the same settings: History compares the two sweeps.")
    if args.json:
        print(json.dumps({"before": res.to_dict(), "after": None, "flags_changed": [r.flags for r in chosen],
                          "verdict": {"kind": "not launched here", "headline": msg}}, indent=2, default=str))
    else:
        print(msg)
    return 0


def _print_trials(doc: dict) -> None:
    for i, t in enumerate(doc["trials"]):
        print(f"try {i + 1}: {' '.join(f'{k} {v}'.strip() for k, v in t['flags_changed'].items())}")
        for row in (t.get("comparison") or {}).get("loads", []):
            r, ttft = row["rps"], row["ttft_p50"]
            print(f"    at {row['load']:g}: {_num(r['before'])} -> {_num(r['after'])} req/s, TTFT p50 "
                  f"{fmt_ms_cell(ttft['before'], 0)} -> {fmt_ms_cell(ttft['after'], 0)} ms")
        print(f"    {t['verdict'].get('headline', '')}")
    if doc["summary"] not in (t["verdict"].get("headline") for t in doc["trials"]):  # each sentence once
        print(doc["summary"])
    print(f"command that won: {doc['command']}" if doc.get("best") is not None else
          f"command (the original's: no change helped): {doc['command']}")


def _num(v) -> str:
    return "N/A" if v is None else f"{v:.2f}"
