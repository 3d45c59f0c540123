"""The deployment probe: n streamed completions of exact prompt length sent to a running server, timed by the
client, beside what the server's /metrics says over the same window; each probe is saved to History.

Client timings include the network and HTTP (unlike the server's histograms); client_itl spreads a chunk of
coalesced tokens over its tokens, so the mean inter-token latency is TPOT.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from core.engines.base import Generation, GenerationParams
from core.engines.remote import RemoteEngine
from core.errors import InputError, RemoteError
from core.stats import nearest_rank_percentiles

FILLER = ("The quick brown fox jumps over the lazy dog while the committee reviews the quarterly report on "
          "river navigation, bridge maintenance and the history of lighthouses along the northern coast. ")


@dataclass
class ProbeResult:
    base_url: str
    model: str
    n: int
    prompt_tokens: int
    max_new_tokens: int
    concurrency: int
    wall_s: float
    generations: list[Generation]
    client: dict[str, dict[str, float | None]]  # "ttft"/"itl"/"e2e" -> p50/p90/p99 seconds, measured here
    tpot_s: float | None  # mean decode time per output token over all requests, client side
    chunks: int  # SSE chunks that carried tokens; fewer than tokens when the server coalesced them
    tokens: int
    server: dict[str, dict[str, float | None]] | None  # same keys, from the /metrics histogram delta
    server_counts: dict[str, float]  # observations in that delta
    metrics_note: str = ""
    anatomy: dict | None = None  # where the server says the time went (core.telemetry.vllm_anatomy), same window

    def to_dict(self) -> dict:
        d = {k: v for k, v in self.__dict__.items() if k != "generations"}
        d["requests"] = [g.timing_summary() for g in self.generations]
        return d

    def record(self) -> int | None:
        """Save to History (None when it could not be written; the caller still has the result)."""
        import time

        from core import store

        summary = {"model": self.model, "requests": self.n, "prompt_tokens": self.prompt_tokens,
                   "new_tokens": self.max_new_tokens, "concurrency": self.concurrency, "wall_s": self.wall_s,
                   "tpot_s": self.tpot_s, "client": self.client, "server": self.server}
        title = f"Probe {self.base_url}: {self.n} x {self.prompt_tokens} -> {self.max_new_tokens} tokens"
        return store.record("probe", title, self.to_dict(), summary, started_at=time.time() - self.wall_s)


def client_itl(gen: Generation) -> list[float]:
    """Per-token inter-token latency as the client saw it: a chunk of k tokens arriving g seconds after the previous
    chunk counts k gaps of g/k (the server coalesces tokens when the client falls behind), so the mean is TPOT."""
    out: list[float] = []
    times = gen.token_times
    i = 1
    while i < len(times):
        j = i
        while j + 1 < len(times) and times[j + 1] == times[i]:
            j += 1
        k = j - i + 1
        out += [(times[i] - times[i - 1]) / k] * k
        i = j + 1
    return out


def exact_prompts(eng: RemoteEngine, n: int, prompt_tokens: int, texts: list[str] | None = None) -> list:
    """n prompts of exactly prompt_tokens token ids, each starting differently so the prefix cache cannot shortcut
    the prefill; with `texts` (a dataset), those texts in turn instead, as they are."""
    if texts:
        return [texts[i % len(texts)] for i in range(n)]
    nonce = f"{time.time_ns() % 10**9:09d}"
    filler = eng.tokenize(FILLER * (prompt_tokens // 20 + 2))
    prompts = []
    for i in range(n):
        head = eng.tokenize(f"Probe {nonce} request {i}:")
        prompts.append((head + filler[1:])[:prompt_tokens])  # filler[0] is BOS
    return prompts


def probe(base_url: str, n: int = 8, prompt_tokens: int = 128, max_new_tokens: int = 32, concurrency: int = 1,
          api_key: str | None = None, timeout_s: float = 120.0, engine: RemoteEngine | None = None) -> ProbeResult:
    """Send n streamed completions of exactly prompt_tokens tokens; each prompt starts differently so the prefix
    cache does not shortcut the prefill. Server numbers come from two /metrics scrapes around the run."""
    from core.telemetry.vllm_metrics import MetricsError, scrape

    if not 1 <= n <= 256 or not 1 <= prompt_tokens <= 32768 or not 1 <= concurrency <= 64:
        raise InputError("n must be 1-256, prompt_tokens 1-32768 and concurrency 1-64.")
    eng = engine or RemoteEngine(base_url, api_key=api_key, timeout_s=timeout_s)
    info = eng.connect()
    if info.max_model_len and prompt_tokens + max_new_tokens > info.max_model_len:
        raise RemoteError(f"prompt_tokens + max_new_tokens = {prompt_tokens + max_new_tokens} exceeds the server's "
                          f"max_model_len {info.max_model_len}.")
    prompts = exact_prompts(eng, n, prompt_tokens)

    def metrics():
        try:
            return scrape(eng.base_url, timeout_s=10.0, api_key=api_key), ""
        except (RemoteError, MetricsError) as exc:
            return None, str(exc)

    before, note = metrics()
    params = GenerationParams(max_new_tokens=max_new_tokens, top_logprobs=0, stop_at_eos=False)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        gens = list(pool.map(lambda p: eng.stream_completion(p, params), prompts))
    wall = time.perf_counter() - t0
    after, note2 = metrics() if before is not None else (None, note)
    server, counts, parts = None, {}, None
    if before is not None and after is not None:
        if after.logging_disabled:
            note = ("The server exposes no vllm:* metrics: it was started with --disable-log-stats. Restart it "
                    "without that flag to see its own latency numbers.")
        else:
            from core.telemetry.vllm_anatomy import anatomy
            from core.telemetry.vllm_metrics import LATENCY_KEYS, rates

            recent = {k: h for k, h in rates(before, after).recent.items() if k in LATENCY_KEYS}
            server = {k: h.percentiles() for k, h in recent.items()}
            counts = {k: h.count for k, h in recent.items()}
            parts = anatomy(before, after).to_dict()
            note = "Server percentiles are interpolated from histogram buckets; other traffic in the same window counts too."
    decode = [(g.token_times[-1] - g.token_times[0], len(g.token_times) - 1) for g in gens if len(g.token_times) > 1]
    spans, steps = sum(d for d, _ in decode), sum(k for _, k in decode)
    return ProbeResult(
        base_url=eng.base_url, model=eng.model, n=n, prompt_tokens=prompt_tokens, max_new_tokens=max_new_tokens,
        concurrency=concurrency, wall_s=wall, generations=gens,
        client={"ttft": nearest_rank_percentiles([g.ttft_s for g in gens if g.ttft_s is not None]),
                "itl": nearest_rank_percentiles([x for g in gens for x in client_itl(g)]),
                "e2e": nearest_rank_percentiles([g.token_times[-1] for g in gens if g.token_times])},
        tpot_s=spans / steps if steps else None,
        chunks=sum(len(set(g.token_times)) for g in gens), tokens=sum(len(g.token_ids) for g in gens),
        server=server, server_counts=counts, metrics_note=note or note2, anatomy=parts,
    )
