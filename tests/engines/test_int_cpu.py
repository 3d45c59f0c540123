"""The integer layers' CPU kernel (core/engines/torch/int_cpu.py) against their torch ops: the same bf16 weights bit for bit; the
few-row GEMV the same products as F.linear on them (summed in another order); float32 GEMMs of the same values for
many rows where the CPU has no bf16 GEMM; and the same tokens on the real embedded model."""
import pytest
import torch
from torch.nn import functional as F

from core.engines.torch import cbuild, int_cpu, quant
from core.engines.base import GenerationParams
from tests.engines.ties import assert_same_tokens_until_a_tie

pytestmark = pytest.mark.skipif(not int_cpu.available(), reason=f"no INT CPU kernel here: {int_cpu.why_not()}")


def _linear(n_out, n_in, seed=0):
    torch.manual_seed(seed)
    lin = torch.nn.Linear(n_in, n_out, bias=False)
    lin.weight.data.normal_(0, 0.05)
    lin.weight.data[:, 3] *= 40  # an outlier input channel, as AWQ's scales are for
    return lin


@pytest.mark.parametrize("n_in", [640, 200])  # 200: the last group is zero-padded
@pytest.mark.parametrize("awq", [False, True])
def test_int4_weights_are_the_torch_ops_bits(n_in, awq):
    lin = _linear(96, n_in)
    scale = torch.rand(n_in) * 3 + 0.05 if awq else None
    layer = quant.Int4Linear(lin, scale)
    ref = layer.dequantized(torch.bfloat16)
    args = (layer.weight_packed, layer.weight_scales, layer.weight_zeros, layer.input_scale, n_in)
    assert torch.equal(int_cpu.int4_weights(*args), ref)
    assert torch.equal(int_cpu.int4_weights(*args, as_float32=True), ref.float())


def test_int8_weights_are_the_torch_ops_bits():
    layer = quant.Int8Linear(_linear(96, 330), w8a8=False)
    ref = layer.dequantized(torch.bfloat16)
    assert torch.equal(int_cpu.int8_weights(layer.weight_int8, layer.weight_scale), ref)
    assert torch.equal(int_cpu.int8_weights(layer.weight_int8, layer.weight_scale, as_float32=True), ref.float())


def _within_one_bf16_step(got, ref):
    """bf16 results of the same products summed in other orders: equal, or one bf16 step apart."""
    step = ref.float().abs().clamp(min=1e-30) * 2.0 ** -7
    assert bool(((got.float() - ref.float()).abs() <= step).all())
    return float((got == ref).float().mean())


@pytest.mark.parametrize("n_in", [640, 200])
@pytest.mark.parametrize("awq", [False, True])
@pytest.mark.parametrize("rows", [1, 3, 8])
def test_int4_gemv_is_f_linear_on_the_same_weights(n_in, awq, rows):
    layer = quant.Int4Linear(_linear(160, n_in), torch.rand(n_in) * 3 + 0.05 if awq else None)
    torch.manual_seed(2)
    x = torch.randn(rows, n_in).bfloat16()
    got = int_cpu.int4_gemv(x, layer.weight_packed, layer.weight_scales, layer.weight_zeros, layer.input_scale, n_in)
    assert _within_one_bf16_step(got, F.linear(x, layer.dequantized(torch.bfloat16))) > 0.99


@pytest.mark.parametrize("rows", [1, 5])
def test_int8_gemv_is_f_linear_on_the_same_weights(rows):
    layer = quant.Int8Linear(_linear(160, 320), w8a8=False)
    torch.manual_seed(3)
    x = torch.randn(rows, 320).bfloat16()
    got = int_cpu.int8_gemv(x, layer.weight_int8, layer.weight_scale)
    assert _within_one_bf16_step(got, F.linear(x, layer.dequantized(torch.bfloat16))) > 0.99


@pytest.mark.parametrize("make", [lambda lin: quant.Int4Linear(lin), lambda lin: quant.Int8Linear(lin, w8a8=False)])
def test_layers_give_the_torch_ops_products(make):
    layer = make(_linear(256, 640))
    assert layer.kernel.startswith("C GEMV from the codes")
    torch.manual_seed(1)
    few, several = torch.randn(2, 4, 640).bfloat16(), torch.randn(3, 7, 640).bfloat16()  # 8 rows: GEMV; 21: GEMM
    got_few, got_several = layer(few), layer(several)
    with int_cpu.turned_off():
        ref_few, ref_several = layer(few), layer(several)
        assert layer.kernel == layer.TORCH_KERNEL
    assert got_few.shape == (2, 4, 256) and got_several.shape == (3, 7, 256)
    _within_one_bf16_step(got_few, ref_few)
    w = layer.dequantized(torch.bfloat16)
    if cbuild.packs_bf16():
        assert torch.equal(got_several, ref_several)  # the same weights through the same F.linear
    else:  # a float32 GEMM of the same bf16 values, rounded once: a bf16 GEMM's arithmetic, in another order
        assert torch.equal(got_several, F.linear(several.float(), w.float()).bfloat16())
        _within_one_bf16_step(got_several, ref_several)


def test_weight_buffers_are_reused_per_shape_and_thread():
    layer = quant.Int8Linear(_linear(64, 128), w8a8=False)
    a = int_cpu.int8_weights(layer.weight_int8, layer.weight_scale)
    b = int_cpu.int8_weights(layer.weight_int8, layer.weight_scale)
    assert a.data_ptr() == b.data_ptr()  # no fresh allocation (and its page faults) per call


@pytest.mark.parametrize("precision", ["int4", "int8-wo"])
def test_embedded_model_gives_the_torch_ops_tokens(engine_cache, precision):
    e = engine_cache(precision)
    assert "integer weights dequantized in C" in e.ran
    params = GenerationParams(max_new_tokens=8, top_logprobs=5, stop_at_eos=False)
    prompts = ["The capital of France is", "def fibonacci(n):"]
    fast = e.generate(prompts, params)
    with int_cpu.turned_off():
        slow = e.generate(prompts, params)
        assert "dequantized by torch ops" in e.ran
    # the same weights, the products summed in other orders (GEMV, float32 GEMMs where the CPU has no bf16 GEMM):
    # a parting at a near-tie is allowed
    assert assert_same_tokens_until_a_tie(fast, slow) <= 1


@pytest.mark.parametrize("make", [lambda lin: quant.Int4Linear(lin), lambda lin: quant.Int8Linear(lin, w8a8=False)])
def test_a_layer_with_a_bias_takes_the_dequantized_weights(make):
    lin = torch.nn.Linear(100, 48).bfloat16()  # a bias the GEMV does not add; 100 inputs, not a multiple of 16
    layer = make(lin)
    assert layer.kernel.startswith("weights dequantized in C")
    x = torch.randn(2, 100).bfloat16()
    got = layer(x)
    with int_cpu.turned_off():
        ref = layer(x)
    _within_one_bf16_step(got, ref)
