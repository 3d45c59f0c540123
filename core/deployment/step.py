"""One step of a load sweep: the load offered, what finished, the client's quantiles and the server's anatomy over
exactly that step. Its own module so that the sweep (which measures steps) and the verdict (which reads them) both
import it without importing each other."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Step:
    mode: str
    load: float  # clients (concurrency) or target requests/s (rate)
    requests: int
    ok: int
    errors: int
    wall_s: float
    achieved_rps: float  # finished requests / wall time
    output_tok_s: float
    client: dict[str, dict[str, float | None]]  # ttft/itl/e2e -> p50/p90/p99 seconds
    server: dict | None  # Anatomy.to_dict() over exactly this step, None without metrics
    busiest: dict[str, float | None]  # max running / waiting / KV usage seen by the scrapes during the step
    error: str = ""  # the first request error, if any
    meets_slo: bool | None = None  # None when no SLO was given

    @property
    def ttft_p50(self) -> float | None:
        return self.client["ttft"]["p50"]

    def server_mean(self, phase: str) -> float | None:
        p = (self.server or {}).get("phases", {}).get(phase)
        return p["mean_s"] if p else None

    @property
    def queue_share(self) -> float | None:
        return (self.server or {}).get("queue_share_ttft")
