"""On a GPU host, a Llama-shaped setup gets the fast CUDA-graph engine; the engine answers with timings."""
import pytest

from core.engines.base import GenerationParams
from core.engines.fast import fa3
from core.engines.factory import build_engine
from core.models import ModelSpec
from core.precision import KVDtype, Precision

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision,kv", [(Precision.BF16, KVDtype.AUTO), (Precision.FP8, KVDtype.AUTO),
                                          (Precision.FP8, KVDtype.FP8)])
def test_synthetic_llama_gets_the_fast_engine(precision, kv):
    engine = build_engine(ModelSpec("synthetic", "llama-3-8b"), precision, kv)
    try:
        assert engine.name == "torch-fast" and engine.ran.startswith("torch fast path (CUDA graphs")
        assert "norms folded into the linears at batch 1" in engine.ran  # 4096 wide: DecodeGraph folds them
        assert ("prompt GEMMs with FP8 fast accumulation" in engine.ran) == (precision is Precision.FP8)
        assert ("decode attention over the E4M3 cache in CUDA C++" in engine.ran) == (kv is KVDtype.FP8)
        fa3_why = fa3.why_not("cuda", 32, 8, 128)  # built by scripts/build_fa3.sh, or SDPA and the reason
        assert ("prompt attention through FlashAttention-3 (BF16)" if fa3_why is None else
                f"prompt attention through SDPA (cuDNN where it runs; FlashAttention-3: {fa3_why})") in engine.ran
        print(engine.ran)
        g = engine.generate(["hello"], GenerationParams(max_new_tokens=8, stop_at_eos=False))[0]
        assert len(g.token_ids) == 8 and g.decode_tok_s and g.ttft_s > 0
        print(f"{precision.value}: decode {g.decode_tok_s:.1f} tok/s, TTFT {g.ttft_s * 1000:.1f} ms")
        assert engine.memory_report().weights_bytes > 0
    finally:
        engine.unload()


def test_the_eager_engine_names_itself_and_its_gpu():
    from core.engines.torch.engine import TorchEngine

    engine = TorchEngine(ModelSpec("synthetic", "llama-3-8b"), Precision.BF16, KVDtype.AUTO)
    try:
        assert engine.ran == f"torch eager on {engine.device.name}" and "NVIDIA" in engine.ran
        engine.generate(["hello"], GenerationParams(max_new_tokens=4, stop_at_eos=False))
        report = engine.memory_report()
        assert report.peak_bytes >= report.weights_bytes and "CUDA" in report.peak_source
    finally:
        engine.unload()


def test_the_eager_engine_scores_over_its_kept_prompt_pass_on_cuda():
    """The precision compare's scoring over a generation's prompt pass, on CUDA: prompts of different lengths
    (prefilled apart, caches joined on the GPU), rows in another order; the same function as a full pass."""
    import numpy as np

    from core.engines.torch.engine import TorchEngine

    engine = TorchEngine(ModelSpec("synthetic", "llama-3-8b"), Precision.FP32, KVDtype.AUTO)
    try:
        prompts = ["a short prompt", "a long prompt, " * 40, "another short one"]
        gens, kept = engine.generate_keeping_prompt_pass(
            prompts, GenerationParams(max_new_tokens=5, top_logprobs=5, stop_at_eos=False))
        assert kept is not None and kept.cache.layers[0].keys.is_cuda
        rows = [1, 2, 0]
        conts = [gens[r].token_ids[:n] for r, n in zip(rows, (5, 3, 1))]
        for r, cont, s in zip(rows, conts, engine.score_after_prompt_pass(kept, rows, conts, top_k=5, full=True)):
            whole = engine.score(gens[r].prompt_ids, cont, top_k=5, full=True)
            assert np.abs(s.full_logprobs - whole.full_logprobs).max() < 1e-3
    finally:
        engine.unload()


def test_vllm_would_see_this_gpus_real_capability():
    """CUDA vLLM is not installed on the GPU machine: check the device the vLLM engine would read (real NVML) and
    the command line and rules it would get there."""
    from core.engines.vllm_engine import cuda_device, server_command
    from core.precision import unsupported_reasons

    device = cuda_device()
    assert device.kind == "cuda" and device.capability is not None and "NVIDIA" in device.name
    print(f"vLLM would run on {device.name}, compute capability {device.cc_text}")
    w8a8_ok = device.capability >= (8, 9)
    assert (not unsupported_reasons(Precision.FP8, KVDtype.AUTO, device, engine="vllm")) == w8a8_ok
    assert not unsupported_reasons(Precision.FP8_WEIGHT_ONLY, KVDtype.AUTO, device, engine="vllm")
    cmd = server_command("python", "/m", 8000, Precision.FP8_WEIGHT_ONLY, KVDtype.AUTO, served_name="m",
                         max_model_len=4096, cpu=False, kv_cache_bytes=None, gpu_memory_utilization=0.45)
    assert cmd[cmd.index("--linear-backend") + 1] == "marlin" and "0.45" in cmd


@pytest.mark.parametrize("precision", [Precision.INT8, Precision.INT8_WEIGHT_ONLY, Precision.INT4])
def test_integer_precisions_run_eagerly_on_cuda_and_say_which_kernel(precision):
    """The integer layers (core/engines/torch/quant.py) on the GPU through the eager engine ("torch-eager"; "torch"
    gives the fast path): they generate, store int8 / packed uint8, name the kernel that really ran (torch._int_mm
    pads decode's one row), and the label says such a run's speed is not representative."""
    from core.engines.factory import EngineChoice, open_engine
    from core.engines.torch import quant
    from core.engines.torch.engine import TorchEngine

    engine = open_engine(EngineChoice("torch-eager", ModelSpec("synthetic", "llama-3-8b"), precision, KVDtype.AUTO))
    try:
        assert isinstance(engine, TorchEngine) and "torch eager on NVIDIA" in engine.ran
        assert "eager GPU integer runs are not representative" in engine.ran
        g = engine.generate(["hello"], GenerationParams(max_new_tokens=4, stop_at_eos=False))[0]
        assert len(g.token_ids) == 4
        by_dtype = engine.memory_report().weights_by_dtype
        # Llama-3-8B's 7.0e9 quantized weights: a byte each at int8, half a byte (3.3 GiB) packed at int4
        stored = by_dtype.get("uint8" if precision.is_int4 else "int8", 0)
        assert stored > (3 if precision.is_int4 else 6) * 2**30
        ran = quant.kernels(engine.model)
        print(f"{precision.value}: kernels {ran}, decode {g.decode_tok_s:.1f} tok/s")
        assert ran and (precision is not Precision.INT8 or any("_int_mm" in k for k in ran))
    finally:
        engine.unload()


def test_the_engine_door_gives_the_fast_engine_and_its_scores_agree():
    """open_engine("torch") on a Llama shape is the fast engine; what features call through the door (score_many,
    window_logprobs, the HF side) gives the same numbers as its own score()."""
    import numpy as np

    from core.engines.factory import EngineChoice, open_engine

    engine = open_engine(EngineChoice("torch", "llama-3-8b", Precision.BF16))
    try:
        assert engine.name == "torch-fast" and engine.vocab_size == 128256
        ids = engine.encode("the engine door, " * 8)
        items = [(ids[:20], ids[20:28]), (ids[:50], ids[50:53])]
        batch = engine.score_many(items, top_k=5)
        for (p, c), s in zip(items, batch):
            one = engine.score(p, c, top_k=5, full=True)
            assert s.continuation_ids == c and np.allclose(s.full_logprobs, one.full_logprobs, atol=1e-5)
        lp, seconds = engine.window_logprobs(ids[:28], keep=9)  # positions 19..26 predict ids[20..27]
        assert lp.shape == (8, engine.vocab_size) and seconds > 0
        assert np.allclose(lp.cpu().numpy(), batch[0].full_logprobs, atol=2e-2)  # bf16 passes of other lengths
    finally:
        engine.unload()


@pytest.mark.parametrize("precision", [Precision.INT4, Precision.INT8_WEIGHT_ONLY, Precision.INT8])
def test_integer_precisions_get_the_fast_engine(precision):
    """On a GPU the door gives the weight-only integer precisions the fast path: its integer kernels, named in `ran`,
    the weights stored as the torch engine stores them. INT8 W8A8 is not routed yet (core/engines/fast/support.py):
    it gets the eager engine, labelled as not representative."""
    engine = build_engine(ModelSpec("synthetic", "llama-3-8b"), precision, KVDtype.AUTO)
    try:
        if precision is Precision.INT8:
            assert engine.name != "torch-fast" and "eager GPU integer runs are not representative" in engine.ran
            return
        assert engine.name == "torch-fast" and engine.ran.startswith("torch fast path (CUDA graphs")
        assert ("INT4 g128 linears in Triton" if precision.is_int4 else "INT8 weight-only linears in Triton") in engine.ran
        g = engine.generate(["hello"], GenerationParams(max_new_tokens=8, stop_at_eos=False))[0]
        assert len(g.token_ids) == 8 and g.decode_tok_s
        print(f"{precision.value}: decode {g.decode_tok_s:.1f} tok/s, TTFT {g.ttft_s * 1000:.1f} ms; {engine.ran}")
        stored = engine.memory_report().weights_by_dtype.get("uint8" if precision.is_int4 else "int8", 0)
        assert stored > (3 if precision.is_int4 else 6) * 2**30
    finally:
        engine.unload()
