"""HTML and tables for the Precision compare page. Pure: a CompareResult in, strings and plain rows out.

Every piece of model or user text (tokens, top-k alternatives, prompt names) goes through html.escape: a token can
be "<script>" or a quote that would close an attribute. Tooltips are CSS (a hidden child shown on hover), so they
hold a small table and show up in screenshots, unlike title attributes.
"""
from __future__ import annotations

import csv
import html
import io
import math

from core.compare import agreement as ag
from core.compare.result import CompareResult, PromptResult

CSS = """
<style>
.cmp-wrap{display:grid;grid-template-columns:1fr 1fr;gap:1rem;}
.cmp-col{border:1px solid rgba(128,128,128,.35);border-radius:.5rem;padding:.6rem .8rem;}
.cmp-head{font-weight:600;margin-bottom:.4rem;}
.cmp-prompt{opacity:.6;white-space:pre-wrap;font-family:monospace;font-size:.85rem;max-height:6.5em;overflow:hidden;}
.cmp-out{white-space:pre-wrap;font-family:monospace;font-size:.9rem;line-height:1.7;}
.cmp-tok{position:relative;border-radius:3px;padding:0 1px;cursor:help;}
.cmp-tok:hover{outline:1px solid #76b900;}
.cmp-same{background:rgba(118,185,0,.16);}
.cmp-first{background:rgba(230,60,60,.55);outline:1px solid #e63c3c;}
.cmp-after{color:rgba(170,170,170,.75);}  /* not opacity: it would fade and trap the tooltip */
.cmp-tfmiss{text-decoration:underline wavy #f0a020;text-decoration-thickness:2px;}
.cmp-ws{opacity:.5;}
.cmp-tip{display:none;position:absolute;z-index:1000;left:0;top:1.6em;min-width:26rem;background:#1e1e24;color:#eee;
  border:1px solid #555;border-radius:.4rem;padding:.4rem .5rem;font-size:.78rem;line-height:1.3;white-space:normal;
  box-shadow:0 4px 14px rgba(0,0,0,.5);}
.cmp-tok:hover .cmp-tip{display:block;}
.cmp-col + .cmp-col .cmp-tip{left:auto;right:0;}
.cmp-tip div{font-family:sans-serif;margin-bottom:.2rem;}
.cmp-tip table{border-collapse:collapse;width:100%;}
.cmp-tip td,.cmp-tip th{padding:1px 4px;text-align:left;vertical-align:top;font-weight:normal;}
.cmp-tip th{opacity:.7;}
.cmp-tip .cmp-hit{color:#9be22d;font-weight:700;}
.cmp-tip code{white-space:pre;}
.cmp-legend{font-size:.8rem;opacity:.85;margin:.2rem 0 .6rem 0;}
.cmp-legend span{margin-right:1rem;}
</style>
"""


def esc(text: object) -> str:
    return html.escape(str(text), quote=True)


def visible(token: str) -> str:
    """Escaped token text with whitespace made visible: a token that is only a newline must still be hoverable."""
    out = esc(token)
    out = out.replace("\n", '<span class="cmp-ws">\u21b5</span>\n').replace("\t", '<span class="cmp-ws">\u21e5</span>\t')
    return out if token else '<span class="cmp-ws">\u2205</span>'


def _short(token: str) -> str:
    """A token for a tooltip cell: escaped, newlines and tabs shown as escapes, a whitespace-only token as visible
    spaces (a bare space would look like an empty row), never empty."""
    if token and not token.strip(" "):
        token = token.replace(" ", "\u2423")
    return esc(token.replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")) or "\u2205"


def _topk_cells(res: CompareResult, topk: dict[int, float], k: int, mark: int | None) -> list[str]:
    cells = []
    for t in ag.topk_ids(topk, k):
        cls = ' class="cmp-hit"' if t == mark else ""
        cells.append(f'<td{cls}><code>{_short(res.text_of(t))}</code></td><td{cls}>{100 * math.exp(topk[t]):.1f}%</td>')
    return cells


def tooltip(res: CompareResult, title: str, left: tuple[str, dict], right: tuple[str, dict], mark: int | None) -> str:
    """Two side-by-side top-k lists with probabilities; `mark` (the shown token) is highlighted in both."""
    k = res.top_k
    lc, rc = _topk_cells(res, left[1], k, mark), _topk_cells(res, right[1], k, mark)
    rows = []
    for i in range(max(len(lc), len(rc))):
        a = lc[i] if i < len(lc) else "<td></td><td></td>"
        b = rc[i] if i < len(rc) else "<td></td><td></td>"
        rows.append(f"<tr><td>{i + 1}</td>{a}{b}</tr>")
    head = f'<tr><th>#</th><th colspan="2">{esc(left[0])}</th><th colspan="2">{esc(right[0])}</th></tr>'
    return f'<span class="cmp-tip"><div>{title}</div><table>{head}{"".join(rows)}</table></span>'


def _column(res: CompareResult, p: PromptResult, side: str) -> str:
    ids = p.ref_ids if side == "ref" else p.cand_ids
    div = p.free.first_divergence
    judged = ag.not_judged(res.summary.status) is None  # against a broken side no colour may read as a verdict
    spans = []
    for i, tok in enumerate(ids):
        classes = ["cmp-tok"]
        if judged:
            classes.append("cmp-same" if div is None or i < div else "cmp-first" if i == div else "cmp-after")
        if side == "ref":
            has_tf = i < len(p.tf.kl)
            if judged and has_tf and not p.tf.top1_agree[i]:
                classes.append("cmp-tfmiss")
            title = (f"Position {i} · teacher-forced on the reference text · KL {p.tf.kl[i]:.4g} nats · "
                     f"top-{res.top_k} overlap {p.tf.topk_overlap[i]:.2f}" if has_tf else f"Position {i}")
            tip = tooltip(res, esc(title), ("reference", p.ref_tf_topk[i] if has_tf else {}),
                          ("candidate", p.cand_tf_topk[i] if has_tf else {}), tok)
        else:
            note = " (contexts differ from here on)" if div is not None and i >= div else ""
            title = f"Position {i} · each side's own generation{note}"
            ref_d = p.ref_decode_topk[i] if i < len(p.ref_decode_topk) else {}
            cand_d = p.cand_decode_topk[i] if i < len(p.cand_decode_topk) else {}
            tip = tooltip(res, esc(title), ("candidate", cand_d), ("reference", ref_d), tok)
        spans.append(f'<span class="{" ".join(classes)}">{visible(res.text_of(tok))}{tip}</span>')
    return "".join(spans)


def side_by_side_html(res: CompareResult, index: int) -> str:
    """The reference and candidate outputs of one prompt, tokens coloured by agreement, top-k on hover."""
    p = res.prompts[index]
    div = p.free.first_divergence
    why = ag.not_judged(res.summary.status)
    where = why or ("identical outputs" if div is None else f"first divergence at token {div}")
    legend = ('<div class="cmp-legend"><span class="cmp-same">&nbsp;same as the other side&nbsp;</span>'
              '<span class="cmp-first">&nbsp;first divergence&nbsp;</span>'
              '<span class="cmp-after">after divergence (contexts differ)</span>'
              '<span class="cmp-tfmiss">candidate would pick another token here (teacher-forced)</span>'
              '<span>hover a token for both sides\' top-k</span></div>') if why is None else (
        '<div class="cmp-legend"><span>tokens are not coloured by agreement: an agreement with a broken side means '
        'nothing</span><span>hover a token for both sides\' top-k</span></div>')
    cols = []
    for side, label in (("ref", f"Reference: {res.reference.short_label}"),
                        ("cand", f"Candidate: {res.candidate.short_label}")):
        n = len(p.ref_ids if side == "ref" else p.cand_ids)
        cols.append(f'<div class="cmp-col"><div class="cmp-head">{esc(label)} · {n} tokens</div>'
                    f'<div class="cmp-prompt">{esc(p.prompt)}</div><div class="cmp-out">{_column(res, p, side)}</div></div>')
    return (f'{CSS}<div class="cmp-legend"><b>{esc(p.name)}</b>: {esc(where)}</div>{legend}'
            f'<div class="cmp-wrap">{"".join(cols)}</div>')


def most_divergent(res: CompareResult) -> int:
    """The prompt the token diff opens on: the lowest free-running top-1 agreement, then the earliest divergence
    (an identical prompt is the last choice, as it shows nothing)."""
    def key(i: int) -> tuple:
        f = res.prompts[i].free
        return (f.top1_agreement, math.inf if f.first_divergence is None else f.first_divergence, i)
    return min(range(len(res.prompts)), key=key) if res.prompts else 0


def prompt_choice(p: PromptResult, status: str = "") -> str:
    """A prompt as the picker lists it: its name and where it diverged (`status`: the comparison's; with a broken
    side, nothing diverged from anything)."""
    div = p.free.first_divergence
    where = ag.NOT_JUDGED if ag.not_judged(status) else "identical" if div is None else (
        f"diverged at token {div}, top-1 agreement {p.free.top1_agreement:.2f}")
    return f"{p.name} · {where}"


def _fmt(v: float | None, spec: str) -> str:
    return "n/a" if v is None else format(v, spec)


def prompt_table(res: CompareResult) -> list[dict]:
    """Per-prompt metrics; plain values (the page shows them, the CLI prints them). With a broken side every
    agreement cell reads "not judged": a number or a FAIL against a broken side would read as a verdict."""
    rows = []
    judged = ag.not_judged(res.summary.status) is None
    for p in res.prompts:
        kl = p.tf.kl
        row = {
            "prompt": p.name,
            "tokens (ref/cand)": f"{len(p.ref_ids)}/{len(p.cand_ids)}",
            "top-3 match": p.free.top3_match,
            "exact prefix": p.free.exact_prefix,
            "free top-1 agreement": p.free.top1_agreement,
            f"vLLM rule (top-{res.top_k})": "pass" if p.free.vllm.passed else "FAIL",
            "same top token %": 100 * sum(p.tf.top1_agree) / len(kl) if kl else None,
            f"top-{res.top_k} overlap": sum(p.tf.topk_overlap) / len(kl) if kl else None,
            "mean KLD (nats)": sum(kl) / len(kl) if kl else None,
            "max KLD (nats)": max(kl) if kl else None,
        }
        rows.append(row if judged else {k: v if k in ("prompt", "tokens (ref/cand)") else ag.NOT_JUDGED
                                        for k, v in row.items()})
    return rows


def to_csv(res: CompareResult) -> str:
    rows = res.rows()
    buf = io.StringIO()
    if rows:
        w = csv.DictWriter(buf, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return buf.getvalue()


def summary_lines(res: CompareResult) -> list[str]:
    """Plain-text summary (CLI): each number with what it is and where it came from."""
    s = res.summary
    lines = [
        f"reference  {res.reference.label}",
        f"candidate  {res.candidate.label}",
        f"{s.prompts} prompts, up to {res.max_new_tokens} new tokens, top-k {res.top_k}",
        "free-running (each side generates greedily on its own):",
        f"  top-3 token match (seed)        {_fmt(s.top3_match, '.3f')}   band: {s.bands['top3_match'].label}",
        f"  exact prefix, mean tokens       {_fmt(s.exact_prefix_mean, '.1f')}",
        f"  top-1 agreement, position-wise  {_fmt(s.top1_agreement_free, '.3f')}",
        f"  vLLM check_logprobs_close rule  passed {s.vllm_passed}/{s.vllm_total} prompts (top-{res.top_k})",
        f"teacher-forced (both score the reference continuation, {s.positions} positions):",
        f"  same top token                  {_fmt(None if s.same_top is None else 100 * s.same_top, '.2f')} %"
        f"   band: {s.bands['same_top'].label}",
        f"  top-{res.top_k} overlap                 {_fmt(s.mean_topk_overlap, '.3f')}",
        f"  mean KLD / 99th pct / max       {_fmt(s.mean_kld, '.3g')} / {_fmt(s.p99_kld, '.3g')} / "
        f"{_fmt(s.max_kld, '.3g')} nats  ({ag.KL_SOURCE_TEXT[s.kl_source]})",
        f"verdict: {s.verdict}",
    ]
    return lines
