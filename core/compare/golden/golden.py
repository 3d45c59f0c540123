"""A golden set: what a reference deployment answered, kept so that replicas can be checked against it later.

Per prompt: the reference's greedy continuation (token ids) with the top-k logprobs it reported while generating, and
the top-k logprobs of that continuation scored teacher-forced (vLLM's `prompt_logprobs`), plus what produced it (the
served model, max_model_len, vLLM version, the settings the server publishes, its process start) and the noise
floor: the same golden set replayed on the reference itself right after recording. A sampled continuation is one
draw among many, so a golden set is always greedy; a file that says otherwise is refused.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Sequence

from core.compare import agreement as ag
from core.errors import InputError
from core.fmt import fmt_utc

FORMAT = "triage-golden"
VERSION = 1
MAX_TOP_K = 20  # vLLM's default --max-logprobs
MAX_NEW_TOKENS = 512
USER_TAG = "triage-golden"  # the `user` field of every golden request, so other checks can tell them apart


def _pairs(d: dict[int, float]) -> list[list]:
    """A top-k dict as [[id, logprob], ...] best first; a non-finite logprob as null (JSON has no NaN)."""
    return [[t, d[t] if math.isfinite(d[t]) else None] for t in ag.topk_ids(d, len(d))]


def _dict(pairs: Sequence[Sequence]) -> dict[int, float]:
    return ag.normalize_topk({t: lp for t, lp in pairs})


@dataclass
class GoldenPrompt:
    name: str
    text: str
    prompt_ids: list[int]
    ids: list[int]  # the reference's greedy continuation
    decode_topk: list[dict[int, float]]  # its top-k while generating (for vLLM's check_logprobs_close rule)
    tf_topk: list[dict[int, float]]  # its top-k on the same continuation, teacher-forced
    tf_target: list[float]  # the logprob it gave each continuation token, teacher-forced

    def to_dict(self) -> dict:
        return {"name": self.name, "text": self.text, "prompt_ids": self.prompt_ids, "ids": self.ids,
                "decode_topk": [_pairs(d) for d in self.decode_topk], "tf_topk": [_pairs(d) for d in self.tf_topk],
                "tf_target": [x if math.isfinite(x) else None for x in self.tf_target]}

    @classmethod
    def from_dict(cls, d: dict) -> "GoldenPrompt":
        return cls(d["name"], d["text"], list(d["prompt_ids"]), list(d["ids"]),
                   [_dict(p) for p in d["decode_topk"]], [_dict(p) for p in d["tf_topk"]],
                   [math.nan if x is None else float(x) for x in d["tf_target"]])


@dataclass
class GoldenSet:
    server: dict  # server_facts() of the reference at record time
    max_new_tokens: int
    top_k: int
    temperature: float
    prompts: list[GoldenPrompt]
    recorded_at: float = field(default_factory=time.time)  # Unix seconds
    noise_floor: dict | None = None  # the reference replayed against itself: ag.Summary.to_dict() plus cost
    format: str = FORMAT
    version: int = VERSION

    @property
    def model(self) -> str:
        return self.server.get("model") or ""

    @property
    def longest(self) -> int:
        return max(len(p.prompt_ids) + len(p.ids) for p in self.prompts)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["prompts"] = [p.to_dict() for p in self.prompts]
        d["recorded_at_utc"] = fmt_utc(self.recorded_at)
        return d

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), allow_nan=False, default=_plain) + "\n")

    @classmethod
    def from_dict(cls, d: dict, where: str = "the golden set") -> "GoldenSet":
        if not isinstance(d, dict) or d.get("format") != FORMAT:
            raise InputError(f"{where} is not a golden set (no \"format\": \"{FORMAT}\"). Record one with "
                             "`python -m diagnostics golden record --url URL --out golden.json`.")
        if d.get("version") != VERSION:
            raise InputError(f"{where} is a golden set of version {d.get('version')!r}; this console reads version "
                             f"{VERSION}. Record it again.")
        temperature = float(d.get("temperature", 0.0))
        refuse_sampling(temperature, where)
        try:
            prompts = [GoldenPrompt.from_dict(p) for p in d["prompts"]]
            return cls(dict(d["server"]), int(d["max_new_tokens"]), int(d["top_k"]), temperature, prompts,
                       float(d["recorded_at"]), d.get("noise_floor"))
        except (KeyError, TypeError, ValueError) as exc:
            raise InputError(f"{where} is damaged ({exc!r}); record it again.") from exc

    @classmethod
    def load(cls, path: str | Path) -> "GoldenSet":
        p = Path(path).expanduser()  # the pages show paths under the home directory as ~/...
        try:
            data = json.loads(p.read_text())
        except FileNotFoundError:
            raise InputError(f"No golden set at {p}. Record one with `python -m diagnostics golden record "
                             f"--url URL --out {p}`.") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"{p} could not be read as JSON ({exc}).") from exc
        return cls.from_dict(data, str(p))


def source_line(golden: dict) -> str:
    """What a golden set holds and what produced it (golden.to_dict(), as the file and History keep it)."""
    s = golden.get("server") or {}
    return (f"{len(golden.get('prompts') or [])} prompts x {golden.get('max_new_tokens')} greedy tokens, top-"
            f"{golden.get('top_k')} logprobs, from {s.get('model') or 'unknown model'} at "
            f"{s.get('url') or 'unknown URL'} (vLLM {s.get('vllm_version') or 'unknown'}, max_model_len "
            f"{s.get('max_model_len') or 'unknown'}, vocabulary {s.get('vocab_size') or 'not published'})")


def _plain(obj):
    raise TypeError(f"{type(obj).__name__} is not JSON")


def refuse_sampling(temperature: float, where: str = "this golden set") -> None:
    if temperature > 0:
        raise InputError(f"{where} is recorded with sampling (temperature {temperature:g}): a sampled continuation "
                         "is one draw among many, so no replica can be judged against it. Record it greedily "
                         "(temperature 0, the default).")


def check_request(max_new_tokens: int, top_k: int) -> None:
    if not 1 <= max_new_tokens <= MAX_NEW_TOKENS:
        raise InputError(f"max_new_tokens must be between 1 and {MAX_NEW_TOKENS}; got {max_new_tokens}.")
    if not 1 <= top_k <= MAX_TOP_K:
        raise InputError(f"top_k must be between 1 and {MAX_TOP_K} (vLLM's default --max-logprobs); got {top_k}.")
