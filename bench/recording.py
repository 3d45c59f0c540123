"""What every recording script shares (bench/record_demo.py, bench/record_incident.py, bench/remedy_grid.py): the
log line, the UTC time stamp, the machine a recording says it ran on, how its file is written, and the load that
keeps a vLLM server busy while it is recorded."""
from __future__ import annotations

import json
import os
import platform
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def log(*a) -> None:
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def log_changes(prefix: str):
    """A progress callback that logs a message once, not at every tick."""
    last = [None]

    def report(fraction: float, message: str) -> None:
        if message != last[0]:
            last[0] = message
            log(f"{prefix}{message}")
    return report


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return " ".join(line.split(":", 1)[1].split())
    except OSError:
        pass
    return platform.processor() or platform.machine()


def host_description() -> str:
    return f"{os.cpu_count()}-core {cpu_model()}"


def vllm_description() -> str:
    from core.engines.vllm_engine import vllm_flavor, vllm_python

    flavor, version = vllm_flavor(str(vllm_python()))
    return f"{flavor} {version}" if flavor else "vLLM"


def server_machine() -> str:
    """The machine of a recording taken from vLLM servers started here: the host and the vLLM that served."""
    return f"{host_description()}, {vllm_description()}"


def write_recording(out: Path, name: str, kind: str, title: str, machine: str, recorded_at: str, captured_by: str,
                    payload: dict) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.json"
    rec = {"kind": kind, "title": title, "machine": machine, "recorded_at": recorded_at, "captured_by": captured_by,
           "payload": payload}
    # Paths of the capturing checkout (a vLLM Python the checklist read flags through) shown relative to it.
    path.write_text(json.dumps(rec, separators=(",", ":"), default=str).replace(f"{ROOT}/", ""))
    log(f"wrote {path} ({path.stat().st_size / 1024:.0f} KB)")
    return path


def load_until(url: str, until: float, clients: int, prompt: int, new: int, errors: list) -> None:
    """The console's own probe, over and over: `clients` streamed requests at a time until `until`."""
    from core.deployment.probe import probe

    while time.time() < until:
        try:
            probe(url, n=clients, prompt_tokens=prompt, max_new_tokens=new, concurrency=clients, timeout_s=180)
        except Exception as exc:  # keep loading; the snapshot shows what the server did
            errors.append(f"{url}: {type(exc).__name__}: {str(exc)[:160]}")
            time.sleep(1)
