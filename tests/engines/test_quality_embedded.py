"""The quality run and the integer precisions on the real embedded model (Gemma 3 270M): storage really int8 /
packed uint8, the identity run, KLD order on the shipped sample prose, the kept reference reused, bad documents.

A short document (the first ~200 tokens of the shipped sample prose, windows of 64) keeps this to about a minute on
2 cores; the engines come from the session's engine_cache and stay loaded for other tests."""
import pytest
import torch

from core.engines.torch import quant
from core.engines.torch.engine import count_weight_bytes
from core.models import ModelSpec
from core.precision import Precision
from core.quality import run as qr
from core.textfile import DocumentError, source_text

DOC = source_text()[:1000]
WINDOW, STRIDE = 64, 64


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("quality-refs")


def _run(engine_cache, cache_dir, monkeypatch, candidates, doc=DOC, reference="bf16"):
    monkeypatch.setenv("TRIAGE_QUALITY_CACHE", str(cache_dir))
    return qr.run(ModelSpec("embedded"), doc, qr.parse_variant(reference), qr.parse_variants(candidates),
                  window=WINDOW, stride=STRIDE, top_k=64, device="cpu", decode_tokens=3,
                  load=lambda v, progress: engine_cache(v.precision.value))


def test_int8_and_int4_weights_really_are_int8_and_packed_uint8(engine_cache):
    int8, int4 = engine_cache("int8"), engine_cache("int4")
    q = int8.model.model.layers[0].mlp.down_proj
    assert isinstance(q, quant.Int8Linear) and q.weight_int8.dtype == torch.int8
    p = int4.model.model.layers[0].mlp.down_proj
    assert isinstance(p, quant.Int4Linear) and p.weight_packed.dtype == torch.uint8
    assert p.weight_packed.shape == (p.out_features, p.in_features // 2)
    assert int4.model.lm_head.weight.dtype == torch.bfloat16  # lm_head (tied embeddings) stays at the base dtype
    m8, m4 = int8.memory_report().weights_by_dtype, int4.memory_report().weights_by_dtype
    n = sum(x.weight_int8.numel() for x in int8.model.modules() if isinstance(x, quant.Int8Linear))
    assert m8["int8"] == n
    assert m4["uint8"] == n // 2 + n // 128  # two codes a byte, plus a uint8 zero point per group of 128
    assert m4["float16"] == 2 * (n // 128)  # a float16 scale per group
    bf16 = count_weight_bytes(int8.config, Precision.BF16)
    assert count_weight_bytes(int4.config, Precision.INT4) < count_weight_bytes(int8.config, Precision.INT8) < bf16


def test_quality_table_on_the_sample_prose(engine_cache, cache_dir, monkeypatch):
    res = _run(engine_cache, cache_dir, monkeypatch, "bf16,fp8,int8,int4")
    assert not res["reference_cache"]["reused"] and res["positions"] == res["document"]["tokens"] - 1
    rows = {r["name"]: r for r in res["rows"][1:]}
    ref = res["rows"][0]
    same = rows["bf16"]
    assert same["kld"]["max"] == 0.0 and same["perplexity"] == ref["perplexity"] and same["rms_dp"] == 0.0
    assert same["same_top"]["share"] == 1.0
    for name in ("fp8", "int8", "int4"):
        assert rows[name]["kld"]["mean"] > 0, name
        assert rows[name]["kld"]["max"] >= rows[name]["kld"]["p99_9"] >= rows[name]["kld"]["p99"]
    # Measured on this document (windows of 64): fp8 ~0.02, int8 ~0.035, int4 ~0.4 nats; margins of 3x and more.
    assert rows["fp8"]["kld"]["mean"] * 3 < rows["int4"]["kld"]["mean"]
    assert rows["int8"]["kld"]["mean"] * 3 < rows["int4"]["kld"]["mean"]
    assert rows["int8"]["kernels"] == ["torch._int_mm" if quant.cpu_has_int8_dot() else quant.FLOAT32_ROUTE]
    assert rows["int4"]["weights_bytes"] < rows["int8"]["weights_bytes"] < ref["weights_bytes"]

    again = _run(engine_cache, cache_dir, monkeypatch, "int8")
    assert again["reference_cache"]["reused"] and again["rows"][0]["reused"]
    assert again["rows"][0]["perplexity"] == ref["perplexity"]
    r2 = again["rows"][1]
    assert r2["perplexity"] == rows["int8"]["perplexity"] and r2["kld"] == rows["int8"]["kld"]
    assert r2["same_top"] == rows["int8"]["same_top"]


def test_int4_awq_on_the_sample_prose(engine_cache, cache_dir, monkeypatch):
    """Apart from the table so it can be left out (-k "not awq"): AWQ's per-layer search is the slowest load."""
    res = _run(engine_cache, cache_dir, monkeypatch, "int4-awq")
    (row,) = res["rows"][1:]
    assert row["kld"]["mean"] > 0 and row["same_top"]["share"] < 1
    awq = engine_cache("int4-awq").quant_info["awq"]
    assert len(awq) == 126 and all(v["mse"] <= v["plain_mse"] for v in awq.values())


def test_bad_documents_get_clear_messages(engine_cache, cache_dir, monkeypatch):
    with pytest.raises(DocumentError, match="shorter than one window of 64"):
        _run(engine_cache, cache_dir, monkeypatch, "int8", doc="A short note.")
    with pytest.raises(DocumentError, match="empty"):
        _run(engine_cache, cache_dir, monkeypatch, "int8", doc="   \n")
    with pytest.raises(DocumentError, match="binary"):
        _run(engine_cache, cache_dir, monkeypatch, "int8", doc="\x00\x01\x02\x03" * 50)
