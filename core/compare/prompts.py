"""Prompt sets for precision comparison: the seed's three prompts, code, JSON and a long-context prompt, plus the
user's own. The embedded model is a base (not instruction-tuned) model, so prompts are written to be continued.

The long-context prompt is the text core/textfile.py ships for its sample documents (written for this project, nothing
is downloaded), so it changes only when that text does, and saved comparisons stay comparable. It is longer than
Gemma 3's 512-token sliding window, so the global-attention layers and the window both take part.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from core import textfile
from core.errors import InputError

LONG_CHARS = 4800  # about 1,100 Gemma tokens: past the 512-token window, still quick on a CPU
LONG_QUESTION = ("\n\nQuestion: Why does the first token of an answer take longer to appear than the tokens after it?"
                 "\nAnswer:")
MAX_PROMPTS = 64
MAX_PROMPT_CHARS = 100_000


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    kind: str = "user"  # "seed", "code", "json", "long", "user"


def long_context_text(chars: int = LONG_CHARS) -> str:
    """The shipped long-document source text, cut at a paragraph boundary near `chars`."""
    text = textfile.source_text()
    if len(text) > chars:
        cut = text.rfind("\n\n", 0, chars)
        text = text[: cut if cut > chars // 2 else chars]
    return text


def default_prompts() -> list[Prompt]:
    return [
        Prompt("arithmetic", "What is 123 * 456?", "seed"),
        Prompt("france", "The capital of France is", "seed"),
        Prompt("translation", "Translate to French: The weather is nice today.", "seed"),
        Prompt("code", 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n', "code"),
        Prompt("json", 'A user record as JSON.\nName: Ada Lovelace, born 1815 in London, languages English and '
                       'French.\nJSON: {"name": "Ada Lovelace", "born": ', "json"),
        Prompt("long-context", "Technical notes on an LLM triage console.\n\n" + long_context_text() + LONG_QUESTION,
               "long"),
    ]


def parse_user_prompts(text: str) -> list[Prompt]:
    """One prompt per non-empty line. Write a newline inside a prompt as a literal backslash-n."""
    lines = [ln.strip() for ln in (text or "").splitlines()]
    prompts = [Prompt(f"user-{i + 1}", ln.replace("\\n", "\n")) for i, ln in enumerate(x for x in lines if x)]
    return _checked(prompts)


def read_prompts_file(path: str | Path) -> list[Prompt]:
    p = Path(path).expanduser()
    if not p.is_file():
        raise InputError(f"No prompts file at {str(p)!r}; give a text file with one prompt per line.")
    return prompts_from_bytes(p.read_bytes(), p.name, extensions=None)


PROMPT_FILE_EXTENSIONS = ("txt", "jsonl", "json")


def prompts_from_bytes(data: bytes, filename: str,
                       extensions: tuple[str, ...] | None = PROMPT_FILE_EXTENSIONS) -> list[Prompt]:
    """Prompts from an uploaded or read file, which must be text: a binary file (an image, an archive) is refused
    with the reason, never compared as replacement characters."""
    return parse_prompts(textfile.decode_bytes(data, filename, extensions=extensions), filename)


def parse_prompts(text: str, filename: str = "") -> list[Prompt]:
    """Prompts from a file's text: .jsonl (each line a JSON string, or an object with "prompt" and optional
    "name"), .json (a list of the same), anything else one prompt per line."""
    suffix = Path(filename).suffix.lower()
    if suffix not in (".jsonl", ".json"):
        return parse_user_prompts(text)
    try:
        items = json.loads(text) if suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
    except json.JSONDecodeError as exc:
        raise InputError(f"{filename} is not valid JSON ({exc}); expected strings or {{\"prompt\": ...}} objects.") from None
    if not isinstance(items, list):
        raise InputError(f"{filename} must hold a list of prompts.")
    prompts = []
    for i, item in enumerate(items):
        if isinstance(item, dict) and isinstance(item.get("prompt"), str):
            prompts.append(Prompt(str(item.get("name") or f"user-{i + 1}"), item["prompt"]))
        elif isinstance(item, str):
            prompts.append(Prompt(f"user-{i + 1}", item))
        else:
            raise InputError(f"Entry {i + 1} of {filename} is neither a string nor an object with a \"prompt\" string.")
    return _checked(prompts)


def _checked(prompts: list[Prompt]) -> list[Prompt]:
    prompts = [p for p in prompts if p.text.strip()]
    if len(prompts) > MAX_PROMPTS:
        raise InputError(f"{len(prompts)} prompts given; compare at most {MAX_PROMPTS} at a time.")
    for p in prompts:
        if len(p.text) > MAX_PROMPT_CHARS:
            raise InputError(f"Prompt {p.name!r} is {len(p.text):,} characters; the limit is {MAX_PROMPT_CHARS:,}.")
    return prompts


def unique_names(prompts: list[Prompt]) -> list[Prompt]:
    """Typed and file prompts are both numbered user-1, user-2, ... and a JSON file may repeat a name: a repeat gets
    -2, -3, ... so the page can pick each prompt by name and the CSV rows stay apart."""
    seen: dict[str, int] = {}
    out = []
    for p in prompts:
        n = seen[p.name] = seen.get(p.name, 0) + 1
        out.append(p if n == 1 else replace(p, name=f"{p.name}-{n}"))
    return out

