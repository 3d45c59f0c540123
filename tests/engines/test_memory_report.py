"""The torch engine's memory report on the real embedded model: weights as each precision stores them, the CPU fast
path's extra copies apart."""
from core.engines.torch import cpu_fast
from core.engines.torch.cbuild import packs_bf16
from core.models import count_parameters

LM_HEAD = 262_144 * 640  # Gemma 3 270M's tied embedding / lm_head


def test_weights_are_what_the_precision_stores_and_copies_are_apart(engine_cache):
    bf16, int4 = engine_cache("bf16"), engine_cache("int4")
    counts = count_parameters(bf16.config)
    params = counts["quantizable"] + counts["other"]
    m16, m4 = bf16.memory_report(), int4.memory_report()
    # BF16: two bytes a parameter, the tied embedding once (plus the float32 norm scales, well under 1%)
    assert 2 * params <= m16.weights_bytes < 2 * params * 1.01, m16
    # INT4: the linears at half a byte plus group scales and zero points; embedding at BF16 as before
    quantized = m4.weights_by_dtype["uint8"] + m4.weights_by_dtype["float16"]
    assert quantized < 0.6 * counts["quantizable"], m4
    assert m4.weights_bytes < 0.75 * m16.weights_bytes, (m4.weights_bytes, m16.weights_bytes)
    assert 2 * LM_HEAD <= m4.weights_by_dtype["bfloat16"] <= 2 * counts["other"]
    # the fast path's copies are listed apart, labelled, and counted in neither: with bf16 GEMMs (AVX-512) the
    # oneDNN-packed copy of the tied lm_head; without (AVX2-only) float32 copies of the bf16 linears, lm_head included
    if cpu_fast.enabled():
        native = packs_bf16()
        for m in (m16, m4):
            (what, size), = m.runtime_copies.items()
            assert ("lm_head" if native else "float32 copies") in what, what
            assert size >= (2 if native else 4) * LM_HEAD
            assert m.runtime_bytes == size
    assert not any("packed" in k for k in m16.weights_by_dtype)
