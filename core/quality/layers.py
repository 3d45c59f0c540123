"""Which layer broke it: the per-linear relative output error of each quantizer against the unquantized model on the
calibration text, with the activation statistics behind it (core/engines/torch/quant.py's layer_errors), ranked."""
from __future__ import annotations

from core.precision import Precision

CALIBRATION_TOKENS = 256


def analyze(spec, base: Precision = Precision.BF16, calibration: str | None = None, tokens: int = CALIBRATION_TOKENS,
            device: str | None = None, engine=None, progress=lambda f, m: None) -> dict:
    """Loads `spec` at `base` (or uses the given unquantized engine), measures every linear, unloads what it loaded."""
    from core.engines.base import EagerEngine

    if base.is_fp8 or base.is_int:
        raise ValueError("The layer analysis measures against an unquantized model (fp32, bf16 or fp16).")
    owned = engine is None
    if owned:
        from core.engines.factory import EngineChoice, open_engine

        engine = open_engine(EngineChoice("torch-eager", spec, base, device=device),
                             lambda f, m: progress(0.5 * f, m))
    try:
        if not isinstance(engine, EagerEngine):
            raise ValueError("The layer analysis runs on the eager torch engine (its quantizers' per-layer errors).")
        progress(0.5, "Measuring each linear layer")
        ids = engine.calibration_ids(calibration, tokens)
        rows = engine.layer_errors(ids)
    finally:
        if owned:
            engine.unload()
    progress(1.0, "done")
    quantizers = list(rows[0]["errors"]) if rows else []  # the engine's quantizers, in its order
    return {"base": base.value, "tokens": len(ids), "quantizers": quantizers, "layers": rows,
            "calibration": "shipped sample prose" if calibration is None else f"user text ({len(calibration):,} chars)"}


def ranked(result: dict, by: str = "int4", limit: int | None = 20) -> list[dict]:
    """Table rows, worst first by the `by` quantizer's error."""
    rows = sorted(result["layers"], key=lambda r: -r["errors"][by])
    out = [{"layer": r["layer"], **{f"{q} err %": round(100 * r["errors"][q], 3) for q in result["quantizers"]},
            "max|x|": round(r["max_abs"], 2), "outlier channels": r["outlier_channels"],
            "top channels": ", ".join(map(str, r["top_channels"]))} for r in rows]
    return out[:limit] if limit else out


def summary(result: dict) -> dict:
    """Mean relative error per quantizer over all layers, how often per-channel INT8 beat per-tensor, and how often
    a quantizer's activation-aware variant (its name + "-awq") was no worse than it."""
    layers = result["layers"]
    mean = {q: sum(r["errors"][q] for r in layers) / len(layers) for q in result["quantizers"]}
    wins = sum(1 for r in layers if r["errors"]["int8"] < r["errors"]["int8 per-tensor"])
    pairs = [(q, q + "-awq") for q in result["quantizers"] if q + "-awq" in result["quantizers"]]
    awq = sum(1 for r in layers for plain, aware in pairs if r["errors"][aware] <= r["errors"][plain])
    return {"mean_rel_error": mean, "per_channel_int8_better": wins, "awq_not_worse": awq, "layers": len(layers)}
