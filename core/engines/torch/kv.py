"""The torch engine's KV caches: transformers' dynamic caches, or the same layers holding E4M3 values (an FP8 KV
cache, as vLLM's), and joining the caches of prompts prefilled apart into one batch."""
from __future__ import annotations

import torch
from torch.nn import functional as F
from transformers.cache_utils import DynamicCache, DynamicLayer, DynamicSlidingWindowLayer

from core.engines.torch import fp8
from core.precision import KVDtype


def _store_fp8(layer, key_states, value_states) -> None:
    """Quantize the new K and V to E4M3 and keep them (both FP8 cache layers)."""
    if not layer.is_initialized:
        layer.is_initialized, layer.device = True, key_states.device
        layer.k, layer.v = fp8.FP8KV(key_states), fp8.FP8KV(value_states)
    else:
        layer.k.append(key_states)
        layer.v.append(value_states)


class _FP8Layer(DynamicLayer):
    """Full-attention KV stored in E4M3; what attention reads has been through FP8, as in vLLM's FP8 KV cache."""

    def update(self, key_states, value_states, *args, **kwargs):
        _store_fp8(self, key_states, value_states)
        self.keys = self.k.q  # only its shape is read (sequence length)
        return self.k.read(), self.v.read()

    def get_seq_length(self) -> int:
        return self.k.q.shape[-2] if self.is_initialized else 0


class _FP8SlidingLayer(DynamicSlidingWindowLayer):
    def update(self, key_states, value_states, *args, **kwargs):
        _store_fp8(self, key_states, value_states)
        self.cumulative_length += key_states.shape[-2]
        keys, values = self.k.read(), self.v.read()
        # Keep window-1 tokens for the next step, return everything this step may attend to (as the parent does).
        self.k.keep_last(self.sliding_window - 1)
        self.v.keep_last(self.sliding_window - 1)
        self.keys = self.k.q
        return keys, values


def make_cache(config, kv_dtype: KVDtype) -> DynamicCache:
    cache = DynamicCache(config=config)
    if kv_dtype is KVDtype.FP8:
        cache.layers = [
            _FP8SlidingLayer(sliding_window=layer.sliding_window) if isinstance(layer, DynamicSlidingWindowLayer)
            else _FP8Layer()
            for layer in cache.layers
        ]
    return cache


JOINABLE = (DynamicLayer, DynamicSlidingWindowLayer, _FP8Layer, _FP8SlidingLayer)


def _left_pad_join(parts: list[torch.Tensor], where: torch.Tensor) -> torch.Tensor:
    """[batch, heads, tokens, dim] tensors, each left-padded with zeros to the longest, as one batch in `where`'s
    row order. Every row's last token stays in the last column, as left padding of the whole batch would put it."""
    n = max(t.shape[-2] for t in parts)
    return torch.cat([F.pad(t, (0, 0, n - t.shape[-2], 0)) for t in parts]).index_select(0, where)


def join_caches(parts: list[DynamicCache], where: torch.Tensor, config, kv_dtype: KVDtype) -> DynamicCache:
    """One cache for a batch from the caches of its prefill groups (rows concatenated in group order, then reordered
    by `where`). Padded slots hold zeros (E4M3 zeros with a zero scale in an FP8 cache); the attention mask hides
    them, as it hides a padded prompt's."""
    joined = make_cache(config, kv_dtype)
    for li, layer in enumerate(joined.layers):
        srcs = [c.layers[li] for c in parts]
        if hasattr(srcs[0], "k"):  # an FP8 layer: E4M3 values and their per-token scales
            layer.is_initialized, layer.device = True, srcs[0].device
            for name in ("k", "v"):
                kvs = [getattr(s, name) for s in srcs]
                setattr(layer, name, fp8.FP8KV.stored(_left_pad_join([kv.q for kv in kvs], where),
                                                      _left_pad_join([kv.scale for kv in kvs], where), kvs[0].dtype))
            layer.keys = layer.k.q
        else:
            layer.lazy_initialization(srcs[0].keys, srcs[0].values)
            layer.keys = _left_pad_join([s.keys for s in srcs], where)
            layer.values = _left_pad_join([s.values for s in srcs], where)
        if hasattr(layer, "cumulative_length"):  # sliding-window layers: tokens seen, the longest row's
            layer.cumulative_length = max(s.cumulative_length for s in srcs)
    return joined


def cache_bytes(cache: DynamicCache) -> int:
    total = 0
    for layer in cache.layers:
        if not getattr(layer, "is_initialized", False):
            continue
        if hasattr(layer, "k"):
            total += layer.k.nbytes + layer.v.nbytes
        else:
            total += layer.keys.numel() * layer.keys.element_size() + layer.values.numel() * layer.values.element_size()
    return total
