"""The quality run as text and table rows: pure, for the page, the CLI and the bench. Token text stays text: made
visible with core.fmt.visible_token, and the page shows it in dataframes (never as Markdown or HTML)."""
from __future__ import annotations

from core.fmt import fmt_bytes, visible_token


def _num(v, fmt: str) -> str:
    return "n/a" if v is None else format(v, fmt)


def table_rows(result: dict) -> list[dict]:
    """One row per precision, the reference first: the issue's table."""
    out = []
    for r in result["rows"]:
        k, s = r.get("kld") or {}, r.get("same_top")
        kernels = [x for x in r.get("kernels") or [] if x not in r["label"]]  # only what the label does not say
        out.append({
            "precision": r["name"] + (" (reference)" if r["role"] == "reference" else ""),
            "perplexity": _num(r["perplexity"], ".4f"),
            "mean KLD": _num(k.get("mean"), ".5f"),
            "median KLD": _num(k.get("median"), ".5f"),
            "p99 KLD": _num(k.get("p99"), ".4f"),
            "p99.9 KLD": _num(k.get("p99_9"), ".4f"),
            "max KLD": _num(k.get("max"), ".4f"),
            "same top %": "n/a" if not s else
            f"{100 * s['share']:.2f} ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})",
            "RMS Δp %": "n/a" if r.get("rms_dp") is None else f"{100 * r['rms_dp']:.3f}",
            "weights": fmt_bytes(r.get("weights_bytes")),
            "peak memory": fmt_bytes(r.get("peak_bytes")),
            "prefill tok/s": _num(r.get("prefill_tok_s"), ",.0f"),
            "decode tok/s": _num(r.get("decode_tok_s"), ",.1f"),
            "runs as": r["label"] + (f" [{', '.join(kernels)}]" if kernels else ""),
        })
    return out


def worst_rows(result: dict) -> list[dict]:
    """Positions where candidates differ most from the reference, tokens made visible."""
    out = []
    for r in result["rows"]:
        for w in r.get("worst") or []:
            out.append({"precision": r["name"], "position": w["position"], "KLD": round(w["kld"], 4),
                        "context": visible_token(w["context"]), "token": visible_token(w["token"]),
                        "reference top": visible_token(w["reference_top"]),
                        "candidate top": visible_token(w["candidate_top"])})
    return out


def notes(result: dict) -> list[str]:
    c = result["reference_cache"]
    ref = ("reused the kept reference pass" if c["reused"] else "ran the reference and kept its pass") + \
        (f" ({c['kept']}; {c['path']})" if c.get("path") else f" ({c['kept']}, not kept)")
    d = result["document"]
    return [f"document: {d['name']}, {d['tokens']:,} tokens; {result['windows']} windows of {result['window']:,} "
            f"tokens, stride {result['stride']:,}; {result['positions']:,} positions scored",
            f"reference {result['reference']}: {ref}",
            f"AWQ calibration: {result['calibration']}",
            "KLD in nats, KL(reference || candidate) per position; same top % with its Wilson 95% interval; "
            "RMS Δp: root mean square change of the correct token's probability"]


def text_table(rows: list[dict]) -> str:
    cells = [list(rows[0])] + [[str(v) for v in r.values()] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in cells)
