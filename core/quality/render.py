"""The quality run as text and table rows: pure, for the page, the CLI and the bench. Token text stays text: made
visible with core.fmt.visible_token, and the page shows it in dataframes (never as Markdown or HTML)."""
from __future__ import annotations

from core.fmt import MIB, fmt_bytes, short_path, visible_token


def _num(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def table_rows(result: dict) -> list[dict]:
    """One row per precision, the reference first: the issue's table."""
    out = []
    for r in result.get("rows") or []:
        k, s = r.get("kld") or {}, r.get("same_top")
        label = r.get("label") or r["name"]
        kernels = [x for x in r.get("kernels") or [] if x not in label]  # only what the label does not say
        out.append({
            "precision": r["name"] + (" (reference)" if r.get("role") == "reference" else ""),
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
            "peak memory": _peak(r),
            "prefill tok/s": _num(r.get("prefill_tok_s"), ",.0f"),
            "decode tok/s": _num(r.get("decode_tok_s"), ",.1f"),
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


def compact_rows(result: dict) -> list[dict]:
    """The page's table: one row per precision with the numbers that decide (numbers, not text, so the page can
    format and sort them), under short headers that fit a laptop's width. table_rows has every column."""
    out = []
    for r in result.get("rows") or []:
        k, s = r.get("kld") or {}, r.get("same_top")
        out.append({
            "precision": r["name"] + (" (ref)" if r.get("role") == "reference" else ""),
            "PPL": r.get("perplexity"),
            "KLD mean": k.get("mean"), "KLD p99": k.get("p99"), "KLD max": k.get("max"),
            "same top %": None if not s else 100 * s["share"],
            "RMS Δp %": None if r.get("rms_dp") is None else 100 * r["rms_dp"],
            "weights": fmt_bytes(r.get("weights_bytes")), "peak mem": _peak(r),
            "prefill tok/s": r.get("prefill_tok_s"), "decode tok/s": r.get("decode_tok_s"),
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
    if result.get("calibration"):
        out.append(f"AWQ calibration: {result['calibration']}")
    out.append("KLD in nats, KL(reference || candidate) per position; same top % with its Wilson 95% interval; "
               "RMS Δp: root mean square change of the correct token's probability")
    return out


def text_table(rows: list[dict]) -> str:
    cells = [list(rows[0])] + [[str(v) for v in r.values()] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)
