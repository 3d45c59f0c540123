"""`python -m diagnostics probe --url URL`: client-side TTFT/ITL of a running vLLM server beside its own metrics."""
from __future__ import annotations

import argparse
import json
import os

from core.fmt import fmt_ms_cell as ms


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "probe", help="measure a running vLLM server: client TTFT/ITL beside its /metrics",
        description="Send N streamed completions of an exact prompt length to a vLLM OpenAI server and print the "
                    "latency measured here beside the server's own histograms (/metrics) over the same window.")
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--n", type=int, default=8, help="number of requests (default 8)")
    p.add_argument("--prompt-tokens", type=int, default=128, help="prompt length in tokens (default 128)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="tokens generated per request (default 32)")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once (default 1)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds to wait for any answer (default 120)")
    p.add_argument("--api-key", default=os.environ.get("VLLM_API_KEY"),
                   help="the server's --api-key (default: $VLLM_API_KEY)")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from core.deployment.probe import probe
    from core.telemetry.vllm_metrics import scrape

    res = probe(args.url, n=args.n, prompt_tokens=args.prompt_tokens, max_new_tokens=args.max_new_tokens,
                concurrency=args.concurrency, api_key=args.api_key, timeout_s=args.timeout)
    res.record()
    try:
        snap = scrape(res.base_url, api_key=args.api_key)
    except Exception as exc:  # the probe itself succeeded; a metrics failure is reported, not fatal
        snap, snap_error = None, str(exc)
    else:
        snap_error = ""
    server_state = None
    if snap is not None and not snap.logging_disabled:
        server_state = {
            "running": snap.running, "waiting": snap.waiting, "kv_cache_usage_pct":
                None if snap.kv_cache_usage is None else 100 * snap.kv_cache_usage,
            "prompt_tokens_total": snap.prompt_tokens, "generation_tokens_total": snap.generation_tokens,
            "preemptions_total": snap.preemptions, "prefix_cache_hit_rate": snap.prefix_cache_hit_rate,
            "cache_dtype": snap.cache_dtype, "block_size": snap.block_size, "metric_names": snap.sources,
        }
    if args.json:
        print(json.dumps({**res.to_dict(), "server_state": server_state,
                          "metrics_error": snap_error or None}, indent=2, default=str))
        return 0

    print(f"{res.base_url}  model {res.model}: {res.n} requests x {res.prompt_tokens} prompt tokens -> "
          f"{res.max_new_tokens} new, {res.concurrency} at a time, {res.wall_s:.1f} s")
    print(f"{'latency (ms)':<16}{'client p50':>11}{'p90':>9}{'p99':>9}   {'server p50':>11}{'p90':>9}{'p99':>9}")
    for key, label in (("ttft", "TTFT"), ("itl", "ITL"), ("e2e", "end-to-end")):
        c = res.client[key]
        s = (res.server or {}).get(key, {})
        print(f"{label:<16}{ms(c['p50']):>11}{ms(c['p90']):>9}{ms(c['p99']):>9}   "
              f"{ms(s.get('p50')):>11}{ms(s.get('p90')):>9}{ms(s.get('p99')):>9}")
    print(f"client decode time per output token {ms(res.tpot_s)} ms; {res.tokens} tokens in {res.chunks} chunks")
    if res.metrics_note:
        print(f"note: {res.metrics_note}")
    if server_state:
        kv = server_state["kv_cache_usage_pct"]
        hit = server_state["prefix_cache_hit_rate"]
        print(f"server now: {server_state['running']:.0f} running, {server_state['waiting']:.0f} waiting, KV cache "
              f"{'N/A' if kv is None else f'{kv:.1f} %'} used ({server_state['cache_dtype']}, block "
              f"{server_state['block_size']}), {server_state['preemptions_total']:.0f} preemptions, prefix cache "
              f"hit rate {'N/A' if hit is None else f'{100 * hit:.1f} %'}, "
              f"{server_state['generation_tokens_total']:.0f} tokens generated since start")
    elif snap_error:
        print(f"metrics: {snap_error}")
    return 0
