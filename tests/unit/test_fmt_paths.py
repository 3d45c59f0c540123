"""core.fmt.short_path: captions show paths relative to the repository or under ~, never a user's home directory."""
from pathlib import Path

from core.fmt import short_path

ROOT = Path(__file__).resolve().parents[2]


def test_repository_paths_are_relative_and_home_paths_start_with_a_tilde(tmp_path, monkeypatch):
    assert short_path(ROOT / "core" / "data" / "x.json") == "core/data/x.json"
    home = tmp_path / "home" / "someone"
    (home / ".cache").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    assert short_path(home / ".cache" / "triage-console" / "history.sqlite") == "~/.cache/triage-console/history.sqlite"
    assert short_path(str(home)) == "~"
    assert short_path("/srv/data/history.sqlite") == "/srv/data/history.sqlite"  # elsewhere: kept whole
    assert short_path("relative/file.txt") == "relative/file.txt"
    assert short_path(ROOT / "docs", root=ROOT / "docs") == "."


def test_old_quality_titles_are_shortened_for_the_list():
    from core.quality.history import short_title, title

    old = ("Quality: fp8, int8 vs bf16 on shipped sample prose (window 512, stride 256) · Gemma 3 270M (embedded, "
           "from Q4_K_M GGUF; Gemma terms apply)")
    assert short_title(old) == "Quality fp8, int8 vs bf16 · shipped sample prose · window 512"
    new = title("Gemma 3 270M", {"candidates": ["fp8"], "reference": "bf16", "document": "a.txt", "window": 1024,
                                 "stride": 256})
    assert new == short_title(new) == "Quality fp8 vs bf16 · a.txt · window 1,024"
