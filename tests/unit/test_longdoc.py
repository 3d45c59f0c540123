"""Reading, splitting and truncating documents. Token counts use the embedded model's real tokenizer (no model
weights: only its tokenizer files are read)."""
import pytest

from core import textfile
from core.long_context import document as longdoc
from core.textfile import DocumentError


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from core.models import embedded_model_dir

    return AutoTokenizer.from_pretrained(embedded_model_dir())


# ---- decoding ----

def test_utf8_with_and_without_bom_and_utf16_with_bom():
    text = "Grüße, 東京 — naïve café\r\nsecond line\n"
    want = text.replace("\r\n", "\n")
    assert textfile.decode_bytes(text.encode("utf-8"), "a.txt") == want
    assert textfile.decode_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"), "a.md") == want
    assert textfile.decode_bytes(text.encode("utf-16"), "a.log") == want  # Python writes a BOM
    assert textfile.decode_bytes(b"\xfe\xff" + text.encode("utf-16-be"), "a.csv") == want


def test_binary_file_is_refused_with_a_message():
    png = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256))
    with pytest.raises(DocumentError, match=r"looks binary: it has a NUL byte at offset 8"):
        textfile.decode_bytes(png, "image.txt")


def test_control_characters_without_nul_are_refused():
    data = bytes([1, 2, 3, 4, 5, 6, 7, 14, 15, 16] * 50) + b"some text"
    with pytest.raises(DocumentError, match=r"looks binary: \d+% of its first"):
        textfile.decode_bytes(data, "x.log")


def test_latin1_bytes_that_are_not_utf8_say_which_encoding_and_what_to_do():
    data = "Résumé of the café incident".encode("latin-1")
    with pytest.raises(DocumentError) as err:
        textfile.decode_bytes(data, "notes.txt")
    msg = str(err.value)
    assert "not valid UTF-8" in msg and "0xe9 at offset 1" in msg
    assert "Latin-1" in msg and "iconv" in msg and "UTF-16 with BOM" in msg


def test_empty_file_and_whitespace_paste():
    with pytest.raises(DocumentError, match=r"notes.txt is empty \(0 bytes\)"):
        textfile.decode_bytes(b"", "notes.txt")
    with pytest.raises(DocumentError, match="only whitespace"):
        textfile.decode_bytes(b" \n\n\t ", "notes.txt")
    with pytest.raises(DocumentError, match="empty"):
        textfile.check_text("   ")


def test_huge_file_and_paste_are_refused_with_the_limit():
    assert textfile.upload_limit_mb() == 20  # .streamlit/config.toml server.maxUploadSize
    huge = b"a" * (2 * 2**20 + 1)
    with pytest.raises(DocumentError, match=r"2\.0 MB; the limit is 2 MB \(server.maxUploadSize"):
        textfile.decode_bytes(huge, "big.log", limit_mb=2)
    with pytest.raises(DocumentError, match="the limit is 20 MB"):
        textfile.check_text("x" * (20 * 2**20 + 1))


def test_unsupported_extension():
    with pytest.raises(DocumentError, match=r"extension \.pdf"):
        textfile.decode_bytes(b"%PDF-1.7", "paper.pdf")


# ---- sections, sample, stats ----

def test_sections_from_headings_ignore_hashes_in_code():
    text = "intro line\n\n# One\nprose\n```python\n# a comment, not a heading\n```\n## Two\nmore\n"
    secs = longdoc.split_sections(text)
    assert [s.title for s in secs] == ["(before the first heading)", "One", "Two"]
    assert secs[0].start == 0 and secs[-1].end == len(text)
    assert all(a.end == b.start for a, b in zip(secs, secs[1:]))


def test_sections_from_blank_line_blocks():
    secs = longdoc.split_sections("first block\nstill first\n\n\nsecond\n\nthird\n")
    assert [s.title for s in secs] == ["block 1: first block", "block 2: second", "block 3: third"]


def test_sample_document_mixes_prose_code_and_json(tokenizer):
    doc = longdoc.sample_document(3000, lambda s: longdoc.count_tokens(tokenizer, s))
    assert "```python" in doc and "```json" in doc and "## Section 1" in doc
    n = longdoc.count_tokens(tokenizer, doc)
    assert 3000 <= n <= 3000 + longdoc.SAMPLE_OVERSHOOT_TOKENS  # blocks that would overshoot more are skipped
    count = lambda s: longdoc.count_tokens(tokenizer, s)  # noqa: E731
    for target in (256, 1000):  # near the target a ~200-token JSON block no longer lands whole beyond it
        assert target <= count(longdoc.sample_document(target, count)) <= target + longdoc.SAMPLE_OVERSHOOT_TOKENS
    assert longdoc.sample_document(3000, seed=0) == longdoc.sample_document(3000, seed=0)


def test_stats_count_tokens_per_section_and_fit(tokenizer):
    doc = longdoc.sample_document(1500, lambda s: longdoc.count_tokens(tokenizer, s))
    s = longdoc.stats(doc, tokenizer, max_positions=32768, max_length=1024, reserve_new_tokens=24)
    assert s.tokens == len(tokenizer(doc, add_special_tokens=False).input_ids) == len(s.ids)
    assert sum(sec.tokens for sec in s.sections) == s.tokens
    assert s.prompt_tokens == s.tokens + 1  # BOS
    assert s.limit == 1000 and not s.fits
    assert longdoc.stats(doc, tokenizer, 32768, 8192).fits
    assert s.chars == len(doc) and 1.5 < s.chars_per_token < 8


# ---- truncation ----

def test_truncation_head_tail_middle():
    ids = list(range(10))
    assert longdoc.truncate_ids(ids, 4, "head") == ([0, 1, 2, 3], 6)
    assert longdoc.truncate_ids(ids, 4, "tail") == ([6, 7, 8, 9], 6)
    assert longdoc.truncate_ids(ids, 4, "middle") == ([0, 1, 8, 9], 6)
    assert longdoc.truncate_ids(ids, 5, "middle") == ([0, 1, 2, 8, 9], 5)
    assert longdoc.truncate_ids(ids, 0, "tail") == ([], 10)
    assert longdoc.truncate_ids(ids, 0, "middle") == ([], 10)
    assert longdoc.truncate_ids(ids, 10, "middle") == (ids, 0)
    assert longdoc.truncate_ids(ids, 50, "head") == (ids, 0)
    with pytest.raises(ValueError, match="head, tail, middle"):
        longdoc.truncate_ids(ids, 4, "start")


def test_new_tokens_that_fill_the_max_length_get_a_message_not_a_crash(tokenizer):
    with pytest.raises(textfile.DocumentError, match="600 new tokens leave no room for a prompt within 512 positions"):
        longdoc.stats("some text " * 100, tokenizer, max_positions=32768, max_length=512, reserve_new_tokens=600)


def test_section_chart_marks_cut_titles_and_hovers_the_whole_one():
    from core.long_context import charts

    secs = [longdoc.Section(title="Sample long document (about 256 tokens)", start=0, end=10, tokens=10),
            longdoc.Section(title="<b>Short</b>", start=10, end=20, tokens=5)]
    bar = charts.section_tokens(secs).data[0]
    assert list(bar.x) == ["1. Sample long document (about…", "2. &lt;b&gt;Short&lt;/b&gt;"]
    assert bar.customdata[0] == "1. Sample long document (about 256 tokens)"
