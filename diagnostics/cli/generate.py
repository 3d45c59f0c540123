"""python -m diagnostics generate --model embedded --precision fp8 --prompt TEXT [--max-new-tokens N] [--json]"""
from __future__ import annotations

import json
import sys


def add_parser(sub) -> None:
    p = sub.add_parser("generate", help="generate text with the torch engine at a chosen precision")
    p.add_argument("--model", default="embedded", help="embedded, llama-3-8b, llama-3-70b, an HF dir or a .gguf")
    p.add_argument("--precision", default="fp32", help="fp32, bf16, fp16, fp8 (W8A8) or fp8-wo (weight-only)")
    p.add_argument("--kv-dtype", default="auto", help="auto or fp8")
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--top-logprobs", type=int, default=5)
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda when available)")
    p.add_argument("--json", action="store_true", help="print token ids, top-k logprobs and timings as JSON")
    p.set_defaults(func=run)


def run(args) -> int:
    from core.engines.base import GenerationParams, RunControl, controlled, precision_short, short_label
    from diagnostics.cli.progress import prefill_progress
    from core.engines.factory import EngineChoice, open_engine
    from core.precision import parse_kv_dtype, parse_precision

    if not args.prompt.strip():
        print("error: the prompt is empty; pass some text with --prompt.", file=sys.stderr)
        return 2
    params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              top_logprobs=args.top_logprobs).validated()
    # the CUDA-graph engine where it can run (as on the Model page), else the eager one
    engine = open_engine(EngineChoice("torch", args.model, parse_precision(args.precision),
                                      parse_kv_dtype(args.kv_dtype), device=args.device))
    stream = not args.json and sys.stdout.isatty()
    shown = [0]

    def on_step(ev):
        text = ev.texts[0]
        sys.stdout.write(text[shown[0]:])
        sys.stdout.flush()
        shown[0] = len(text)

    # a long prompt's prefill shows its chunks (core/engines/torch/engine.py) on stderr; Ctrl-C stops between them
    with controlled(RunControl(on_prefill=prefill_progress(args.json))):
        gen = engine.generate([args.prompt], params, on_step=on_step if stream else None)[0]
    if args.json:
        out = {"model": engine.spec.label, "precision": engine.precision.value, "kv_dtype": engine.kv_dtype.value,
               "device": engine.device.name, "engine": engine.ran, "engine_short": engine.ran_short,
               "label": short_label(precision_short(engine.precision, engine.kv_dtype), engine.ran_short),
               **gen.to_dict(),
               "token_texts": engine.token_texts(gen.token_ids)}
        print(json.dumps(out))
    else:
        if not stream:
            print(gen.text, end="")
        t = gen.timing_summary()
        tok_s = f"{t['decode_tok_s']:.1f} tok/s" if t["decode_tok_s"] else "n/a"
        print(f"\n[{short_label(precision_short(engine.precision, engine.kv_dtype), engine.ran_short)}, "
              f"{t['new_tokens']} tokens, "
              f"TTFT {t['ttft_s'] * 1000:.0f} ms, "
              f"decode {tok_s}]", file=sys.stderr)
    return 0
