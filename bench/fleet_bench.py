"""Time to the fleet table and checklist at 10, 100 and 1,000 replicas, against a real Prometheus.

    python -m bench.fleet_bench [--replicas 10,100,1000] [--refreshes 5] [--window 1m]

For each size a replay server serves the recorded real vLLM /metrics page (tests/fixtures) under that many
`instance` labels, one scrape target each, and a fresh Prometheus (Debian's binary, temporary TSDB, loopback)
scrapes them; the scrape interval grows with the fleet (1 s up to 100 replicas, 10 s at 1,000) so the two shared
cores keep up. Once every replica has three samples, the fleet refresh (discovery, one query per column, the
targets list, every fleet check) is timed --refreshes times; reported: median and worst wall time, requests and
queries per refresh (which must not grow with the fleet), and the query time Prometheus itself reports
(stats=all, evalTotalTime). Prints a Markdown table with the machine and the date.
"""
from __future__ import annotations

import argparse
import statistics
import subprocess
import time
from pathlib import Path

from core.fleet.prom import Prometheus
from diagnostics import fleet
from tests.promstack import PrometheusServer, ReplayServer, scrape_job

LOG = Path("artifacts/fleet-bench-prometheus.log")


def machine() -> str:
    out = subprocess.run("lscpu | grep 'Model name'", shell=True, capture_output=True, text=True).stdout
    return " ".join(out.split(":", 1)[-1].split()) or "unknown"


def wait_for_samples(prom: Prometheus, n: int, timeout_s: float) -> float:
    t0 = time.monotonic()
    q = 'count(count_over_time(vllm:num_requests_running{job="replay"}[1m]) >= 3)'
    while time.monotonic() - t0 < timeout_s:
        got = prom.query(q)
        if got and (got[0].value or 0) >= n:
            return time.monotonic() - t0
        time.sleep(1.0)
    raise SystemExit(f"Prometheus did not get 3 samples of all {n} replicas in {timeout_s:g} s")


def one_size(n: int, refreshes: int, window: str) -> dict:
    interval = 1.0 if n <= 100 else 10.0
    replay = ReplayServer(n, slow={n // 2})
    targets, labels = replay.targets()
    server = PrometheusServer([scrape_job("replay", targets, interval, labels)], LOG, interval_s=interval)
    try:
        server.start()
        prom = Prometheus(server.url, timeout_s=60.0)
        waited = wait_for_samples(prom, n, 60 + 6 * interval)
        times, runs = [], []
        for _ in range(refreshes):
            t0 = time.perf_counter()
            runs.append(fleet.run(prom, '{job="replay"}', "instance", window, save=False))
            times.append(time.perf_counter() - t0)
        snap = runs[-1].snapshot
        slow = [f for f in runs[-1].result.findings if f.check_id == "fleet.slow_replica"][0]
        return {"replicas": n, "found": len(snap.replicas), "interval_s": interval, "waited_s": waited,
                "median_s": statistics.median(times), "worst_s": max(times),
                "requests": snap.cost.requests, "queries": snap.cost.queries,
                "prom_eval_ms": 1000 * statistics.median(r.snapshot.cost.prom_eval_s for r in runs),
                "slow_found": f"replica-{n // 2:04d}" in slow.verdict}
    finally:
        server.stop()
        replay.stop()


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.fleet_bench")
    ap.add_argument("--replicas", default="10,100,1000")
    ap.add_argument("--refreshes", type=int, default=5)
    ap.add_argument("--window", default="1m")
    args = ap.parse_args()
    started = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    rows = [one_size(int(n), args.refreshes, args.window) for n in args.replicas.split(",")]
    print(f"Machine: {machine()}; {started}; window {args.window}; {args.refreshes} refreshes per size.\n")
    print("| replicas | found | scrape interval | table + checklist, median | worst | requests / refresh | "
          "queries / refresh | Prometheus query time (sum, median) | slow replica flagged |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    for r in rows:
        print(f"| {r['replicas']:,} | {r['found']:,} | {r['interval_s']:g} s | {r['median_s'] * 1000:,.0f} ms | "
              f"{r['worst_s'] * 1000:,.0f} ms | {r['requests']} | {r['queries']} | {r['prom_eval_ms']:,.0f} ms | "
              f"{'yes' if r['slow_found'] else 'NO'} |")


if __name__ == "__main__":
    main()
