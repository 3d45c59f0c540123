"""Loaded engines shared by every browser session of the process: keyed by Setup (model, precision, KV dtype),
one load at a time, at most KEEP loaded (the least recently used idle one is unloaded first).

Pure Python: the pages hold one EnginePool for the process (views/common/session.py), so eight browser tabs on the
same setup share one copy of the weights; each engine serializes its own generations.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from typing import Callable
from dataclasses import dataclass

from core.models import ModelSpec
from core.precision import KVDtype, Precision

KEEP = 3  # reference + candidate for a comparison, plus one more
# ...and at most this many bytes of weights and runtime copies in all (the newest engine always stays): the default
# compare (FP32 + FP8) with the Model page's BF16 held 5.1 GiB RSS on a 24 GiB machine (bench/app_memory.py).
KEEP_BYTES = 3 * 1024 ** 3


def held_bytes(engine) -> int:
    """Weights plus runtime copies of a loaded engine; 0 where it cannot say (a server's memory is not ours)."""
    try:
        mem = engine.memory_report()
    except Exception:  # noqa: BLE001 - an unloaded or remote engine: nothing of ours to count
        return 0
    return mem.weights_bytes + getattr(mem, "runtime_bytes", 0)


def _lock_of(engine) -> threading.Lock | None:
    """The lock an in-process engine holds while it runs; the vLLM and remote engines have none (nothing in-process
    to wait for: their server queues requests itself)."""
    return getattr(engine, "lock", None)


def wait_until_free(engine, on_wait: Callable[[float], None], poll_s: float = 0.5,
                    check: Callable[[], None] | None = None) -> None:
    """Return once no run holds `engine`, calling on_wait(seconds waited) every poll_s meanwhile, so a page can say
    what it waits for instead of a bar at 0; `check` may raise to give up (a stop). A stopped run on the torch
    engine lets go within about a second (prefill in chunks: core/engines/torch/engine.py)."""
    lock = _lock_of(engine)
    if lock is None:
        return
    t0 = time.monotonic()
    while not lock.acquire(timeout=poll_s):
        on_wait(time.monotonic() - t0)
        if check is not None:
            check()
    lock.release()


@dataclass(frozen=True)
class Setup:
    spec: ModelSpec
    precision: Precision
    kv_dtype: KVDtype = KVDtype.AUTO

    @property
    def label(self) -> str:
        """What was asked for; `ran_label` adds what executes, once an engine is loaded."""
        kv = "" if self.kv_dtype is KVDtype.AUTO else ", FP8 KV cache"
        return f"{self.spec.label} at {self.precision.label}{kv}"

    def ran_label(self, engine) -> str:
        """The label with the engine that really runs it: eager torch and the CUDA-graph path differ 13-17x in speed."""
        return f"{self.label} ({engine.ran})"

    @property
    def model_short(self) -> str:
        """The model without its parenthesized details: "Gemma 3 270M" (the label names its source and terms)."""
        from core.engines.base import _drop_parentheses

        return _drop_parentheses(self.spec.label) or self.spec.label

    def short_label(self, engine) -> str:
        """A headline-sized label: "FP8 W8A8 · torch eager · CPU" (precision, engine path, device or server). The
        model is named apart; ran_label is the full form, for details one click away."""
        from core.engines.base import precision_short, short_label

        return short_label(precision_short(self.precision, self.kv_dtype), engine.ran_short)


DEFAULT_SETUP = Setup(ModelSpec("embedded"), Precision.BF16)


class EnginePool:
    def __init__(self, keep: int = KEEP, keep_bytes: int = KEEP_BYTES):
        self.keep, self.keep_bytes = keep, keep_bytes
        self._engines: OrderedDict[Setup, object] = OrderedDict()  # oldest first
        self._lock = threading.Lock()

    def load(self, setup: Setup, progress=None):
        """The engine for `setup`, loaded now unless it is already; it becomes the most recently used. Raises on
        failure, leaving the pool as it was."""
        with self._lock:  # a second session asking for the same model waits here, then reuses it
            engine = self._engines.get(setup)
            if engine is None:
                from core.engines.factory import build_engine

                engine = build_engine(setup.spec, setup.precision, setup.kv_dtype, progress=progress)
                self._engines[setup] = engine
                self._evict_beyond_keep(setup)
            self._engines.move_to_end(setup)
        return engine

    def _evict_beyond_keep(self, newest: Setup) -> None:
        """Unload the least recently used engines until KEEP remain, holding at most KEEP_BYTES (the two most
        recently used always stay: a comparison's pair), each under its own lock. An engine generating now (lock
        held) is skipped, not pulled from under its session; it goes at a later load, once idle, so the pool can
        hold more than KEEP for a while. A session that reaches an unloaded engine gets EngineUnloaded from it."""
        sizes = {s: held_bytes(e) for s, e in self._engines.items()}
        for old in list(self._engines)[:-min(2, self.keep)]:
            if len(self._engines) <= self.keep and sum(sizes.values()) <= self.keep_bytes:
                break
            if old != newest and self._unload_if_idle(old):
                sizes.pop(old, None)

    def release_idle(self) -> list[Setup]:
        """Unload every engine no session is generating with, and say which: a page about to load engines of its
        own (the Quality page's five precisions) first hands back what the pool holds, so the process never holds
        both. The pages reload a session's current setup when it next needs it."""
        with self._lock:
            return [s for s in list(self._engines) if self._unload_if_idle(s)]

    def _unload_if_idle(self, setup: Setup) -> bool:
        """Unload `setup`'s engine unless it is generating now (its lock held); True when it was unloaded."""
        engine = self._engines[setup]
        lock = _lock_of(engine)
        if lock is not None and not lock.acquire(blocking=False):
            return False
        try:
            del self._engines[setup]
            engine.unload()
        finally:
            if lock is not None:
                lock.release()
        return True

    def get(self, setup: Setup):
        """The loaded engine for `setup`, or None (never loads)."""
        return self._engines.get(setup)

    def loaded(self) -> list[tuple[Setup, object]]:
        """Every loaded (setup, engine), the most recently used last."""
        return list(self._engines.items())
