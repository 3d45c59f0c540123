"""One replica against a golden set: replay (the requests) and judge (pure: the agreement and the verdict).

The replay generates greedily on the golden prompts (free-running: the seed's top-3 match and vLLM's
check_logprobs_close rule) and scores the golden continuation teacher-forced through `prompt_logprobs` (same top
token, KLD over the shared top-k). The metrics, bands and verdict are core.compare's, unchanged. A replica that fails
to answer is "no answer"; one that serves another model, tokenizes the golden prompts differently or cannot hold the
longest golden sequence is "refused", with the reason; one whose log-probabilities vLLM cannot write (NaN or infinity)
is "broken", with what it answered.
"""
from __future__ import annotations

import time
import uuid
from dataclasses import asdict, dataclass, field

from core.compare import agreement as ag
from core.engines.base import GenerationParams, Score
from core.errors import NonFiniteAnswer, TriageError
from core.compare.golden.golden import USER_TAG, GoldenSet

NO_ANSWER = "no answer"
REFUSED = "refused"


def tagged_engine(url: str, tag: str, api_key: str | None = None, timeout_s: float = 120.0):
    """A RemoteEngine whose completion requests carry `user` = "triage-golden" and a request id "golden-<tag>-...":
    vLLM logs both, so a golden round is never mistaken for users' traffic (or for another check's)."""
    from core.engines.remote import RemoteEngine

    eng = RemoteEngine(url, api_key=api_key, timeout_s=timeout_s)
    plain = eng._session.request

    def tagged(method, req_url, *args, json=None, **kw):
        if isinstance(json, dict) and req_url.endswith("/v1/completions"):
            json = {**json, "user": USER_TAG, "request_id": f"golden-{tag}-{uuid.uuid4().hex[:12]}"}
        return plain(method, req_url, *args, json=json, **kw)

    eng._session.request = tagged
    return eng


@dataclass
class Replay:
    """What one replica answered (all of it real data; a recorded one is replayed by judge() alone)."""

    url: str
    facts: dict | None = None
    prompt_ids: list[list[int]] = field(default_factory=list)  # as the replica tokenized the golden prompts
    ids: list[list[int]] = field(default_factory=list)  # its own greedy continuation
    decode_topk: list[list[dict[int, float]]] = field(default_factory=list)
    tf_topk: list[list[dict[int, float]]] = field(default_factory=list)  # the golden continuation, teacher-forced
    tf_target: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""  # the replica did not answer: why
    broken: str = ""  # it answered, with numbers no sound forward pass gives (NaN or infinity): what it said
    refusal: str = ""  # it answered, but is not comparable with the golden set: why

    def to_dict(self) -> dict:
        from core.compare.golden.golden import _pairs

        d = asdict(self)
        for k in ("decode_topk", "tf_topk"):
            d[k] = [[_pairs(x) for x in seq] for seq in getattr(self, k)]
        d["tf_target"] = [[x if x == x and abs(x) != float("inf") else None for x in seq] for seq in self.tf_target]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Replay":
        from core.compare.golden.golden import _dict

        r = cls(**{k: v for k, v in d.items() if k not in ("decode_topk", "tf_topk", "tf_target")})
        r.decode_topk = [[_dict(x) for x in seq] for seq in d["decode_topk"]]
        r.tf_topk = [[_dict(x) for x in seq] for seq in d["tf_topk"]]
        r.tf_target = [[float("nan") if x is None else x for x in seq] for seq in d["tf_target"]]
        return r


def refusal(golden: GoldenSet, facts: dict) -> str:
    """Why this server cannot be judged against the golden set ("" when it can), from its facts alone."""
    if facts.get("model") != golden.model:
        return (f"serves {facts.get('model')!r}, not the golden set's {golden.model!r}: another model is not a drift "
                "but a different deployment. Record a golden set for it.")
    ours, theirs = golden.server.get("vocab_size"), facts.get("vocab_size")
    if ours and theirs and ours != theirs:
        return (f"has a vocabulary of {theirs:,} tokens, the golden set's reference {ours:,}: token ids cannot be "
                "compared. Record a golden set for it.")
    mml = facts.get("max_model_len")
    if mml and mml < golden.longest:
        return (f"serves max_model_len {mml:,}, shorter than the golden set's longest prompt and continuation "
                f"({golden.longest:,} tokens). Restart it with --max-model-len {golden.longest} or more.")
    return ""


def replay(eng, golden: GoldenSet) -> Replay:
    """The replica's answers to the golden set: two requests per prompt (one generation, one teacher-forced score).
    Never raises for a server fault: it is recorded as the replay's error."""
    out = Replay(eng.base_url)
    t0, before = time.perf_counter(), None
    try:
        from core.compare.golden.facts import read_server

        out.facts, before = read_server(eng)  # its /metrics snapshot: the counters at the round's start
        out.refusal = refusal(golden, out.facts)
        if out.refusal:
            return out
        params = GenerationParams(max_new_tokens=golden.max_new_tokens, temperature=0.0, top_logprobs=golden.top_k,
                                  stop_at_eos=False)
        gens = eng.generate([p.text for p in golden.prompts], params)
        out.prompt_ids = [list(g.prompt_ids) for g in gens]
        out.ids = [list(g.token_ids) for g in gens]
        out.decode_topk = [[ag.normalize_topk(d) for d in g.top_logprobs] for g in gens]
        differs = [p.name for p, ids in zip(golden.prompts, out.prompt_ids) if ids != p.prompt_ids]
        if differs:
            out.refusal = (f"tokenizes {len(differs)} of {len(golden.prompts)} golden prompts differently "
                           f"({', '.join(differs[:3])}): another tokenizer or vocabulary, so token ids cannot be "
                           "compared. Record a golden set for it.")
            return out
        # The golden prompt ids, not the replica's: the teacher-forced context must be the reference's, token for token.
        scores: list[Score] = eng.score_many([(p.prompt_ids, p.ids) for p in golden.prompts], golden.top_k)
        out.tf_topk = [[ag.normalize_topk(d) for d in s.top_logprobs] for s in scores]
        out.tf_target = [list(s.target_logprobs) for s in scores]
    except NonFiniteAnswer as exc:
        out.broken = str(exc)
    except TriageError as exc:
        out.error = str(exc)
        note = stall_note(before, _counters(eng), eng.base_url) if out.facts is not None and not out.refusal else ""
        if note:
            out.error = out.error.rstrip(". ") + ". " + note
    finally:
        out.seconds = time.perf_counter() - t0
    return out


def _counters(eng):
    """The server's /metrics now (a VllmSnapshot), or None where it does not answer: the evidence of a stall."""
    from core.errors import RemoteError
    from core.telemetry.vllm_metrics import MetricsError, scrape

    try:
        return scrape(eng.base_url, timeout_s=5.0, api_key=eng.api_key)
    except (RemoteError, MetricsError):
        return None


def stall_note(before, after, url: str) -> str:
    """Pure: why a replica gave no answer, where its own counters say so: requests in flight and not one token counted
    or request finished between the round's start and its failure. An engine that answers nothing but /metrics (a
    stopped or wedged engine core: /health and /metrics are the API server's) reads so; "" where the evidence is not
    there (no vllm:* series, or something moved)."""
    if before is None or after is None or not (before.has_vllm_series and after.has_vllm_series):
        return ""
    in_flight = (after.running or 0) + (after.waiting or 0)
    moved = any(getattr(before, k) != getattr(after, k)
                for k in ("prompt_tokens", "generation_tokens", "requests_finished"))
    if in_flight <= 0 or moved:
        return ""
    return (f"The engine made no progress in the {after.t - before.t:.0f} s since the round began, with "
            f"{in_flight:.0f} request(s) in flight (no prompt or generated token counted, no request finished): "
            f"a stalled or stopped engine, not an answer about quality; `python -m diagnostics watch --url {url}` "
            "follows it.")


@dataclass
class ReplicaRound:
    """One replica's verdict in one round."""

    url: str
    status: str  # fine, watch, low agreement, inconclusive, a broken side, "no answer" or "refused"
    verdict: str
    summary: dict | None  # core.compare.agreement.Summary.to_dict(); None without an answer
    facts: dict | None
    tokens: dict  # prompt (prefill) and generated tokens this replica was sent / made
    seconds: float
    round: int = 0
    drift: str = ""  # filled by the watch: how this round differs from the replica's previous one

    def to_dict(self) -> dict:
        return asdict(self)


def tokens_of(golden: GoldenSet) -> dict:
    """A replay's cost in tokens: each prompt is prefilled twice (generation, then prompt + golden continuation
    scored) and max_new_tokens are generated."""
    prompt = sum(len(p.prompt_ids) for p in golden.prompts)
    cont = sum(len(p.ids) for p in golden.prompts)
    generated = golden.max_new_tokens * len(golden.prompts)
    return {"prompt": 2 * prompt + cont, "generated": generated, "total": 2 * prompt + cont + generated,
            "requests": 2 * len(golden.prompts)}


def tokens_before_broken(golden: GoldenSet) -> dict:
    """What a replay cost a replica that answered its generation requests with vLLM's non-finite HTTP 400: vLLM holds
    a stream's first output back to answer an error with a status, so each prompt was prefilled once and one token
    made before the 400; the scoring requests never went."""
    prompt, n = sum(len(p.prompt_ids) for p in golden.prompts), len(golden.prompts)
    return {"prompt": prompt, "generated": n, "total": prompt + n, "requests": n}


def _with_target(topks: list[dict[int, float]], ids: list[int], target: list[float]) -> list[dict[int, float]]:
    # core.compare does the same for a server's scores: the continuation token's own logprob tightens the top-k KLD
    from core.compare.run import _with_target as add

    return add(Score(ids, target, topks))


def judge(golden: GoldenSet, r: Replay) -> ReplicaRound:
    """Pure: the replica's agreement with the golden set, with core.compare's metrics, bands and verdict."""
    if r.error:
        return ReplicaRound(r.url, NO_ANSWER, f"No answer: {r.error}", None, r.facts, {}, r.seconds)
    if r.refusal:
        return ReplicaRound(r.url, REFUSED, f"Refused: {r.url} {r.refusal}", None, r.facts, {}, r.seconds)
    if r.broken:  # nothing to score, but an answer about quality all the same: the worst one
        return ReplicaRound(r.url, "broken", f"Broken: {r.broken}.", None, r.facts, tokens_before_broken(golden),
                            r.seconds)
    k = golden.top_k
    free, tf = [], []
    for p, ids, dec, tft, tgt in zip(golden.prompts, r.ids, r.decode_topk, r.tf_topk, r.tf_target):
        free.append(ag.free_run(p.ids, p.decode_topk, ids, dec, k))
        tf.append(ag.teacher_forced(_with_target(p.tf_topk, p.ids, p.tf_target), _with_target(tft, p.ids, tgt), k))
    health = (ag.side_health([p.ids for p in golden.prompts],
                             [x for p in golden.prompts for x in (p.decode_topk, p.tf_topk)]),
              ag.side_health(r.ids, [x for pair in zip(r.decode_topk, r.tf_topk) for x in pair]))
    s = ag.summarize(free, tf, "golden", r.url, health=health)
    # Identical to the golden set is the best a replica can be: "fine" in the compare's bands, the line says identical.
    status = "fine" if s.status == "identical" else s.status
    return ReplicaRound(r.url, status, s.verdict, s.to_dict(), r.facts, tokens_of(golden), r.seconds)
