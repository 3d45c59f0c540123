"""Label selectors from users, parsed into matchers and re-emitted escaped: user text never reaches PromQL raw.

`{namespace="prod", pod=~"vllm-.*"}` (braces optional) is parsed into (label, operator, value) triples; anything else
(a function call, `or vector(1)`, an unclosed quote) is refused with an InputError that says what is accepted. The
values are then written back with PromQL's own string escaping, so a value that holds `"}` stays a value.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from core.errors import InputError

LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*\Z")
OPERATORS = ("=~", "!~", "!=", "=")  # two-character operators first, so "=~" is not read as "=" then "~..."
EXAMPLE = 'e.g. {namespace="prod", pod=~"vllm-.*"}'
MAX_LEN = 2000

_ESCAPES = {'"': '"', "\\": "\\", "n": "\n", "t": "\t", "'": "'"}


@dataclass(frozen=True)
class Matcher:
    label: str
    op: str
    value: str

    def promql(self) -> str:
        return f"{self.label}{self.op}{quote(self.value)}"

    def matches(self, labels: dict[str, str]) -> bool:
        """As Prometheus matches a series: an absent label reads as "", regexes are anchored."""
        v = labels.get(self.label, "")
        if self.op in ("=", "!="):
            return (v == self.value) == (self.op == "=")
        return bool(re.fullmatch(self.value, v)) == (self.op == "=~")


def quote(value: str) -> str:
    """A PromQL double-quoted string holding exactly `value`."""
    out = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\t", "\\t")
    return f'"{out}"'


def check_label_name(name: str, what: str = "label") -> str:
    name = (name or "").strip()
    if not LABEL_NAME.match(name) or name.startswith("__"):
        raise InputError(f"{name!r} is not a {what} name: use letters, digits and _ (not starting with a digit or "
                         "__), e.g. instance or pod.")
    return name


def parse_selector(text: str | None) -> tuple[Matcher, ...]:
    """'{a="x", b!~"y"}' -> matchers. Empty or '{}' -> no matchers. Refuses everything that is not a matcher list."""
    src = (text or "").strip()
    if len(src) > MAX_LEN:
        raise InputError(f"The selector is {len(src)} characters long; at most {MAX_LEN} are accepted.")
    if src.startswith("{"):
        if not src.endswith("}"):
            raise _refuse(text, "it opens { but does not end with }")
        src = src[1:-1]
    matchers, i = [], 0
    while True:
        i = _skip_space(src, i)
        if i >= len(src):
            break
        m = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*").match(src, i)
        if not m:
            raise _refuse(text, f"a label name was expected at {src[i:i + 12]!r}")
        label, i = m.group(), _skip_space(src, m.end())
        op = next((o for o in OPERATORS if src.startswith(o, i)), None)
        if op is None:
            raise _refuse(text, f"after {label!r} an operator (=, !=, =~, !~) was expected")
        value, i = _read_string(src, _skip_space(src, i + len(op)), text)
        if label.startswith("__"):
            raise _refuse(text, f"{label!r} is an internal label; select on target labels such as job or namespace")
        if op in ("=~", "!~"):
            _check_regex(value, text)
        matchers.append(Matcher(label, op, value))
        i = _skip_space(src, i)
        if i < len(src):
            if src[i] != ",":
                raise _refuse(text, f"a comma was expected at {src[i:i + 12]!r}")
            i += 1
    return tuple(matchers)


def render(matchers: tuple[Matcher, ...] | list[Matcher]) -> str:
    """The matchers as they go inside a PromQL selector's braces (no braces): 'a="x",b!~"y"'."""
    return ",".join(m.promql() for m in matchers)


def _skip_space(src: str, i: int) -> int:
    while i < len(src) and src[i] in " \t\r\n":
        i += 1
    return i


def _read_string(src: str, i: int, text: str) -> tuple[str, int]:
    if i >= len(src) or src[i] not in "\"'":
        raise _refuse(text, "label values must be quoted, e.g. \"prod\"")
    q, out, i = src[i], [], i + 1
    while i < len(src):
        c = src[i]
        if c == "\\":
            if i + 1 >= len(src) or src[i + 1] not in _ESCAPES:
                raise _refuse(text, "an unknown escape (\\) in a value")
            out.append(_ESCAPES[src[i + 1]])
            i += 2
        elif c == q:
            return "".join(out), i + 1
        else:
            out.append(c)
            i += 1
    raise _refuse(text, "a quoted value is not closed")


def _check_regex(value: str, text: str) -> None:
    # Prometheus uses RE2; Python's re is close enough to catch what would fail there, with a clearer message.
    try:
        re.compile(value)
    except re.error as exc:
        raise _refuse(text, f"the regular expression {value!r} is invalid ({exc})") from None


def _refuse(text: str | None, why: str) -> InputError:
    return InputError(f"The selector {str(text)[:120]!r} is not a label selector: {why}. Give label matchers only "
                      f"(=, !=, =~, !~ with quoted values), {EXAMPLE}.")
