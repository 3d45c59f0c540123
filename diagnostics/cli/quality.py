"""python -m diagnostics quality --model embedded --document FILE --reference bf16 --candidates fp8,int8,int4
[--window N] [--stride N] [--top-k K] [--calibration FILE] [--layers] [--no-cache] [--json] [--no-history]

Perplexity of each precision over the document, and against the reference: KLD (mean, median, p99, p99.9, max),
same top token % with its 95% interval, RMS delta-p, weights, and a verdict per precision (fine / degraded / broken,
core/quality/verdict.py); host timings and peak memory follow apart, one pass each, not comparable across rows. The
reference pass is kept in a cache file and reused by later runs on the same model, document and windows (the output
says which). --layers adds which layer broke it: each linear's relative output error per quantizer on the
calibration text, ranked, with its activation statistics. --document sample uses the shipped sample prose. Saved to the history as a "quality" run unless
--no-history.

Exit code 0 when the run finished, 2 on errors (one line, by diagnostics.__main__).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from diagnostics.cli.progress import stderr_progress


def add_parser(sub) -> None:
    from core.precision import COMPARED_BY_DEFAULT, Precision
    from core.quality.run import DEFAULT_STRIDE, DEFAULT_WINDOW, WINDOW_RANGE
    from core.quality.refcache import DEFAULT_TOP_K

    p = sub.add_parser(
        "quality", help="perplexity and KLD of quantized precisions on a document (llama.cpp's numbers)",
        description="Score a document in windows at a reference precision and at each candidate; report perplexity, "
                    "KL divergence from the reference, same top token and RMS delta-p, with memory and speed.")
    p.add_argument("--model", default="embedded", help="embedded, an HF model directory or a .gguf file")
    p.add_argument("--document", default="sample",
                   help="a text file (txt, md, json, log, csv, py), or 'sample' for the shipped sample prose")
    p.add_argument("--reference", default="bf16", help="the reference precision (default bf16)")
    p.add_argument("--candidates", default=",".join(x.value for x in COMPARED_BY_DEFAULT),
                   help="comma-separated: " + ", ".join([x.value for x in Precision] + ["fp8-static:N"]))
    lo, hi = WINDOW_RANGE
    p.add_argument("--window", type=int, default=DEFAULT_WINDOW,
                   help=f"tokens per window, {lo:,}-{hi:,} (default {DEFAULT_WINDOW})")
    p.add_argument("--stride", type=int, default=DEFAULT_STRIDE,
                   help=f"tokens between window starts, 1-window (default {DEFAULT_STRIDE}; = window for no overlap)")
    p.add_argument("--top-k", type=int, default=DEFAULT_TOP_K,
                   help="reference log-probs kept per position when the full vocabulary does not fit the cache")
    p.add_argument("--calibration", help="calibration text file for AWQ and fp8-static (default: the shipped "
                                         "sample prose)")
    p.add_argument("--layers", action="store_true",
                   help="also rank the linear layers by relative output error per quantizer (fp8, int8, int8 "
                        "per-tensor, int8-wo, int4 plain and AWQ) on the calibration text")
    p.add_argument("--device", choices=["cpu", "cuda"], help="default: cuda when present")
    p.add_argument("--no-cache", action="store_true", help="neither read nor write the kept reference pass")
    p.add_argument("--json", action="store_true", help="print the whole result as JSON")
    p.add_argument("--no-history", action="store_true", help="do not save the run to the history database")
    p.set_defaults(func=run)


def read_document(arg: str) -> tuple[str, str]:
    """(text, name) of --document: the sample or a file, decoded and checked like an upload."""
    from core.errors import InputError
    from core.textfile import decode_bytes, source_text

    if arg == "sample":
        return source_text(), "shipped sample prose"
    path = Path(arg).expanduser()
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise InputError(f"Cannot read the document {arg!r}: {exc.strerror or exc}.") from None
    return decode_bytes(data, path.name), path.name


def run(args) -> int:
    from core.models import parse_model
    from core.quality import history, render
    from core.quality import run as quality

    quality.check_windows(args.window, args.stride)
    text, name = read_document(args.document)
    calibration = read_document(args.calibration)[0] if args.calibration else None
    reference = quality.parse_variant(args.reference)
    candidates = quality.parse_variants(args.candidates)
    spec = parse_model(args.model)
    progress = stderr_progress(args.json)

    def go(keep):
        return quality.run(spec, text, reference, candidates, window=args.window, stride=args.stride,
                           top_k=args.top_k, device=args.device, calibration=calibration, document_name=name,
                           use_cache=not args.no_cache, progress=progress, on_result=keep)

    if args.no_history:
        result, warning, run_id = go(lambda r: None), None, None
    else:
        params = {"reference": reference.name, "candidates": [c.name for c in candidates], "document": name,
                  "window": args.window, "stride": args.stride}
        out = history.run_recorded(spec.label, params, go, reraise=(Exception,))
        result, warning, run_id = out.result, out.warning, out.run_id
        if out.status != "finished":
            raise RuntimeError(out.message)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    if args.layers:
        from core.precision import Precision
        from core.quality import layers

        base = reference.precision if not (reference.precision.is_fp8 or reference.precision.is_int) \
            else Precision.BF16
        result["layers"] = layers.analyze(spec, base, calibration, device=args.device, progress=progress)
    if args.json:
        print(json.dumps(result))
        return 0
    rows = render.table_rows(result)
    print(render.text_table([{k: v for k, v in r.items() if k != "runs as"} for r in rows]))
    print()
    for r in render.verdict_rows(result):
        print(f"{r['precision']}: {r['verdict']} ({r['why']})")
    print(f"verdicts: {render.VERDICT_HELP}")
    print()
    for r in rows:
        print(f"{r['precision']}: {r['runs as']}")
    print()
    print("\n".join(render.notes(result)))
    print("\nhost timings, not comparable across rows (" + render.TIMINGS_CAPTION + ")")
    print(render.text_table([{k: "n/a" if v is None else v if isinstance(v, str) else f"{v:,.1f}"
                              for k, v in r.items()} for r in render.timing_rows(result)]))
    if args.layers:
        from core.quality import layers

        lay = result["layers"]
        s = layers.summary(lay)
        print(f"\nlayers: relative output error on {lay['tokens']} calibration tokens at {lay['base']}, worst 15 by "
              "int4 (all in --json)")
        print(render.text_table(layers.ranked(lay, "int4", 15)))
        print("mean relative error: " + ", ".join(f"{q} {100 * v:.3f}%" for q, v in s["mean_rel_error"].items()))
        print(f"per-channel INT8 beat per-tensor on {s['per_channel_int8_better']} of {s['layers']} layers; "
              f"AWQ no worse than plain INT4 on {s['awq_not_worse']} of {s['layers']}")
    print(f"time: {result['total_s']:.1f} s")
    if not args.no_history:
        print(f"history: saved as run #{run_id}" if run_id else "history: not saved (see the warning above)")
    return 0
