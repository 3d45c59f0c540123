"""The compare page's HTML, tables, CSV and charts on a hand-made result whose tokens are hostile HTML."""
from __future__ import annotations

import csv
import io
import json
import math

import pytest

from core.compare import agreement as ag
from core.compare import charts, render
from core.compare.result import CompareResult, PromptResult, Side, summarize_prompts
from core.precision import KVDtype, Precision

EVIL = {
    10: "<script>alert(1)</script>",
    11: '" onmouseover="alert(2)',
    12: "\n",
    13: "&amp; <b>",
    14: " ok",
    15: "<img src=x onerror=alert(3)>",
    16: "",
}


def _result() -> CompareResult:
    ref_ids, cand_ids = [14, 10, 12, 11], [14, 15, 13, 16]
    lp = lambda *ids: {t: math.log(0.5 / (i + 1)) for i, t in enumerate(ids)}  # noqa: E731
    ref_tf = [lp(14, 10), lp(10, 15), lp(12, 13), lp(11, 16)]
    cand_tf = [lp(14, 10), lp(15, 10), lp(12, 16), lp(11, 13)]
    free = ag.free_run(ref_ids, [lp(14), lp(10, 15), lp(12), lp(11)], cand_ids, [lp(14), lp(15, 10), lp(13), lp(16)], 2)
    tf = ag.teacher_forced(ref_tf, cand_tf, 2)
    p = PromptResult('<script>name</script>', "Say <script>hi</script>", [2, 5], ref_ids, cand_ids, "ref", "cand",
                     [lp(14), lp(10, 15), lp(12), lp(11)], [lp(14), lp(15, 10), lp(13), lp(16)], ref_tf, cand_tf,
                     free, tf)
    ref, cand = Side(Precision.FP32), Side(Precision.FP8, KVDtype.FP8)
    summary = summarize_prompts([p], ref, cand, EVIL)
    return CompareResult(ref, cand, 4, 2, [p], summary, dict(EVIL),
                         {"total": 1.0}, noise_floor=False)


def test_side_by_side_escapes_every_token_and_name():
    res = _result()
    out = render.side_by_side_html(res, 0)
    for raw in ("<script>", "</script>", "<img", '" onmouseover="', "&amp; <b>"):
        assert raw not in out, raw
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in out
    assert "&lt;img src=x onerror=alert(3)&gt;" in out
    assert "&quot; onmouseover=&quot;alert(2)" in out
    assert "&amp;amp; &lt;b&gt;" in out  # already-escaped text is escaped again, shown literally
    assert "&lt;script&gt;name&lt;/script&gt;" in out and "Say &lt;script&gt;hi&lt;/script&gt;" in out


def test_tooltips_hold_both_sides_topk_escaped():
    out = render.side_by_side_html(_result(), 0)
    assert out.count('class="cmp-tip"') == 8  # every token of both sides
    assert "cmp-first" in out and "cmp-after" in out and "cmp-tfmiss" in out
    assert "50.0%" in out and "25.0%" in out  # probabilities, not logprobs
    assert "\u21b5" in out and "\u2205" in out  # a newline token and an empty token stay visible and hoverable


def test_visible_and_esc():
    assert render.visible("<a>") == "&lt;a&gt;"
    assert render.esc('"x"') == "&quot;x&quot;"
    assert render._short(" ") == "\u2423" and render._short(" a") == " a" and render._short("\n<") == "\\n&lt;"


def test_tables_csv_and_json_keep_text_as_data():
    res = _result()
    rows = render.prompt_table(res)
    assert rows[0]["prompt"] == "<script>name</script>" and rows[0]["vLLM rule (top-2)"] == "pass"
    parsed = list(csv.DictReader(io.StringIO(render.to_csv(res))))
    assert len(parsed) == 4 and parsed[1]["ref_token"] == EVIL[10] and parsed[1]["cand_free_token"] == EVIL[15]
    assert parsed[1]["after_first_divergence"] == "True" and parsed[0]["free_same"] == "True"
    d = json.loads(json.dumps(res.to_dict()))
    assert d["token_text"]["10"] == EVIL[10] and d["candidate"]["kv_dtype"] == "fp8"
    assert "\n".join(render.summary_lines(res)).count("band:") == 2


def test_chart_hover_and_titles_are_escaped():
    res = _result()
    for fig in (charts.position_chart(res, 0), charts.prompts_chart(res)):
        text = json.dumps(fig.to_plotly_json(), default=str)
        assert "<script>" not in text and "<img" not in text
    fig = charts.position_chart(res, 0)
    assert len(fig.data[0].y) == 4 and any(tr.name == "different top token" for tr in fig.data)


def test_repeated_prompt_names_are_numbered_apart():
    from core.compare.prompts import Prompt, parse_prompts, parse_user_prompts, unique_names

    typed = parse_user_prompts("first\nsecond")
    filed = parse_prompts('{"prompt": "a", "name": "x"}\n{"prompt": "b", "name": "x"}\n"c"', "p.jsonl")
    names = [p.name for p in unique_names(typed + filed)]
    assert names == ["user-1", "user-2", "x", "x-2", "user-3"]
    assert [p.name for p in unique_names(typed + typed)] == ["user-1", "user-2", "user-1-2", "user-2-2"]
    assert unique_names([Prompt("a", "1"), Prompt("a", "2"), Prompt("a", "3")])[2].name == "a-3"


def test_a_binary_prompts_file_is_refused_not_compared_as_replacement_characters(tmp_path):
    from core.textfile import DocumentError
    from core.compare.prompts import prompts_from_bytes, read_prompts_file

    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    with pytest.raises(DocumentError, match="looks binary"):
        prompts_from_bytes(png, "small.txt")
    with pytest.raises(DocumentError, match="not valid UTF-8"):
        prompts_from_bytes("caf\xe9\n".encode("latin-1"), "p.txt")
    (tmp_path / "p.bin").write_bytes(png)
    with pytest.raises(DocumentError, match="looks binary"):
        read_prompts_file(tmp_path / "p.bin")  # the CLI: any name, still text only
    assert [p.text for p in prompts_from_bytes(b"one\ntwo\n", "p.txt")] == ["one", "two"]
