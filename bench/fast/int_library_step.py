"""The whole decode step per precision with the integer linears on each library candidate in turn, and the tables
bench/fast/int_library_bench.py prints (see its docstring)."""
from __future__ import annotations

import contextlib
import functools
import json
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
BENCH = "python -m bench.fast.int_library_bench"
LINS = ("qkv", "o", "gu", "down")


def run_meta() -> dict:
    import triton

    try:
        import gemlite
        gl = gemlite.__version__
    except Exception as exc:  # reported, not fatal: the library rows are then missing
        gl = f"not available ({type(exc).__name__})"
    props = torch.cuda.get_device_properties(0)
    return {"device": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
            "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "triton": triton.__version__,
            "gemlite": gl, "model": "llama-3-8b shape, random weights", "command": BENCH}


def load_project_tables(device: str | None = None) -> str:
    """The shipped tuning table's section for `device` (default: this GPU's, else the same SM's), as the engine
    loads it; returns the section's name."""
    from core.engines.fast.methods import tuning
    from core.engines.fast.tuned_table import SHIPPED, device_section

    props = torch.cuda.get_device_properties(0)
    name = device or props.name
    tuning.load(SHIPPED, name, (props.major, props.minor))
    data = json.loads(SHIPPED.read_text())
    section = device_section(data, name, (props.major, props.minor))
    return next((k for k, v in data.get("devices", {}).items() if v is section), "none")


class ProjectKernel:
    """The project's own Triton kernels (int_tile / int_gemv: the integer method's "tile" and "gemv" launches, as the
    tuning table picks them, else its default; never a library launch), in library.py's calling convention."""

    name = "project"

    def __init__(self, iw):
        from core.engines.fast import int_weight as IW
        from core.engines.fast.methods import method_for
        from core.precision import Precision

        precision = {IW.MODE_INT4: Precision.INT4, IW.MODE_INT4_AWQ: Precision.INT4_AWQ,
                     IW.MODE_INT8_WO: Precision.INT8_WEIGHT_ONLY, IW.MODE_INT8: Precision.INT8}[iw.mode]
        self.iw, self.n, self.k = iw, iw.n, iw.k
        self.method = method_for(precision)
        self.label = f"{self.method.WHAT.get(precision, precision.label)} in the project's Triton kernels (tile / GEMV)"
        self.exact = iw.mode != IW.MODE_INT8  # its W8A8 is not yet torch._int_mm's bit for bit (methods/__init__.py)

    def _cfg(self, rows: int) -> dict:
        """The tuning table's winner where it is one of the project's launches, else the H200's (their tuning)."""
        from core.engines.fast.methods import tuning
        from core.engines.fast.tuned_table import read_tuned_table

        cfg = self.method.config(rows, self.n, self.k)
        if cfg.get("kernel") in ("tile", "gemv"):
            return cfg
        h200 = read_tuned_table(None, "NVIDIA H200").get(tuning.key(self.method.precision, rows, self.n, self.k))
        return h200 or self.method.default_config(rows, self.n, self.k)

    def into(self, x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return self.method.launch(self.iw, x, out, self._cfg(x.shape[0]))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.into(x, torch.empty(x.shape[0], self.n, dtype=x.dtype, device=x.device))


def all_candidates(iw) -> dict:
    """The project's kernels and every library candidate for one integer weight."""
    from core.engines.fast.kernels import library

    return {"project": ProjectKernel, **library.candidates(iw)}


def _routed_fast(kern, x, x_scale, out, silu_x: bool = False, x16=None, x_div=None):
    """Linear.fast's convention on a library candidate: its own output, read by the step as it is."""
    from core.engines.fast.kernels import library

    return library.linear_product(kern, x, silu_x, x_div)


SHAPE_OF = {"qkv": "qkv", "o": "o", "gu": "gate_up", "down": "down"}


def _int_weight(lin):
    from core.engines.fast.int_weight import IntWeight

    return lin.weights if isinstance(lin.weights, IntWeight) else None


def route(model, choose) -> list:
    """Put a library candidate in place of each integer Lin.fast of `model`: choose(shape) names it, or None for the
    project's own kernels (choose None: all back to the project's). Returns the kernels built."""
    from core.engines.fast.kernels import library

    built = []
    for L in model.layers:
        for n in LINS:
            lin = L[n]
            lin.__dict__.pop("fast", None)
            lin.__dict__.pop("input_divisors", None)
            iw = _int_weight(lin)
            name = choose(SHAPE_OF[n]) if choose and iw is not None else None
            if name is None or name == "engine":
                continue
            kern = library.candidates(iw)[name](iw)
            lin.fast = functools.partial(_routed_fast, kern)
            # AWQ's folds read the rows the producing kernel divided (as the engine's library launches do)
            lin.input_divisors = lambda rows, kern=kern: getattr(kern, "divisors", None)
            built.append(kern)
    torch.cuda.empty_cache()
    return built


def _time_rows(model, cache, p, name, batches, prompt, steps, bw, log, describe) -> list[dict]:
    from bench.fast.fp8_speed import floor_ms, time_decode

    rows = []
    for b in batches:
        label, exact = describe(b)
        r = time_decode(model, cache, b, prompt, steps)
        fl = floor_ms(model, cache, b, prompt, steps, bw)
        rows.append(dict(precision=p, kv="auto", prompt=prompt, batch=b, candidate=name,
                         status="ok" if r["finite"] else "non-finite", ms_per_step=r["ms_per_step"],
                         tok_s=1000 * b / r["ms_per_step"], floor_ms=fl, floor_frac=fl / r["ms_per_step"],
                         engine=ENGINE_OF(None if name.startswith("engine") else name), kernel=label,
                         exact=bool(exact), date=time.strftime("%Y-%m-%d"),
                         machine=torch.cuda.get_device_name(0)))
        log(f"decode {p:8s} {name:14s} b={b}: {r['ms_per_step']:.3f} ms/step ({100 * fl / r['ms_per_step']:.0f}% "
            f"of floor)")
    return rows


# The engine's own route with one of this work's savings taken back, to measure each in the same run
ENGINE_VARIANTS = {
    "engine-copy": "; each library output [M, N] copied into the step's bf16 buffer first (as before 2026-12-06)",
    "engine-noring": "; gemlite's one-row outputs zeroed per call (no output rings)",
}


@contextlib.contextmanager
def engine_variant(model, name: str):
    """The engine as it is ("engine"), or with a saving taken back (ENGINE_VARIANTS)."""
    from core.engines.fast.kernels import library

    patched = []
    if name == "engine-copy":
        for L in model.layers:
            for n in LINS:
                lin = L[n]
                if _int_weight(lin) is not None:
                    lin.fast = functools.partial(_copied_fast, lin)
                    patched.append(lin)
    ring = library.graph_outputs
    if name == "engine-noring":
        library.graph_outputs = lambda keep, layers: contextlib.nullcontext()
    try:
        yield
    finally:
        library.graph_outputs = ring
        for lin in patched:
            lin.__dict__.pop("fast", None)


def _copied_fast(lin, x, x_scale, out, silu_x: bool = False, x16=None, x_div=None):
    """Linear.fast with its product copied into the step's buffer, as the step did before it read library outputs
    as they are (AWQ's row blocks, which had a gather launch, are left as they are)."""
    from core.engines.fast.methods.base import Linear

    got = Linear.fast(lin, x, x_scale, out, silu_x, x16, x_div)
    if isinstance(got, tuple):  # AWQ split: one copy per projection
        start = 0
        for part in got:
            out[:, start:start + part.shape[1]].copy_(part)
            start += part.shape[1]
        return out
    return out.copy_(got) if got is not out and got.shape == out.shape else got


def step_profile(model, cache, prompt: int, steps: int = 5) -> dict:
    """What one batch-1 CUDA-graph step is made of (torch profiler over replays): kernel and memset time and count
    per step, the step's wall time, and the largest kernel groups; idle = wall - busy (launch gaps)."""
    from bench.fast.fp8_speed import profiled_replays

    wall, events = profiled_replays(model, cache, prompt, steps)
    groups: dict[str, list] = {}
    for key, ms, count in events:
        name = "Memset" if "Memset" in key else "Memcpy" if "Memcpy" in key else key.split("(")[0][:60]
        grp = groups.setdefault(name, [0.0, 0])
        grp[0] += ms
        grp[1] += count
    busy = sum(v[0] for v in groups.values())
    top = sorted(groups.items(), key=lambda kv: -kv[1][0])
    return {"ms_per_step": wall, "busy_ms_per_step": busy, "idle_ms_per_step": max(wall - busy, 0.0),
            "launches_per_step": sum(v[1] for v in groups.values()),
            "memsets_per_step": groups.get("Memset", [0, 0])[1], "memcpys_per_step": groups.get("Memcpy", [0, 0])[1],
            "groups": {k: {"ms": v[0], "count": v[1]} for k, v in top[:14]}}


def _decode_one(model, p: str, batches, prompt: int, steps: int, bw: float, log, winners: dict,
                measured_exact: set, only) -> tuple[list[dict], dict | None]:
    """Every candidate of precision p in the whole step; for integer precisions last 'tuned': each shape on its
    winner (the fastest exact candidate at that batch in the linear table). Also the engine's batch-1 step profile."""
    from bench.fast.fp8_speed import kernel_of
    from core.engines.fast.kernels import library

    cache = model.new_cache(max(batches), prompt + steps + 16, False)
    ids = torch.randint(0, model.dims.vocab, (1, prompt), device="cuda",
                        generator=torch.Generator(device="cuda").manual_seed(prompt))
    model.prefill(ids, cache, rows=slice(0, 1))
    cache.replicate_row0()
    iw = _int_weight(model.layers[0]["qkv"])
    variants = [v for v in ENGINE_VARIANTS if v in only and library.gemlite_available() and p != "int8"
                and (v != "engine-noring" or p != "int8-wo")]  # the rings are the INT4 one-row GEMVs'
    names = ["engine"] + (variants + [n for n in library.candidates(iw) if n != "project" and n in only]
                          if iw is not None else [])
    rows = []
    for name in names:
        try:
            built = route(model, None if name.startswith("engine") else lambda shape: name)
            k = built[0] if built else None
            desc = (k.label, k.exact or (p, name) in measured_exact) if k else \
                (kernel_of(p) + ENGINE_VARIANTS.get(name, ""), p != "int8")
            timed = [b for b in batches if b == 1 or name != "engine-noring"]
            with engine_variant(model, name):
                rows += _time_rows(model, cache, p, name, timed, prompt, steps, bw, log, lambda b: desc)
        except Exception as exc:
            log(f"decode {p} {name}: failed: {exc!r}"[:300])
    prof = None
    if 1 in batches and "profile" in only:
        try:
            route(model, None)
            prof = step_profile(model, cache, prompt)
            log(f"profile {p}: {prof['ms_per_step']:.3f} ms/step, busy {prof['busy_ms_per_step']:.3f}, "
                f"{prof['launches_per_step']:.0f} launches ({prof['memsets_per_step']:.0f} memsets)")
        except Exception as exc:
            log(f"profile {p}: failed: {exc!r}"[:300])
    for b in (batches if iw is not None and "tuned" in only else []):
        pick = {s: winners.get(f"{p}|{b}|{s}", {}).get("exact", {}).get("kernel") for s in SHAPE_OF.values()}
        try:
            route(model, pick.get)
            label = "per shape: " + ", ".join(f"{s} {k}" for s, k in pick.items())
            rows += _time_rows(model, cache, p, "tuned", [b], prompt, steps, bw, log,
                               lambda _b: (label, all(k is not None for k in pick.values())))
        except Exception as exc:
            log(f"decode {p} tuned b={b}: failed: {exc!r}"[:300])
    route(model, None)
    del cache
    return rows, prof


def ENGINE_OF(name) -> str:
    return "torch fast path (CUDA graphs)" + ("" if name is None else f", integer linears on {name}")


def decode_table(precisions, batches, prompt: int, steps: int, winners: dict, measured_exact: set, log,
                 only=frozenset({"tinygemm", "gemlite", "tinygemm+fold", "tinygemm+split", "gemlite+fold",
                                 "gemlite+split", "torch._int_mm", "tuned", "profile", *ENGINE_VARIANTS})) -> dict:
    from bench.fast.fp8_speed import copy_bandwidth, random_awq_scales
    from core.engines.fast.model import Dims, FastLlama
    from core.models import synthetic_config

    bw = copy_bandwidth()
    config = synthetic_config("llama-3-8b")
    dims = Dims.from_config(config)
    master = FastLlama.random_weights(dims, "cuda", seed=0)
    awq = random_awq_scales(dims) if "int4-awq" in precisions else {}
    rows, profiles = [], {}
    for p in precisions:
        t0 = time.perf_counter()
        model = FastLlama(dims, master | awq if p == "int4-awq" else master, p, rotary=config)
        got, prof = _decode_one(model, p, batches, prompt, steps, bw, log, winners, measured_exact, only)
        rows += got
        if prof:
            profiles[p] = prof
        del model
        torch.cuda.empty_cache()
        log(f"decode {p}: {time.perf_counter() - t0:.0f} s")
    bf = {r["batch"]: r["tok_s"] for r in rows if r["precision"] == "bf16" and r["status"] == "ok"}
    for r in rows:
        if r.get("tok_s") and r["batch"] in bf:
            r["speedup_vs_bf16"] = r["tok_s"] / bf[r["batch"]]
    return {"copy_bandwidth_GBps": bw / 1e9, "steps": steps, "decode_candidates": rows, "step_profiles": profiles}


ENGINE_NOW = "torch fast path (CUDA graphs), its linears as the engine routes them (the tuning table's winners)"
BENCH_ROUTED = ("torch fast path (CUDA graphs), integer linears routed to {} by python -m bench.fast.int_library_bench "
                "(not yet the engine's own routing)")
W8A8_NOTE = ("; the app runs INT8 W8A8 on the eager torch engine (its fast-path kernel is not yet torch._int_mm's "
             "bit for bit)")


def recorded_rows(rows: list[dict]) -> list[dict]:
    """The rows the pages show, per (precision, batch): what the engine runs now (its own kernels; BF16 and FP8
    always), and, where more than 1% faster, the fastest library route whose weights are the torch engine's
    ('tuned': each shape on its winner), named as a bench route. Kernels that are not the torch engine's numbers
    stay under decode_candidates only. INT8 W8A8: the torch engine's own ops in a CUDA graph, labelled."""
    out = []
    for key in sorted({(r["precision"], r["batch"]) for r in rows}):
        mine = [r for r in rows if (r["precision"], r["batch"]) == key and r["status"] == "ok"]
        now = next((r for r in mine if r["candidate"] in ("engine", "project") and r["exact"]), None)
        routes = [r for r in mine if not r["candidate"].startswith("engine") and r["candidate"] != "project"
                  and r["exact"]]
        lib = max(routes, key=lambda r: r["tok_s"], default=None)
        if lib is not None and lib["candidate"] == "tuned":  # one kernel within 1% of the per-shape mix: name it
            lib = next((r for r in routes if r["candidate"] != "tuned" and r["tok_s"] > 0.99 * lib["tok_s"]), lib)
        if now is not None:
            out.append({**now, "engine": ENGINE_NOW if key[0] in ("int4", "int4-awq", "int8-wo") else now["engine"]})
        if lib is not None and (now is None or lib["tok_s"] > 1.01 * now["tok_s"]):  # past one run's spread
            route = "torch._int_mm" if lib["candidate"] == "torch._int_mm" else "library kernels"
            out.append({**lib, "engine": BENCH_ROUTED.format(route),
                        "kernel": lib["kernel"] + (W8A8_NOTE if key[0] == "int8" else "")})
    return sorted(out, key=lambda r: (r["batch"], r["precision"] != "bf16", r["precision"], -r["tok_s"]))


def table_from(result: dict) -> dict:
    """The recorded table (core/data/fp8_speed_<kind>.json) from a run's result: its rows recomputed."""
    from bench.fast.fp8_speed import kernel_of

    out = {k: v for k, v in result.items() if k not in ("rows",)}
    out["rows"] = recorded_rows(result.get("decode_candidates", []))
    out["kernels"] = {p: kernel_of(p) for p in {r["precision"] for r in out["rows"]}}
    return out


def tuned_section(result: dict, base: str = "NVIDIA H200") -> tuple[dict, dict]:
    """This GPU's section of the shipped tuning table from a run: the `base` device's winners (what the run's own
    kernels used) with each integer (precision, batch, shape) whose fastest exact candidate was a library kernel set
    to it. Returns (meta, table)."""
    from core.engines.fast.methods import tuning
    from core.engines.fast.tuned_table import read_tuned_table

    table = read_tuned_table(None, base)
    for key, win in result["winners"].items():
        p, b, shape = key.split("|")
        kernel = win.get("exact", {}).get("kernel")
        n, k = next((r["n"], r["k"]) for r in result["linears"] if r["shape"] == shape)
        if kernel and kernel != "project" and p != "int8":  # W8A8 is not routed (methods/__init__.py)
            table[(p, tuning.bucket(int(b)), n, k)] = {"kernel": kernel}
    meta = {"capability": [int(c) for c in result["capability"].split(".")], "date": result["date"],
            "torch": result["torch"], "triton": result["triton"], "gemlite": result["gemlite"],
            "sources": [f"{base}'s winners; integer linears' library winners (batch 1 and 8) measured here by "
                        f"{BENCH} ({result['date']})"]}
    return meta, table


def print_tables(result: dict, log) -> None:
    log(f"\n{result['device']} (cc {result['capability']}), {result['date']}, torch {result['torch']}, triton "
        f"{result['triton']}, gemlite {result['gemlite']}; {result['model']}; command: {result['command']}")
    log("\nLinears (32 layers of distinct weights, one CUDA graph per shape; us per call):")
    log("| precision | kernel | shape | batch | us | x BF16 | rel err vs torch engine | equal outputs | exact |")
    log("|---|---|---|---|---|---|---|---|---|")
    for r in result["linears"]:
        log(f"| {r['precision']} | {r['kernel']} | {r['shape']} | {r['batch']} | {r['us']:.1f} | "
            f"{r['speedup_vs_bf16']:.2f} | {r.get('rel_err', 0):.1e} | {100 * r.get('equal_share', 1):.0f}% | "
            f"{'yes' if r['exact'] else 'no'} |")
    log("\nOne layer's four linears summed:")
    log("| precision | kernel | batch | us | x BF16 | exact |")
    log("|---|---|---|---|---|---|")
    for r in sorted(result["linear_step_sums"], key=lambda r: (r["batch"], r["precision"], r["us"])):
        log(f"| {r['precision']} | {r['kernel']} | {r['batch']} | {r['us']:.1f} | {r['speedup_vs_bf16']:.2f} | "
            f"{'yes' if r['exact'] else 'no'} |")
    if "decode_candidates" in result:
        log(f"\nWhole decode step, prompt 512, KV bf16, {result['steps']} CUDA-graph replays:")
        log("| precision | candidate | batch | ms/step | tok/s | x BF16 | % of floor | exact |")
        log("|---|---|---|---|---|---|---|---|")
        for r in sorted(result["decode_candidates"], key=lambda r: (r["batch"], r["precision"])):
            if r["status"] != "ok":
                continue
            log(f"| {r['precision']} | {r['candidate']} | {r['batch']} | {r['ms_per_step']:.3f} | {r['tok_s']:.1f} | "
                f"{r.get('speedup_vs_bf16', float('nan')):.2f} | {100 * r['floor_frac']:.0f}% | "
                f"{'yes' if r['exact'] else 'no'} |")
    if result.get("step_profiles"):
        log("\nBatch-1 step profiles (torch profiler over CUDA-graph replays; ms per step, launches per step):")
        log("| precision | wall | busy | idle | launches | memsets | largest groups (ms, count) |")
        log("|---|---|---|---|---|---|---|")
        for p, f in result["step_profiles"].items():
            top = "; ".join(f"{k[:40]} {v['ms']:.3f} x{v['count']:.0f}" for k, v in list(f["groups"].items())[:6])
            log(f"| {p} | {f['ms_per_step']:.3f} | {f['busy_ms_per_step']:.3f} | {f['idle_ms_per_step']:.3f} | "
                f"{f['launches_per_step']:.0f} | {f['memsets_per_step']:.0f} | {top} |")
