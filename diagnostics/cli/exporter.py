"""`python -m diagnostics exporter`: serve this host's GPU and memory telemetry to Prometheus (/metrics).

Needs only core/, prometheus_client and nvidia-ml-py: no Streamlit, no torch. Names and units are in the README.
"""
from __future__ import annotations

import argparse
import sys
import time


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "exporter", help="serve this host's GPU (NVML, GPM bandwidth) and memory telemetry for Prometheus",
        description="Serves /metrics in Prometheus text format: GPU util, GPM DRAM bandwidth and SM util, memory, "
                    "power, clocks, clock-event reasons, host MemAvailable. Each scrape reads the GPUs; GPM values "
                    "are averaged since the previous scrape. Runs until Ctrl-C.")
    p.add_argument("--port", type=int, default=9401, help="port (default 9401; dcgm-exporter's is 9400)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1; 0.0.0.0 lets a remote Prometheus scrape it)")
    p.set_defaults(func=main)


def main(args: argparse.Namespace) -> int:
    from core.errors import InputError
    from core.telemetry.exporter import TelemetryCollector, describe, serve

    if not 0 < args.port < 65536:
        raise InputError(f"--port {args.port} is not a TCP port (1-65535).")
    collector = TelemetryCollector()
    try:
        serve(args.port, args.host, collector)
    except OSError as exc:
        raise InputError(f"Cannot listen on {args.host}:{args.port}: {exc.strerror or exc}. Pick another --port.") \
            from None
    print(f"Serving http://{args.host}:{args.port}/metrics: {describe(collector)}", file=sys.stderr, flush=True)
    while True:
        time.sleep(3600)
