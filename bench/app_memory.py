"""The app process's own memory through the pages' default heavy work, in one process as the Streamlit server runs
it: the Precision compare page's default (FP32 vs FP8 W8A8, the built-in prompts, engines from the shared pool) and
then the Quality page's default run (BF16 reference; FP8, INT8, INT4, INT4 AWQ on the shipped sample prose).
Prints RSS after each step, the sampled peak and the final RSS, with the machine's CPU model and the date.

    python -m bench.app_memory
"""
from __future__ import annotations

import datetime
import platform
import threading
import time

import psutil


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class Peak:
    def __init__(self):
        self.peak, self._stop = 0, threading.Event()
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            self.peak = max(self.peak, me.memory_info().rss)
            time.sleep(0.05)


def rss() -> str:
    return f"{psutil.Process().memory_info().rss / 2**30:.2f} GiB"


def main() -> None:
    from core.compare.prompts import default_prompts
    from core.compare.result import Side
    from core.compare.run import run as run_compare
    from core.engines.pool import EnginePool, Setup
    from core.models import ModelSpec, parse_model
    from core.precision import KVDtype, Precision
    from core.quality import run as quality

    print(f"{cpu_model()}, {psutil.cpu_count()} CPUs, {psutil.virtual_memory().total / 2**30:.1f} GiB; "
          f"{datetime.date.today()}")
    peak = Peak()
    pool = EnginePool()  # the pages' process-wide pool
    print("start", rss())
    pool.load(Setup(ModelSpec("embedded"), Precision.BF16))  # the Model page's first visit
    print("model page (BF16 loaded)", rss())
    loader = lambda side, progress: pool.load(Setup(parse_model(side.model), side.precision, side.kv_dtype), progress)
    run_compare(Side(Precision.FP32, KVDtype.AUTO, "embedded"), Side(Precision.FP8, KVDtype.AUTO, "embedded"),
                default_prompts(), loader=loader)
    print("after the default compare", rss(), f"(peak so far {peak.peak / 2**30:.2f} GiB)")
    pool.release_idle()  # as the Quality page does before its run
    quality.run(ModelSpec("embedded"), quality_sample(),
                quality.parse_variant("bf16"), quality.parse_variants("fp8,int8,int4,int4-awq"), use_cache=False)
    print("after the default quality run", rss())
    print(f"peak RSS {peak.peak / 2**30:.2f} GiB, final RSS {rss()}")


def quality_sample() -> str:
    from diagnostics.cli.quality import read_document

    return read_document("sample")[0]


if __name__ == "__main__":
    main()
