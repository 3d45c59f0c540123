"""The one door to an engine: `open_engine(choice)` turns what a user picked (an EngineChoice) into a loaded engine.

"torch" is the CUDA-graph engine where it can run (NVIDIA GPU, a Llama-shaped model, BF16/FP8/INT8/INT4), else the
eager torch engine; "torch-eager" always the eager one (static FP8 and the layer analysis need its numerics; on a GPU
its integer runs are the reference, not a speed); "vllm" a local vLLM server started here; "remote" an OpenAI-compatible server already running.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from core.errors import InputError
from core.models import ModelSpec
from core.precision import KVDtype, Precision

KINDS = ("torch", "torch-eager", "vllm", "remote")
Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class EngineChoice:
    kind: str  # one of KINDS
    model: ModelSpec | str = "embedded"  # torch/vllm: a spec, or what a user types; remote: the served name or ""
    precision: Precision = Precision.BF16
    kv_dtype: KVDtype = KVDtype.AUTO
    url: str = ""  # remote only
    api_key: str | None = None  # remote only; never saved
    device: str | None = None  # torch kinds: "cpu" or "cuda" to force one (None: the best present)
    calibration: str | None = None  # torch kinds: AWQ's calibration text (None: the shipped sample prose)
    gpu_share: float | None = None  # vllm only: the GPU memory fraction its server may take (None: vLLM's default)

    def spec(self) -> ModelSpec:
        from core.models import parse_model

        return self.model if isinstance(self.model, ModelSpec) else parse_model(self.model)


def open_engine(choice: EngineChoice, progress: Progress | None = None):
    """A ready engine for `choice`. Raises UnsupportedCombination/EngineError/RemoteError with a message for the user."""
    if choice.kind in ("torch", "torch-eager"):
        from core.engines.device import current_device
        from core.engines.torch.engine import TorchEngine

        spec = choice.spec()
        device = current_device(choice.device)
        if choice.kind == "torch" and device.kind == "cuda" and spec.kind in ("synthetic", "hf_dir"):
            from core.engines.fast import fast_decode_unavailable_reasons
            from core.models import load_config

            if not fast_decode_unavailable_reasons(device, choice.precision, choice.kv_dtype, load_config(spec)):
                from core.engines.fast.engine import FastLlamaEngine

                return FastLlamaEngine(spec, choice.precision, choice.kv_dtype, device=choice.device,
                                       progress=progress, calibration=choice.calibration)
        return TorchEngine(spec, choice.precision, choice.kv_dtype, device=choice.device, progress=progress,
                           calibration=choice.calibration)
    if choice.kind == "vllm":
        from pathlib import Path

        from core.engines.vllm_engine import VllmEngine

        model = choice.model if isinstance(choice.model, str) else choice.model.path
        model_dir = None if model in ("", "embedded") else str(Path(model).expanduser())
        return VllmEngine(model_dir, choice.precision, choice.kv_dtype,
                          gpu_memory_utilization=choice.gpu_share).load(progress)
    if choice.kind == "remote":
        from core.engines.base import UnsupportedCombination

        eng = connect_remote(choice.url, choice.api_key, model=str(choice.model) or None, connect_timeout_s=120.0)
        reasons = eng.unsupported_reasons(choice.precision, choice.kv_dtype)
        if reasons:
            raise UnsupportedCombination(reasons)
        return eng
    raise InputError(f"Unknown engine {choice.kind!r}; choose one of: {', '.join(KINDS)}.")


def connect_remote(url: str, api_key: str | None = None, model: str | None = None, timeout_s: float = 120.0,
                   connect_timeout_s: float = 10.0):
    """A RemoteEngine connected to the server at `url`: the one connection a page and the runs it starts share (the
    Deployment page's Connect, then its probe and sweep). Raises RemoteError with what to do."""
    from core.engines.remote import RemoteEngine

    eng = RemoteEngine(url, model=model, api_key=api_key, timeout_s=connect_timeout_s)
    eng.connect()
    eng.timeout_s = timeout_s  # a server answers the check at once or not at all; a run's requests take longer
    return eng


def unstarted_vllm(model_dir: str | None, precision: Precision, kv_dtype: KVDtype, *, kv_cache_gib: float = 1.0,
                   extra_args: list[str] = (), start_timeout_s: float | None = None):
    """A local vLLM server's engine, not yet started: its load() starts it. For the deployment feature's own servers,
    which register the process group while it starts (a console killed mid-start leaves an orphan it can list)."""
    from core.engines.vllm_engine import DEFAULT_START_TIMEOUT_S, VllmEngine

    return VllmEngine(model_dir, precision, kv_dtype, kv_cache_gib=kv_cache_gib, extra_args=list(extra_args),
                      start_timeout_s=start_timeout_s or DEFAULT_START_TIMEOUT_S)


def build_engine(spec: ModelSpec, precision: Precision, kv_dtype: KVDtype, progress: Progress | None = None):
    """The in-process engine for a setup (the pool's loader): open_engine with kind "torch"."""
    return open_engine(EngineChoice("torch", spec, precision, kv_dtype), progress)
