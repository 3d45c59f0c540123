"""Every check, in one place. Ids are stable and unique; the order here is the order checks run in."""
from __future__ import annotations

from diagnostics.checks import config, golden, gpu, gpus, host, vllm
from diagnostics.findings import Check

CHECKS: tuple[Check, ...] = gpu.CHECKS + gpus.CHECKS + host.CHECKS + vllm.CHECKS + golden.CHECKS + config.CHECKS

_BY_ID = {c.id: c for c in CHECKS}
assert len(_BY_ID) == len(CHECKS), "check ids must be unique"


def all_checks() -> tuple[Check, ...]:
    return CHECKS


def get(check_id: str) -> Check:
    try:
        return _BY_ID[check_id]
    except KeyError:
        raise KeyError(f"Unknown check {check_id!r}; known: {', '.join(_BY_ID)}") from None
