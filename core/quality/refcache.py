"""The reference pass kept on disk, as llama.cpp's --kl-divergence-base file: later runs over the same model,
reference precision, document and window settings reuse it instead of running the reference again.

One .npz per key (model, precision, KV dtype, document SHA-256, window, stride, top-k, format version) under
$TRIAGE_QUALITY_CACHE, default quality-refs/ in the console's cache directory (core.models.cache_dir). It holds, per scored position: the target token, its log-prob
under the reference, the reference's top token, and the reference's top-k log-probs, or the full vocabulary's when
that fits in FULL_LIMIT_BYTES; plus the reference's row of the table (perplexity, memory, speeds) as JSON.
A file whose metadata does not match its key, or that cannot be read, is recomputed, never trusted.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import numpy as np
from core.settings import settings

FORMAT = 1
FULL_LIMIT_BYTES = 64 * 2**20  # full-vocabulary float32 log-probs are kept when they fit in this; else top-k
DEFAULT_TOP_K = 256


def cache_root() -> Path:
    """$TRIAGE_QUALITY_CACHE, else quality-refs/ in the console's cache directory."""
    from core.models import cache_dir

    d = settings().quality_cache or cache_dir() / "quality-refs"
    d.mkdir(parents=True, exist_ok=True)
    return d


def document_hash(ids: list[int]) -> str:
    return hashlib.sha256(np.asarray(ids, dtype=np.int64).tobytes()).hexdigest()


def key_meta(model: str, precision: str, kv: str, doc_sha: str, window: int, stride: int, top_k: int) -> dict:
    return {"format": FORMAT, "model": model, "precision": precision, "kv": kv, "document_sha256": doc_sha,
            "window": window, "stride": stride, "top_k": top_k}


def path_for(meta: dict) -> Path:
    digest = hashlib.sha256(json.dumps(meta, sort_keys=True).encode()).hexdigest()[:32]
    return cache_root() / f"ref-{meta['precision']}-{digest}.npz"


def load(meta: dict) -> dict | None:
    """The cached reference for this key, or None (absent, unreadable, or written for another key)."""
    path = path_for(meta)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            stored = json.loads(str(z["meta"]))
            if stored.get("key") != meta:
                return None
            out = {k: z[k] for k in z.files if k != "meta"}
    except (OSError, ValueError, KeyError, json.JSONDecodeError):
        return None
    out["row"] = stored["row"]
    out["path"] = str(path)
    return out


def save(meta: dict, arrays: dict, row: dict) -> Path:
    """Write atomically (a temporary file renamed into place), so a killed run never leaves half a file."""
    path = path_for(meta)
    tmp = path.with_suffix(f".{os.getpid()}.tmp.npz")
    np.savez(tmp, meta=np.array(json.dumps({"key": meta, "row": row})), **arrays)
    os.replace(tmp, path)
    return path
