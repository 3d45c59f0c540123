"""Recording a golden set from a reference server: its greedy continuations, their teacher-forced top-k, what
produced them, and the noise floor (the golden set replayed on the same server at once)."""
from __future__ import annotations

from typing import Callable, Sequence

from core.compare import agreement as ag
from core.compare.prompts import Prompt
from core.errors import InputError, RemoteError
from core.compare.golden.golden import GoldenPrompt, GoldenSet, check_request, refuse_sampling
from core.compare.golden.replay import judge, replay, tagged_engine


def record(url: str, prompts: Sequence[Prompt], *, max_new_tokens: int = 32, top_k: int = ag.DEFAULT_K,
           temperature: float = 0.0, api_key: str | None = None, timeout_s: float = 120.0,
           progress: Callable[[str], None] | None = None) -> GoldenSet:
    """Greedy continuations and teacher-forced top-k from the reference at `url`, then the noise floor (the golden
    set replayed on the same server). RemoteError when the server does not answer as vLLM does; Cancelled when the
    caller's RunControl stops it (its requests' streams are closed: what came back is no golden set)."""
    refuse_sampling(temperature, "A golden set")
    check_request(max_new_tokens, top_k)
    if not prompts:
        raise InputError("Give at least one prompt.")
    say = progress or (lambda m: None)
    eng = tagged_engine(url, "record", api_key, timeout_s)
    from core.compare.golden.facts import server_facts

    facts = server_facts(eng)
    say(f"recording {len(prompts)} prompts x {max_new_tokens} tokens from {facts['model']} at {eng.base_url}")
    from core.engines.base import GenerationParams, check_stop

    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=0.0, top_logprobs=top_k, stop_at_eos=False)
    gens = eng.generate([p.text for p in prompts], params)
    check_stop()  # before reading cut-short streams as a server's fault
    for p, g in zip(prompts, gens):
        if not g.token_ids or not g.prompt_ids:
            raise RemoteError(f"{eng.base_url} returned no token ids for prompt {p.name!r}; a golden set needs "
                              "vLLM's return_token_ids.")
    scores = eng.score_many([(g.prompt_ids, g.token_ids) for g in gens], top_k)
    check_stop()
    golden = GoldenSet(facts, max_new_tokens, top_k, 0.0, [
        GoldenPrompt(p.name, p.text, list(g.prompt_ids), list(g.token_ids),
                     [ag.normalize_topk(d) for d in g.top_logprobs], [ag.normalize_topk(d) for d in s.top_logprobs],
                     list(s.target_logprobs))
        for p, g, s in zip(prompts, gens, scores)])
    say("replaying it on the same server for the noise floor")
    noise = judge(golden, replay(eng, golden))
    check_stop()
    if noise.status in ("no answer", "refused"):
        raise RemoteError(f"The noise-floor replay on {eng.base_url} failed: {noise.verdict}")
    golden.noise_floor = {**noise.summary, "tokens": noise.tokens, "seconds": noise.seconds}
    eng.unload()
    return golden


def history(golden: GoldenSet, out: str, started_at: float) -> int | None:
    from core import store

    nf = golden.noise_floor or {}
    summary = {"model": golden.model, "url": golden.server.get("url"), "prompts": len(golden.prompts),
               "max_new_tokens": golden.max_new_tokens, "top_k": golden.top_k, "file": out,
               "noise_same_top": nf.get("same_top"), "noise_mean_kld": nf.get("mean_kld")}
    title = f"Golden set of {golden.model}: {len(golden.prompts)} prompts x {golden.max_new_tokens} tokens"
    return store.record("golden-record", title, golden.to_dict(), summary, started_at=started_at)
