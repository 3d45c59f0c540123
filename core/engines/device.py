"""Which device a model would run on and how much memory it has, and whether a model's weights fit: shared by the
factory, both in-process engines, features and pages. Importing this module imports neither torch nor psutil; each
function imports what it asks."""
from __future__ import annotations

from pathlib import Path

from core.fmt import GIB
from core.models import ModelSpec, count_parameters
from core.precision import Device, Precision

_BASE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}  # Precision.base_dtype -> bytes an element
# Quantizing one Linear holds, beside its base-dtype weight: a float32 copy, the scaled float32 values and the 8-bit
# result (fp8.quantize_rows; about as much for quant.py's integer layers), 4 + 4 + 1 bytes a parameter.
_QUANTIZE_TEMP_BYTES_PER_PARAM = 9


def current_device(prefer: str | None = None) -> Device:
    """The first CUDA GPU unless `prefer` is "cpu" or there is none; else the host."""
    import torch

    if prefer != "cpu" and torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        return Device("cuda", props.name, (props.major, props.minor), props.total_memory)
    import psutil

    return Device("cpu", "CPU", None, psutil.virtual_memory().total)


def available_bytes(device: Device) -> int:
    if device.kind == "cuda":
        import torch

        return torch.cuda.mem_get_info()[0]
    import psutil

    return psutil.virtual_memory().available


def count_weight_bytes(config, precision: Precision) -> int:
    """Bytes of the weights at `precision`, counted on the model built on the meta device (FP8 stores the quantized
    linears in one byte a parameter); the KV cache calculator's estimate_weight_bytes works from the config alone."""
    counts = count_parameters(config)
    base = _BASE_BYTES[precision.base_dtype]
    if precision.is_int:  # int8: 1 byte a weight; int4: half a byte plus a scale and zero point per group
        from core.engines.torch import quant

        return quant.weight_bytes(counts["quantizable"], precision) + counts["other"] * base
    per_linear = 1 if precision.is_fp8 else base
    return counts["quantizable"] * per_linear + counts["other"] * base


def load_peak_bytes(config, precision: Precision) -> int:
    """The most memory loading the weights at `precision` takes. Quantized weights are read at the base dtype and
    quantized afterwards, Linear by Linear, so the peak is the whole model at the base dtype plus one Linear's
    temporaries, about twice the FP8 size that stays once loading is done."""
    if not (precision.is_fp8 or precision.is_int):
        return count_weight_bytes(config, precision)
    counts = count_parameters(config)
    base = _BASE_BYTES[precision.base_dtype]
    return (counts["quantizable"] + counts["other"]) * base + _QUANTIZE_TEMP_BYTES_PER_PARAM * counts["largest_linear"]


def fit_problem(spec: ModelSpec, config, precision: Precision, device: Device, free: int) -> str | None:
    """Why the weights would not fit in `free` bytes while loading or after, or None. Keeps 15% for activations."""
    settled, peak = count_weight_bytes(config, precision), load_peak_bytes(config, precision)
    if peak <= 0.85 * free:
        return None
    if settled <= 0.85 * free:
        return (f"{spec.label} at {precision.label} keeps about {settled / GIB:.1f} GiB of weights once loaded, but "
                f"its weights load at {precision.base_dtype} and are quantized afterwards, so loading peaks at about "
                f"{peak / GIB:.1f} GiB; only {free / GIB:.1f} GiB is free on {device.name}. Free some memory "
                "(unload other models) or pick a smaller model.")
    return (f"{spec.label} at {precision.label} needs about {settled / GIB:.1f} GiB for its weights; only "
            f"{free / GIB:.1f} GiB is free on {device.name}. Pick a smaller model or a lower precision.")


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of a process group, from /proc. Zombies are ignored: they hold no resources
    and only wait for their new parent (PID 1 in a container, which may be slow) to reap them."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z" and int(fields[2]) == pgid:
            members.append(int(stat.parent.name))
    return members


def cpu_computes_bf16() -> bool:
    """Whether this host's CPU multiplies bf16 natively (oneDNN's check); where it only emulates bf16 (AVX2), float32
    is several times faster and the better default for a server started here."""
    from core.engines.torch.cbuild import packs_bf16

    return packs_bf16()
