"""python -m diagnostics compare --model embedded --reference fp32 --candidate fp8 [--kv-dtype fp8]
[--prompts-file F] [--max-new-tokens N] [--top-k K] [--budget-s S] [--json] [--no-history]

Prompts run in batches until the 95% interval of the same-top-token share lies inside one band, every prompt is
scored, or the time budget (loads included, default 120 s) would be spent by the next batch; an inconclusive verdict
says how many more prompts would decide it.

Every run is saved to the history database as a "compare" run (the History page reopens it) unless --no-history;
a history that cannot be written is a warning on stderr, never a failed comparison.

Exit code 0 when the comparison ran (whatever the verdict), 1 with --fail-on watch/failed when the verdict is
at least that bad (for CI gates: "failed" is low agreement or a broken side, "watch" adds watch and inconclusive),
2 on errors (printed as one line by diagnostics.__main__). A precision the model is known to break in (FP16 on
Gemma 3, from its config) is named on stderr before the run.
"""
from __future__ import annotations

import json

from core.precision import KVDtype, Precision
from diagnostics.cli.progress import stderr_progress


def fail_on_statuses(level: str) -> tuple[str, ...]:
    """--fail-on: the statuses at least as bad as `level`."""
    from core.compare.agreement import BROKEN, INCONCLUSIVE, LOW

    return {"watch": ("watch", INCONCLUSIVE, LOW, *BROKEN), "failed": (LOW, *BROKEN)}[level]


def add_parser(sub) -> None:
    from core.compare.run import DEFAULT_BUDGET_S, LIMITS, MAX_NEW_TOKENS, MAX_TOP_K

    p = sub.add_parser(
        "compare", help="token agreement of two precisions on the same prompts (top-3 match, KL, vLLM rule)",
        description="Greedy-generate with a reference and a candidate precision, score the reference continuation "
                    "teacher-forced on both, and report the seed's top-3 token match, exact prefix, vLLM's "
                    "check_logprobs_close rule, same-top-token share and KL divergence.")
    p.add_argument("--model", default="embedded", help="embedded, an HF model directory or a .gguf file")
    p.add_argument("--reference", default="fp32", choices=[x.value for x in Precision], help="default fp32")
    p.add_argument("--candidate", default="fp8", choices=[x.value for x in Precision], help="default fp8")
    p.add_argument("--kv-dtype", default="auto", choices=[x.value for x in KVDtype],
                   help="the candidate's KV cache dtype (default auto)")
    p.add_argument("--reference-kv-dtype", default="auto", choices=[x.value for x in KVDtype])
    p.add_argument("--reference-url", default="", help="compare against a running OpenAI-compatible server instead "
                                                       "of the in-process torch engine (--reference labels it)")
    p.add_argument("--candidate-url", default="", help="the same for the candidate")
    p.add_argument("--engine", default="torch", choices=["torch", "vllm"],
                   help="engine for sides without a URL: in-process torch, or a local vLLM server (default torch)")
    p.add_argument("--prompts-file", help="one prompt per line, or .jsonl/.json; default: the built-in set")
    p.add_argument("--prompt", action="append", default=[], help="a prompt (repeatable); replaces the built-in set")
    p.add_argument("--max-new-tokens", type=int, default=32, help=f"1-{MAX_NEW_TOKENS} (default 32)")
    p.add_argument("--top-k", type=int, default=8, help=f"logprobs per position, 1-{MAX_TOP_K} (vLLM's rule uses 8)")
    _, lo, hi = LIMITS["budget_s"]
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                   help=f"{lo}-{hi}: seconds the comparison may take, loads included; prompts are added in batches "
                        f"until the verdict is decided or the next batch would pass it (default {DEFAULT_BUDGET_S})")
    p.add_argument("--noise-floor", action="store_true", help="also compare the reference with itself")
    p.add_argument("--fail-on", choices=["watch", "failed"], help="exit 1 when the verdict is this bad or worse")
    p.add_argument("--json", action="store_true", help="print the full result (ids, top-k, per-position metrics)")
    p.add_argument("--no-history", action="store_true",
                   help="do not save the run to the history database ($TRIAGE_DB; saved by default)")
    p.set_defaults(func=run)


def run(args) -> int:
    from core.compare import render
    from core.compare.result import Side, save_to_history
    from core.compare.run import run as run_compare
    from core.compare.prompts import default_prompts, parse_user_prompts, read_prompts_file

    prompts = parse_user_prompts("\n".join(x.replace("\n", "\\n") for x in args.prompt)) if args.prompt else []
    if args.prompts_file:
        prompts += read_prompts_file(args.prompts_file)
    prompts = prompts or default_prompts()

    def side(prec: str, kv: str, url: str) -> Side:
        return Side(Precision(prec), KVDtype(kv), "" if url else args.model, "remote" if url else args.engine, url)

    ref = side(args.reference, args.reference_kv_dtype, args.reference_url)
    cand = side(args.candidate, args.kv_dtype, args.candidate_url)
    warn_known_failures(args.model, ((ref, "reference"), (cand, "candidate")))
    progress = stderr_progress(args.json)

    res = run_compare(ref, cand, prompts, max_new_tokens=args.max_new_tokens, top_k=args.top_k, progress=progress,
                      budget_s=args.budget_s)
    noise = None
    if args.noise_floor:
        noise = run_compare(ref, ref, prompts, max_new_tokens=args.max_new_tokens, top_k=args.top_k, progress=progress,
                            budget_s=args.budget_s)

    saved = None if args.no_history else save_to_history(res, noise)
    if args.json:
        out = res.to_dict()
        if noise is not None:
            out["noise_floor_summary"] = noise.summary.to_dict()
        print(json.dumps(out))
    else:
        rows = render.prompt_table(res)
        cells = [list(rows[0])] + [[_cell(v) for v in r.values()] for r in rows]
        widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]))]
        for row in cells:
            print("  ".join(c.rjust(w) for c, w in zip(row, widths)))
        print()
        print("\n".join(render.summary_lines(res)))
        if noise is not None:
            print(f"noise floor: {noise.summary.verdict}")
        t = res.timings
        print(f"prompts: {res.scored_text}")
        print(f"time: {t['total']:.1f} s (load {t.get('load', 0):.1f} s, generate {t['reference_generate']:.1f} + "
              f"{t['candidate_generate']:.1f} s, score {t['reference_score']:.1f} + {t['candidate_score']:.1f} s)")
        if not args.no_history:
            print(f"history: saved as run #{saved}" if saved else "history: not saved (see the warning above)")
    return 1 if args.fail_on and res.summary.status in fail_on_statuses(args.fail_on) else 0


def warn_known_failures(model: str, sides) -> None:
    """Before the run: name on stderr each in-process side whose precision the model is known to break in."""
    import sys

    from core.compare.known import known_failures

    failures = known_failures(model)
    for side, role in sides:
        if side.engine != "remote" and side.precision in failures:
            print(f"warning: the {side.precision.label} {role} is known to fail on this model: "
                  f"{failures[side.precision]}. The verdict will name the side that broke.", file=sys.stderr)


def _cell(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3f}" if isinstance(v, float) else str(v)
