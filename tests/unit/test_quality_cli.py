"""`python -m diagnostics quality` refuses bad documents and settings with one clear line before loading a model."""
from diagnostics.__main__ import main


def run(argv, capsys):
    code = main(["quality", "--no-history", *argv])
    return code, capsys.readouterr().err


def test_empty_binary_and_missing_documents(tmp_path, capsys):
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    binary = tmp_path / "data.txt"
    binary.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00" + bytes(range(200)))
    code, err = run(["--document", str(empty)], capsys)
    assert code == 2 and "is empty" in err
    code, err = run(["--document", str(binary)], capsys)
    assert code == 2 and "looks binary" in err
    code, err = run(["--document", str(tmp_path / "nope.md")], capsys)
    assert code == 2 and "Cannot read the document" in err


def test_unknown_candidate_is_refused(capsys):
    code, err = run(["--candidates", "fp8,int3"], capsys)
    assert code == 2 and "Unknown precision 'int3'" in err and "int4-awq" in err


def test_a_window_out_of_range_is_refused_with_its_range(capsys):
    code, err = run(["--window", "1000000000"], capsys)
    assert code == 2 and "between 16 and 32,000 tokens; got 1,000,000,000" in err
    code, err = run(["--window", "64", "--stride", "65"], capsys)
    assert code == 2 and "stride must be between 1 and the window (64)" in err
