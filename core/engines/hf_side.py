"""The side of an in-process engine that faces the Hugging Face tokenizer and the caller, shared by the torch engine
and the fast CUDA-graph engine: text to ids and back, length checks, picking the next token, scores from log-softmax
rows, and the scoring entry points that features use (`score_many`). An engine that mixes it in has `tokenizer`,
`max_positions` and `score(prompt_ids, continuation_ids, top_k, full)`. Torch is imported only where tensors are
made, so a tokenizer-only stand-in (the Long context page before a model is loaded) can use the token side too.
"""
from __future__ import annotations

from core.engines.base import ByteTokenizer, GenerationParams, MemoryPlan, Score
from core.errors import InputError


def score_from_logprobs(lp, continuation_ids: list[int], top_k: int, full: bool) -> Score:
    """A Score from the log-softmax rows that predict each continuation token (one row per token)."""
    import torch

    target = torch.tensor(continuation_ids, device=lp.device)
    tv, ti = lp.topk(top_k, dim=-1)
    return Score(
        continuation_ids=list(continuation_ids),
        target_logprobs=lp.gather(1, target[:, None])[:, 0].tolist(),
        top_logprobs=[dict(zip(i, v)) for i, v in zip(ti.tolist(), tv.tolist())],
        full_logprobs=lp.cpu().numpy() if full else None,
    )


def pick_next(logprobs, params: GenerationParams, gen):
    """Greedy at temperature 0, else sampling with temperature and top-p, one token per row (torch tensors)."""
    import torch

    if params.temperature == 0:
        return logprobs.argmax(dim=-1)
    probs = torch.softmax(logprobs / params.temperature, dim=-1)
    if params.top_p < 1.0:
        sorted_p, idx = probs.sort(dim=-1, descending=True)
        keep = sorted_p.cumsum(-1) - sorted_p < params.top_p
        sorted_p = sorted_p * keep
        probs = torch.zeros_like(probs).scatter(-1, idx, sorted_p)
    return torch.multinomial(probs, 1, generator=gen)[:, 0]


class HFSide:
    tokenizer: object
    max_positions: int | None

    # ---- tokens ----
    def encode(self, prompt: str | list[int]) -> list[int]:
        if isinstance(prompt, list):
            return [int(t) for t in prompt]
        if isinstance(self.tokenizer, ByteTokenizer):
            return self.tokenizer.encode(prompt)
        return self.tokenizer(prompt).input_ids

    def encode_plain(self, text: str) -> list[int]:
        """Ids of a text without the special tokens the tokenizer adds (a document scored in windows)."""
        if callable(self.tokenizer):
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
        return list(self.tokenizer.encode(text))

    def calibration_ids(self, text: str | None, tokens: int) -> list[int]:
        """BOS + the first `tokens` tokens of a calibration text (None: the shipped sample prose), as the torch
        engine's quantizers take them."""
        from core.engines.torch import quant

        return quant.calibration_ids(self.tokenizer, text, tokens)

    def memory_plan(self) -> MemoryPlan:
        """The device, the activations' element size, the model's config and the bytes free now (base.MemoryPlan)."""
        from core.engines.device import available_bytes

        return MemoryPlan(self.device, self.dtype.itemsize, self.config, available_bytes(self.device))

    @property
    def bos_ids(self) -> list[int]:
        """[BOS id], or [] for a tokenizer without one."""
        b = getattr(self.tokenizer, "bos_token_id", None)
        return [b] if b is not None else []

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def token_texts(self, ids: list[int]) -> list[str]:
        """The text of each token alone, for side-by-side display."""
        return [self.tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    def check_lengths(self, ids: list[list[int]], params: GenerationParams) -> None:
        if any(len(i) == 0 for i in ids):
            raise InputError("A prompt is empty after tokenization; type some text.")
        longest = max(len(i) for i in ids) + params.max_new_tokens
        if self.max_positions and longest > self.max_positions:
            raise InputError(
                f"Prompt plus new tokens is {longest} tokens; the model handles at most {self.max_positions}. "
                "Shorten the prompt or ask for fewer new tokens."
            )

    # ---- scoring, as features ask for it ----
    def score_many(self, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
        """Teacher-forced scores of (prompt ids, continuation ids) pairs with full distributions (exact KL). An
        engine with a batched pass overrides this."""
        return [self.score(p, c, top_k, full=True) for p, c in items]
