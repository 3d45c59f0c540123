"""On a GPU host, a Llama-shaped setup gets the fast CUDA-graph engine; the engine answers with timings."""
import pytest

from core.engines.base import GenerationParams
from core.engines.factory import build_engine
from core.models import ModelSpec
from core.precision import KVDtype, Precision

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("precision", [Precision.BF16, Precision.FP8])
def test_synthetic_llama_gets_the_fast_engine(precision):
    engine = build_engine(ModelSpec("synthetic", "llama-3-8b"), precision, KVDtype.AUTO)
    try:
        assert engine.name == "torch-fast"
        g = engine.generate(["hello"], GenerationParams(max_new_tokens=8, stop_at_eos=False))[0]
        assert len(g.token_ids) == 8 and g.decode_tok_s and g.ttft_s > 0
        print(f"{precision.value}: decode {g.decode_tok_s:.1f} tok/s, TTFT {g.ttft_s * 1000:.1f} ms")
        assert engine.memory_report().weights_bytes > 0
    finally:
        engine.unload()
