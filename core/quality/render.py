"""The quality run as text and table rows: pure, for the page, the CLI and the bench. Token text stays text: made
visible with core.fmt.visible_token, and the page shows it in dataframes (never as Markdown or HTML)."""
from __future__ import annotations

import math

from core.fmt import MIB, fmt_bytes, short_path, visible_token
from core.quality.verdict import THRESHOLDS_TEXT, verdicts


def _num(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def table_rows(result: dict) -> list[dict]:
    """One row per precision, the reference first: every quality column and what ran (host timings apart:
    timing_rows)."""
    out = []
    judged = verdicts(result)
    for r in result.get("rows") or []:
        k, s = r.get("kld") or {}, r.get("same_top")
        label = r.get("label") or r["name"]
        kernels = [x for x in r.get("kernels") or [] if x not in label]  # only what the label does not say
        v = judged.get(r["name"])
        out.append({
            "precision": r["name"] + (" (reference)" if r.get("role") == "reference" else ""),
            "verdict": v.name if v and r.get("role") != "reference" else "",
            "perplexity": _num(r.get("perplexity"), ".4f"),
            "mean KLD": _num(k.get("mean"), ".5f"),
            "median KLD": _num(k.get("median"), ".5f"),
            "p99 KLD": _num(k.get("p99"), ".4f"),
            "p99.9 KLD": _num(k.get("p99_9"), ".4f"),
            "max KLD": _num(k.get("max"), ".4f"),
            "same top %": "n/a" if not s else
            f"{100 * s['share']:.2f} ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})",
            "RMS Δp %": "n/a" if r.get("rms_dp") is None else f"{100 * r['rms_dp']:.3f}",
            "weights": fmt_bytes(r.get("weights_bytes")),
            "runs as": label + (f" [{', '.join(kernels)}]" if kernels else ""),
        })
    return out


def _peak(row: dict) -> str:
    """A CPU run's peak is what the process's resident memory grew by: a run that fit in memory the process already
    held (freed by an earlier run) grows it by nothing, which reads as a broken "0 B"."""
    b = row.get("peak_bytes")
    return "< 1 MiB" if b is not None and b < MIB and "RSS" in (row.get("peak_source") or "") else fmt_bytes(b)


def worst_rows(result: dict) -> list[dict]:
    """Positions where candidates differ most from the reference, tokens made visible."""
    out = []
    for r in result.get("rows") or []:
        for w in r.get("worst") or []:
            out.append({"precision": r["name"], "position": w["position"], "KLD": round(w["kld"], 4),
                        "context": visible_token(w["context"]), "token": visible_token(w["token"]),
                        "reference top": visible_token(w["reference_top"]),
                        "candidate top": visible_token(w["candidate_top"])})
    return out


def timing_rows(result: dict) -> list[dict]:
    """Host timings and peak memory per precision. They are one pass each, taken while whatever else ran on the
    host ran, the peak a process-wide high-water mark: shown apart from the quality numbers, never beside them."""
    return [{"precision": r["name"], "peak memory": _peak(r), "prefill tok/s": r.get("prefill_tok_s"),
             "decode tok/s": r.get("decode_tok_s"), "forward (s)": r.get("forward_s")}
            for r in result.get("rows") or []]


TIMINGS_CAPTION = ("One pass per precision on this host, in turn, while whatever else ran here ran: not comparable "
                   "across rows. Peak memory is the CUDA allocator's peak on a GPU; on the CPU what the process's "
                   "resident memory grew by during that precision, which an earlier precision's freed memory hides. "
                   "For speed, use the Model page's repeated runs or the recorded H200 table.")


def verdict_rows(result: dict) -> list[dict]:
    """One row per candidate: its verdict and the numbers and thresholds it rests on."""
    return [{"precision": name, "verdict": v.name, "why": v.reason} for name, v in verdicts(result).items()]


VERDICT_HELP = "Against the reference: " + THRESHOLDS_TEXT + "."


def compact_rows(result: dict) -> list[dict]:
    """The page's table: one row per precision with its verdict and the numbers that decide (numbers, not text, so
    the page can format and sort them), under short headers that fit a laptop's width. table_rows has every
    column; timing_rows the host's timings."""
    out = []
    judged = verdicts(result)
    for r in result.get("rows") or []:
        k, s = r.get("kld") or {}, r.get("same_top")
        v = judged.get(r["name"]) if r.get("role") != "reference" else None
        out.append({
            "precision": r["name"] + (" (ref)" if r.get("role") == "reference" else ""),
            "verdict": v.name if v else "reference",
            "PPL": r.get("perplexity"),
            "KLD mean": k.get("mean"), "KLD p99": k.get("p99"), "KLD max": k.get("max"),
            "same top %": None if not s else 100 * s["share"],
            "RMS Δp %": None if r.get("rms_dp") is None else 100 * r["rms_dp"],
            "weights": fmt_bytes(r.get("weights_bytes")),
        })
    return out


def notes(result: dict) -> list[str]:
    """What the numbers rest on. A run saved while it ran (cancelled, failed, or by an older version) may lack some
    of these fields: what is there is said, the rest left out."""
    params = result.get("params") or {}
    out = []
    d = result.get("document") or {"name": params.get("document")}
    window, stride = result.get("window", params.get("window")), result.get("stride", params.get("stride"))
    head = f"document: {d.get('name') or 'unnamed'}" + (f", {d['tokens']:,} tokens" if d.get("tokens") else "")
    if window:
        head += (f"; {str(result['windows']) + ' ' if result.get('windows') else ''}windows of {window:,} tokens"
                 + (f", stride {stride:,}" if stride else ""))
    if result.get("positions"):
        head += f"; {result['positions']:,} positions scored"
    out.append(head)
    c = result.get("reference_cache")
    reference = result.get("reference", params.get("reference"))
    if c:
        ref = ("reused the kept reference pass" if c.get("reused") else "ran the reference and kept its pass") + \
            (f" ({c.get('kept')}; {short_path(c['path'])})" if c.get("path") else f" ({c.get('kept')}, not kept)")
        out.append(f"reference {reference}: {ref}")
    ref_row = next((r for r in result.get("rows") or [] if r.get("role") == "reference"), {})
    if ref_row.get("log_loss_noise") is not None:
        out.append(f"reference noise floor: its perplexity is known to within x{math.exp(ref_row['log_loss_noise']):.3f}"
                   " (95% interval over these positions)")
    if result.get("calibration"):
        out.append(f"AWQ calibration: {result['calibration']}")
    out.append("KLD in nats, KL(reference || candidate) per position; same top % with its Wilson 95% interval; "
               "RMS Δp: root mean square change of the correct token's probability")
    return out


def text_table(rows: list[dict]) -> str:
    cells = [list(rows[0])] + [[str(v) for v in r.values()] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)
