"""The fast engine's static KV cache: K and V for every layer, preallocated, bf16 or E4M3 with per-token scales."""
from __future__ import annotations

import copy

import torch

from core.engines.torch import fp8

E4M3 = fp8.E4M3


class StaticKVCache:
    """K and V for every layer as [layers, batch, kv_heads, max_len, head_dim]; E4M3 plus a float32 scale per
    (layer, batch, head, token) when fp8, the scheme of core.engines.torch.fp8.FP8KV. Zero-filled so that masked reads of unused
    slots in the torch path never meet NaN garbage."""

    def __init__(self, dims: Dims, batch: int, max_len: int, fp8_kv: bool, device, dtype=torch.bfloat16):
        self.dims, self.batch, self.max_len, self.fp8 = dims, batch, max_len, fp8_kv
        self.dtype = dtype
        shape = (dims.layers, batch, dims.kv_heads, max_len, dims.head_dim)
        store = E4M3 if fp8_kv else dtype
        self.k = torch.zeros(shape, dtype=store, device=device)
        self.v = torch.zeros(shape, dtype=store, device=device)
        self.k_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=device) if fp8_kv else None
        self.v_scale = torch.zeros(shape[:-1], dtype=torch.float32, device=device) if fp8_kv else None

    def rows(self, b: int) -> "StaticKVCache":
        """The first b rows as a cache of their own (views; the kernels take strides, so no copy)."""
        view = copy.copy(self)
        view.batch = b
        view.k, view.v = self.k[:, :b], self.v[:, :b]
        if self.fp8:
            view.k_scale, view.v_scale = self.k_scale[:, :b], self.v_scale[:, :b]
        return view

    def replicate_row0(self) -> None:
        """Copy row 0 into every other row (a batch of one prompt without prefilling it again)."""
        for t in (self.k, self.v, self.k_scale, self.v_scale):
            if t is not None and self.batch > 1:
                t[:, 1:].copy_(t[:, :1].expand_as(t[:, 1:]))

    def bytes_per_token(self) -> int:
        d = self.dims
        per = d.kv_heads * d.head_dim * self.k.element_size() + (d.kv_heads * 4 if self.fp8 else 0)
        return 2 * d.layers * per

    @property
    def nbytes(self) -> int:
        return self.bytes_per_token() * self.batch * self.max_len

    def write(self, layer: int, rows, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [b, kv_heads, T, d] into rows `rows` (a slice) at positions start..start+T-1."""
        T = k.shape[2]
        for src, dst, sc in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            if self.fp8:
                q, s = fp8.quantize_rows(src)
                dst[layer, rows, :, start:start + T] = q
                sc[layer, rows, :, start:start + T] = s[..., 0]
            else:
                dst[layer, rows, :, start:start + T] = src

    def write_at(self, layer: int, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, kv_heads, d]: row b at position pos[b]."""
        b = torch.arange(k.shape[0], device=k.device)
        for src, dst, sc in ((k, self.k, self.k_scale), (v, self.v, self.v_scale)):
            if self.fp8:
                q, s = fp8.quantize_rows(src)
                # index_put has no float8 kernel on every backend; the bytes are what we store
                dst[layer].view(torch.uint8)[b, :, pos] = q.view(torch.uint8)
                sc[layer][b, :, pos] = s[..., 0]
            else:
                dst[layer][b, :, pos] = src

    def read(self, layer: int, rows, length: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Dequantized K, V [b, kv_heads, length, d] in the activation dtype (FP8KV.read's arithmetic)."""
        k, v = self.k[layer, rows, :, :length], self.v[layer, rows, :, :length]
        if not self.fp8:
            return k, v
        ks, vs = self.k_scale[layer, rows, :, :length, None], self.v_scale[layer, rows, :, :length, None]
        return fp8.dequantize(k, ks, self.dtype), fp8.dequantize(v, vs, self.dtype)
