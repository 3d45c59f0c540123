"""The console's telemetry in Prometheus text format, so a fleet without DCGM still gets DRAM bandwidth.

`python -m diagnostics exporter` serves /metrics with prometheus_client. GPUs and the host are read on each scrape
(a collector, not a background thread): NVML GPM then averages DRAM bandwidth over the time since the previous
scrape, which is exactly the scrape interval Prometheus sees. Names follow dcgm-exporter and nvitop's exporter:
one gauge per quantity, base units in the name (`_percent`, `_bytes`, `_watts`, `_hertz`, `_celsius`), labels
`gpu` (NVML index), `uuid` and `name`. A field the GPU cannot give is left out of the scrape, never written as 0.
Importing this module needs only prometheus_client; pynvml and psutil are loaded by the sources, lazily.
"""
from __future__ import annotations

import threading
from typing import Any, Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector, CollectorRegistry

from core.telemetry.host import HostSource
from core.telemetry.nvml import THROTTLE_REASONS, NvmlSource

# (sampler field, metric name, help, scale to the metric's unit). The field's unit is in its name (core/telemetry).
GPU_METRICS = (
    ("util_pct", "triage_gpu_util_percent", "NVML utilization.gpu: share of time any kernel ran (%)", 1.0),
    ("mem_busy_pct", "triage_gpu_memory_busy_percent",
     "NVML utilization.memory: share of time memory was read or written (%); not bandwidth", 1.0),
    ("dram_bw_util_pct", "triage_gpu_dram_bw_util_percent",
     "NVML GPM DRAM bandwidth utilization (%), averaged since the previous scrape; Hopper and newer", 1.0),
    ("sm_util_pct", "triage_gpu_sm_util_percent", "NVML GPM SM utilization (%), averaged since the previous scrape",
     1.0),
    ("mem_used_bytes", "triage_gpu_memory_used_bytes", "GPU memory in use (bytes)", 1.0),
    ("mem_total_bytes", "triage_gpu_memory_total_bytes", "GPU memory in total (bytes)", 1.0),
    ("power_w", "triage_gpu_power_watts", "GPU power draw (W)", 1.0),
    ("power_limit_w", "triage_gpu_power_limit_watts", "enforced GPU power limit (W)", 1.0),
    ("sm_clock_mhz", "triage_gpu_sm_clock_hertz", "SM clock (Hz)", 1e6),
    ("mem_clock_mhz", "triage_gpu_memory_clock_hertz", "memory clock (Hz)", 1e6),
    ("temp_c", "triage_gpu_temperature_celsius", "GPU temperature (°C)", 1.0),
)
HOST_METRICS = (
    ("host.mem_available_bytes", "triage_host_memory_available_bytes", "MemAvailable from /proc/meminfo (bytes)"),
    ("host.mem_total_bytes", "triage_host_memory_total_bytes", "MemTotal (bytes)"),
)
CLOCK_EVENTS = ("triage_gpu_clock_event_reasons",
                "NVML clock event (throttle) reasons as nvml.h's bit mask; 0 when the clocks are not held back")


def reasons_to_mask(text: str) -> int:
    """'SW power cap, HW thermal' (nvml.decode_throttle's text) -> the nvml.h bit mask again."""
    names = {n.strip() for n in text.split(",")}
    return sum(bit for bit, name in THROTTLE_REASONS if name in names)


class TelemetryCollector(Collector):
    def __init__(self, nvml: NvmlSource | None = None, host: HostSource | None = None):
        self.nvml = nvml or NvmlSource()
        self.host = host or HostSource(watch=())
        self.gpu_reason = "" if self.nvml.probe().ok else self.nvml.probe().reason
        self.host_ok = self.host.probe().ok
        self._lock = threading.Lock()  # two scrapes at once must not interleave GPM windows
        if not self.gpu_reason:
            self.nvml.sample()  # opens the first GPM window, so the first scrape has bandwidth

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            gpu = self.nvml.sample().values if not self.gpu_reason else {}
            host = self.host.sample().values if self.host_ok else {}
        labels = ["gpu", "uuid", "name"]
        gpus = [(g, [str(g.index), g.uuid, g.name]) for g in self.nvml.gpus] if not self.gpu_reason else []
        for field, name, doc, scale in GPU_METRICS:
            fam = GaugeMetricFamily(name, doc, labels=labels)
            for g, lv in gpus:
                v = gpu.get(f"gpu{g.index}.{field}")
                if v is not None:
                    fam.add_metric(lv, float(v) * scale)
            yield fam
        free = GaugeMetricFamily("triage_gpu_memory_free_bytes", "GPU memory free (bytes)", labels=labels)
        events = GaugeMetricFamily(*CLOCK_EVENTS, labels=labels)
        for g, lv in gpus:
            used, total = gpu.get(f"gpu{g.index}.mem_used_bytes"), gpu.get(f"gpu{g.index}.mem_total_bytes")
            if used is not None and total is not None:
                free.add_metric(lv, float(total - used))
            reasons = gpu.get(f"gpu{g.index}.throttle_reasons")
            if reasons is not None:
                events.add_metric(lv, float(reasons_to_mask(reasons)))
        yield free
        yield events
        for key, name, doc in HOST_METRICS:
            fam = GaugeMetricFamily(name, doc)
            if host.get(key) is not None:
                fam.add_metric([], float(host[key]))
            yield fam


def registry(collector: TelemetryCollector | None = None) -> CollectorRegistry:
    reg = CollectorRegistry(auto_describe=False)
    reg.register(collector or TelemetryCollector())
    return reg


def serve(port: int, host: str, collector: TelemetryCollector | None = None) -> Any:
    """Start the HTTP server in a daemon thread; returns (server, thread) from prometheus_client."""
    from prometheus_client import start_http_server

    return start_http_server(port, addr=host, registry=registry(collector))


def describe(collector: TelemetryCollector) -> str:
    gpus = ", ".join(f"GPU {g.index} {g.name}" for g in collector.nvml.gpus) or f"no GPU ({collector.gpu_reason})"
    return f"{gpus}; host memory {'from psutil' if collector.host_ok else 'unavailable'}"


