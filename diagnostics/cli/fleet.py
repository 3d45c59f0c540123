"""`python -m diagnostics fleet`: every vLLM replica a Prometheus knows, as a table, with the fleet checklist; with
--alert-rules, the checks that can run inside Prometheus written as a rule file instead."""
from __future__ import annotations

import argparse
import json
import re


def add_prometheus_args(p: argparse.ArgumentParser, required: bool) -> None:
    p.add_argument("--prometheus-url", metavar="URL", required=required,
                   help="base URL of the Prometheus (or Thanos, Mimir, VictoriaMetrics) that scrapes the vLLM servers; "
                        "credentials only from $TRIAGE_PROM_TOKEN or $TRIAGE_PROM_USER/$TRIAGE_PROM_PASSWORD")
    p.add_argument("--selector", default="", metavar="SEL", help='label matchers narrowing the fleet, e.g. '
                   '\'{namespace="prod"}\'')
    p.add_argument("--replica-label", default="instance", metavar="LABEL",
                   help="label that names a replica: instance (default), pod, model_name or engine; where no vLLM "
                        "series carries it, replicas are named by instance and a warning says so")
    p.add_argument("--window", default="5m", help="rate and quantile window, 10s to 24h (default 5m)")
    p.add_argument("--at", metavar="TIME", help="evaluate as it stood at a past instant (the window ends there; a "
                   "replica is up or down as its `up` series was then): 2026-12-06T03:00 (this console's time zone "
                   "unless one is given), -2h, or unix seconds")
    p.add_argument("--since", metavar="TIME", help="the window from TIME to --at (or now) instead of --window: a "
                   "post-incident review of 02:50-03:10 is --since 2026-12-06T02:50 --at 2026-12-06T03:10")


TIME_OPTIONS = ("--at", "--since")
TIME_COMMANDS = ("fleet", "run")


def join_time_args(argv: list[str]) -> list[str]:
    """`--at -2m` as `--at=-2m`: argparse takes a next argument that starts with '-' (and is not a plain number) for
    an option of its own and stops with "expected one argument", though -2m is the documented form. Only in the
    commands that have these options, and never after `--`."""
    command = next((a for a in argv if not a.startswith("-")), None)
    if command not in TIME_COMMANDS:
        return list(argv)
    out, i = [], 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return out + argv[i:]
        if tok in TIME_OPTIONS and i + 1 < len(argv) and re.fullmatch(r"-\d.*", argv[i + 1]):
            out.append(f"{tok}={argv[i + 1]}")
            i += 2
            continue
        out.append(tok)
        i += 1
    return out


def window_and_at(args: argparse.Namespace) -> tuple[str, float | None]:
    """--window, --at and --since as fleet.run's window and instant (None: now)."""
    import time

    from core.errors import InputError
    from core.fleet.promql import parse_instant

    now = time.time()
    at = parse_instant(args.at, now) if getattr(args, "at", None) else None
    if not getattr(args, "since", None):
        return args.window, at
    start, end = parse_instant(args.since, now), at if at is not None else now
    if end - start < 10:
        raise InputError(f"--since {args.since} must be at least 10 s before {'--at' if at else 'now'}: rates need "
                         "two scrapes inside the window.")
    seconds = int(end - start)
    # said as it was asked: a 02:50-03:10 review is "the 20m up to 03:10", not "the 1200s"
    n, unit = next((seconds // k, u) for u, k in (("h", 3600), ("m", 60), ("s", 1)) if seconds % k == 0)
    return f"{n}{unit}", at


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "fleet", help="table and checklist of every vLLM replica in a Prometheus",
        description="Reads every vLLM replica's metrics (and GPU metrics from dcgm-exporter or the console's "
                    "exporter) from a Prometheus, ranks the replicas against the fleet median and runs the fleet "
                    "checklist. The result is saved to History. Exit 0 whenever it ran. With --alert-rules FILE it "
                    "writes the checks that can run inside Prometheus (stall, target down, KV pressure, saturation, "
                    "slow replica) as a Prometheus rule file and exits; --prometheus-url is then optional (it only "
                    "finds which metric names the fleet uses; without it, native vllm: names).")
    add_prometheus_args(p, required=False)
    p.add_argument("--json", action="store_true", help="print the fleet and the findings as JSON")
    p.add_argument("--alert-rules", metavar="FILE", help="write a Prometheus rule file for --selector, "
                   "--replica-label and --window (2m is a good alerting window) to FILE and exit")
    p.add_argument("--for", dest="for_", metavar="DURATION", help="the rules' `for:` (default: half the stall "
                   "window, e.g. 60s for --window 2m)")
    p.set_defaults(func=main)


def print_run(fleet_run, as_json: bool) -> None:
    from core.fleet import table
    from diagnostics.report import to_text

    if as_json:
        print(json.dumps(fleet_run.to_dict(), indent=2, default=str))
        return
    print(table.header_line(fleet_run.snapshot))
    for note in fleet_run.snapshot.notes:
        if note.startswith("Warning"):  # above the table it describes (e.g. the replica label that is absent)
            print(note)
    print(table.as_text(fleet_run.snapshot))
    print()
    print(to_text(fleet_run.result))


def main(args: argparse.Namespace) -> int:
    from core.errors import InputError
    from core.fleet.prom import Prometheus
    from diagnostics import fleet

    if args.alert_rules:
        return write_rules(args)
    if not args.prometheus_url:
        raise InputError("fleet needs --prometheus-url (the Prometheus that scrapes the vLLM servers), or "
                         "--alert-rules FILE to write the alert rules only.")
    window, at = window_and_at(args)
    out = fleet.run(Prometheus(args.prometheus_url), args.selector, args.replica_label, window, at=at)
    print_run(out, args.json)
    return 0


def write_rules(args: argparse.Namespace) -> int:
    from core.fleet.fleet import names_at, scrape_interval
    from core.fleet.prom import Prometheus
    from diagnostics import fleet_rules

    names, where, interval = None, "", None
    if args.prometheus_url:
        prom = Prometheus(args.prometheus_url)
        names, where = names_at(prom, args.selector), prom.base_url
        interval = scrape_interval(prom.targets(), names.jobs)
    rules = fleet_rules.export(args.alert_rules, names, args.selector, args.replica_label, args.window, args.for_,
                               where, interval)
    print(f"Wrote {len(rules)} alert rules to {args.alert_rules}: {', '.join(r.alert for r in rules)}.")
    if not names:
        print("Metric names: native vllm: assumed; give --prometheus-url to use the names your Prometheus holds "
              "(vllm_ or ray_vllm_ after relabelling).")
    print(f"Check it with `promtool check rules {args.alert_rules}`, then list it under rule_files in prometheus.yml.")
    return 0
