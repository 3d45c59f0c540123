"""What a server says about itself, so a change in its answers can be put beside a change in its setup: the served
model, the checkpoint it loaded (vLLM's /v1/models `root`, the --model path or repository: a replica rolled to other
weights under the same served name is named), max_model_len and vLLM version (/v1/models, /version), the vocabulary
size where /tokenizer_info answers, the settings it publishes as *_config_info gauges (each label as the server spells
it) and its process start (`process_start_time_seconds`: a restart moves it). A source that does not answer leaves its
facts None, never guessed.
"""
from __future__ import annotations

import time

from core.errors import RemoteError
from core.fmt import fmt_utc

# Facts whose change is worth naming next to a drift, in the order they are named.
WATCHED = ("model", "checkpoint", "max_model_len", "vocab_size", "vllm_version", "process_start_time_s")


def facts_from(url: str, model: str, max_model_len: int | None, version: str | None, vocab_size: int | None,
               snap, metrics_note: str = "", checkpoint: str | None = None) -> dict:
    """Pure: the facts from what the endpoints answered (`snap` a VllmSnapshot, or None when /metrics did not)."""
    config, sources = {}, {}
    for metric, labels in sorted(((snap.config_info if snap else None) or {}).items()):
        for label, v in labels.items():
            if not label.startswith("_") and label != "engine":  # bookkeeping labels, not settings
                config[label], sources[label] = v, metric
    return {"url": url, "model": model, "checkpoint": checkpoint, "max_model_len": max_model_len,
            "vllm_version": version, "vocab_size": vocab_size, "config": dict(sorted(config.items())),
            "config_sources": sources,
            "process_start_time_s": snap.process_start_time_s if snap else None,
            "metrics": ("no /metrics: " + metrics_note) if snap is None else
                       ("no vllm:* series (--disable-log-stats)" if snap.logging_disabled else "vllm:* series"),
            "read_at": time.time()}


def _vocab_size(eng) -> int | None:
    """vLLM answers /tokenizer_info only with --enable-tokenizer-info-endpoint; elsewhere the size is unknown."""
    from core.http import request

    try:
        resp = request("GET", eng.base_url + "/tokenizer_info", 5.0, eng.api_key, eng._session)
        body = resp.json() if resp.status_code == 200 else None
    except (RemoteError, ValueError):
        return None
    for key in ("vocab_size", "model_vocab_size"):
        if isinstance(body, dict) and isinstance(body.get(key), int):
            return body[key]
    return None


def server_facts(eng) -> dict:
    """The facts of the server behind a RemoteEngine; RemoteError when it is not an OpenAI-compatible server."""
    return read_server(eng)[0]


def read_server(eng):
    """(server_facts, the /metrics snapshot they were read from, None where /metrics did not answer): a replay round
    keeps the snapshot as its counters at the round's start instead of scraping the server a second time."""
    from core.telemetry.vllm_metrics import MetricsError, scrape

    info = eng.connect()
    try:
        snap, note = scrape(eng.base_url, timeout_s=10.0, api_key=eng.api_key), ""
    except (RemoteError, MetricsError) as exc:
        snap, note = None, str(exc)
    roots = [m.get("root") for m in info.raw_models if m.get("id") == eng.model and isinstance(m.get("root"), str)]
    return facts_from(eng.base_url, eng.model, info.max_model_len, info.version, _vocab_size(eng), snap, note,
                      checkpoint=roots[0] if roots else None), snap


def _said(value) -> str:
    return "not reported" if value is None else str(value)


def changes(before: dict | None, after: dict | None) -> list[str]:
    """What the server reports as changed between two reads, in words: the watched facts and each published
    setting (a setting that appeared or vanished included)."""
    if not before or not after:
        return []
    out = []
    for key in WATCHED:
        a, b = before.get(key), after.get(key)
        if a == b:
            continue
        if key == "process_start_time_s":
            if a is not None and b is not None:
                same_second = fmt_utc(a) == fmt_utc(b)  # two processes started within one second: say which is which
                out.append(f"restarted: process start {fmt_utc(a, same_second)} -> {fmt_utc(b, same_second)}")
            continue
        out.append(f"{key} {_said(a)} -> {_said(b)}")
    ca, cb = before.get("config") or {}, after.get("config") or {}
    if bool(ca) != bool(cb):  # a whole gauge came or went (--disable-log-stats): one line, not one per label
        kv = f" (cache_dtype was {ca['cache_dtype']})" if "cache_dtype" in ca else ""
        out.append(f"published settings: {len(ca)} -> {len(cb)}{kv}")
        ca = cb = {}
    for label in sorted(set(ca) | set(cb)):
        if ca.get(label) == cb.get(label):
            continue
        out.append(f"{label} {ca.get(label, 'not published')} -> {cb.get(label, 'not published')}")
    if before.get("metrics") != after.get("metrics"):
        out.append(f"/metrics: {before.get('metrics')} -> {after.get('metrics')}")
    return out
