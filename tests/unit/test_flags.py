"""The vLLM flag linter: the seed's fictional flags are rejected with the real way; real flags pass; the CLI's exit
codes; the committed table is what answers when no Python with vLLM is there."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from diagnostics import flags

ROOT = Path(__file__).resolve().parents[2]
TABLE = flags.committed_table()
SEED = ("python -m vllm.entrypoints.api_server \\ --model Meta-Llama-3-8B-Instruct \\ --tensor-parallel-size 2 \\ "
        "--quantization fp8 \\ --fp8-padding-threshold 0.05 \\ --fp8-w8a16 \\ --kv-cache-dtype fp8 \\ --quant-aware "
        "\\ --fp8-use-matrix \\ --host 0.0.0.0 \\ --port 8000")


def lint(cmd):
    return flags.lint_command(cmd, TABLE)


def issue(result, flag):
    return next(i for i in result.issues if i.flag == flag)


# --- the committed table --------------------------------------------------------------------------------------------

def test_committed_table_is_vllm_0_32_and_has_the_real_flags():
    assert TABLE.vllm_version == flags.COMMITTED_VERSION == "0.32.0"
    assert "kept in the repo" in TABLE.source
    # real flags of vLLM 0.32
    for f in ("--quantization", "--kv-cache-dtype", "--block-size", "--enable-chunked-prefill",
              "--max-num-batched-tokens", "--enable-prefix-caching", "--enforce-eager", "--disable-log-stats",
              "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs", "--tensor-parallel-size"):
        assert f in TABLE.options, f
    assert "fp8" in TABLE.options["--kv-cache-dtype"].choices
    assert "--calculate-kv-scales" not in TABLE.options  # removed upstream
    assert TABLE.entrypoints == {"vllm.entrypoints.openai.api_server": True, "vllm.entrypoints.api_server": False}


# --- fictions, removed flags, typos ------------------------------------------------------------------------------

@pytest.mark.parametrize("fiction, related", [
    ("--fp8-padding-threshold", "--quantization"), ("--fp8-w8a16", "--quantization"),
    ("--quant-aware", "--quantization"), ("--fp8-use-matrix", "--quantization"),
    ("--attention-reduction", "--kv-cache-dtype"), ("--max-num-prompt-tokens", "--max-num-batched-tokens")])
def test_seed_fictions_are_rejected_with_a_real_flag_and_the_real_way(fiction, related):
    value = "" if fiction in flags.FICTION_SWITCHES else " 0.05"  # the seed gives the threshold a value
    r = lint(f"vllm serve m {fiction}{value} --enforce-eager")
    i = issue(r, fiction)
    assert not r.ok and i.is_error and i.kind == "fiction"
    assert i.suggestion == related and related in TABLE.options
    assert i.real_way
    assert [x.flag for x in r.issues] == [fiction]  # its value was not taken for a second model
    assert "--enforce-eager" in r.flags


def test_fp8_w8a16_says_quantization_fp8_runs_weight_only_below_8_9():
    i = issue(lint("vllm serve m --fp8-w8a16"), "--fp8-w8a16")
    assert "--quantization fp8" in i.real_way and "weight-only" in i.real_way and "8.9" in i.real_way
    assert "--linear-backend marlin" in i.real_way  # the way to get W8A16 on 8.9+ as well
    assert "Marlin" in i.real_way


def test_the_seed_command_line():
    r = lint(SEED)
    kinds = {i.flag: i.kind for i in r.issues}
    assert kinds == {"vllm.entrypoints.api_server": "entrypoint", "--fp8-padding-threshold": "fiction",
                     "--fp8-w8a16": "fiction", "--quant-aware": "fiction", "--fp8-use-matrix": "fiction"}
    assert r.program == "python -m vllm.entrypoints.api_server"
    assert {"--quantization", "--kv-cache-dtype", "--tensor-parallel-size", "--model"} <= set(r.flags)


def test_the_quantization_header_is_named_as_fiction():
    r = lint('vllm serve m --header "X-VLLM-QUANTIZATION: fp16"')
    i = next(i for i in r.issues if i.kind == "fiction")
    assert "X-VLLM-QUANTIZATION" in i.flag and "second server" in i.real_way


def test_removed_flag_says_removed_and_what_to_do():
    i = issue(lint("vllm serve m --kv-cache-dtype fp8 --calculate-kv-scales"), "--calculate-kv-scales")
    assert i.kind == "removed" and i.is_error and "removed" in i.message and "checkpoint" in i.real_way


def test_typo_gets_the_nearest_real_flag():
    i = issue(lint("vllm serve m --gpu-memory-utilizaton 0.9"), "--gpu-memory-utilizaton")
    assert i.kind == "unknown" and i.suggestion == "--gpu-memory-utilization"
    assert "Did you mean --gpu-memory-utilization?" in i.message


def test_bad_choice_names_the_valid_values():
    i = issue(lint("vllm serve m --kv-cache-dtype fp9"), "--kv-cache-dtype fp9")
    assert i.kind == "bad_choice" and i.suggestion == "fp8"


def test_abbreviations_as_argparse_sees_them():
    r = lint("vllm serve m --enforce")
    i = issue(r, "--enforce")
    assert r.ok and i.kind == "abbreviated" and i.suggestion == "--enforce-eager"
    r = lint("vllm serve m --quant fp8")
    assert not r.ok and "ambiguous" in issue(r, "--quant").message


# --- real command lines pass ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", [
    "vllm serve meta-llama/Llama-3-8B --quantization fp8 --kv-cache-dtype fp8 --block-size 16 "
    "--enable-chunked-prefill --max-num-batched-tokens 8192 --enable-prefix-caching --enforce-eager "
    "--disable-log-stats --gpu-memory-utilization 0.9 --max-model-len 8192 --max-num-seqs 64 --tensor-parallel-size 2",
    "CUDA_VISIBLE_DEVICES=0,1 vllm serve m -tp 2 -q fp8 --max_model_len=4096 -O3",
    "vllm serve m -O 3 -cc.mode 3 --compilation-config='{\"mode\": 3}'",
    "python -m vllm.entrypoints.openai.api_server --model m --port 8000 --compilation-config.mode 3",
    "vllm serve m \\\n  --max-model-len 2048 \\\n  --no-enable-prefix-caching",
    "--max-model-len 2048 --enforce-eager",  # only the flags
])
def test_real_command_lines_pass(cmd):
    r = lint(cmd)
    assert r.ok, [i.message for i in r.issues]
    assert not [i for i in r.issues if i.kind not in ("deprecated",)]


def test_model_flag_with_vllm_serve_is_a_warning_not_an_error():
    r = lint("vllm serve --model m")
    assert r.ok and issue(r, "--model").kind == "deprecated"


def test_extra_positional_is_reported():
    r = lint("vllm serve m extra")
    assert not r.ok and issue(r, "extra").kind == "positional"


def test_unbalanced_quotes_do_not_raise():
    assert not lint('vllm serve m --served-model-name "oops').ok


# --- where the table comes from ----------------------------------------------------------------------------------

def test_committed_table_is_used_when_vllm_is_not_importable(monkeypatch):
    monkeypatch.setenv(flags.ENV_PYTHON, sys.executable)  # the console's Python: no vLLM in it
    t = flags.load_table()
    assert t.vllm_version == "0.32.0" and "kept in the repo" in t.source and "not importable" in t.source
    monkeypatch.setenv(flags.ENV_PYTHON, "")  # empty: do not even look
    t = flags.load_table()
    assert "kept in the repo" in t.source and "not importable" not in t.source
    assert not flags.lint_command("vllm serve m --fp8-w8a16").ok  # load_table() inside, no table passed


@pytest.mark.vllm  # imports vLLM in .venv-vllm: 20-60 s on 2 cores
def test_live_parser_is_read_from_the_vllm_env_and_agrees_with_the_committed_table(tmp_path, monkeypatch):
    python = ROOT / ".venv-vllm" / "bin" / "python"
    if not python.exists():  # CI makes it: missing is a broken setup, skipped only on purpose, as tests/vllm does
        if os.environ.get("TRIAGE_TESTS_WITHOUT_VLLM") != "1":
            pytest.fail("no .venv-vllm here (scripts/setup_vllm.sh makes it). Set TRIAGE_TESTS_WITHOUT_VLLM=1 to "
                        "skip this test on purpose.", pytrace=False)
        pytest.skip("no .venv-vllm here, skipped on purpose (TRIAGE_TESTS_WITHOUT_VLLM=1)")
    monkeypatch.setattr(flags, "CACHE_DIR", tmp_path)  # force a real dump, not a cached one
    live = flags.load_table(str(python))
    assert "own parser" in live.source and live.vllm_version == "0.32.0"
    assert set(live.options) == set(TABLE.options)
    assert list(tmp_path.glob("vllm-0.32.0-*.json"))  # cached for the next run


# --- the CLI -----------------------------------------------------------------------------------------------------

def cli(*args):
    env = {**os.environ, flags.ENV_PYTHON: ""}  # the committed table: fast and the same everywhere
    return subprocess.run([sys.executable, "-m", "diagnostics", "lint-flags", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)


def test_cli_exit_1_on_unknown_flag_with_the_real_way():
    p = cli("--", "vllm", "serve", "m", "--fp8-w8a16")
    assert p.returncode == 1, p.stderr
    assert "--fp8-w8a16" in p.stdout and "--quantization fp8" in p.stdout


def test_cli_exit_0_on_real_flags_and_json_output():
    p = cli("--json", "--", "vllm serve m --enforce-eager --max-model-len 2048")
    assert p.returncode == 0, p.stderr
    data = json.loads(p.stdout)
    assert data["ok"] is True and data["flags"] == ["--enforce-eager", "--max-model-len"]
    assert data["vllm_version"] == "0.32.0"


def test_cli_json_lists_issues_and_exit_1():
    p = cli("--json", "--", "vllm", "serve", "m", "--max-num-prompt-tokens", "131072", "--calculate-kv-scales")
    assert p.returncode == 1
    kinds = {i["flag"]: i["kind"] for i in json.loads(p.stdout)["issues"]}
    assert kinds == {"--max-num-prompt-tokens": "fiction", "--calculate-kv-scales": "removed"}


def test_cli_without_a_command_is_a_usage_error():
    p = cli()
    assert p.returncode == 2 and "no command given" in p.stderr


# --- far-off flags are not suggested (#15) ----------------------------------------------------------------------------

@pytest.mark.parametrize("flag", ["--enable-fp8-kv-offload", "--enable-dynamic-kv", "--enable-fp8"])
def test_a_flag_spelled_like_nothing_real_gets_no_suggestion(flag):
    # These once got "--enable-lora", "--enable-elastic-ep" and "--enable-eplb": only "--enable-" was alike.
    r = lint(f"vllm serve m {flag} --enforce-eager")
    i = issue(r, flag)
    assert not r.ok and i.kind == "unknown" and i.suggestion is None
    assert "vLLM has no such flag" in i.message and "Did you mean" not in i.message
    assert "nearest real" not in flags.format_text(r)
    assert [x.flag for x in r.issues] == [flag]


@pytest.mark.parametrize("typo, real", [
    ("--gpu-memory-utilizaton", "--gpu-memory-utilization"), ("--max-model-length", "--max-model-len"),
    ("--enable-prefix-cache", "--enable-prefix-caching"), ("--kv-cache-type", "--kv-cache-dtype"),
    ("--enable-chunk-prefill", "--enable-chunked-prefill"), ("--quantisation", "--quantization"),
    ("--trust-remote", "--trust-remote-code"), ("--disable-log-stat", "--disable-log-stats"),
])
def test_typos_still_get_the_real_flag(typo, real):
    i = issue(lint(f"vllm serve m {typo} 1"), typo)
    assert i.kind in ("unknown", "abbreviated") and i.suggestion == real


@pytest.mark.parametrize("myth, related", [("--max-batch-size", "--max-num-seqs"),
                                           ("--fp8-kv-cache", "--kv-cache-dtype")])
def test_known_myths_get_the_flag_meant_even_when_spelled_far_from_it(myth, related):
    value = "" if myth in flags.FICTION_SWITCHES else " 64"
    r = lint(f"vllm serve m {myth}{value} --enforce-eager")
    i = issue(r, myth)
    assert i.kind == "fiction" and i.suggestion == related and related in TABLE.options and i.real_way
    assert [x.flag for x in r.issues] == [myth]
