"""Reports of a checklist run: JSON (everything, for machines), Markdown (for tickets), HTML (one file with charts).

The HTML file is self-contained and small: its charts are inline SVG (no charting library, no script), so it opens
offline and can be attached to a ticket.
Every piece of text in it is HTML-escaped, because much of it comes from outside (launch commands, URLs, error
messages, metric labels) and a report is opened in a browser.
"""
from __future__ import annotations

import html
import json
from dataclasses import dataclass
from typing import Any, Iterable

from core.fmt import fmt_field, fmt_s, markdown_safe
from diagnostics.findings import Finding, RunResult, Status

STATUS_COLOURS = {Status.FAIL: "#c62828", Status.ERROR: "#6a1b9a", Status.WARN: "#ef6c00", Status.PASS: "#2e7d32",
                  Status.SKIP: "#757575"}
STATUS_ICONS = {Status.FAIL: "✖", Status.ERROR: "⚠", Status.WARN: "▲", Status.PASS: "✔", Status.SKIP: "–"}


def format_value(key: str, value: Any) -> str:
    """Evidence value as text, by the unit its key names (core.fmt.fmt_field)."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    if key.endswith("_s") and isinstance(value, (int, float)):
        return fmt_s(value)  # fmt_field has no seconds; latencies want ms
    return fmt_field(key, value)


_UNIT_SUFFIXES = (("_mib_per_min", " (MiB/min)"), ("_pct", ""), ("_bytes", ""), ("_s", ""))  # values carry units


def evidence_label(key: str) -> str:
    """'GPU 0 (H200) mean_util_pct' -> 'GPU 0 (H200) mean util (%)': the unit suffix read aloud."""
    for suffix, text in _UNIT_SUFFIXES:
        if key.endswith(suffix):
            key = key[: -len(suffix)] + text
            break
    return key.replace("_", " ")


def evidence_rows(finding: Finding) -> list[tuple[str, str]]:
    """(label, text) per evidence item; lists of flag issues become one row each."""
    rows = []
    for key, value in finding.evidence.items():
        if key == "issues" and isinstance(value, list):
            for issue in value:
                text = issue.get("message", "")
                if issue.get("real_way") and issue["real_way"] not in text:
                    text += f" Instead: {issue['real_way']}"
                elif issue.get("suggestion"):
                    text += f" (nearest real: {issue['suggestion']})"
                rows.append((f"{issue.get('kind', 'issue')}: {issue.get('flag', '')}", text))
        else:
            rows.append((evidence_label(key), format_value(key, value)))
    return rows


@dataclass(frozen=True)
class SkipGroup:
    """Checks skipped for one and the same reason (no NVIDIA driver: every GPU check), shown as one card instead
    of eight identical ones. Only a view: the run, the JSON and the CLI keep each check's own finding."""

    missing: str
    findings: tuple[Finding, ...]

    @property
    def input(self) -> str:
        """'no GPU' of 'no GPU: No NVIDIA driver here: ...': the input that was missing."""
        head, sep, _ = self.missing.partition(":")
        return head.strip() if sep and len(head) <= 40 else ""

    @property
    def reason(self) -> str:
        return self.missing.partition(":")[2].strip() if self.input else self.missing

    @property
    def cause(self) -> str:
        """'no NVIDIA driver here' of the reason 'No NVIDIA driver here: libnvidia-ml.so.1 was not found ...': its
        short head, when it has one; '' otherwise."""
        head, sep, _ = self.reason.partition(":")
        return head[:1].lower() + head[1:] if sep and len(head) <= 40 else ""

    @property
    def detail(self) -> str:
        """The reason after its short head (the whole reason when there is no head)."""
        return self.reason.partition(":")[2].strip() if self.cause else self.reason

    @property
    def title(self) -> str:
        """'7 GPU checks skipped: no NVIDIA driver here', the one line that stands for all of them."""
        noun = "GPU checks" if self.input == "no GPU" else "checks"
        what = self.cause or self.input
        return f"{len(self.findings)} {noun} skipped" + (f": {what}" if what else "")

    @property
    def check_ids(self) -> list[str]:
        return [f.check_id for f in self.findings]

    @property
    def remedy(self) -> str:
        """The members' remedy where they agree on one (they share the cause, so usually do), else none."""
        remedies = {f.remedy for f in self.findings}
        return remedies.pop() if len(remedies) == 1 else ""


def group_skips(findings: Iterable[Finding], min_size: int = 2) -> list[Finding | SkipGroup]:
    """The findings in their order, SKIPs sharing a missing-input text folded into one SkipGroup (placed where the
    first of them was); a reason that only one check gives stays that check's own card."""
    findings = list(findings)
    by_reason: dict[str, list[Finding]] = {}
    for f in findings:
        if f.status is Status.SKIP and f.missing:
            by_reason.setdefault(f.missing, []).append(f)
    out, placed = [], set()
    for f in findings:
        group = by_reason.get(f.missing) if f.status is Status.SKIP and f.missing else None
        if group is None or len(group) < min_size:
            out.append(f)
        elif f.missing not in placed:
            placed.add(f.missing)
            out.append(SkipGroup(f.missing, tuple(group)))
    return out


def summary_line(result: RunResult) -> str:
    counts = result.counts()
    parts = [f"{n} {status}" for status, n in counts.items() if n]
    if result.inputs.get("at"):  # a review of a past instant (fleet --at): of then, not of when it ran
        return (f"{', '.join(parts)} over the {result.inputs.get('window') or f'{result.window_s:.0f}s'} up to "
                f"{result.inputs['at']} (a past instant), read on {result.host}")
    window = f"{result.window_s:.0f} s window" + (" (cancelled early)" if result.cancelled else "")
    return f"{', '.join(parts)} over a {window} on {result.host}, {result.started_at}"


def history_title(inputs: dict, duration_s: float) -> str:
    target = inputs.get("vllm_url") or "this host"
    return f"Checklist, {duration_s:.0f} s on {target}"


def history_summary(result: RunResult) -> dict:
    """The numbers History lists and compares: findings per status and the window."""
    return {**result.counts(), "window_s": result.window_s, "cancelled": result.cancelled,
            "summary": summary_line(result)}


def to_text(result: RunResult) -> str:
    """The terminal report: the summary line, then a line per finding with its remedy under the ones to act on;
    checks skipped for one reason share a line, which says the reason once."""
    lines = [summary_line(result)]
    for f in group_skips(result.findings):
        if isinstance(f, SkipGroup):
            lines.append(f"SKIP  {f.title}: {f.detail}")
            lines.append(f"{'':26} ({', '.join(f.check_ids)})")
            continue
        lines.append(f"{f.status.value:5} {f.check_id:20} {f.verdict}")
        if f.remedy and f.status in (Status.FAIL, Status.WARN, Status.ERROR):
            lines.append(f"{'':26} -> {f.remedy}")
    return "\n".join(lines)


# --- JSON ---------------------------------------------------------------------------------------------------------

def to_json(result: RunResult) -> str:
    """Every finding with its id, status and missing input; checks skipped for one reason say the reason and its
    remedy once, in "skip_groups", and each of them points there ("skip_group": its index) with the input alone
    ("missing": "no GPU") instead of repeating the whole sentence."""
    data = result.to_dict()
    groups = [g for g in group_skips(result.findings) if isinstance(g, SkipGroup)]
    index = {f.check_id: i for i, g in enumerate(groups) for f in g.findings}
    if groups:
        data["skip_groups"] = [{"title": g.title, "missing": g.missing, "remedy": g.remedy, "checks": g.check_ids}
                               for g in groups]
        for f in data.get("findings", []):
            if f.get("id") in index:
                i = index[f["id"]]
                short = groups[i].input or f"see skip_groups[{i}]"
                f.update(verdict=f"Not decided: {short} (skip_groups[{i}])", missing=short, remedy="", skip_group=i)
    return json.dumps(data, indent=2, default=str)


def remedy_markdown(remedy: str) -> str:
    """A one-line remedy stays inline; a list (one "- item" per line) starts on its own paragraph."""
    sep = "\n\n" if "\n" in remedy else " "
    return f"**What to do:**{sep}{markdown_safe(remedy)}"


def _cell(text: Any) -> str:
    return markdown_safe(text).replace("\n", " ")


def _code(text: str) -> str:
    """An inline code span that survives backticks inside the text."""
    fence = "`"
    while fence in text:
        fence += "`"
    return f"{fence} {text} {fence}" if text.startswith("`") or text.endswith("`") else f"{fence}{text}{fence}"


def to_markdown(result: RunResult) -> str:
    out = ["# Diagnostic checklist", "", markdown_safe(summary_line(result)), ""]
    inputs = result.inputs
    out.append(f"- vLLM URL: {_code(inputs['vllm_url']) if inputs.get('vllm_url') else 'none given'}")
    out.append(f"- Launch command: {_code(inputs['launch_cmd']) if inputs.get('launch_cmd') else 'none given'}")
    for note in result.collector_notes:
        out.append(f"- {markdown_safe(note)}")
    items = group_skips(result.findings)
    out += ["", "| status | check | verdict |", "|---|---|---|"]
    for f in items:
        if isinstance(f, SkipGroup):
            out.append(f"| SKIP | {_cell(', '.join(f.check_ids))} | {_cell(f.title)} |")
        else:
            out.append(f"| {f.status.value} | {_cell(f.check_id)} | {_cell(f.verdict)} |")
    for f in items:
        if isinstance(f, SkipGroup):
            out += ["", f"## SKIP · {markdown_safe(f.title)}", "", markdown_safe(f.detail)]
            out += ["", remedy_markdown(f.remedy)] if f.remedy else []
            out += ["", "Not decided: " + ", ".join(f"{markdown_safe(m.title)} (`{m.check_id}`)" for m in f.findings)]
            continue
        heading = f"## {f.status.value} · {markdown_safe(f.title)} (`{f.check_id}`, severity {f.severity.label})"
        out += ["", heading, "", markdown_safe(f.verdict)]
        if f.remedy:
            out += ["", remedy_markdown(f.remedy)]
        rows = evidence_rows(f)
        if rows:
            out += ["", "Evidence:", ""] + [f"- {_cell(k)}: {_cell(v)}" for k, v in rows]
        if f.charts:
            titles = ", ".join(markdown_safe(c.title) for c in f.charts)
            out += ["", f"Charts: {titles} (in the HTML and JSON reports)."]
        out += ["", f"_Looks at: {markdown_safe(f.hint)}_"]
    return "\n".join(out) + "\n"


# --- HTML ---------------------------------------------------------------------------------------------------------

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1100px;color:#222;
padding:0 1rem}
h1{margin-bottom:.2rem} .summary{color:#555;margin-bottom:1rem}
table.inputs td{padding:.15rem .6rem;vertical-align:top} code{background:#f3f3f3;padding:0 .25rem;border-radius:3px;
word-break:break-all}
.card{border:1px solid #ddd;border-left:6px solid var(--c);border-radius:6px;padding:.8rem 1rem;margin:1rem 0}
.badge{display:inline-block;background:var(--c);color:#fff;border-radius:4px;padding:0 .5rem;font-weight:600;
margin-right:.5rem} .id{color:#666;font-family:monospace}
.remedy{background:#fafafa;padding:.5rem;border-radius:4px;white-space:pre-line}
svg.chart{display:block;max-width:760px;margin:.5rem 0}
table.ev{border-collapse:collapse;margin:.5rem 0} table.ev td{border-bottom:1px solid #eee;padding:.15rem .6rem;
font-size:.92rem;vertical-align:top} .hint{color:#777;font-size:.85rem}
"""


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _card(f: Finding, charts_html: list[str]) -> str:
    colour = STATUS_COLOURS[f.status]
    parts = [f'<div class="card" style="--c:{colour}" id="{_e(f.check_id)}">',
             f'<div><span class="badge">{STATUS_ICONS[f.status]} {_e(f.status.value)}</span>'
             f'<strong>{_e(f.title)}</strong> <span class="id">{_e(f.check_id)} · severity {_e(f.severity.label)}'
             "</span></div>",
             f"<p>{_e(f.verdict)}</p>"]
    if f.remedy:
        parts.append(f'<p class="remedy"><strong>What to do:</strong> {_e(f.remedy)}</p>')
    rows = evidence_rows(f)
    if rows:
        parts.append('<table class="ev">' + "".join(f"<tr><td>{_e(k)}</td><td>{_e(v)}</td></tr>" for k, v in rows)
                     + "</table>")
    parts += charts_html
    parts.append(f'<div class="hint">Looks at: {_e(f.hint)}</div></div>')
    return "\n".join(parts)


def _skip_group_card(g: SkipGroup) -> str:
    colour = STATUS_COLOURS[Status.SKIP]
    parts = [f'<div class="card" style="--c:{colour}">',
             f'<div><span class="badge">{STATUS_ICONS[Status.SKIP]} {len(g.findings)} SKIP</span>'
             f"<strong>{_e(g.title)}</strong></div>", f"<p>{_e(g.detail)}</p>"]
    if g.remedy:
        parts.append(f'<p class="remedy"><strong>What to do:</strong> {_e(g.remedy)}</p>')
    parts.append('<div class="hint">Not decided: ' + " · ".join(
        f'<span id="{_e(f.check_id)}">{_e(f.title)} <span class="id">{_e(f.check_id)}</span></span>'
        for f in g.findings) + "</div></div>")
    return "\n".join(parts)


def to_html(result: RunResult) -> str:
    """One file, no script: the charts are inline SVG (a few kB each), so it opens offline in any browser and a
    ticket can carry it. Checks skipped for the same reason share one card; the JSON keeps each finding."""
    from diagnostics.charts import svg, window_start

    t0 = window_start(result.started_at)
    cards = []
    for item in group_skips(result.findings):
        if isinstance(item, SkipGroup):
            cards.append(_skip_group_card(item))
        else:
            cards.append(_card(item, [svg(chart, t0) for chart in item.charts]))
    inputs = result.inputs
    input_rows = [("vLLM URL", inputs.get("vllm_url") or "none given"),
                  ("Launch command", inputs.get("launch_cmd") or "none given")]
    input_rows += [("Telemetry", note) for note in result.collector_notes]
    inputs_html = "".join(f"<tr><td>{_e(k)}</td><td><code>{_e(v)}</code></td></tr>" for k, v in input_rows)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>Diagnostic checklist · {_e(result.host)}</title>
<style>{_CSS}</style></head>
<body><h1>Diagnostic checklist</h1>
<div class="summary">{_e(summary_line(result))}</div>
<table class="inputs">{inputs_html}</table>
{chr(10).join(cards)}
</body></html>
"""


def write_all(result: RunResult, directory: str) -> tuple[dict[str, str], dict[str, str]]:
    """Write report.{md,json,html} under `directory` (created); returns (format -> path, format -> why it was not
    written). A format whose optional package is missing is named, never the run's loss."""
    from pathlib import Path

    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    stamp = result.started_at.replace(":", "").replace("-", "")[:15]
    paths, not_written = {}, {}
    for ext, render in (("md", to_markdown), ("json", to_json), ("html", to_html)):
        try:
            text = render(result)
        except ModuleNotFoundError as exc:
            not_written[ext] = (f"the {ext.upper()} report needs {exc.name}, which is not installed here "
                                f"(pip install {exc.name})")
            continue
        p = d / f"diagnostics-{stamp}.{ext}"
        p.write_text(text, encoding="utf-8")
        paths[ext] = str(p)
    return paths, not_written
