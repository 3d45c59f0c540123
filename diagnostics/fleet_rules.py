"""The fleet checks that can run inside Prometheus, as a Prometheus rule file (groups / rules / alert, expr, for,
labels.severity, annotations).

Each expr is built from the same PromQL the fleet view queries (core/fleet/promql.py's Builder), so what the Fleet
page shows and what Prometheus alerts on cannot drift apart: the stall rule's expr *is* the `stalled` column's
query; KV pressure, saturation and the slow replica compose the columns their checks read with the checks' own
thresholds. What needs more than PromQL stays in the console: the median/MAD outlier test of a slow replica, the
two-replica comparison, GPU matching by host.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

from core.compare.golden.export import PREFIX as GOLDEN_PREFIX
from core.errors import InputError
from core.fleet.fleet import FleetSnapshot
from core.fleet.promql import (COUNTERS, GAUGES, HISTOGRAMS, PEER_MIN_FINISHED, PREFIXES, Builder, Names,
                               parse_window)
from core.fleet.selector import check_label_name, parse_selector, render
from core.telemetry.vllm_anatomy import KV_ROOM, QUEUE_SHARE_SATURATED, SATURATION_REMEDY
from diagnostics.checks.fleet import SILENT_REMEDY, SLOW_RATIO, SLOW_REMEDY, STALL_REMEDY
from diagnostics.checks.vllm import KV_FULL

GROUP = "vllm-fleet-triage"
# Labels that come from vLLM's own /metrics page, not from the scrape target: `up` never carries them, so a selector
# matcher on one is left off the target-down rule (it would match nothing there).
PAGE_LABELS = ("model_name", "engine")
DOWN_MEMORY = "1h"  # a job counts as vLLM's while it exported vLLM series this recently (a whole fleet down too)
_DURATION = re.compile(r"(\d+)([smh])\Z")


@dataclass(frozen=True)
class Rule:
    alert: str
    expr: str
    for_: str
    severity: str  # critical | warning
    summary: str
    description: str
    check_id: str  # the console's check that decides the same thing


def native_names() -> Names:
    """Every column under its native vllm: name, for a rule file written without a Prometheus to ask."""
    present = {PREFIXES[0] + bases[0] for bases in (*GAUGES.values(), *COUNTERS.values())}
    present |= {PREFIXES[0] + bases[0] + "_count" for bases in HISTOGRAMS.values()}
    return Names.resolve(present)


def alert_rules(names: Names, selector: str = "", replica_label: str = "instance", window: str = "2m",
                for_: str | None = None, scrape_interval_s: float | None = None) -> list[Rule]:
    """The rules for one fleet (the selector's series, replicas by `replica_label`). Rates and quantiles are over
    `window`; the stall rules over the stall window (promql.stall_window: three scrape intervals where known, else
    the window clamped). `for_` defaults to half the stall
    window: one odd evaluation pages no one, and a stall is named within 1.5 stall windows."""
    matchers = parse_selector(selector)
    L = check_label_name(replica_label, "replica label")
    window = parse_window(window)[0]
    b = Builder(matchers, L, window, names, scrape_interval_s)
    q = b.replica_columns()
    sw, sw_s = b.stall_window
    for_ = _duration(for_) if for_ is not None else f"{max(1, sw_s // 2)}s"
    who = f"{{{{ $labels.{L} }}}}"
    out = []
    if "stalled" in q:
        out.append(Rule(
            "VllmReplicaStalled", q["stalled"], for_, "critical",
            f"vLLM replica {who} is stalled: no token and no finished request for {sw} with {{{{ $value }}}} "
            "request(s) in flight",
            f"Over the last {sw} its generation and prompt token counters and its finished requests did not move "
            "while its running + waiting gauges stayed above 0 (a stopped engine freezes them). /health and /metrics "
            f"can still answer 200. {STALL_REMEDY}", "fleet.stalled"))
    if "silent" in q:
        out.append(Rule(
            "VllmReplicaSilent", q["silent"], for_, "warning",
            f"vLLM replica {who} made no progress for {sw} while the fleet served",
            f"No token and no finished request over the last {sw}, no request shown in flight, while the median "
            f"replica of the fleet finished {PEER_MIN_FINISHED}+ requests. {SILENT_REMEDY}", "fleet.stalled"))
    # up carries the fleet's target labels only: the page's own labels (model_name, ...) are left off
    target = render(tuple(m for m in matchers if m.label not in PAGE_LABELS))
    running = names.get("running")
    if running:
        up = f"up{{{target}}}" if target else "up"
        vllm_jobs = f"group by (job) (last_over_time({b.sel(running)}[{DOWN_MEMORY}]))"
        out.append(Rule(
            "VllmTargetDown", f"{up} == 0 and on (job) {vllm_jobs}", for_, "critical",
            "vLLM target {{ $labels.instance }} (job {{ $labels.job }}) is down",
            "Prometheus cannot scrape it (a scrape target of a job that exported vLLM series in the last "
            f"{DOWN_MEMORY}). Refused: the server is not running (vLLM's API server exits when its engine core dies); "
            "a timeout: hung or overloaded. Look at the last scrape error (Status > Targets), the server's log above "
            "EngineDeadError, and `dmesg` for an OOM kill; restart it or take it out of the load balancer.",
            "fleet.replica_down"))
    if "kv_peak" in q and "preemptions_s" in q:
        out.append(Rule(
            "VllmKvCachePressure", f"{q['kv_peak']} >= {KV_FULL:g} and on ({L}) ({q['preemptions_s']}) > 0", for_,
            "critical", f"vLLM replica {who}: KV cache at {100 * KV_FULL:.0f}%+ with preemptions",
            f"Its KV cache peaked at {{{{ $value | humanizePercentage }}}} over the last {window} and it preempted "
            "requests (they are recomputed: TTFT and inter-token latency spikes). Give the KV cache more room or ask "
            "less of it: --kv-cache-dtype fp8, a higher --gpu-memory-utilization, a lower --max-num-seqs or "
            "--max-model-len, or more GPUs.", "vllm.kv_pressure"))
    if "queue_mean_s" in q and "ttft_mean_s" in q:
        share = f"({q['queue_mean_s']}) / ({q['ttft_mean_s']}) >= {QUEUE_SHARE_SATURATED:g}"
        room = f" unless on ({L}) ({q['kv_peak']} >= {KV_ROOM:g})" if "kv_peak" in q else ""
        out.append(Rule(
            "VllmReplicaSaturated", share + room, for_, "warning",
            f"vLLM replica {who} is capacity-bound: {{{{ $value | humanizePercentage }}}} of its mean time to first "
            "token is queueing",
            f"Over the last {window} requests waited for a scheduling slot for {100 * QUEUE_SHARE_SATURATED:.0f}%+ "
            f"of the mean TTFT while the KV cache stayed under {100 * KV_ROOM:.0f}%: they wait for a slot, not for "
            f"the model or for memory. {SATURATION_REMEDY}", "fleet.saturation"))
    for col, what, rule in (("ttft_p99_s", "p99 time to first token", "VllmReplicaSlowTtft"),
                            ("itl_p99_s", "p99 inter-token latency", "VllmReplicaSlowItl")):
        if col not in q:
            continue
        x = f"({q[col]} >= 0)"  # drops NaN: a replica that finished no request in the window has no quantile
        out.append(Rule(
            rule, f"{x} > {SLOW_RATIO:g} * scalar(quantile(0.5, {x})) and on () count({x}) >= 3", for_, "warning",
            f"vLLM replica {who}: {what} {{{{ $value | humanizeDuration }}}}, {SLOW_RATIO:g}x+ the fleet median",
            f"Over the last {window} its {what} was at least {SLOW_RATIO:g} times the median replica's (3+ "
            "replicas; the console's fleet.slow_replica also asks for a median/MAD outlier and compares two "
            f"replicas directly). {SLOW_REMEDY}", "fleet.slow_replica"))
    return out + golden_rules(for_, f"up{{{target}}}" if target else "")


def golden_rules(for_: str, fleet_targets: str = "") -> list[Rule]:
    """Rules on the quality watch's gauges (`golden watch --metrics-port`, core/compare/golden/export.py): a replica
    whose answers left the golden set's bands, drifted, or stopped answering the watch. The gauges come from the
    watch's own scrape target, so the fleet's selector cannot apply to them as it stands: with `fleet_targets` (the
    fleet's `up{...}` series) a rule keeps only replicas whose URL's host:port is one of those targets' instances,
    as the Fleet page matches them."""
    g, who = GOLDEN_PREFIX, "{{ $labels.replica }}"

    def scoped(expr: str) -> str:
        if not fleet_targets:
            return expr
        # a label of its own for the replica's host:port: the watch's `instance` stays as it is, so two watches of
        # one replica never collide
        return (f'label_replace({expr}, "replica_instance", "$1", "replica", "[a-z]+://([^/]+).*") and on '
                f'(replica_instance) label_replace(group by (instance) ({fleet_targets}), "replica_instance", "$1", '
                '"instance", "(.*)")')

    undo = ("Compare its setup with the golden set's (model path and revision, --dtype, --kv-cache-dtype, "
            "--quantization, vLLM version) and undo what changed; `python -m diagnostics golden watch` names the "
            "round it began in and what the server reports as changed.")
    # The watch judged each round already: a drift stands for one round only, so its rule fires at once.
    return [
        Rule("TriageGoldenBroken", scoped(f'{g}status{{status=~"low agreement|broken"}} == 1'), for_, "critical",
             f"Replica {who} no longer answers like the golden set ({{{{ $labels.status }}}})",
             "Its last quality-watch round was judged low agreement or broken against the golden set "
             f"({{{{ $labels.golden }}}}) with the compare's bands. {undo}", "fleet.quality_outlier"),
        Rule("TriageGoldenDrift", scoped(f"{g}drift == 1"), "0s", "warning",
             f"Replica {who}: its answers moved beyond the golden set's noise floor since its previous round",
             f"Same top token share or mean KLD changed by more than the noise floor between two rounds. {undo}",
             "fleet.quality_outlier"),
        Rule("TriageGoldenNoAnswer", scoped(f'{g}status{{status="no answer"}} == 1'), for_, "warning",
             f"Replica {who} did not answer the quality watch's last round",
             "The golden set's requests got no answer (refused, timed out or an error): its agreement is unknown, "
             "not fine. Look at the replica's liveness (fleet.stalled, vllm.liveness) and its log.",
             "fleet.quality_outlier"),
    ]


def rules_yaml(rules: list[Rule], source: str) -> str:
    """The Prometheus rule file. Strings are JSON-quoted (a JSON string is a YAML double-quoted scalar), so no label
    value or annotation text can break out of its field; each expr is a literal block, pasteable as it stands."""
    lines = ["# vLLM fleet alert rules from the triage console (python -m diagnostics fleet --alert-rules).",
             f"# {source}",
             "# Check: promtool check rules FILE; load: rule_files in prometheus.yml, then reload Prometheus.",
             "groups:", f"  - name: {GROUP}", "    rules:"]
    for r in rules:
        lines += [f"      - alert: {r.alert}", "        expr: |-", f"          {r.expr}", f"        for: {r.for_}",
                  "        labels:", f"          severity: {r.severity}", f"          triage_check: {r.check_id}",
                  "        annotations:", f"          summary: {_q(r.summary)}",
                  f"          description: {_q(r.description)}"]
    return "\n".join(lines) + "\n"


def for_snapshot(snap: FleetSnapshot, for_: str | None = None) -> str:
    """The rule file for the fleet a refresh looked at: its names, selector, replica label and window."""
    names = Names(dict(snap.names))
    rules = alert_rules(names, snap.selector, snap.replica_label, snap.window, for_, snap.scrape_interval_s)
    return rules_yaml(rules, _source(snap.selector, snap.replica_label, snap.window, f"names found at "
                                     f"{snap.prometheus_url}"))


def export(path: str, names: Names | None, selector: str, replica_label: str, window: str,
           for_: str | None = None, where: str = "", scrape_interval_s: float | None = None) -> list[Rule]:
    rules = alert_rules(names or native_names(), selector, replica_label, window, for_, scrape_interval_s)
    found = f"names found at {where}" if names else "native vllm: names assumed (no --prometheus-url to ask)"
    text = rules_yaml(rules, _source(selector, replica_label, window, found))
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise InputError(f"Cannot write the alert rules to {path}: {exc.strerror}. Give a path in a writable "
                         "folder.") from exc
    return rules


def _source(selector: str, label: str, window: str, names: str) -> str:
    return f"selector {selector or '(none)'}, replicas by {label}, window {window}; {names}."


def _duration(text: str) -> str:
    m = _DURATION.match((text or "").strip())
    if not m:
        raise InputError(f"--for {text!r} is not a duration: give a number and s, m or h, e.g. 0s, 30s or 2m.")
    return f"{m.group(1)}{m.group(2)}"


def _q(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)
