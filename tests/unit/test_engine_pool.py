"""The engine pool (core/engines/pool.py): one load per setup, the least recently used unloaded beyond KEEP, and
one load at a time. Loading is the factory's job, tested on the real model elsewhere; here it is a stand-in that
records what the pool asked of it."""
from __future__ import annotations

import threading
import time

import pytest

from core.engines import factory
from core.engines.pool import KEEP, EnginePool, Setup
from core.models import ModelSpec
from core.precision import KVDtype, Precision


class Loaded:
    def __init__(self, precision):
        self.precision, self.unloaded = precision, False

    def unload(self):
        self.unloaded = True


@pytest.fixture
def built(monkeypatch):
    calls = []

    def build(spec, precision, kv_dtype, progress=None):
        calls.append(precision)
        time.sleep(0.05)  # long enough for a second thread to arrive while the first loads
        return Loaded(precision)

    monkeypatch.setattr(factory, "build_engine", build)
    return calls


def setup(precision: Precision, kv: KVDtype = KVDtype.AUTO) -> Setup:
    return Setup(ModelSpec("embedded"), precision, kv)


def test_a_setup_loads_once_and_is_reused(built):
    pool = EnginePool()
    first = pool.load(setup(Precision.BF16))
    assert pool.load(setup(Precision.BF16)) is first and pool.get(setup(Precision.BF16)) is first
    assert built == [Precision.BF16]
    assert pool.get(setup(Precision.FP32)) is None and built == [Precision.BF16]  # get never loads


def test_beyond_keep_the_least_recently_used_is_unloaded(built):
    pool = EnginePool()
    assert KEEP == 3
    bf16, fp32, fp8 = (pool.load(setup(p)) for p in (Precision.BF16, Precision.FP32, Precision.FP8))
    pool.load(setup(Precision.BF16))  # used again: FP32 is now the oldest
    fp16 = pool.load(setup(Precision.FP16))
    assert fp32.unloaded and pool.get(setup(Precision.FP32)) is None
    assert not any(e.unloaded for e in (bf16, fp8, fp16))


def test_two_sessions_asking_at_once_share_one_load(built):
    pool = EnginePool()
    got = []
    threads = [threading.Thread(target=lambda: got.append(pool.load(setup(Precision.BF16)))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert built == [Precision.BF16] and got[0] is got[1]
