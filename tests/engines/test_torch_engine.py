"""The torch engine on the real embedded model (Gemma 3 270M) on the CPU. No mocks, no golden FP8 strings."""
import json
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from core.engines import base
from core.engines.torch import fp8
from core.engines.base import Cancelled, GenerationParams, length_groups
from core.engines.torch.engine import PREFILL_PAD_TOKENS, TorchEngine
from core.errors import InputError
from core.models import REFERENCE_CONTINUATION, REFERENCE_PROMPT, ModelSpec
from core.precision import KVDtype, Precision
from tests.conftest import ROOT

GREEDY = GenerationParams(max_new_tokens=12, top_logprobs=5)
PROMPTS = ["The capital of France is", "def fibonacci(n):", "What is 123 * 456?"]


def top1_agreement(a, b) -> float:
    """Share of positions where two teacher-forced scores have the same most likely token."""
    same = [max(x, key=x.get) == max(y, key=y.get) for x, y in zip(a.top_logprobs, b.top_logprobs)]
    return sum(same) / len(same)


def test_reference_continuation_at_fp32(engine_cache):
    gen = engine_cache("fp32").generate([REFERENCE_PROMPT], GREEDY)[0]
    assert gen.text.startswith(REFERENCE_CONTINUATION)


def test_fp32_against_itself_is_identical(engine_cache):
    e = engine_cache("fp32")
    a, b = e.generate(PROMPTS, GREEDY), e.generate(PROMPTS, GREEDY)
    assert [g.token_ids for g in a] == [g.token_ids for g in b]
    sa = e.score(a[0].prompt_ids, a[0].token_ids)
    sb = e.score(a[0].prompt_ids, a[0].token_ids)
    assert sa.target_logprobs == sb.target_logprobs


def test_batch_rows_match_single_prompts(engine_cache):
    e = engine_cache("fp32")
    batch = e.generate(PROMPTS, GREEDY)
    for prompt, g in zip(PROMPTS, batch):
        assert e.generate([prompt], GREEDY)[0].token_ids == g.token_ids


LONG_PROMPT = " ".join(f"Item {i}: the {w} report is filed." for i, w in enumerate(["annual", "weekly", "final"] * 30))


def test_prompts_of_different_lengths_prefill_apart_and_decode_as_one_batch(engine_cache):
    """A 986-token prompt (past the 512-token sliding window) and two short ones: prefilled in separate passes, their
    caches joined row by row, decoded together. Each row generates what that prompt generates alone. (In FP32: with
    bf16 activations, or an FP8 KV cache, the rounding of a row already depends on the rows beside it, joined or not.)"""
    e = engine_cache("fp32")
    prompts = [PROMPTS[0], LONG_PROMPT + " Summarize the items:", PROMPTS[1]]
    params = GenerationParams(max_new_tokens=8, top_logprobs=5, stop_at_eos=False)
    assert len(length_groups([len(e.encode(p)) for p in prompts], pad_tokens=PREFILL_PAD_TOKENS)) == 2
    batch = e.generate(prompts, params)
    for prompt, g in zip(prompts, batch):
        alone = e.generate([prompt], params)[0]
        assert g.token_ids == alone.token_ids
        for a, b in zip(g.top_logprobs, alone.top_logprobs):
            assert a.keys() == b.keys() and max(abs(a[t] - b[t]) for t in a) < 1e-4


@pytest.mark.parametrize("precision,kv", [("fp32", "auto"), ("bf16", "fp8")])
def test_joined_cache_holds_each_groups_own_rows(engine_cache, precision, kv):
    """The joined cache is each group's cache, row for row, left-padded with zeros; also for the E4M3 cache with its
    scales. The logits are each group's own."""
    e = engine_cache(precision, kv)
    ids = [e.encode(p) for p in (PROMPTS[0], LONG_PROMPT, PROMPTS[1])]
    groups = [[1], [0, 2]]
    logits, joined = e._prefill_groups(ids, groups, pad=0)
    for group in groups:
        own_logits, own = e._prefill_groups([ids[i] for i in group], [list(range(len(group)))], pad=0)
        for layer, own_layer in zip(joined.layers, own.layers):
            pairs = ([(layer.k.q.view(torch.uint8), own_layer.k.q.view(torch.uint8)), (layer.k.scale, own_layer.k.scale),
                      (layer.v.q.view(torch.uint8), own_layer.v.q.view(torch.uint8)), (layer.v.scale, own_layer.v.scale)]
                     if kv == "fp8" else [(layer.keys, own_layer.keys), (layer.values, own_layer.values)])
            for big, small in pairs:
                n = small.shape[-2]
                assert torch.equal(big[group, :, -n:], small) and not big[group, :, :-n].any()
        assert torch.equal(logits[group], own_logits)


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_scores_after_the_kept_prompt_pass_match_a_full_pass(engine_cache, kv):
    """Scoring over the cache a generation's prompt pass left (only the continuation runs; the long prompt, past the
    sliding window, was prefilled apart from the short ones) gives what one pass over prompt + continuation gives:
    rows in another order, continuations of different lengths, one of a single token; also with the E4M3 cache."""
    e = engine_cache("fp32", kv)
    prompts = [PROMPTS[0], LONG_PROMPT, PROMPTS[2]]
    params = GenerationParams(max_new_tokens=6, top_logprobs=5, stop_at_eos=False)
    gens, kept = e.generate_keeping_prompt_pass(prompts, params)
    assert [g.token_ids for g in gens] == [g.token_ids for g in e.generate(prompts, params)]
    rows = [2, 0, 1]
    conts = [gens[r].token_ids[:n] for r, n in zip(rows, (6, 1, 4))]
    after = e.score_after_prompt_pass(kept, rows, conts, top_k=5, full=True)
    for r, cont, s in zip(rows, conts, after):
        whole = e.score(gens[r].prompt_ids, cont, top_k=5, full=True)
        assert s.continuation_ids == cont and len(s.target_logprobs) == len(cont)
        p = np.exp(whole.full_logprobs.astype(np.float64))
        kl = (p * (whole.full_logprobs - s.full_logprobs)).sum(axis=1)
        # an E4M3 cache turns float32 rounding differences (rows padded beside others) into a different E4M3 value
        # now and then, here KL 8e-5 at most; without it the pass agrees to float32 rounding
        assert kl.max() < 1e-3 and (kv == "fp8" or np.abs(s.full_logprobs - whole.full_logprobs).max() < 1e-3)
        assert [max(d, key=d.get) for d in s.top_logprobs] == [max(d, key=d.get) for d in whole.top_logprobs]
    again = e.score_after_prompt_pass(kept, rows, conts, top_k=5, full=True)  # the kept pass is left as it was
    assert all(np.array_equal(a.full_logprobs, b.full_logprobs) for a, b in zip(after, again))
    with pytest.raises(InputError, match="non-empty continuation"):
        e.score_after_prompt_pass(kept, [0], [[]])


def test_a_prompt_pass_too_big_to_copy_is_not_kept_and_the_compare_scores_anyway(engine_cache, monkeypatch):
    """With too little free memory for a copy of the cache, no prompt pass is kept and the compare scores with full
    passes, to the same numbers as over a kept pass (FP32: equal to float rounding)."""
    from core.compare import run as cp
    from core.engines.torch import engine as torch_engine

    e = engine_cache("fp32")
    params = GenerationParams(max_new_tokens=4, top_logprobs=5, stop_at_eos=False)
    kept_result = cp.compare(e, e, PROMPTS[:2], max_new_tokens=4, top_k=5)
    monkeypatch.setattr(torch_engine, "available_bytes", lambda device: 1000)
    assert e.generate_keeping_prompt_pass(PROMPTS[:2], params)[1] is None
    full_result = cp.compare(e, e, PROMPTS[:2], max_new_tokens=4, top_k=5)
    for a, b in zip(kept_result.prompts, full_result.prompts):
        assert a.ref_ids == b.ref_ids and a.tf.top1_agree == b.tf.top1_agree
        for da, db in zip(a.ref_tf_topk, b.ref_tf_topk):
            assert da.keys() == db.keys() and max(abs(da[t] - db[t]) for t in da) < 1e-4


def test_fp8_weights_are_e4m3_and_lm_head_embeddings_stay_base(engine_cache):
    e = engine_cache("fp8")
    linears = [m for m in e.model.modules() if isinstance(m, fp8.FP8Linear)]
    assert linears and all(m.weight_fp8.dtype == torch.float8_e4m3fn for m in linears)
    assert all(m.w8a8 for m in linears)
    assert e.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert e.model.lm_head.weight.dtype == torch.bfloat16
    assert not any(isinstance(m, torch.nn.Linear) for n, m in e.model.named_modules() if n != "lm_head")
    assert e.memory_report().weights_by_dtype["float8_e4m3fn"] > 0


@pytest.mark.parametrize("candidate", ["fp8", "fp8-wo", "bf16"])
def test_lower_precisions_differ_from_fp32_but_agree_on_top_token(engine_cache, candidate):
    ref, cand = engine_cache("fp32"), engine_cache(candidate)
    agreements = []
    for g in ref.generate(PROMPTS, GenerationParams(max_new_tokens=16)):
        s_ref = ref.score(g.prompt_ids, g.token_ids)
        s_cand = cand.score(g.prompt_ids, g.token_ids)
        assert s_ref.target_logprobs != s_cand.target_logprobs  # the numerics really changed
        agreements.append(top1_agreement(s_ref, s_cand))
    assert sum(agreements) / len(agreements) >= 0.8


def test_fp8_kv_cache_halves_cache_bytes_and_agrees(engine_cache):
    auto, kv8 = engine_cache("bf16"), engine_cache("bf16", "fp8")
    a = auto.generate(PROMPTS[:1], GenerationParams(max_new_tokens=16))[0]
    b = kv8.generate(PROMPTS[:1], GenerationParams(max_new_tokens=16))[0]
    assert 0.4 < kv8.last_kv_bytes / auto.last_kv_bytes < 0.6  # E4M3 plus one fp32 scale per 256-wide head row
    assert sum(x == y for x, y in zip(a.token_ids, b.token_ids)) / len(a.token_ids) >= 0.5


def test_timings_logprobs_and_streaming(engine_cache):
    e = engine_cache("fp32")
    events = []
    g = e.generate([PROMPTS[0]], GREEDY, on_step=events.append)[0]
    assert len(g.token_times) == len(g.token_ids) == len(g.top_logprobs) == len(events)
    assert all(b >= a for a, b in zip(g.token_times, g.token_times[1:])) and g.ttft_s > 0
    assert len(g.itl_s) == len(g.token_ids) - 1
    assert all(len(top) == 5 and g.token_ids[i] in top for i, top in enumerate(g.top_logprobs))  # greedy = argmax
    assert events[-1].texts[0] == g.text and len(events[0].texts[0]) <= len(g.text)


def test_sampling_is_reproducible_with_a_seed(engine_cache):
    e = engine_cache("fp32")
    p = GenerationParams(max_new_tokens=8, temperature=1.0, top_p=0.9, seed=7)
    assert e.generate([PROMPTS[0]], p)[0].token_ids == e.generate([PROMPTS[0]], p)[0].token_ids


def test_cancel_and_bad_input_give_clear_errors(engine_cache):
    e = engine_cache("fp32")
    with pytest.raises(Cancelled):
        e.generate([PROMPTS[0]], GREEDY, should_stop=lambda: True)
    with pytest.raises(ValueError, match="empty"):
        e.generate([""], GREEDY)
    with pytest.raises(ValueError, match="at most"):
        e.generate([[5] * 40000], GREEDY)
    with pytest.raises(ValueError, match="max_new_tokens"):
        e.generate([PROMPTS[0]], GenerationParams(max_new_tokens=-3))


def test_model_that_does_not_fit_is_refused_before_loading():
    with pytest.raises(Exception, match="needs about .* GiB"):
        TorchEngine(ModelSpec("synthetic", "llama-3-70b"), Precision.BF16, KVDtype.AUTO, device="cpu")


def test_cli_generate_json():
    out = subprocess.run(
        [sys.executable, "-m", "diagnostics", "generate", "--model", "embedded", "--precision", "fp8",
         "--prompt", REFERENCE_PROMPT, "--max-new-tokens", "6", "--json"],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout.strip().splitlines()[-1])
    assert data["precision"] == "fp8" and len(data["token_ids"]) == 6
    assert len(data["top_logprobs"]) == 6 and data["timing"]["ttft_s"] > 0


def test_cli_rejects_unknown_precision():
    out = subprocess.run([sys.executable, "-m", "diagnostics", "generate", "--precision", "fp9", "--prompt", "x"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "choose one of" in out.stderr


def test_the_pool_never_unloads_a_generating_engine_and_an_unloaded_one_says_so(monkeypatch):
    """Real threads on the real model: a fourth load while a session generates does not pull the weights from under
    it (it once died with a TypeError); once idle it is unloaded, and a session still holding it gets a clear
    TriageError instead."""
    import threading

    from core.engines import factory
    from core.engines.base import EngineUnloaded
    from core.engines.pool import EnginePool, Setup
    from core.errors import TriageError

    real = TorchEngine(ModelSpec("embedded"), Precision.FP32, device="cpu")  # its own: this test unloads it

    class Stub:  # the other setups only need to exist
        lock = None

        def unload(self):
            pass

    monkeypatch.setattr(factory, "build_engine", lambda spec, precision, kv_dtype, progress=None:
                        real if precision is Precision.FP32 else Stub())
    pool = EnginePool(keep=1)
    assert pool.load(Setup(ModelSpec("embedded"), Precision.FP32)) is real
    out, errors = [], []

    def session():
        try:
            out.extend(real.generate([REFERENCE_PROMPT], GenerationParams(max_new_tokens=48, stop_at_eos=False)))
        except Exception as exc:  # recorded, so the main thread's assertions report it
            errors.append(exc)

    t = threading.Thread(target=session)
    t.start()
    for _ in range(2000):  # until the session holds the engine's lock
        if real.lock.locked():
            break
        threading.Event().wait(0.005)
    assert real.lock.locked()
    pool.load(Setup(ModelSpec("embedded"), Precision.BF16))  # beyond keep, while FP32 generates
    assert real.model is not None and pool.get(Setup(ModelSpec("embedded"), Precision.FP32)) is real
    t.join(120)
    assert not errors and len(out[0].token_ids) == 48
    pool.load(Setup(ModelSpec("embedded"), Precision.FP16))  # FP32 is idle now: unloaded
    assert real.model is None and pool.get(Setup(ModelSpec("embedded"), Precision.FP32)) is None
    for call in (lambda: real.generate([REFERENCE_PROMPT], GenerationParams(max_new_tokens=4)),
                 lambda: real.score([2, 651], [6037]), real.memory_report):
        with pytest.raises(EngineUnloaded) as err:
            call()
        assert isinstance(err.value, TriageError) and "unloaded" in str(err.value) and "Load it again" in str(err.value)


def test_fp8_fit_check_counts_the_bf16_load_peak(monkeypatch):
    """FP8 weights load at BF16 and are quantized afterwards: a GPU or host with room for the FP8 weights but not for
    the BF16 load is refused before loading, with both numbers. The free-memory reading is the one injected value: no
    machine here has a size between the two."""
    from core.engines.torch import engine as te
    from core.models import synthetic_config

    config = synthetic_config("llama-3-8b")
    settled, peak = te.count_weight_bytes(config, Precision.FP8), te.load_peak_bytes(config, Precision.FP8)
    assert peak >= te.count_weight_bytes(config, Precision.BF16) > 1.7 * settled  # about twice, not the FP8 size
    between = int((settled + peak) / 2 / 0.85)
    monkeypatch.setattr(te, "available_bytes", lambda device: between)
    with pytest.raises(te.EngineError, match="loading peaks at about") as exc:
        TorchEngine(ModelSpec("synthetic", "llama-3-8b"), Precision.FP8, KVDtype.AUTO, device="cpu")
    assert f"{settled / 2**30:.1f} GiB" in str(exc.value) and f"{peak / 2**30:.1f} GiB" in str(exc.value)
    assert te.fit_problem(ModelSpec("synthetic", "llama-3-8b"), config, Precision.FP8, te.current_device("cpu"),
                          int(peak / 0.85) + 1) is None


def test_peak_memory_is_the_runs_own_not_the_processes_high_water_mark(engine_cache):
    """On the CPU the reported peak is this run's, sampled: a short run after a long one reports less, and memory
    the process held before the run (another session's model) is not in it."""
    e = engine_cache("bf16")
    params = GenerationParams(max_new_tokens=2, top_logprobs=0)
    e.generate([[5] * 3000], params)
    long_peak = e.memory_report()
    held = torch.ones(256 * 2**20 // 4)  # 256 MiB held across the next run, as another model would be
    e.generate([PROMPTS[0]], params)
    short_peak = e.memory_report()
    del held
    assert "sampled" in long_peak.peak_source and long_peak.peak_bytes > 0
    assert short_peak.peak_bytes < long_peak.peak_bytes and short_peak.peak_bytes < 256 * 2**20


def test_run_peak_counts_what_the_run_allocates():
    from core.telemetry.run_peak import RunPeakRss

    before = b"\x01" * (128 * 2**20)  # held before: not the run's
    with RunPeakRss() as peak:
        during = b"\x02" * (96 * 2**20)
        time.sleep(0.05)  # a run lasts longer than the sampling period; this one held the GIL while it allocated
        del during
    assert 80 * 2**20 <= peak.bytes < 128 * 2**20 + 96 * 2**20
    del before


@pytest.mark.parametrize("kv", ["auto", "fp8"])
def test_chunked_prefill_gives_the_logits_of_one_pass(engine_cache, kv, monkeypatch):
    """A 900-token prompt (past the 512-token sliding window) prefilled in chunks of 128 tokens gives the last
    positions' logits of one pass over it, to float32 rounding. With an E4M3 cache a float32 rounding difference now
    and then lands on another E4M3 value, as in the kept-pass test above: over 18 layers and 900 tokens that moves
    tokens far down the ranking by a few tenths of a nat, so there the distributions are compared by KL."""
    from core.engines.torch import engine as torch_engine
    from core.engines.torch.kv import make_cache

    e = engine_cache("fp32", kv)
    ids = torch.tensor([e.encode(LONG_PROMPT)])
    assert ids.shape[1] > e.config.sliding_window
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        whole = e._forward(ids, mask, make_cache(e.config, e.kv_dtype), 0, 4)
        monkeypatch.setattr(torch_engine, "PREFILL_CHUNK", 128)
        seen = []
        with base.controlled(base.RunControl(on_prefill=lambda done, total: seen.append((done, total)))):
            chunked = e._prefill(ids, mask, make_cache(e.config, e.kv_dtype), 0, 4)
    assert len(seen) > 5 and seen[-1] == (ids.shape[1], ids.shape[1])
    lw, lc = torch.log_softmax(whole.float(), -1), torch.log_softmax(chunked.float(), -1)
    assert torch.equal(lw.argmax(-1), lc.argmax(-1))
    kl = (lw.exp() * (lw - lc)).sum(-1)
    assert kl.max() < 1e-2 and (kv == "fp8" or (lw - lc).abs().max() < 1e-3), kl
    with torch.inference_mode():  # the same chunks give the same bits on every run (the compare's metrics rest on it)
        again = e._prefill(ids, mask, make_cache(e.config, e.kv_dtype), 0, 4)
    assert torch.equal(chunked, again)


def test_a_prefill_keeps_every_asked_position_whatever_its_chunks(engine_cache, monkeypatch):
    # a prompt one chunk and a few tokens long, keeping more positions than the last chunk would hold
    from core.engines.torch import engine as torch_engine

    e = engine_cache("fp32")
    monkeypatch.setattr(torch_engine, "PREFILL_CHUNK", 16)
    prompt, cont = e.encode(LONG_PROMPT)[:12], list(range(100, 110))
    assert len(e.score(prompt, cont).target_logprobs) == len(cont)


def test_a_stop_lands_between_prefill_chunks_and_frees_the_engine(engine_cache):
    """A stop asked after the first prefill chunk raises Cancelled before the prompt is through, dated to the stop,
    and the engine's lock is free at once for the next run."""
    e = engine_cache("fp32")
    seen = []
    control = base.RunControl(should_stop=lambda: bool(seen), on_prefill=lambda done, total: seen.append(done))
    with base.controlled(control), pytest.raises(Cancelled):
        e.generate([LONG_PROMPT * 3], GenerationParams(max_new_tokens=4))
    assert len(seen) == 1 and seen[0] < len(e.encode(LONG_PROMPT * 3))
    assert control.stopped_at is not None and not e.lock.locked()
    with base.controlled(control), pytest.raises(Cancelled):  # scoring (the needle test) stops the same way
        e.score(e.encode(LONG_PROMPT * 3), [5, 6])
    assert e.generate([PROMPTS[0]], GenerationParams(max_new_tokens=2))[0].token_ids
