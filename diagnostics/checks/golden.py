"""golden.agreement: the connected vLLM server replays a golden set (core.compare.golden) right after the window, so
its requests never count among the window's, and is judged against it with the compare's bands: is it still
answering what the reference answered when the set was recorded?"""
from __future__ import annotations

from core.compare.golden.replay import NO_ANSWER, REFUSED
from diagnostics.context import CheckContext
from diagnostics.findings import Check, Outcome, Severity, fail, passed, skip, warn

WATCH_CMD = "python -m diagnostics golden watch --golden FILE --url URL --every 60"


def decide_agreement(ctx: CheckContext) -> Outcome:
    r = ctx.golden_round
    if r is None:
        return skip(ctx.golden_reason)
    s = r.get("summary") or {}
    evidence = {"golden": ctx.golden_file or "", "url": r["url"], "status": r["status"],
                **{k: s.get(k) for k in ("same_top", "same_top_ci95", "top3_match", "mean_kld", "p99_kld")},
                "vllm_rule": f"{s['vllm_passed']}/{s['vllm_total']}" if s else None,
                "tokens": (r.get("tokens") or {}).get("total", 0), "seconds": round(r.get("seconds") or 0.0, 1)}
    verdict = f"Against the golden set {ctx.golden_file}: {r['verdict']}"
    if r["status"] == NO_ANSWER:
        return skip(f"golden set replay: {r['url']} did not answer it ({r['verdict']}; vllm.liveness says why)",
                    evidence=evidence)
    if r["status"] == REFUSED:
        return warn(verdict, "The server is not the one the golden set was recorded from (another model, vocabulary "
                    "or context length): record a golden set from this deployment's reference with `python -m "
                    "diagnostics golden record --url URL --out golden.json`.", evidence=evidence)
    if r["status"] == "fine":
        return passed(verdict, evidence=evidence)
    remedy = ("Compare this server's setup with the golden set's (model path and revision, --dtype, "
              "--kv-cache-dtype, --quantization, vLLM version: the set records each) and undo what changed; "
              f"`{WATCH_CMD}` names the round a change began in.")
    if r["status"] in ("watch", "inconclusive"):
        return warn(verdict, remedy, evidence=evidence)
    return fail(verdict, remedy, evidence=evidence)  # low agreement, or a broken side


CHECKS = (
    Check("golden.agreement", "Answers match the golden set", Severity.HIGH,
          "the server's greedy answers and top-k logprobs on a golden set's prompts, replayed after the window, agree "
          "with the set within the compare's bands (same top token share, KLD over the shared top-k, vLLM's "
          "check_logprobs_close rule)", decide_agreement),
)
