"""Agreement between the fast decoder and the eager reference, as token ids and logprobs (never strings).

The eager reference is what TorchEngine runs: the HF model, core.engines.torch.fp8.quantize_linears for FP8 weights, and
core.engines.torch.engine.make_cache for the FP8 KV cache, decoded one token at a time with a DynamicCache. Metrics follow
Teacher-forced top-1 agreement and KL(ref || candidate) over the reference's continuation,
plus free-running greedy token ids.
"""
from __future__ import annotations

import copy

import torch

from core.engines.torch import fp8
from core.engines.fast.graph import DecodeGraph
from core.engines.fast.model import FastLlama
from core.precision import KVDtype


def eager_reference(hf_model, mode: str):
    """A copy of the HF model at `mode` ("bf16", "fp8-wo", "fp8") exactly as TorchEngine quantizes it."""
    ref = copy.deepcopy(hf_model).eval()
    if mode != "bf16":
        fp8.quantize_linears(ref, w8a8=mode == "fp8")
    return ref


@torch.inference_mode()
def eager_logprobs(ref, prompt: torch.Tensor, cont: torch.Tensor, kv: str) -> torch.Tensor:
    """Teacher-forced, token by token as TorchEngine decodes: prompt [B, T], cont [B, N] -> logprobs [B, N, V]
    where position i predicts cont[:, i]."""
    from core.engines.torch.engine import make_cache

    cache = make_cache(ref.config, KVDtype(kv))
    out = ref(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    lps = [torch.log_softmax(out.logits[:, -1].float(), dim=-1)]
    for i in range(cont.shape[1] - 1):
        out = ref(input_ids=cont[:, i:i + 1], past_key_values=cache, use_cache=True)
        lps.append(torch.log_softmax(out.logits[:, -1].float(), dim=-1))
    return torch.stack(lps, dim=1)


@torch.inference_mode()
def eager_greedy(ref, prompt: torch.Tensor, n: int, kv: str) -> torch.Tensor:
    from core.engines.torch.engine import make_cache

    cache = make_cache(ref.config, KVDtype(kv))
    out = ref(input_ids=prompt, past_key_values=cache, use_cache=True, logits_to_keep=1)
    toks = [out.logits[:, -1].argmax(-1)]
    for _ in range(n - 1):
        out = ref(input_ids=toks[-1][:, None], past_key_values=cache, use_cache=True)
        toks.append(out.logits[:, -1].argmax(-1))
    return torch.stack(toks, dim=1)


@torch.inference_mode()
def fast_logprobs(model: FastLlama, prompt: torch.Tensor, cont: torch.Tensor, kv: str, path: str,
                  folds=None) -> torch.Tensor:
    """The same teacher-forced logprobs from the compact model. path: "ref" (torch ops, any device) or
    "graph" (Triton kernels in a CUDA graph, after the fused W8A8 prefill where it applies; `folds` as DecodeGraph
    takes them, None for its default)."""
    B, T = prompt.shape
    N = cont.shape[1]
    cache = model.new_cache(B, T + N + 8, kv == "fp8")
    lps = [torch.log_softmax(model.prefill(prompt, cache, fused=path == "graph").float(), dim=-1)]
    pos = torch.full((B,), T, device=prompt.device, dtype=torch.long)
    runner = DecodeGraph(model, cache, use_graph=True, folds=folds) if path == "graph" else None
    for i in range(N - 1):
        if runner is None:
            logits = model.decode_ref(cont[:, i], pos + i, cache)
            lps.append(torch.log_softmax(logits.float(), dim=-1))
        else:
            runner.set_state(cont[:, i], pos + i)
            lps.append(runner.step()["logprobs"].clone())
    return torch.stack(lps, dim=1)


@torch.inference_mode()
def fast_greedy(model: FastLlama, prompt: torch.Tensor, n: int, kv: str, path: str) -> torch.Tensor:
    B, T = prompt.shape
    cache = model.new_cache(B, T + n + 8, kv == "fp8")
    tok = model.prefill(prompt, cache, fused=path == "graph").argmax(-1)
    toks = [tok]
    pos = torch.full((B,), T, device=prompt.device, dtype=torch.long)
    if path == "graph":
        runner = DecodeGraph(model, cache, use_graph=True)
        runner.set_state(tok, pos)  # the graph then feeds its own argmax back
        for _ in range(n - 1):
            toks.append(runner.step()["next"].clone())
    else:
        for i in range(n - 1):
            toks.append(model.decode_ref(toks[-1], pos + i, cache).argmax(-1))
    return torch.stack(toks, dim=1)


def agreement(lp_ref: torch.Tensor, lp_cand: torch.Tensor) -> dict:
    """Per-position top-1 agreement and KL(ref || cand) in nats over [..., V] logprobs."""
    lp_ref, lp_cand = lp_ref.float(), lp_cand.float()
    kl = (lp_ref.exp() * (lp_ref - lp_cand)).sum(-1).clamp(min=0)
    top1 = (lp_ref.argmax(-1) == lp_cand.argmax(-1)).float()
    return {"top1": top1.mean().item(), "kl_mean": kl.mean().item(), "kl_max": kl.max().item(),
            "positions": top1.numel()}


def prefix_match(a: torch.Tensor, b: torch.Tensor) -> float:
    """Mean over rows of the exact-prefix length of two greedy id sequences, as a fraction of their length."""
    eq = (a == b).int().cumprod(dim=1)
    return eq.sum(dim=1).float().mean().item() / a.shape[1]
