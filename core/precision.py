"""Precisions, KV cache dtypes and the hardware rules that decide which combinations can run.

Pure Python: importing this module never imports torch or touches a GPU. Rules are stated per engine
path because the same precision has different requirements in torch and in vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from core.errors import InputError


class Precision(str, Enum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"
    FP8 = "fp8"  # E4M3 W8A8: per-output-channel weight scales, dynamic per-token activation scales
    FP8_WEIGHT_ONLY = "fp8-wo"  # E4M3 weights, upcast to the base dtype for the matmul (W8A16)
    # Integer precisions (core/engines/torch/quant.py; on an NVIDIA GPU the weight-only ones also run on the fast
    # engine, core/engines/fast/methods/integer.py), never vLLM; lm_head and embeddings stay at the base dtype.
    # W8A8: per-output-channel weight scales, dynamic per-token activation scales, int8 products (core/engines/torch/quant.py: int_mm)
    INT8 = "int8"
    INT8_WEIGHT_ONLY = "int8-wo"  # int8 weights, upcast to the base dtype for each matmul (W8A16)
    INT4 = "int4"  # weight-only, groups of 128 along the input, asymmetric (zero point), two weights a byte
    INT4_AWQ = "int4-awq"  # the same storage after activation-aware per-input-channel scaling (AWQ)

    @property
    def label(self) -> str:
        return _LABELS[self]

    @property
    def short(self) -> str:
        """The precision in a few words, for short labels ("FP8 W8A8")."""
        return _SHORT[self]

    @property
    def is_fp8(self) -> bool:
        return self in (Precision.FP8, Precision.FP8_WEIGHT_ONLY)

    @property
    def is_int(self) -> bool:
        """Integer weights (core/engines/torch/quant.py): INT8 W8A8, INT8 weight-only, INT4 and INT4 with AWQ scaling."""
        return self in (Precision.INT8, Precision.INT8_WEIGHT_ONLY, Precision.INT4, Precision.INT4_AWQ)

    @property
    def is_int4(self) -> bool:
        return self in (Precision.INT4, Precision.INT4_AWQ)

    @property
    def base_dtype(self) -> str:
        """The torch dtype name of activations, embeddings and lm_head (kept unquantized, as vLLM does)."""
        return {Precision.FP32: "float32", Precision.FP16: "float16"}.get(self, "bfloat16")


_LABELS = {
    Precision.FP32: "FP32",
    Precision.BF16: "BF16",
    Precision.FP16: "FP16",
    Precision.FP8: "FP8 E4M3 (W8A8)",
    Precision.FP8_WEIGHT_ONLY: "FP8 E4M3 weight-only (W8A16)",
    Precision.INT8: "INT8 W8A8",
    Precision.INT8_WEIGHT_ONLY: "INT8 weight-only (W8A16)",
    Precision.INT4: "INT4 weight-only, g128 asymmetric",
    Precision.INT4_AWQ: "INT4 AWQ weight-only, g128 asymmetric",
}


_SHORT = {
    Precision.FP32: "FP32", Precision.BF16: "BF16", Precision.FP16: "FP16",
    Precision.FP8: "FP8 W8A8", Precision.FP8_WEIGHT_ONLY: "FP8 W8A16",
    Precision.INT8: "INT8 W8A8", Precision.INT8_WEIGHT_ONLY: "INT8 W8A16",
    Precision.INT4: "INT4 g128", Precision.INT4_AWQ: "INT4 AWQ g128",
}

# What a comparison against BF16 tries when none are named (the Quality page and `diagnostics quality`): one of each
# family the torch engine quantizes to
COMPARED_BY_DEFAULT = (Precision.FP8, Precision.INT8, Precision.INT4, Precision.INT4_AWQ)


class KVDtype(str, Enum):
    AUTO = "auto"  # same dtype as the activations
    FP8 = "fp8"  # E4M3 with per-token, per-head scales

    @property
    def label(self) -> str:
        return {KVDtype.AUTO: "auto (activation dtype)", KVDtype.FP8: "FP8 E4M3"}[self]


# Minimum CUDA compute capability for each precision on the torch engine.
# FP8 W8A8 uses torch._scaled_mm, which needs FP8 tensor cores (Ada 8.9, Hopper 9.0).
# Weight-only FP8 only stores E4M3 and upcasts, so it runs wherever the base dtype runs.
TORCH_CUDA_MIN_CC = {
    Precision.FP32: (3, 5),
    Precision.FP16: (5, 3),
    Precision.BF16: (8, 0),
    Precision.FP8_WEIGHT_ONLY: (8, 0),
    Precision.FP8: (8, 9),
    # Activations stay BF16 around the integer weights (torch._int_mm itself runs from Volta on).
    Precision.INT8: (8, 0),
    Precision.INT8_WEIGHT_ONLY: (8, 0),
    Precision.INT4: (8, 0),
    Precision.INT4_AWQ: (8, 0),
}


@dataclass(frozen=True)
class Device:
    """Where a model would run. `kind` is "cpu" or "cuda"; capability is None on the CPU."""

    kind: str = "cpu"
    name: str = "CPU"
    capability: tuple[int, int] | None = None
    total_bytes: int | None = None

    @property
    def cc_text(self) -> str:
        return f"{self.capability[0]}.{self.capability[1]}" if self.capability else "n/a"


def unsupported_reasons(precision: Precision, kv: KVDtype, device: Device, engine: str = "torch") -> list[str]:
    """Full-sentence reasons why this combination cannot run; an empty list means it can."""
    reasons: list[str] = []
    if engine == "torch":
        if device.kind == "cuda" and device.capability is not None:
            need = TORCH_CUDA_MIN_CC[precision]
            if device.capability < need:
                alt = ("FP8 weight-only or BF16" if precision is Precision.FP8 else
                       "the CPU" if precision.is_int else "FP16 or FP32")
                reasons.append(
                    f"{precision.label} on the torch engine needs compute capability >= {need[0]}.{need[1]}; "
                    f"found {device.cc_text} ({device.name}). Use {alt}."
                )
    if engine in ("vllm", "vllm-cpu") and precision.is_int:
        reasons.append(
            f"{precision.label} is this console's own online quantization (core/engines/torch/quant.py); vLLM cannot quantize a "
            "BF16 checkpoint to INT8 or INT4 at load (it runs INT8/INT4 only from pre-quantized checkpoints: "
            "compressed-tensors, GPTQ, AWQ). Use the torch engine for this precision."
        )
    elif engine == "vllm-cpu":
        if precision.is_fp8:
            reasons.append(
                "vLLM's CPU build cannot run quantization='fp8' (engine start fails in "
                "_C::static_scaled_fp8_quant). Use the torch engine for FP8 weights, or BF16 with an FP8 KV cache."
            )
    elif engine == "vllm":
        cc = device.capability
        if precision is Precision.FP8 and cc is not None and cc < (8, 9):
            reasons.append(
                f"vLLM runs FP8 W8A8 only on compute capability >= 8.9; on {device.cc_text} ({device.name}) it "
                "falls back to weight-only FP8 (Marlin, W8A16). Choose FP8 weight-only to say what will run."
            )
        if precision is Precision.FP8_WEIGHT_ONLY and cc is not None and cc < (7, 5):
            reasons.append(
                f"vLLM runs weight-only FP8 with its Marlin kernels, which need compute capability >= 7.5; found "
                f"{device.cc_text} ({device.name}). Use BF16 or FP16."
            )
    return reasons


def _parse_choice(enum_type, text: str, what: str):
    try:
        return enum_type(text.lower())
    except ValueError:
        choices = ", ".join(m.value for m in enum_type)
        raise InputError(f"Unknown {what} {text!r}; choose one of: {choices}.") from None


def parse_precision(text: str) -> Precision:
    return _parse_choice(Precision, text, "precision")


def parse_kv_dtype(text: str) -> KVDtype:
    return _parse_choice(KVDtype, text, "KV cache dtype")
