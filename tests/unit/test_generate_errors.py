"""The Model page's prompt box turns running out of memory into a message (EngineError), and lets any other error
keep its traceback. Running out of memory is injected: the engine below raises torch's own error, which a real
model cannot be made to raise here without filling the machine."""
from __future__ import annotations

import pytest
import torch

from core.errors import EngineError, TriageError
from views.common import session


class OutOfMemoryInjectingEngine:
    def __init__(self, exc: BaseException):
        self.exc = exc

    def generate(self, prompts, params, on_step=None):
        raise self.exc


@pytest.mark.parametrize("exc", [torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
                                 MemoryError()])
def test_out_of_memory_is_a_message_with_what_to_do(exc):
    with pytest.raises(EngineError, match="Out of memory while generating.*fewer new tokens") as info:
        session.stream_generate(OutOfMemoryInjectingEngine(exc), "Hello", 4, 0.0, lambda text: None)
    assert isinstance(info.value, TriageError)


def test_any_other_error_keeps_its_traceback():
    with pytest.raises(RuntimeError, match="shape mismatch"):
        session.stream_generate(OutOfMemoryInjectingEngine(RuntimeError("shape mismatch")), "Hello", 4, 0.0,
                                lambda text: None)
