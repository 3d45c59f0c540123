"""Prompt sets for precision comparison: the seed's three prompts, short prompts of many kinds (code, prose, lists,
numbers, dialogue, JSON) and a long-context prompt, plus the user's own. The embedded model is a base (not instruction-tuned) model, so prompts are written to be continued.

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
    kind: str = "user"  # "seed", "code", "json", "prose", "list", "numbers", "dialogue", "long", "user"


def long_context_text(chars: int = LONG_CHARS) -> str:
    """The shipped long-document source text, cut at a paragraph boundary near `chars`."""
    text = textfile.source_text()
    if len(text) > chars:
        cut = text.rfind("\n\n", 0, chars)
        text = text[: cut if cut > chars // 2 else chars]
    return text


# Short prompts of many kinds, to be continued by a base model: a comparison adds them batch by batch until its
# interval decides, so the built-in set is large and varied (code, prose, lists, numbers, dialogue, JSON).
SHORT_PROMPTS = (
    ("code", "sql", "-- the ten customers who spent the most in 2023\nSELECT customer_id, SUM(total) AS spent\nFROM"),
    ("code", "python-sort", "# sort the words by length, longest first\nwords = ['pear', 'fig', 'banana']\nwords."),
    ("code", "shell", "#!/bin/sh\n# print the five largest files in the current directory\n"),
    ("code", "javascript", "// debounce: call fn at most once per wait milliseconds\nfunction debounce(fn, wait) {\n"),
    ("code", "html", "<!DOCTYPE html>\n<html>\n<head>\n  <title>Contact us</title>\n"),
    ("code", "rust", "fn main() {\n    let numbers = vec![3, 1, 4, 1, 5];\n    let total: i32 ="),
    ("code", "regex", "# match an ISO date such as 2024-03-15\nimport re\nDATE = re.compile(r\""),
    ("prose", "story", "Once upon a time, in a village at the edge of a great forest, there lived"),
    ("prose", "recipe", "To make a simple tomato sauce, first"),
    ("prose", "history", "The printing press changed Europe because"),
    ("prose", "science", "Water boils at a lower temperature on a mountain because"),
    ("prose", "review", "I bought these headphones last month. The sound is"),
    ("prose", "email", "Dear Ms. Patel,\n\nThank you for your letter of 3 May. I am writing to"),
    ("prose", "news", "GENEVA (Reuters) - Wheat prices rose on Monday after"),
    ("prose", "definition", "A prime number is"),
    ("prose", "weather", "Tomorrow will be cloudy in the morning, with"),
    ("list", "groceries", "Shopping list:\n- eggs\n- milk\n-"),
    ("list", "planets", "The planets of the solar system, in order from the Sun:\n1. Mercury\n2. Venus\n3."),
    ("list", "steps", "How to change a flat tyre:\n1. Park on flat ground.\n2."),
    ("list", "days", "Monday, Tuesday, Wednesday,"),
    ("list", "colours", "The colours of the rainbow are red, orange,"),
    ("list", "todo", "TODO before the release:\n[x] update the changelog\n[ ]"),
    ("numbers", "count", "1, 2, 3, 4, 5,"),
    ("numbers", "powers", "Powers of two: 1, 2, 4, 8, 16,"),
    ("numbers", "sum", "Question: What is 17 + 25?\nAnswer:"),
    ("numbers", "percent", "Twenty per cent of 150 is"),
    ("numbers", "dates", "The Second World War lasted from 1939 to"),
    ("numbers", "table", "| year | revenue |\n|------|---------|\n| 2019 | 1.2M    |\n| 2020 |"),
    ("numbers", "units", "One kilometre is 1000 metres, and one mile is about"),
    ("dialogue", "support", "Customer: My order has not arrived yet.\nAgent:"),
    ("dialogue", "interview", "Interviewer: Why do you want to work here?\nCandidate:"),
    ("dialogue", "friends", "\"Are you coming to the party tonight?\" asked Maria.\n\"I"),
    ("dialogue", "doctor", "Doctor: How long have you had this cough?\nPatient:"),
    ("dialogue", "teacher", "Teacher: Who can tell me what photosynthesis is?\nStudent:"),
    ("dialogue", "chat", "User: Can you recommend a good book?\nAssistant:"),
    ("json", "config", '{"server": {"host": "0.0.0.0", "port": 8080}, "logging": {"level": '),
    ("json", "product", 'Product as JSON: {"id": 42, "name": "desk lamp", "price": '),
    ("prose", "quote", "The only thing we have to fear is"),
    ("prose", "instructions", "Before first use, charge the battery fully. To turn the device on,"),
    ("prose", "summary", "In short, the report finds that"),
    ("list", "csv", "name,age,city\nAlice,34,Paris\nBob,29,"),
    ("numbers", "fractions", "One half plus one quarter equals"),
)


def default_prompts() -> list[Prompt]:
    """The built-in set in the order a comparison runs it: the seed's short prompts, code and JSON, the short
    prompts of many kinds, and the long-context prompt last (the costliest: it runs when the others did not
    decide)."""
    return [
        Prompt("arithmetic", "What is 123 * 456?", "seed"),
        Prompt("france", "The capital of France is", "seed"),
        Prompt("translation", "Translate to French: The weather is nice today.", "seed"),
        Prompt("code", 'def fibonacci(n: int) -> int:\n    """Return the n-th Fibonacci number."""\n', "code"),
        Prompt("json", 'A user record as JSON.\nName: Ada Lovelace, born 1815 in London, languages English and '
                       'French.\nJSON: {"name": "Ada Lovelace", "born": ', "json"),
        *(Prompt(name, text, kind) for kind, name, text in SHORT_PROMPTS),
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

