"""Peak memory of one needle-test scoring pass (teacher-forced, engine.score) at a given prompt length.

    .venv/bin/python -m bench.needle_memory --tokens 32758 [--precision bf16] [--device cpu]

Each length runs in a fresh process. Loading the model has its own peak (the conversion to the load dtype), so the
peak resident size is reset after loading (Linux clear_refs) and read again after the pass: that is the pass's own
peak, the figure that grows with length. Prints it with the resident size after loading and the pass's time.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def status_bytes(field: str) -> int:
    """VmRSS (resident now) or VmHWM (peak resident) from /proc/self/status."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))


def reset_peak() -> bool:
    """Reset VmHWM (Linux: clear_refs 5), so the peak read after the pass is the pass's own, not the load's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="embedded")
    ap.add_argument("--precision", default="bf16")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--tokens", type=int, required=True, help="needle-test prompt length (the page's setting)")
    ap.add_argument("--depth", default="middle", choices=["start", "middle", "end"])
    args = ap.parse_args(argv)

    from core.long_context import document as longdoc
    from core.long_context import runs as longrun
    from core.engines.torch.engine import TorchEngine
    from core.models import parse_model
    from core.precision import parse_precision

    engine = TorchEngine(parse_model(args.model), parse_precision(args.precision), device=args.device)
    doc = longdoc.sample_document(min(args.tokens, 20000), lambda s: longdoc.count_tokens(engine.tokenizer, s))
    filler = longrun.plain_ids(engine, doc)
    longrun.check_needle_length(engine, args.tokens)
    prompts, answer = longrun.needle_prompts(engine, filler, args.tokens, depths=(args.depth,))
    ids = prompts[1][2]
    loaded_rss, load_peak = status_bytes("VmRSS"), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    reset = reset_peak()
    t0 = time.perf_counter()
    s = engine.score(ids, answer, top_k=1)
    wall = time.perf_counter() - t0
    peak = status_bytes("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"model": args.model, "precision": args.precision, "device": args.device,
                      "prompt_tokens": len(ids), "scored_tokens": len(ids) + len(answer),
                      "rss_after_load_gib": round(loaded_rss / 2**30, 3),
                      "peak_rss_while_loading_gib": round(load_peak / 2**30, 3),
                      "peak_rss_during_pass_gib": round(peak / 2**30, 3),
                      "pass_peak_is_own": reset, "pass_s": round(wall, 1),
                      "answer_logprob": round(sum(s.target_logprobs), 3),
                      "load_avg_1min": round(os.getloadavg()[0], 2)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
