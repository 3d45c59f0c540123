"""python -m diagnostics golden record --url URL [--prompts builtin|FILE] --out golden.json
python -m diagnostics golden watch --url URL [--url URL ...] --golden golden.json [--every 60] [--rounds N] [--json]

record keeps a reference deployment's greedy answers (token ids, top-k logprobs, teacher-forced scores) with what
produced them and its noise floor; watch replays them on each replica, round after round, and says per replica
fine / watch / low agreement / a broken side / inconclusive / no answer / refused, and names a drift with the round it
changed in. Each record and each round is saved to History ("golden-record", "golden-watch") unless --no-history.

Exit code 0 when the command ran (whatever the verdicts), 1 with --fail-on when a replica is not fine or drifted in the
last round, 2 on errors.
"""
from __future__ import annotations

import json
import os
import sys
import time


def add_parser(sub) -> None:
    p = sub.add_parser("golden", help="a golden set of a reference deployment, and a watch of replicas against it",
                       description="Record a reference server's greedy answers once; replay them on replicas to "
                                   "see whether a deployment still answers the same.")
    verbs = p.add_subparsers(dest="golden_command", required=True)
    r = verbs.add_parser("record", help="record a golden set from a reference server")
    r.add_argument("--url", required=True, help="the reference server's base URL, e.g. http://127.0.0.1:8000")
    r.add_argument("--prompts", default="builtin",
                   help="'builtin' (the compare's built-in set) or a file: one prompt per line, or .jsonl/.json")
    r.add_argument("--out", required=True, help="where to write the golden set (JSON)")
    r.add_argument("--max-new-tokens", type=int, default=32, help="greedy tokens per prompt (default 32)")
    r.add_argument("--top-k", type=int, default=8, help="logprobs kept per position, 1-20 (default 8, vLLM's rule)")
    r.add_argument("--temperature", type=float, default=0.0,
                   help="must stay 0: a golden set is greedy (anything else is refused)")
    _common(r)
    r.set_defaults(func=run_record)
    w = verbs.add_parser("watch", help="replay a golden set on replicas, round after round")
    w.add_argument("--url", action="append", required=True, help="a replica's base URL (repeatable)")
    w.add_argument("--golden", required=True, help="the golden set written by `golden record`")
    w.add_argument("--every", type=float, default=60.0, help="seconds from one round's start to the next (default 60)")
    w.add_argument("--rounds", type=int, default=1, help="rounds to run (default 1; 0 = until stopped)")
    w.add_argument("--fail-on", action="store_true",
                   help="exit 1 when a replica of the last round is not fine or drifted")
    w.add_argument("--metrics-port", type=int, metavar="PORT",
                   help="also serve each replica's last round on http://HOST:PORT/metrics for Prometheus "
                        "(triage_golden_same_top_ratio, _kld_mean, _drift, _status, ...; rules: `golden rules`)")
    w.add_argument("--metrics-host", default="127.0.0.1",
                   help="address for --metrics-port (default 127.0.0.1; 0.0.0.0 lets a remote Prometheus scrape it)")
    _common(w)
    w.set_defaults(func=run_watch)


def _common(p) -> None:
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="the servers' --api-key (default: $VLLM_API_KEY)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any answer (default 120)")
    p.add_argument("--json", action="store_true", help="print JSON instead of lines")
    p.add_argument("--no-history", action="store_true", help="do not save to the history database")


def _prompts(spec: str):
    from core.compare.prompts import default_prompts, read_prompts_file

    return default_prompts() if spec == "builtin" else read_prompts_file(spec)


def run_record(args) -> int:
    from core.compare.golden.golden import source_line
    from core.compare.golden.record import history, record
    from core.compare.golden.watch import noise_floor_line

    say = (lambda m: None) if args.json or not sys.stderr.isatty() else (lambda m: print(m, file=sys.stderr))
    t0 = time.time()
    golden = record(args.url, _prompts(args.prompts), max_new_tokens=args.max_new_tokens, top_k=args.top_k,
                    temperature=args.temperature, api_key=args.api_key, timeout_s=args.timeout, progress=say)
    golden.save(args.out)
    saved = None if args.no_history else history(golden, args.out, t0)
    nf, s = golden.noise_floor or {}, golden.server
    if args.json:
        print(json.dumps({"out": args.out, "server": s, "prompts": len(golden.prompts), "noise_floor": nf,
                          "history_id": saved}))
        return 0
    print(f"golden set: {args.out}, {source_line(golden.to_dict())}")
    print(f"noise floor (the reference replayed on itself): {noise_floor_line(nf)}")
    if not args.no_history:
        print(f"history: saved as run #{saved}" if saved else "history: not saved (see the warning above)")
    return 0


def _serve_metrics(args):
    """The watch's gauges on --metrics-port (None without it); a port that cannot be bound is refused in words."""
    if args.metrics_port is None:
        return None
    from core.compare.golden.export import GoldenCollector, serve
    from core.errors import InputError

    if not 0 < args.metrics_port < 65536:
        raise InputError(f"--metrics-port {args.metrics_port} is not a TCP port (1-65535).")
    gauges = GoldenCollector(args.golden)
    try:
        serve(args.metrics_port, args.metrics_host, gauges)
    except OSError as exc:
        raise InputError(f"Cannot listen on {args.metrics_host}:{args.metrics_port}: {exc.strerror or exc}. Pick "
                         "another --metrics-port.") from None
    print(f"serving the watch's gauges on http://{args.metrics_host}:{args.metrics_port}/metrics", file=sys.stderr,
          flush=True)
    if args.rounds:
        print(f"note: the gauges go with the watch after its {args.rounds} round(s); --rounds 0 keeps serving them for "
              "Prometheus", file=sys.stderr, flush=True)
    return gauges


def run_watch(args) -> int:
    from core.compare.golden.golden import GoldenSet
    from core.compare.golden.watch import Watch, replica_line, threshold_line
    from core.fmt import fmt_utc

    golden = GoldenSet.load(args.golden)
    if args.rounds < 0 or args.every < 0:
        raise ValueError("--rounds and --every must be 0 or more.")
    watch = Watch(golden, args.url, args.api_key, args.timeout)
    gauges = _serve_metrics(args)
    last = None
    for rnd in watch.run(args.rounds, args.every):
        last = rnd
        if gauges is not None:
            gauges.update(rnd)
        saved = None if args.no_history else rnd.record(args.golden)
        if args.json:
            print(json.dumps({**rnd.to_dict(), "history_id": saved}), flush=True)
            continue
        when = fmt_utc(rnd.started_at)
        print(f"round {rnd.number} ({when}): {len(golden.prompts)} golden prompts of {golden.model}")
        for r in rnd.replicas:
            print("  " + replica_line(r))
            if r.drift:
                print(f"  DRIFT {r.url}: {r.drift}")
        print(f"cost: {rnd.tokens:,} tokens this round ({len(rnd.replicas)} replicas), {rnd.seconds:.1f} s; "
              f"{threshold_line(rnd.noise.__dict__)}", flush=True)
        if not args.no_history and not saved:
            print("history: not saved (see the warning above)")
    bad = last is not None and any(r.status != "fine" or r.drift for r in last.replicas)
    return 1 if args.fail_on and bad else 0
