"""Precision rules and E4M3 numerics (pure; no model)."""
import pytest
import torch

from core.engines.torch import fp8
from core.models import ModelError, parse_model
from core.precision import Device, KVDtype, Precision, parse_precision, unsupported_reasons

A100 = Device("cuda", "NVIDIA A100", (8, 0))
H200 = Device("cuda", "NVIDIA H200", (9, 0))
T4 = Device("cuda", "Tesla T4", (7, 5))


def test_fp8_w8a8_needs_89_and_says_what_to_use():
    reasons = unsupported_reasons(Precision.FP8, KVDtype.AUTO, A100)
    assert len(reasons) == 1 and ">= 8.9" in reasons[0] and "found 8.0" in reasons[0] and "weight-only" in reasons[0]
    assert unsupported_reasons(Precision.FP8, KVDtype.FP8, H200) == []
    assert unsupported_reasons(Precision.FP8_WEIGHT_ONLY, KVDtype.AUTO, A100) == []
    assert unsupported_reasons(Precision.FP8, KVDtype.AUTO, Device()) == []  # torch._scaled_mm runs on the CPU


def test_bf16_needs_ampere():
    assert "8.0" in unsupported_reasons(Precision.BF16, KVDtype.AUTO, T4)[0]


def test_vllm_cpu_refuses_fp8_weights_but_not_fp8_kv():
    assert "static_scaled_fp8_quant" in unsupported_reasons(Precision.FP8, KVDtype.AUTO, Device(), "vllm-cpu")[0]
    assert unsupported_reasons(Precision.BF16, KVDtype.FP8, Device(), "vllm-cpu") == []


def test_parse_precision_lists_choices():
    assert parse_precision("FP8") is Precision.FP8
    with pytest.raises(ValueError, match="fp8-wo"):
        parse_precision("int3")


def test_quantize_rows_scales_to_e4m3_max():
    x = torch.randn(16, 64) * torch.logspace(-3, 3, 16)[:, None]
    q, s = fp8.quantize_rows(x)
    assert q.dtype == torch.float8_e4m3fn and s.shape == (16, 1)
    assert torch.allclose(q.float().abs().amax(dim=1), torch.full((16,), 448.0))
    rel = (fp8.dequantize(q, s, torch.float32) - x).abs() / x.abs().amax(dim=1, keepdim=True)
    assert rel.max() < 2 ** -4  # 3 mantissa bits: half an ulp at the top of the range is 1/16


@pytest.mark.parametrize("w8a8", [True, False])
def test_fp8_linear_close_to_float_linear(w8a8):
    torch.manual_seed(0)
    lin = torch.nn.Linear(256, 512, bias=True)
    x = torch.randn(2, 3, 256)
    got, ref = fp8.FP8Linear(lin, w8a8)(x), lin(x)
    assert got.shape == ref.shape
    assert ((got - ref).norm() / ref.norm()) < 0.06


def test_not_a_gguf_and_wrong_paths(tmp_path):
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 not a gguf")
    with pytest.raises(ModelError, match="not a GGUF"):
        parse_model(str(fake))
    with pytest.raises(ModelError, match="config.json"):
        parse_model(str(tmp_path))
    with pytest.raises(ModelError, match="No model at"):
        parse_model(str(tmp_path / "missing"))
