"""Long documents: build a sample document, count tokens per section, decide the fit (reading uploads and pastes is
core/textfile.py).

Pure Python; the tokenizer is whatever the loaded engine has, passed in, or, before any model is loaded, the embedded
model's own tokenizer read from disk (TokenizerOnly). Errors are DocumentError with a message that says what was
found and what to do.
"""
from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from core.engines.hf_side import HFSide
from core.errors import InputError
from core.models import embedded_converted_dir
from core.textfile import DocumentError, source_text

TRUNCATIONS = {
    "head": "keep the beginning (drop the end)",
    "tail": "keep the end (drop the beginning)",
    "middle": "keep both ends (drop the middle)",
}


# ---- sample document -------------------------------------------------------------------------------------------

def _source_blocks() -> tuple[list[str], list[str]]:
    """(prose paragraphs, fenced code blocks) of the shipped source text, after its introduction."""
    body = source_text()
    fence = r"```[a-z]*\n.*?\n```"
    blocks = [b.strip() for b in re.sub(fence, "", body, flags=re.S).split("\n\n")]
    prose = [b.replace("\n", " ") for b in blocks if b and not b.startswith("#")]
    return prose, re.findall(fence, body, flags=re.S)


def _json_block(rng: random.Random, i: int) -> str:
    records = [{"ts": f"2025-03-{1 + (i % 28):02d}T{rng.randrange(24):02d}:{rng.randrange(60):02d}:{j:02d}Z",
                "level": rng.choice(["INFO", "INFO", "WARN", "ERROR"]),
                "request_id": f"req-{i:04d}-{j}", "prompt_tokens": rng.randrange(16, 32768),
                "kv_cache_usage": round(rng.random(), 3), "preemptions": rng.randrange(4)}
               for j in range(rng.randrange(1, 3))]
    return "```json\n" + json.dumps(records, indent=2) + "\n```"


SAMPLE_OVERSHOOT_TOKENS = 64  # the smallest shipped paragraph is about 45 tokens


def sample_document(target_tokens: int = 2000, count: Callable[[str], int] | None = None, seed: int = 0) -> str:
    """Markdown sections of shuffled prose, a code block and JSON records until about `target_tokens` tokens.
    With `count` (the model's token counter) the target is measured, else estimated at 4 characters a token."""
    count = count or (lambda s: len(s) // 4)
    prose, code = _source_blocks()
    rng = random.Random(seed)
    parts, total, i = [f"# Sample long document (about {target_tokens} tokens)"], 0, 0
    limit = target_tokens + SAMPLE_OVERSHOOT_TOKENS
    while total < target_tokens:
        i += 1
        heading, added = f"## Section {i}", False
        for block in [*rng.sample(prose, 2), rng.choice(code), _json_block(rng, i), rng.choice(prose)]:
            n = count(block) + 1  # counted alone, plus the blank line that joins it
            if total + n > limit:
                continue  # a JSON block is ~200 tokens: near the end, a smaller block of this round may fit
            if not added:
                parts.append(heading)
                total += count(heading) + 1
                added = True
            parts.append(block)
            total += n
            if total >= target_tokens:
                break
        if not added:  # nothing of this round fitted: stop short rather than overshoot
            break
    return "\n\n".join(parts) + "\n"


# ---- stats -----------------------------------------------------------------------------------------------------

@dataclass
class Section:
    title: str
    start: int  # character offsets into the document
    end: int
    tokens: int = 0


def split_sections(text: str) -> list[Section]:
    """Markdown headings (outside code fences) start sections; without headings, blank lines separate blocks."""
    heads, fence, pos = [], False, 0
    for line in text.splitlines(keepends=True):
        if line.startswith("```"):
            fence = not fence
        elif not fence and re.match(r"#{1,6} ", line):
            heads.append((pos, line.strip().lstrip("#").strip()))
        pos += len(line)
    if not heads:
        blocks = [(m.start(), m.end()) for m in re.finditer(r"\S(?:.*?\S)?(?=\n\s*\n|\s*\Z)", text, flags=re.S)]
        return [Section(f"block {n + 1}: {text[a:b][:40].splitlines()[0]}", a, b) for n, (a, b) in enumerate(blocks)]
    if heads[0][0] > 0 and text[:heads[0][0]].strip():
        heads.insert(0, (0, "(before the first heading)"))
    return [Section(title, a, heads[n + 1][0] if n + 1 < len(heads) else len(text))
            for n, (a, title) in enumerate(heads)]


def encode_with_offsets(tokenizer, text: str) -> tuple[list[int], list[int] | None]:
    """(token ids without special tokens, start character of each token or None where the tokenizer cannot say)."""
    if not callable(tokenizer):
        return list(tokenizer.encode(text)), None  # the engine's byte tokenizer on synthetic models
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
        return list(enc["input_ids"]), [a for a, _ in enc["offset_mapping"]]
    except (TypeError, NotImplementedError, ValueError):  # slow tokenizers have no offsets
        return list(tokenizer(text, add_special_tokens=False)["input_ids"]), None


def count_tokens(tokenizer, text: str) -> int:
    if callable(tokenizer):
        return len(tokenizer(text, add_special_tokens=False)["input_ids"])
    return len(tokenizer.encode(text))


@dataclass
class DocStats:
    chars: int
    tokens: int  # the document's own tokens, no special tokens
    special_tokens: int  # what the engine adds in front (BOS)
    max_positions: int | None
    max_length: int | None
    reserve_new_tokens: int
    sections: list[Section] = field(default_factory=list)
    ids: list[int] = field(default_factory=list, repr=False)  # the document's token ids, no special tokens

    @property
    def prompt_tokens(self) -> int:
        return self.tokens + self.special_tokens

    @property
    def limit(self) -> int | None:
        """Most prompt tokens that leave room for the new tokens within both limits."""
        caps = [c for c in (self.max_positions, self.max_length) if c]
        return min(caps) - self.reserve_new_tokens if caps else None

    @property
    def fits(self) -> bool:
        return self.limit is None or self.prompt_tokens <= self.limit

    @property
    def chars_per_token(self) -> float:
        return self.chars / self.tokens if self.tokens else 0.0


def stats(text: str, tokenizer, max_positions: int | None, max_length: int | None = None,
          reserve_new_tokens: int = 0, special_tokens: int = 1) -> DocStats:
    caps = [c for c in (max_positions, max_length) if c]
    if caps and min(caps) - reserve_new_tokens <= special_tokens:
        raise DocumentError(f"{reserve_new_tokens:,} new tokens leave no room for a prompt within {min(caps):,} "
                            "positions. Ask for fewer new tokens or raise the configured max length.")
    sections = split_sections(text)
    ids, offsets = encode_with_offsets(tokenizer, text)
    total = len(ids)
    if offsets is None:
        for s in sections:
            s.tokens = count_tokens(tokenizer, text[s.start:s.end])
    else:
        k = 0  # offsets ascend: one sweep; whitespace between blank-line blocks counts toward the next block
        for s in sections:
            while k < total and offsets[k] < s.end:
                s.tokens += 1
                k += 1
        if sections:
            sections[-1].tokens += total - k
    return DocStats(len(text), total, special_tokens, max_positions, max_length, reserve_new_tokens, sections, ids)


def truncate_ids(ids: list[int], keep: int, mode: str) -> tuple[list[int], int]:
    """(kept ids, number dropped). head keeps the beginning, tail the end, middle both ends (the extra one to the
    head when `keep` is odd)."""
    if mode not in TRUNCATIONS:
        raise InputError(f"Unknown truncation {mode!r}; choose one of: {', '.join(TRUNCATIONS)}.")
    if keep < 0:
        raise InputError(f"keep must be >= 0; got {keep}.")
    if len(ids) <= keep:
        return list(ids), 0
    if mode == "head":
        kept = ids[:keep]
    elif mode == "tail":
        kept = ids[len(ids) - keep:]
    else:
        head = (keep + 1) // 2
        kept = ids[:head] + ids[len(ids) - (keep - head):]
    return list(kept), len(ids) - keep


def headline(s: DocStats) -> list[tuple[str, str, str]]:
    """(label, value, help) for the document's metrics row."""
    return [("Characters", f"{s.chars:,}", ""),
            ("Tokens", f"{s.prompt_tokens:,}", f"{s.tokens:,} of text + {s.special_tokens} special (BOS)"),
            ("Chars per token", f"{s.chars_per_token:.2f}", "code and JSON spend more tokens per character"),
            ("Prompt limit", f"{s.limit:,}" if s.limit else "N/A", "min(model positions, max length) - new tokens"),
            ("Fits", "yes" if s.fits else f"no: +{s.prompt_tokens - s.limit:,}",
             "" if s.fits else f"{s.prompt_tokens - s.limit:,} tokens over the prompt limit; choose how to truncate")]


def fit(s: DocStats, mode: str = "head") -> tuple[list[int], str | None]:
    """The document's ids that runs use, and a warning when they had to be truncated to the prompt limit."""
    if s.fits:
        return s.ids, None
    ids, dropped = truncate_ids(s.ids, s.limit - s.special_tokens, mode)
    return ids, (f"Over the limit: runs use {len(ids) + s.special_tokens:,} tokens, {dropped:,} dropped "
                 f"({TRUNCATIONS[mode]}).")


@dataclass(frozen=True)
class TokenizerOnly(HFSide):
    """What a document's statistics and the KV cache calculator need of a model, without its weights: the tokenizer,
    the config and the position limit, and an engine's token side (so either can be passed)."""
    label: str
    tokenizer: Any
    config: Any
    max_positions: int | None


def embedded_tokenizer_only(model_dir: Path | None = None) -> TokenizerOnly | None:
    """The embedded model's tokenizer and config from its converted directory (a second, no weights), or None when
    it has not been converted yet (setup converts it, as does loading it once)."""
    model_dir = model_dir or embedded_converted_dir()
    if model_dir is None:
        return None
    from transformers import AutoConfig, AutoTokenizer

    config = AutoConfig.from_pretrained(str(model_dir))
    return TokenizerOnly("Gemma 3 270M (embedded, not loaded)", AutoTokenizer.from_pretrained(str(model_dir)), config,
                         getattr(config, "max_position_embeddings", None))
