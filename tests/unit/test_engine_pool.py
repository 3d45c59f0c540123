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


# --- eviction under the engine's own lock (#15) ---------------------------------------------------------------------

class Generating:
    """An engine with a lock, as the torch engines have: a generation holds it from start to end."""

    def __init__(self, precision):
        self.precision, self.lock, self.model, self.unloaded = precision, threading.Lock(), object(), False

    def generate(self, started: threading.Event, finish: threading.Event) -> bool:
        with self.lock:
            started.set()
            assert finish.wait(10)
            return self.model is not None  # the weights were there for the whole generation

    def unload(self):
        self.model, self.unloaded = None, True


@pytest.fixture
def generating(monkeypatch):
    monkeypatch.setattr(factory, "build_engine", lambda spec, precision, kv_dtype, progress=None: Generating(precision))


def generate_in_thread(engine):
    started, finish, out = threading.Event(), threading.Event(), []
    t = threading.Thread(target=lambda: out.append(engine.generate(started, finish)))
    t.start()
    assert started.wait(10)
    return t, finish, out


def test_a_busy_engine_is_not_evicted_from_under_its_generation(generating):
    pool = EnginePool()
    bf16, fp32, fp8 = (pool.load(setup(p)) for p in (Precision.BF16, Precision.FP32, Precision.FP8))
    t, finish, out = generate_in_thread(bf16)  # the least recently used is generating
    fp16 = pool.load(setup(Precision.FP16))
    assert not bf16.unloaded and fp32.unloaded  # the oldest idle one went instead
    assert [pool.get(setup(p)) for p in (Precision.BF16, Precision.FP8, Precision.FP16)] == [bf16, fp8, fp16]
    finish.set()
    t.join(10)
    assert out == [True]


def test_when_every_older_engine_is_busy_the_pool_waits_for_a_later_load(generating):
    pool = EnginePool()
    engines = [pool.load(setup(p)) for p in (Precision.BF16, Precision.FP32, Precision.FP8)]
    running = [generate_in_thread(e) for e in engines]
    pool.load(setup(Precision.FP16))  # nothing idle to unload: four stay loaded, none pulled mid-generation
    assert not any(e.unloaded for e in engines)
    assert all(pool.get(setup(p)) for p in (Precision.BF16, Precision.FP32, Precision.FP8, Precision.FP16))
    for t, finish, out in running:
        finish.set()
        t.join(10)
        assert out == [True]
    pool.load(setup(Precision.FP8, KVDtype.FP8))  # now idle: back down to KEEP, least recently used first
    assert [e.unloaded for e in engines] == [True, True, False]


def test_release_idle_unloads_every_engine_but_the_one_generating(generating):
    """The Quality page hands back the pool's engines before loading its own five: the app never holds both sets."""
    pool = EnginePool()
    bf16, fp32, fp8 = (pool.load(setup(p)) for p in (Precision.BF16, Precision.FP32, Precision.FP8))
    t, finish, out = generate_in_thread(fp32)
    assert pool.release_idle() == [setup(Precision.BF16), setup(Precision.FP8)]
    assert bf16.unloaded and fp8.unloaded and not fp32.unloaded and pool.get(setup(Precision.FP32)) is fp32
    finish.set()
    t.join(10)
    assert out == [True] and pool.release_idle() == [setup(Precision.FP32)] and fp32.unloaded
    assert pool.load(setup(Precision.BF16)) is not bf16  # loaded again when next asked for


def test_a_run_waiting_for_an_engine_hears_how_long_and_can_give_up():
    from core.engines.base import Cancelled, RunControl, check_stop, controlled
    from core.engines.pool import wait_until_free

    engine = Loaded(Precision.BF16)
    engine.lock = threading.Lock()
    engine.lock.acquire()  # another run holds it
    threading.Timer(0.5, engine.lock.release).start()
    waited: list[float] = []
    wait_until_free(engine, waited.append, poll_s=0.1)
    assert waited and waited == sorted(waited) and not engine.lock.locked()  # counted up, then free

    engine.lock.acquire()
    with controlled(RunControl(should_stop=lambda: len(waited) > 8)), pytest.raises(Cancelled):
        wait_until_free(engine, waited.append, poll_s=0.05, check=check_stop)  # a stop while waiting ends the wait
    engine.lock.release()
    wait_until_free(Loaded(Precision.FP32), waited.append)  # a server engine has no lock: nothing to wait for
