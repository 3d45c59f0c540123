"""How far the pages' time-left estimates are from the truth at 25%, 50% and 75% of a run, on this host as it is or
kept busy by spinning processes beside it.

    python -m bench.estimate_error [--prompt-tokens 4096] [--new-tokens 64] [--hogs 2] [--repeats 2]

One run is what the Long context page runs (core.long_context.runs.run_once on the embedded model, torch engine,
BF16): a prefill of --prompt-tokens in chunks, then --new-tokens greedy tokens. Every progress update is timed (the
prefill's chunks through the engine's RunControl, the decode's tokens through run_once's progress) and estimated as
the pages estimate it (core.stats.time_left_s: the work left at the speed this kind of work went so far in the run;
views/common/runs.py shows it as "about 50 s left"). The table gives, for each kind of work and each quarter, the
estimate made at the first update at or past it and the time that was really left, and their ratio (1.00 is exact,
2.00 an estimate twice too long). --hogs N runs N `while True: pass` processes beside it for the whole run.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import time

from bench.app_memory import cpu_model
from core.stats import time_left_s

QUARTERS = (0.25, 0.5, 0.75)


def _spin() -> None:
    while True:
        pass


def estimates(points: list[tuple[float, float]], total: float) -> list[dict]:
    """points: (monotonic time, units done) of one kind of work, the first at its start. For each quarter: the
    estimate at the first update at or past it against the time really left until the last update."""
    t_first, done_first = points[0]
    t_end = points[-1][0]
    out = []
    for q in QUARTERS:
        at = next(((t, d) for t, d in points if d >= q * total and d < total), None)
        if at is None:
            continue
        t, done = at
        left = time_left_s(done, total, t - t_first, done - done_first)
        true_left = t_end - t
        out.append({"quarter": q, "done": done, "estimate_s": left, "true_s": true_left,
                    "ratio": None if left is None or true_left <= 0 else left / true_left})
    return out


def one_run(engine, prompt_ids: list[int], new_tokens: int) -> dict[str, list[dict]]:
    from core.engines import base
    from core.long_context import runs as longrun

    prefill: list[tuple[float, float]] = [(time.monotonic(), 0.0)]  # the page's bar starts at 0 tokens done
    decode: list[tuple[float, float]] = []
    control = base.RunControl(on_prefill=lambda done, total: prefill.append((time.monotonic(), float(done))))

    def progress(fraction: float, msg: str) -> None:
        if msg.startswith("token "):
            decode.append((time.monotonic(), round(fraction * new_tokens)))

    with base.controlled(control):
        longrun.run_once(engine, prompt_ids, new_tokens, progress=progress)
    return {"prefill": estimates(prefill, float(len(prompt_ids))),
            "decode": estimates(decode, float(new_tokens)) if decode else []}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt-tokens", type=int, default=4096)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--hogs", type=int, default=0, help="spinning processes beside the runs (a busy host)")
    ap.add_argument("--repeats", type=int, default=2)
    args = ap.parse_args(argv)

    from core.engines.torch.engine import TorchEngine
    from core.long_context import document as longdoc
    from core.long_context import runs as longrun
    from core.models import ModelSpec
    from core.precision import KVDtype, Precision

    engine = TorchEngine(ModelSpec("embedded"), Precision.BF16, KVDtype.AUTO, device="cpu")
    filler = longrun.plain_ids(engine, longdoc.sample_document(min(args.prompt_tokens, 20000),
                                                                lambda s: longdoc.count_tokens(engine.tokenizer, s)))
    prompt = longrun.exact_prompt(engine, filler, args.prompt_tokens)
    longrun.run_once(engine, longrun.exact_prompt(engine, filler, 256), 2)  # warm-up, not reported
    hogs = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.hogs)]
    for h in hogs:
        h.start()
    try:
        print(f"{cpu_model()}, {os.cpu_count()} cores, {args.hogs} spinning process(es) beside; "
              f"{args.prompt_tokens} prompt tokens, {args.new_tokens} new, torch engine BF16; load average "
              f"{os.getloadavg()[0]:.1f} at the start")
        print("| run | work | at | done | estimated left (s) | really left (s) | estimate / truth |")
        print("|---|---|---|---:|---:|---:|---:|")
        for r in range(args.repeats):
            for work, rows in one_run(engine, prompt, args.new_tokens).items():
                for row in rows:
                    est = "-" if row["estimate_s"] is None else f"{row['estimate_s']:.1f}"
                    ratio = "-" if row["ratio"] is None else f"{row['ratio']:.2f}"
                    print(f"| {r + 1} | {work} | {row['quarter']:.0%} | {row['done']:,.0f} | {est} | "
                          f"{row['true_s']:.1f} | {ratio} |", flush=True)
        print(f"load average {os.getloadavg()[0]:.1f} at the end")
    finally:
        for h in hogs:
            h.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
