"""Integer quantization numerics (core/engines/torch/quant.py), FP8 static scales, and the quality run's pure parts: windows,
metrics, variants, the kept reference file, rendering. No model: small random tensors."""
import math

import numpy as np
import pytest
import torch
from torch import nn

from core.engines.torch import fp8, quant
from core.errors import InputError
from core.fmt import visible_token
from core.precision import Device, KVDtype, Precision, unsupported_reasons
from core.quality import metrics, refcache, render
from core.quality import run as qr
from core.textfile import DocumentError


def test_int4_codes_pack_two_a_byte_and_round_trip_within_half_a_step():
    torch.manual_seed(0)
    w = torch.randn(8, 300)  # 300 is not a multiple of 128: the last group is padded
    packed, scale, zero = quant.quantize_int4(w)
    assert packed.dtype == torch.uint8 and packed.shape == (8, 384 // 2)
    assert scale.dtype == torch.float16 and scale.shape == (8, 3) and zero.dtype == torch.uint8
    back = quant.dequantize_int4(packed, scale, zero, 300)
    step = scale.float().repeat_interleave(128, dim=1)[:, :300]
    assert back.shape == w.shape
    assert ((back - w).abs() <= 0.5 * step + 1e-6).all()


def test_int8_rows_and_int_mm_match_a_float_matmul():
    torch.manual_seed(0)
    lin = nn.Linear(256, 64, bias=True)
    layer = quant.Int8Linear(lin, w8a8=True)
    assert layer.weight_int8.dtype == torch.int8 and layer.weight_scale.shape == (64, 1)
    x = torch.randn(3, 5, 256)
    out = layer(x)
    assert layer.kernel == ("torch._int_mm" if quant.cpu_has_int8_dot() else quant.FLOAT32_ROUTE)
    ref = lin(x)
    assert (out - ref).norm() / ref.norm() < 0.02
    wo = quant.Int8Linear(lin, w8a8=False)
    assert (wo(x) - ref).norm() / ref.norm() < 0.01
    a = torch.randint(-127, 127, (5, 64), dtype=torch.int8)
    b = torch.randint(-127, 127, (64, 32), dtype=torch.int8)
    got, kernel = quant.int_mm(a, b)
    assert torch.equal(got, a.int() @ b.int()) and kernel == layer.kernel


@pytest.mark.parametrize("k", [640, 1024, 1025, 2048, 3000])
def test_int8_products_in_float32_are_torch_int_mm_bit_for_bit(k):
    """Chunks of 1,024 inputs keep every float32 partial sum an exact integer, at the worst case too (every product
    127 * 127 of one sign, past 2^24 over 2,048 inputs) and with rows of any count."""
    g = torch.Generator().manual_seed(k)
    for m in (1, 7, 64):
        a = torch.randint(-127, 128, (m, k), dtype=torch.int8, generator=g)
        b = torch.randint(-127, 128, (k, 48), dtype=torch.int8, generator=g)
        a[0], b[:, 0] = 127, 127  # row 0 x column 0: 127^2 * k
        exact = torch._int_mm(a, b)
        assert exact[0, 0] == 127 * 127 * k
        assert torch.equal(quant.int_mm_in_float32(a, b), exact)


def test_int8_linear_gives_the_same_bits_through_either_product(monkeypatch):
    torch.manual_seed(0)
    lin = nn.Linear(2048, 96, bias=True).to(torch.bfloat16)
    layer = quant.Int8Linear(lin, w8a8=True)
    x = torch.randn(2, 9, 2048).to(torch.bfloat16)
    monkeypatch.setattr(quant, "_CPU_INT8_DOT", True)
    via_int_mm = layer(x)
    assert layer.kernel == "torch._int_mm"
    monkeypatch.setattr(quant, "_CPU_INT8_DOT", False)
    assert torch.equal(layer(x), via_int_mm) and layer.kernel == quant.FLOAT32_ROUTE


def test_awq_search_never_worse_than_plain_int4_on_its_calibration():
    torch.manual_seed(0)
    w = torch.randn(64, 256)
    x = torch.randn(200, 256)
    x[:, :4] *= 30  # salient input channels
    found = quant.awq_search(w, x)
    assert found["mse"] <= found["plain_mse"]
    assert found["alpha"] > 0  # with salient channels, scaling helps
    layer = quant.Int4Linear(nn.Linear(256, 64, bias=False), found["scale"])
    assert layer.input_scale.dtype == torch.float16


def test_weight_bytes_int4_is_half_a_byte_plus_group_scales():
    n = 128 * 1000
    assert quant.weight_bytes(n, Precision.INT8) == n
    assert quant.weight_bytes(n, Precision.INT4) == n // 2 + 1000 * 3


def test_fp8_static_clips_beyond_the_calibrated_range():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 16))
    fp8.quantize_linears(model, w8a8=True)

    class Wrap(nn.Module):  # calibrate_static calls model(input_ids=...)
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, input_ids, use_cache=False):
            return self.inner(input_ids.float().unsqueeze(-1).expand(*input_ids.shape, 32) / 10)

    assert fp8.calibrate_static(Wrap(), list(range(10))) == 1
    layer = model[0]
    assert isinstance(layer, fp8.FP8StaticLinear)
    assert layer.input_scale.item() == pytest.approx(0.9 / fp8.E4M3_MAX, rel=1e-3)
    small = layer(torch.full((2, 32), 0.5))
    big = layer(torch.full((2, 32), 5.0))  # beyond the calibrated 0.9: clipped to it
    assert torch.allclose(big, layer(torch.full((2, 32), 0.9)), rtol=0.05)
    assert not torch.allclose(small, big)


def test_integer_precisions_are_refused_by_vllm_and_weight_only_ones_take_the_fast_path():
    from core.engines.fast.support import fast_decode_unavailable_reasons

    for p in (Precision.INT8, Precision.INT8_WEIGHT_ONLY, Precision.INT4, Precision.INT4_AWQ):
        for engine in ("vllm", "vllm-cpu"):
            (reason,) = unsupported_reasons(p, KVDtype.AUTO, Device(), engine=engine)
            assert "torch engine" in reason and p.label in reason
        assert unsupported_reasons(p, KVDtype.AUTO, Device(), engine="torch") == []
        h200 = Device("cuda", "H200", (9, 0))
        reasons = fast_decode_unavailable_reasons(h200, p, KVDtype.AUTO)
        if p is Precision.INT8:  # W8A8's GPU kernels are not routed yet (core/engines/fast/support.py)
            assert any("eager torch engine" in r for r in reasons)
        else:
            assert reasons == []
    # which int8 product ran depends on the CPU or GPU: the layers record it (quant.kernels), not the label
    assert Precision.INT8.label == "INT8 W8A8"


def test_kl_rows_topk_is_zero_for_identity_and_never_above_the_full_kl():
    torch.manual_seed(0)
    ref = torch.log_softmax(torch.randn(6, 50), dim=-1)
    cand = torch.log_softmax(ref + 0.3 * torch.randn(6, 50), dim=-1)
    full = metrics.kl_rows({"full": ref}, cand)
    v, i = ref.topk(10, dim=-1)
    top = metrics.kl_rows({"topk_ids": i, "topk_lp": v}, cand)
    assert (top <= full + 1e-6).all() and (top > 0).all()
    assert torch.equal(metrics.kl_rows({"topk_ids": i, "topk_lp": v}, ref), torch.zeros(6))
    assert torch.allclose(metrics.kl_rows({"full": ref}, ref), torch.zeros(6), atol=1e-6)


def test_metrics():
    assert metrics.perplexity([math.log(0.5)] * 4) == pytest.approx(2.0)
    s = metrics.same_top([1, 2, 3, 4], [1, 2, 3, 5])
    assert s["share"] == 0.75 and s["ci95"][0] < 0.75 < s["ci95"][1]
    assert metrics.rms_delta_p([math.log(0.5)], [math.log(0.25)]) == pytest.approx(0.25)
    k = metrics.kld_summary([0.0, 0.1, 0.2, 1.0])
    assert k["max"] == 1.0 and k["mean"] == pytest.approx(0.325) and k["median"] == pytest.approx(0.15)


def test_windows_cover_every_token_once():
    w = qr.plan_windows(1000, 256, 128, 32768)
    scored = [t for x in w for t in range(x.first_scored, x.end)]
    assert scored == list(range(1, 1000))
    assert all(x.end - x.start == 256 for x in w) and w[-1].end == 1000
    assert len(qr.plan_windows(512, 256, 256, None)) == 2


@pytest.mark.parametrize("args, msg", [
    ((100, 256, 128, 32768), "shorter than one window"),
    ((1000, 256, 0, 32768), "stride"),
    ((1000, 256, 300, 32768), "stride"),
    ((1000, 600, 100, 512), "positions"),
])
def test_windows_refuse_bad_settings(args, msg):
    with pytest.raises(InputError, match=msg):
        qr.plan_windows(*args)


def test_short_document_is_a_document_error():
    with pytest.raises(DocumentError):
        qr.plan_windows(10, 64, 64, None)


def test_variants():
    assert qr.parse_variant("INT4-AWQ").precision is Precision.INT4_AWQ
    v = qr.parse_variant("fp8-static:32")
    assert v.precision is Precision.FP8 and v.static_tokens == 32 and v.name == "fp8-static:32"
    assert "32 calibration tokens" in v.label
    with pytest.raises(InputError, match="fp8-static:N"):
        qr.parse_variant("fp8-static:x")
    with pytest.raises(InputError, match="Unknown precision"):
        qr.parse_variants("fp8,int3")


def test_reference_file_round_trips_and_refuses_another_key(tmp_path, monkeypatch):
    monkeypatch.setenv("TRIAGE_QUALITY_CACHE", str(tmp_path))
    meta = refcache.key_meta("m", "bf16", "auto", "abc", 64, 32, 8)
    arrays = {"targets": np.arange(5), "target_lp": np.zeros(5, np.float32)}
    path = refcache.save(meta, arrays, {"perplexity": 1.5})
    got = refcache.load(meta)
    assert got["row"] == {"perplexity": 1.5} and np.array_equal(got["targets"], arrays["targets"])
    assert got["path"] == str(path)
    assert refcache.load({**meta, "stride": 16}) is None
    path.write_bytes(b"not a zip")
    assert refcache.load(meta) is None


def test_visible_token_and_rendered_rows_keep_html_as_text():
    assert visible_token("<b>x</b>\n\t\x00") == "<b>x</b>\\n\\t\\x00"
    result = {"rows": [{"name": "int4", "label": "INT4", "role": "candidate", "perplexity": 2.0,
                        "kld": {"mean": 0.1, "median": 0.1, "p99": 0.2, "p99_9": 0.3, "max": 0.4},
                        "same_top": {"share": 0.9, "ci95": [0.8, 0.95]}, "rms_dp": 0.01,
                        "worst": [{"position": 3, "kld": 0.4, "context": "<script>\n", "token": "a",
                                   "reference_top": "a", "candidate_top": "<i>"}]}]}
    (row,) = render.worst_rows(result)
    assert row["context"] == "<script>\\n" and row["candidate top"] == "<i>"
    (t,) = render.table_rows(result)
    assert t["same top %"].startswith("90.00") and t["weights"] == "N/A"


def test_a_cpu_run_that_grew_no_memory_reads_under_1_mib_not_0_b():
    from core.telemetry.run_peak import SOURCE

    rows = [{"name": "int4", "peak_bytes": 0, "peak_source": SOURCE},
            {"name": "fp8", "peak_bytes": 15 * 2**20, "peak_source": SOURCE},
            {"name": "bf16", "peak_bytes": 0, "peak_source": "CUDA allocator (torch.cuda.max_memory_allocated)"}]
    assert [r["peak memory"] for r in render.timing_rows({"rows": rows})] == ["< 1 MiB", "15.00 MiB", "0 B"]


def test_layer_errors_rank_quantizers_and_find_outlier_channels():
    from core.quality import layers

    torch.manual_seed(0)

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(50, 256)
            self.up = nn.Linear(256, 128)
            self.down = nn.Linear(128, 256)
            self.lm_head = nn.Linear(256, 50)
            with torch.no_grad():
                self.emb.weight[:, 7] *= 100  # an outlier channel into `up`

        def forward(self, input_ids, use_cache=False):
            return self.lm_head(self.down(self.up(self.emb(input_ids))))

    rows = quant.layer_errors(Tiny(), list(range(40)))
    assert [r["layer"] for r in rows] == ["up", "down"]  # lm_head stays out
    up = rows[0]
    assert up["outlier_channels"] == 1 and up["top_channels"][0] == 7
    e = up["errors"]
    assert e["int8"] < e["int8 per-tensor"] and e["int8-wo"] < e["int4"] and e["int4-awq"] <= e["int4"] * 1.001
    result = {"quantizers": list(quant.LAYER_QUANTIZERS), "layers": rows}
    s = layers.summary(result)
    assert s["layers"] == 2 and s["per_channel_int8_better"] >= 1
    assert layers.ranked(result, "int4")[0]["layer"] in ("up", "down")
    from core.quality import charts

    assert len(charts.layer_heatmap(result).data) == 1 and len(charts.activation_histograms(result).data) == 2
