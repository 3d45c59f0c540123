"""The Engine protocol and the plain data every engine returns.

Torch (in-process), vLLM (its own process) and remote (an OpenAI-compatible server) all implement it, so the pages,
the agreement metrics and the benchmarks never care which one produced a result. No torch import here.
"""
from __future__ import annotations

import contextlib
import contextvars
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable, Iterator, Protocol, Sequence, runtime_checkable

from core.errors import EngineError  # noqa: F401 - re-exported: engines and their callers name it from here
from core.errors import InputError
from core.precision import Device, KVDtype, Precision
from core.stats import percentile


class UnsupportedCombination(EngineError):
    def __init__(self, reasons: list[str]):
        super().__init__(" ".join(reasons))
        self.reasons = reasons


class Cancelled(EngineError):
    pass


class EngineUnloaded(EngineError):
    """The engine pool unloaded this engine (another session loaded a model beyond the pool's keep) before this call
    reached it: the weights are gone, so say so instead of failing inside the model."""

    def __init__(self, label: str):
        super().__init__(f"{label} was unloaded to make room for a model loaded since (the console keeps only the "
                         "most recently used models loaded). Load it again and retry.")


@dataclass
class GenerationParams:
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy
    top_p: float = 1.0
    top_logprobs: int = 5  # how many alternatives to report at every generated position
    seed: int | None = None
    stop_at_eos: bool = True

    def validated(self) -> "GenerationParams":
        if not 1 <= self.max_new_tokens <= 8192:
            raise InputError(f"max_new_tokens must be between 1 and 8192; got {self.max_new_tokens}.")
        if not 0.0 <= self.temperature <= 5.0:
            raise InputError(f"temperature must be between 0 and 5; got {self.temperature}.")
        if not 0.0 < self.top_p <= 1.0:
            raise InputError(f"top_p must be in (0, 1]; got {self.top_p}.")
        if not 0 <= self.top_logprobs <= 20:
            raise InputError(f"top_logprobs must be between 0 and 20; got {self.top_logprobs}.")
        return self


@dataclass
class Generation:
    """One prompt's continuation. Times are seconds since the request started (perf_counter based)."""

    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)  # logprob of each chosen token
    top_logprobs: list[dict[int, float]] = field(default_factory=list)  # per position: token id -> logprob
    token_times: list[float] = field(default_factory=list)
    text: str = ""
    finish_reason: str = "length"  # "length", "eos", "cancelled"

    @property
    def ttft_s(self) -> float | None:
        return self.token_times[0] if self.token_times else None

    @property
    def itl_s(self) -> list[float]:
        t = self.token_times
        return [b - a for a, b in zip(t, t[1:])]

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens per second after the first token (the decode phase alone)."""
        if len(self.token_times) < 2:
            return None
        span = self.token_times[-1] - self.token_times[0]
        return (len(self.token_times) - 1) / span if span > 0 else None

    def timing_summary(self) -> dict:
        itl = self.itl_s
        return {
            "prompt_tokens": len(self.prompt_ids),
            "new_tokens": len(self.token_ids),
            "ttft_s": self.ttft_s,
            "itl_median_s": statistics.median(itl) if itl else None,
            "itl_p90_s": percentile(itl, 0.9),
            "itl_max_s": max(itl) if itl else None,
            "decode_tok_s": self.decode_tok_s,
        }

    def to_dict(self) -> dict:
        d = asdict(self)
        d["top_logprobs"] = [{str(k): v for k, v in pos.items()} for pos in self.top_logprobs]
        d["timing"] = self.timing_summary()
        return d


@dataclass
class StreamEvent:
    """One decode step for every sequence in the batch; `token_ids[i]` is None once sequence i has finished."""

    step: int
    token_ids: list[int | None]
    texts: list[str]  # the decoded text of each sequence so far
    t: float


@dataclass
class RunControl:
    """How a caller steers a run it cannot interrupt itself: `should_stop()` is asked between prefill chunks and
    decode steps (an in-process engine gives the CPU back within about a second of a stop), `on_prefill(done,
    total)` hears of each prefill chunk (prompt tokens), and `stopped_at` keeps the unix time the stop was first
    seen, so the history can date a cancelled run to its stop. Set for a block of calls with `controlled`; engines
    read it with `check_stop` and `report_prefill`, whatever feature called them."""

    should_stop: Callable[[], bool] | None = None
    on_prefill: Callable[[int, int], None] | None = None
    stopped_at: float | None = None

    def stop_asked(self) -> bool:
        if self.stopped_at is not None:
            return True
        if self.should_stop is not None and self.should_stop():
            self.stopped_at = time.time()
            return True
        return False


_CONTROL: contextvars.ContextVar[RunControl | None] = contextvars.ContextVar("run_control", default=None)


@contextlib.contextmanager
def controlled(control: RunControl) -> Iterator[RunControl]:
    """Every engine call in the block checks `control` for a stop and reports its prefill to it."""
    token = _CONTROL.set(control)
    try:
        yield control
    finally:
        _CONTROL.reset(token)


def check_stop(should_stop: Callable[[], bool] | None = None) -> None:
    """Raise Cancelled when the caller's `should_stop` or the block's RunControl asks to stop."""
    control = _CONTROL.get()
    if (should_stop is not None and should_stop()) or (control is not None and control.stop_asked()):
        if control is not None and control.stopped_at is None:
            control.stopped_at = time.time()
        raise Cancelled("Stopped before the end.")


def stop_probe(should_stop: Callable[[], bool] | None = None) -> Callable[[], bool] | None:
    """`should_stop` joined with the block's RunControl as one callable that another thread may ask (a watcher that
    closes a server's stream: threads do not see the caller's RunControl); None when nothing can ask to stop."""
    control = _CONTROL.get()
    if control is None:
        return should_stop
    return lambda: (should_stop is not None and should_stop()) or control.stop_asked()


def report_prefill(done: int, total: int) -> None:
    """Tell the block's RunControl, if any, that `done` of `total` prompt tokens went through the model."""
    control = _CONTROL.get()
    if control is not None and control.on_prefill is not None:
        control.on_prefill(done, total)


def stopped_at() -> float | None:
    """When the block's RunControl first saw a stop (unix seconds), or None."""
    control = _CONTROL.get()
    return control.stopped_at if control is not None else None


def stop_if_asked(should_stop: Callable[[], bool] | None, gens: list[Generation], done: list[bool]) -> None:
    """Between decode steps: mark unfinished rows cancelled and raise Cancelled when the caller asked to stop."""
    try:
        check_stop(should_stop)
    except Cancelled:
        for g, d in zip(gens, done):
            if not d:
                g.finish_reason = "cancelled"
        raise Cancelled("Generation cancelled.") from None


def append_step(gens: list[Generation], done: list[bool], next_ids, chosen_logprobs, top, t0: float,
                eos_ids: set[int], stop_at_eos: bool) -> tuple[list[int | None], float]:
    """Record one decode step in every unfinished row: token, its logprob, the top-k (a (values, ids) pair of device
    tensors, or None) and the time since t0. Reading the tensors syncs the device, so the time is taken after the
    token exists. Returns what each row emitted (None for rows already done) and that time; rows that hit EOS are
    marked done."""
    chosen, nxt = chosen_logprobs.tolist(), next_ids.tolist()
    now = time.perf_counter() - t0
    top_v, top_i = (top[0].tolist(), top[1].tolist()) if top is not None else (None, None)
    emitted: list[int | None] = []
    for b, g in enumerate(gens):
        if done[b]:
            emitted.append(None)
            continue
        tok = nxt[b]
        g.token_ids.append(tok)
        g.logprobs.append(chosen[b])
        g.top_logprobs.append(dict(zip(top_i[b], top_v[b])) if top_v is not None else {})
        g.token_times.append(now)
        emitted.append(tok)
        if stop_at_eos and tok in eos_ids:
            done[b], g.finish_reason = True, "eos"
    return emitted, now


# Batching limits for in-process forward passes over several prompts: padded tokens per pass, continuation positions
# whose full distributions are held at once (1 MiB each at Gemma's 262k vocabulary), how much padding a batch may waste.
BATCH_TOKENS = 4096
BATCH_POSITIONS = 512
BATCH_PAD_RATIO = 1.3


def length_groups(lengths: Sequence[int], cont_lengths: Sequence[int] | None = None,
                  pad_tokens: int = 0) -> list[list[int]]:
    """Indices grouped so that each group is one forward pass: similar lengths (little padding: at most
    BATCH_PAD_RATIO of the real tokens, or at most `pad_tokens` pad tokens), bounded size. Left padding makes every
    row of a pass as long as its longest, so one long prompt in a group would multiply the short ones' cost."""
    cont_lengths = cont_lengths or [0] * len(lengths)
    groups: list[list[int]] = []
    cur: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: lengths[j]):
        cand = cur + [i]
        width = max(lengths[j] for j in cand)
        real = sum(lengths[j] for j in cand)
        little_padding = width * len(cand) <= BATCH_PAD_RATIO * real or width * len(cand) - real <= pad_tokens
        fits = (width * len(cand) <= max(BATCH_TOKENS, width) and little_padding
                and sum(cont_lengths[j] for j in cand) <= max(BATCH_POSITIONS, cont_lengths[i]))
        if cur and not fits:
            groups.append(cur)
            cand = [i]
        cur = cand
    if cur:
        groups.append(cur)
    return groups


@dataclass
class Score:
    """Teacher-forced scores of a given continuation: position i predicts continuation_ids[i]."""

    continuation_ids: list[int]
    target_logprobs: list[float]  # logprob the engine gives each continuation token
    top_logprobs: list[dict[int, float]]  # per position: the engine's own top-k
    full_logprobs: object | None = None  # float32 array [positions, vocab] where the engine can give it (torch)


@dataclass
class MemoryReport:
    weights_by_dtype: dict[str, int]  # dtype name -> bytes: the weights as the precision stores them
    kv_cache_bytes: int
    peak_bytes: int | None
    peak_source: str  # how peak_bytes was measured: "CUDA allocator (max_memory_allocated)", sampled RSS, ...
    device: str
    # Copies an engine holds beside the weights to run faster (a packed layout of a tied lm_head, float32 copies for
    # a CPU without half GEMMs): what each is -> bytes. Apart from weights_by_dtype so that the weights compare
    # across precisions at what each stores.
    runtime_copies: dict[str, int] = field(default_factory=dict)

    @property
    def weights_bytes(self) -> int:
        return sum(self.weights_by_dtype.values())

    @property
    def runtime_bytes(self) -> int:
        return sum(self.runtime_copies.values())


@runtime_checkable
class Engine(Protocol):
    """What every engine offers. What only some offer is declared below (InProcessEngine, EagerEngine); a feature
    asks with isinstance, never with getattr/hasattr."""

    name: str  # a short key: "torch", "torch-fast", "vllm-cpu", "vllm", "remote"
    ran: str  # what really executes, in full, for details, History and JSON: "torch eager on CPU, FP8 linears ..."
    # The same in a few words for headlines, the sidebar and titles: the engine path and where it runs, joined by
    # " · " ("torch eager · CPU", "fast path · NVIDIA H200", "vLLM 0.32.0 server · host:8000"). short_ran(ran) gives
    # the same from a stored `ran`.
    ran_short: str

    def unsupported_reasons(self, precision: Precision, kv_dtype: KVDtype) -> list[str]: ...

    def generate(
        self,
        prompts: list[str],
        params: GenerationParams,
        on_step: Callable[[StreamEvent], None] | None = None,
        should_stop: Callable[[], bool] | None = None,
    ) -> list[Generation]: ...

    def stream(self, prompt: str, params: GenerationParams) -> Iterator[StreamEvent]: ...

    def score(self, prompt_ids: list[int], continuation_ids: list[int], top_k: int = 8) -> Score: ...

    def score_many(self, items: list[tuple[list[int], list[int]]], top_k: int) -> list[Score]:
        """Teacher-forced scores of (prompt ids, continuation ids) pairs, batched as the engine does best: one padded
        pass in process (with full distributions, for exact KL), parallel prompt_logprobs requests on a server."""
        ...

    def memory_report(self) -> MemoryReport: ...

    def unload(self) -> None: ...


@dataclass(frozen=True)
class MemoryPlan:
    """What one forward pass of an in-process engine draws on: where it runs, its activations' element size, the
    model's transformers config (its shapes), and the bytes free there now."""
    device: Device
    act_bytes: int
    config: object
    free_bytes: int


@runtime_checkable
class InProcessEngine(Engine, Protocol):
    """An engine whose model runs in this process (torch eager, the fast path): its tokens and whole distributions.
    core.engines.hf_side.HFSide gives most of it."""

    device: Device

    def encode(self, prompt: str | list[int]) -> list[int]: ...

    def encode_plain(self, text: str) -> list[int]: ...

    @property
    def bos_ids(self) -> list[int]: ...

    def token_texts(self, ids: list[int]) -> list[str]: ...

    def calibration_ids(self, text: str | None, tokens: int) -> list[int]: ...

    def window_logprobs(self, ids: list[int], keep: int):
        """Log-softmax at the last keep - 1 positions of one pass over ids (a torch tensor), and its seconds."""
        ...

    def memory_plan(self) -> MemoryPlan: ...


@runtime_checkable
class EagerEngine(InProcessEngine, Protocol):
    """The eager torch engine's extras: a prompt pass kept for scoring, and its numerics (which kernels its linears
    ran, static FP8 calibration, per-layer quantization errors)."""

    def generate_keeping_prompt_pass(self, prompts, params: GenerationParams, should_stop=None): ...

    def score_after_prompt_pass(self, kept, rows: list[int], continuations: list[list[int]], top_k: int,
                                full: bool = False) -> list[Score]: ...

    def linear_kernels(self) -> list[str]: ...

    def calibrate_static_fp8(self, ids: list[int]) -> None: ...

    def layer_errors(self, ids: list[int]) -> list[dict]: ...


SEP = " · "  # between the parts of a short label


def precision_short(precision: Precision, kv_dtype: KVDtype = KVDtype.AUTO) -> str:
    """The precision in a few words for short labels ("FP8 W8A8", "BF16 + FP8 KV"); Precision.label is the full one."""
    return precision.short + (" + FP8 KV" if kv_dtype is KVDtype.FP8 else "")


def short_label(precision_label: str, ran_short: str) -> str:
    """A headline-sized label: "FP8 W8A8 · torch eager · CPU". The full `ran` goes one click away (a popover or a
    tooltip) and into --json output beside this."""
    return SEP.join(p for p in (precision_label.strip(), ran_short.strip()) if p)


def _drop_parentheses(text: str) -> str:
    out, depth = [], 0
    for ch in text:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0:
            out.append(ch)
    return " ".join("".join(out).split())


def _host_port(url: str) -> str:
    from urllib.parse import urlsplit

    parts = urlsplit(url if "//" in url else "//" + url)
    return parts.netloc or url


def short_ran(ran: str) -> str:
    """The short form of a full `ran` string (runs saved before ran_short existed keep only the full one):
    "torch eager on CPU, FP8 linears through ..." -> "torch eager · CPU"; "torch fast path (CUDA graphs, ...) on NVIDIA
    H200" -> "fast path · NVIDIA H200"; "vLLM 0.32.0 server at http://h:8000" -> "vLLM 0.32.0 server · h:8000".
    Text of no known shape keeps its first clause."""
    text = _drop_parentheses(ran or "")
    if not text:
        return ""
    if " at " in text and " server" in text:  # a server named by its URL: the URL carries no commas
        what, _, url = text.partition(" at ")
        return SEP.join([what.strip(), _host_port(url.split(",")[0].strip())])
    head = text.split(",")[0].strip()
    what, on, where = head.rpartition(" on ")
    if not on:
        return head
    if what.startswith("torch fast path"):
        what = "fast path"
    return SEP.join([what.strip(), where.strip()])


class ByteTokenizer:
    """Stands in for a tokenizer on synthetic models (random weights, no vocabulary): UTF-8 bytes in, token ids shown
    as [id] out. Shared by the torch and the fast engine."""

    eos_token_id = None
    pad_token_id = 0

    def encode(self, text: str) -> list[int]:
        return [b + 1 for b in text.encode()] or [1]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return "".join(f"[{int(i)}]" for i in ids)

    def convert_ids_to_tokens(self, ids):
        return [f"[{int(i)}]" for i in ids]
