"""KV cache arithmetic. Pure Python: no torch, no model load.

bytes = 2 (K and V) x layers x kv_heads x head_dim x tokens x bytes_per_element, where a sliding-window layer
(Gemma 3: 5 of every 6 layers, window 512) never holds more than its window. vLLM stores the cache in blocks of
`block_size` tokens, so a sequence occupies ceil(tokens / block_size) blocks.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from core.errors import InputError
from core.fmt import fmt_cache_bytes
from core.models import SYNTHETIC_CONFIGS

DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp8": 1}
DEFAULT_BLOCK_SIZE = 16
# vLLM's FP8 KV cache keeps one K scale and one V scale per layer (float32): a few hundred bytes per model,
# independent of length, so they are left out of every figure here.
FP8_SCALES_NOTE = "FP8 scales (one K and one V float32 per layer in vLLM) are negligible and not counted."

# The embedded Gemma 3 270M as converted by core.models (its config.json), hard-coded so no model load is needed.
EMBEDDED_CONFIG = dict(
    model_type="gemma3_text", hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
    num_key_value_heads=1, head_dim=256, vocab_size=262144, max_position_embeddings=32768, sliding_window=512,
    layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 3, tie_word_embeddings=True,
)
BUILTIN_CONFIGS: dict[str, dict] = {"embedded": EMBEDDED_CONFIG, **SYNTHETIC_CONFIGS}


class KVConfigError(InputError):
    """A model config lacks what the arithmetic needs; the message says which field."""


@dataclass(frozen=True)
class KVShape:
    layers: int
    kv_heads: int
    head_dim: int
    sliding_layers: int = 0  # how many of `layers` use the sliding window
    sliding_window: int | None = None
    max_positions: int | None = None

    @property
    def full_layers(self) -> int:
        return self.layers - self.sliding_layers


def _as_dict(config) -> dict:
    if isinstance(config, dict):
        d = config
    elif hasattr(config, "to_dict"):
        d = config.to_dict()
    else:
        d = vars(config)
    # Multimodal wrappers (Gemma 3 4B+, Llava) keep the language model's shape under text_config.
    if "num_hidden_layers" not in d and isinstance(d.get("text_config"), dict):
        return d["text_config"]
    return d


def shape_from_config(config) -> KVShape:
    """The KV-relevant shape of a transformers config (an object or its dict, e.g. a parsed config.json)."""
    d = _as_dict(config)
    if d.get("kv_lora_rank"):
        raise KVConfigError("This model uses multi-head latent attention (kv_lora_rank, DeepSeek style); its cache "
                            "is not K and V per head, so this calculator does not apply.")
    layers = d.get("num_hidden_layers") or d.get("n_layer") or d.get("num_layers")
    heads = d.get("num_attention_heads") or d.get("n_head")
    if not layers or not heads:
        raise KVConfigError("The config needs num_hidden_layers and num_attention_heads; found "
                            f"{layers!r} and {heads!r}. Is this a decoder model's config.json?")
    kv_heads = d.get("num_key_value_heads")
    if not kv_heads and ("multi_query" in d or "new_decoder_architecture" in d):  # Falcon's own fields
        kv_heads = (d.get("num_kv_heads") if d.get("new_decoder_architecture") else
                    1 if d.get("multi_query") else None)
    kv_heads = kv_heads or heads  # no field means plain multi-head attention
    head_dim = d.get("head_dim")
    if not head_dim:
        if not d.get("hidden_size"):
            raise KVConfigError("The config has neither head_dim nor hidden_size; cannot work out the head size.")
        head_dim = d["hidden_size"] // heads

    window = d.get("sliding_window")
    sliding = 0
    if window and d.get("use_sliding_window", True):  # Qwen2 sets a window but switches it off with this flag
        types = d.get("layer_types")
        pattern = d.get("sliding_window_pattern") or d.get("_sliding_window_pattern")
        if not types and not pattern and d.get("model_type") == "gemma2":
            pattern = 2  # Gemma 2's config.json says neither; its layers alternate, sliding first
        if types:
            sliding = sum(1 for t in types[:layers] if t == "sliding_attention")
        elif pattern:
            # Gemma 3's older form: every pattern-th layer is global, the others slide.
            sliding = sum(1 for i in range(layers) if (i + 1) % int(pattern) != 0)
        else:
            sliding = layers  # Mistral 7B v0.1 style: every layer slides
    return KVShape(int(layers), int(kv_heads), int(head_dim), sliding, int(window) if sliding else None,
                   d.get("max_position_embeddings"))


def builtin_shape(name: str) -> KVShape:
    if name not in BUILTIN_CONFIGS:
        raise KVConfigError(f"Unknown built-in model {name!r}; choose one of: {', '.join(BUILTIN_CONFIGS)}.")
    return shape_from_config(BUILTIN_CONFIGS[name])


def dtype_bytes(kv_dtype: str) -> int:
    try:
        return DTYPE_BYTES[kv_dtype]
    except KeyError:
        raise KVConfigError(f"Unknown KV dtype {kv_dtype!r}; choose one of: {', '.join(DTYPE_BYTES)}.") from None


def layer_bytes_per_token(shape: KVShape, kv_dtype: str) -> int:
    """K and V of one token in one layer."""
    return 2 * shape.kv_heads * shape.head_dim * dtype_bytes(kv_dtype)


def kv_bytes(shape: KVShape, kv_dtype: str, tokens: int) -> int:
    """Cache of one sequence of `tokens` tokens; sliding-window layers hold at most their window."""
    per = layer_bytes_per_token(shape, kv_dtype)
    capped = min(tokens, shape.sliding_window) if shape.sliding_layers else 0
    return per * (shape.full_layers * tokens + shape.sliding_layers * capped)


def blocks(tokens: int, block_size: int = DEFAULT_BLOCK_SIZE) -> int:
    if block_size < 1:
        raise InputError(f"block_size must be at least 1; got {block_size}.")
    return math.ceil(tokens / block_size)


def max_tokens(shape: KVShape, kv_dtype: str, budget_bytes: float) -> int | None:
    """Longest single sequence whose cache fits in `budget_bytes`; None when it is unbounded (every layer slides
    and the windows fit), 0 when nothing fits."""
    if budget_bytes <= 0:
        return 0
    per = layer_bytes_per_token(shape, kv_dtype)
    all_layers = per * shape.layers
    if not shape.sliding_layers:
        return int(budget_bytes // all_layers)
    window = shape.sliding_window
    if budget_bytes < all_layers * window:  # runs out while every layer still grows
        return int(budget_bytes // all_layers)
    if shape.full_layers == 0:
        return None
    return window + int((budget_bytes - all_layers * window) // (per * shape.full_layers))


@dataclass
class KVReport:
    kv_dtype: str
    tokens: int
    block_size: int
    layers: int
    sliding_layers: int
    sliding_window: int | None
    kv_heads: int
    head_dim: int
    bytes_per_token: int  # every layer, i.e. while the sequence is within the window
    bytes_per_token_beyond_window: int  # full-attention layers only (equal to bytes_per_token without a window)
    total_bytes: int
    blocks: int
    block_bytes: int  # one block of block_size tokens across every layer
    allocated_bytes: int  # whole blocks: vLLM allocates ceil(tokens / block_size) blocks
    gpu_mem_bytes: float | None = None
    weights_bytes: float | None = None
    gpu_memory_utilization: float | None = None
    budget_bytes: float | None = None
    max_tokens: int | None = None  # None: unbounded, or no GPU given (see budget_bytes)
    note: str = ""
    memory_kind: str = "GPU memory"  # what gpu_mem_bytes is: "GPU memory (NVIDIA H200)", "host memory"

    def to_dict(self) -> dict:
        return asdict(self)


def report(shape: KVShape, kv_dtype: str, tokens: int, block_size: int = DEFAULT_BLOCK_SIZE,
           gpu_mem_bytes: float | None = None, weights_bytes: float | None = None,
           gpu_memory_utilization: float = 1.0, memory_kind: str = "GPU memory") -> KVReport:
    """Everything the calculator shows. With a GPU size and the weights, also the budget left for the cache
    (gpu_mem x utilization - weights, as vLLM's --gpu-memory-utilization; activations are not modelled) and the
    longest sequence that fits in it."""
    if tokens < 0:
        raise InputError(f"tokens must be >= 0; got {tokens}.")
    per = layer_bytes_per_token(shape, kv_dtype)
    n_blocks = blocks(tokens, block_size)
    r = KVReport(
        kv_dtype=kv_dtype, tokens=tokens, block_size=block_size, layers=shape.layers,
        sliding_layers=shape.sliding_layers, sliding_window=shape.sliding_window, kv_heads=shape.kv_heads,
        head_dim=shape.head_dim, bytes_per_token=per * shape.layers,
        bytes_per_token_beyond_window=per * shape.full_layers,
        total_bytes=kv_bytes(shape, kv_dtype, tokens), blocks=n_blocks, block_bytes=per * shape.layers * block_size,
        allocated_bytes=kv_bytes(shape, kv_dtype, n_blocks * block_size),
        note=FP8_SCALES_NOTE if kv_dtype == "fp8" else "", memory_kind=memory_kind,
    )
    if gpu_mem_bytes is not None:
        r.gpu_mem_bytes, r.weights_bytes = gpu_mem_bytes, weights_bytes or 0.0
        r.gpu_memory_utilization = gpu_memory_utilization
        r.budget_bytes = gpu_mem_bytes * gpu_memory_utilization - r.weights_bytes
        r.max_tokens = max_tokens(shape, kv_dtype, r.budget_bytes)
    if shape.max_positions and tokens > shape.max_positions:
        r.note = (r.note + " " if r.note else "") + (
            f"{tokens} tokens is beyond the model's {shape.max_positions} positions.")
    return r


def default_capacity(device) -> tuple[int, str]:
    """The memory the calculator starts from: the device actually present (a core.precision.Device, as
    core.engines.device.current_device gives it), and what it is. A CPU host's KV cache lives in host memory,
    so it is the host's total there, not an assumed GPU."""
    if device.kind == "cuda":
        return int(device.total_bytes or 0), f"GPU memory ({device.name})"
    return int(device.total_bytes or 0), "host memory"


def estimate_weight_bytes(config, bytes_per_param: float = 2.0) -> int | None:
    """Weights of a dense decoder with a gated MLP (Llama, Gemma, Qwen, Mistral), from its config alone.
    None for mixture-of-experts configs, whose size this formula does not know: give the weights explicitly."""
    d = _as_dict(config)
    if any(d.get(k) for k in ("num_local_experts", "num_experts", "n_routed_experts")):
        return None
    h, inter, vocab = d.get("hidden_size"), d.get("intermediate_size"), d.get("vocab_size")
    if not (h and inter and vocab):
        return None
    s = shape_from_config(d)
    q = d.get("num_attention_heads") * s.head_dim
    attn = h * q + 2 * h * s.kv_heads * s.head_dim + q * h
    per_layer = attn + 3 * h * inter + 2 * h  # q/k/v/o, gate/up/down, two norms
    embed = vocab * h * (1 if d.get("tie_word_embeddings") else 2)
    return int((s.layers * per_layer + embed + h) * bytes_per_param)


def headline(r: KVReport) -> list[tuple[str, str, str]]:
    """(label, value, help) for the calculator's metrics row."""
    beyond = (f"Beyond the {r.sliding_window}-token window: {fmt_cache_bytes(r.bytes_per_token_beyond_window)} "
              f"({r.sliding_layers} of {r.layers} layers slide)." if r.sliding_layers else "Every layer, K and V.")
    fits = ("nothing" if r.budget_bytes is not None and r.budget_bytes <= 0 else "any length"
            if r.max_tokens is None else f"{r.max_tokens:,}" if r.max_tokens < 10**6
            else f"{r.max_tokens / 10**6:,.1f}M")  # a metric cuts long values short
    exact = f"{r.max_tokens:,} tokens fit in {r.memory_kind}. " if r.max_tokens else ""
    budget = (f"{exact}{r.memory_kind[0].upper()}{r.memory_kind[1:]} x {r.gpu_memory_utilization:g} (as vLLM's "
              "--gpu-memory-utilization) - weights = "
              f"{fmt_cache_bytes(r.budget_bytes)} for the cache, shared by concurrent sequences; one sequence still stops "
              "at the model's maximum positions. Activations and CUDA graphs are not counted.")
    return [("Per token", fmt_cache_bytes(r.bytes_per_token), beyond),
            (f"At {r.tokens:,} tokens", fmt_cache_bytes(r.total_bytes), f"{r.total_bytes:,} bytes"),
            ("vLLM blocks", f"{r.blocks:,}", f"ceil({r.tokens} / {r.block_size}); whole blocks hold "
                                             f"{fmt_cache_bytes(r.allocated_bytes)}"),
            ("Tokens that fit", fits if r.budget_bytes is not None else "N/A", budget)]


def formula(r: KVReport) -> str:
    """The arithmetic behind a report, in words, for a caption under its numbers."""
    capped = ", sliding-window layers capped at their window" if r.sliding_layers else ""
    return (f"2 (K, V) x {r.layers} layers x {r.kv_heads} KV heads x head_dim {r.head_dim} x "
            f"{DTYPE_BYTES[r.kv_dtype]} bytes per token{capped}. {r.note}").strip()
