"""`python -m diagnostics sweep --url URL`: raise the load on a vLLM server until it breaks; say where and why."""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

from core.fmt import fmt_ms_cell
from diagnostics.cli import serve

_ms = functools.partial(fmt_ms_cell, decimals=0)  # whole milliseconds: the table is wide


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep", help="load sweep of a running vLLM server: knee, goodput at an SLO, and why it is slow",
        description="Send streamed completions at growing load (clients at once, or Poisson requests/s), time them "
                    "here, read the server's queue/prefill/decode histograms over each step, and say at what load it "
                    "breaks and what limits it. Bounded by --max-seconds; saved to History.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--mode", choices=("concurrency", "rate"), default="concurrency",
                   help="concurrency: C clients in a closed loop; rate: Poisson arrivals at R requests/s")
    p.add_argument("--steps", default="auto",
                   help="'auto' (1, 2, 4, ... until the SLO breaks or the knee shows) or a list, e.g. 1,2,4,8")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default 128)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    p.add_argument("--dataset", help="a text file with one prompt per line (or JSON lines with 'prompt')")
    p.add_argument("--slo-ttft-p99", type=float, help="SLO on the client's TTFT p99, seconds")
    p.add_argument("--slo-itl-p99", type=float, help="SLO on the client's inter-token latency p99, seconds")
    p.add_argument("--min-requests", type=int, default=6,
                   help="requests per step at least (default 6; a step sends 2 per client or 4 per req/s if more)")
    p.add_argument("--max-seconds", type=float, default=120.0, help="time budget for the whole sweep (default 120)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any answer (default 120)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="the server's --api-key (default: $VLLM_API_KEY)")
    p.add_argument("--launch-cmd", metavar="CMD",
                   help="the server's launch command, e.g. \"vllm serve MODEL --max-num-seqs 8\": no remedy proposes a "
                        "flag it already sets (what the server publishes on /metrics is read either way)")
    p.add_argument("--no-history", action="store_true", help="do not save the sweep to History")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    serve.add_remedy_args(p)  # --try-remedy / --try-flags
    p.set_defaults(func=run)


def _pct(v: float | None) -> str:
    return "N/A" if v is None else f"{100 * v:.0f}%"


def run(args: argparse.Namespace) -> int:
    from core.deployment.server_config import flags_of
    from core.deployment.sweep import parse_steps, sweep

    steps = parse_steps(args.steps, args.mode)
    started = time.time()

    def progress(frac: float, msg: str) -> None:
        if not args.json:
            print(f"  {msg}", file=sys.stderr, flush=True)

    res = sweep(args.url, args.mode, steps, prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens,
                dataset=args.dataset, slo_ttft_p99=args.slo_ttft_p99, slo_itl_p99=args.slo_itl_p99,
                max_seconds=args.max_seconds, min_requests=args.min_requests, api_key=args.api_key,
                timeout_s=args.timeout, progress=progress, launch_flags=flags_of(args.launch_cmd))
    run_id = None if args.no_history else res.record(started_at=started)
    if not args.json:  # the sweep's own table first, also when remedies are tried after it
        _print_sweep(res, args.launch_cmd)
    tried = serve.run_remedy(args, res, started)  # a remedy tried prints its own before/after
    if tried is not None:
        return tried
    if args.json:
        print(json.dumps({**res.to_dict(), "history_id": run_id}, indent=2, default=str))
        return 0
    return 0 if res.status != "failed" else 1


def _print_sweep(res, launch_cmd: str | None) -> None:
    unit = "clients" if res.mode == "concurrency" else "req/s"
    print(f"{res.base_url}  model {res.model}: {res.mode} sweep, {len(res.steps)} step(s) in {res.wall_s:.0f} s")
    print(f"{unit:>8}{'req/s':>8}{'tok/s':>8}{'err':>5}{'TTFT p50':>10}{'p99':>7}{'ITL p50':>9}{'p99':>6}"
          f"{'queue':>8}{'prefill':>9}{'decode':>8}{'TTFT: queue':>12}{'prefill':>8}{'pre-engine':>11}{'n':>4}"
          f"{'SLO':>5}  (ms; server means)")
    for s in res.steps:
        srv = s.server or {}
        print(f"{s.load:>8g}{s.achieved_rps:>8.2f}{s.output_tok_s:>8.1f}{s.errors:>5}"
              f"{_ms(s.client['ttft']['p50']):>10}{_ms(s.client['ttft']['p99']):>7}"
              f"{_ms(s.client['itl']['p50']):>9}{_ms(s.client['itl']['p99']):>6}"
              f"{_ms(s.server_mean('queue')):>8}{_ms(s.server_mean('prefill')):>9}{_ms(s.server_mean('decode')):>8}"
              f"{_pct(srv.get('queue_share_ttft')):>12}{_pct(srv.get('prefill_share_ttft')):>8}"
              f"{_pct(srv.get('before_engine_share_ttft')):>11}{s.ok:>4}"
              f"{'-' if s.meets_slo is None else 'yes' if s.meets_slo else 'NO':>5}")
    if res.knee:
        print(f"knee: {res.knee['load']:g} {unit} ({res.knee['how']})")
    if res.goodput:
        print(f"goodput: {res.goodput['rps']:.2f} req/s at {res.goodput['load']:g} {unit}")
    print(f"verdict: {res.verdict['headline']}")
    for i, r in enumerate(res.verdict.get("remedies") or [], 1):
        flags = " ".join(f"{k} {v}".strip() for k, v in r["flags"].items())
        print(f"remedy {i} ({r['kind']}{': ' + flags if flags else ''}): {r['text']}")
        if r["flags"] and (command := serve.launch_with(launch_cmd, r["flags"])):  # only where the launch is known
            print(f"    command: {command}")
    if not res.verdict.get("remedies") and res.verdict.get("remedy"):  # a sweep saved before remedies had flags
        print(f"remedy: {res.verdict['remedy']}")
    print(f"stopped: {res.stopped}")
