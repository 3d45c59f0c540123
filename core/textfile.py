"""Text the user uploads or pastes, read once for every page: decoded (UTF-8, UTF-8 with BOM, UTF-16 with BOM), checked
(not empty, under the upload limit, not binary), and the shipped sample prose that long prompts are made from.

Errors are DocumentError with a message that says what was found and what to do.
"""
from __future__ import annotations

import tomllib
import unicodedata
from pathlib import Path

from core.errors import InputError

ROOT = Path(__file__).resolve().parents[1]
SOURCE = Path(__file__).with_name("data") / "longdoc_source.md"
EXTENSIONS = ("txt", "md", "json", "log", "csv", "py")
MAX_CONTROL_SHARE = 0.05  # real text has almost no control characters besides tab, newline and carriage return
DEFAULT_LIMIT_MB = 20



class DocumentError(InputError):
    pass


def upload_limit_mb() -> int:
    """server.maxUploadSize from .streamlit/config.toml, the same limit the Streamlit uploader enforces."""
    try:
        with open(ROOT / ".streamlit" / "config.toml", "rb") as f:
            return int(tomllib.load(f)["server"]["maxUploadSize"])
    except (OSError, KeyError, ValueError, tomllib.TOMLDecodeError):
        return DEFAULT_LIMIT_MB


def _check_size(n_bytes: int, limit_mb: int) -> None:
    if n_bytes > limit_mb * 2**20:
        raise DocumentError(f"The document is {n_bytes / 2**20:.1f} MB; the limit is {limit_mb} MB "
                            "(server.maxUploadSize in .streamlit/config.toml). Split it, or paste the part you need.")


def decode_bytes(data: bytes, name: str = "", limit_mb: int | None = None,
                 extensions: tuple[str, ...] | None = EXTENSIONS) -> str:
    """Text of an uploaded file: UTF-8 (with or without BOM) or UTF-16 with a BOM; line ends normalised to \\n.
    `extensions` are the ones accepted (None: any)."""
    what = f"{name} " if name else "The file "
    ext = name.rsplit(".", 1)[-1].lower() if "." in name else ""
    if name and extensions is not None and ext not in extensions:
        raise DocumentError(f"{what}has extension {('.' + ext) if ext else '(none)'}; this page reads "
                            f"{', '.join('.' + e for e in extensions)} files.")
    if not data:
        raise DocumentError(f"{what}is empty (0 bytes). Choose another file or paste text.")
    _check_size(len(data), limit_mb or upload_limit_mb())
    if data[:2] in (b"\xff\xfe", b"\xfe\xff"):  # UTF-16 BOM first: UTF-16 text is full of NUL bytes
        encoding = "utf-16"
    elif data[:3] == b"\xef\xbb\xbf":
        encoding = "utf-8-sig"
    else:
        nul = data.find(b"\x00")
        if nul >= 0:
            raise DocumentError(f"{what}looks binary: it has a NUL byte at offset {nul}. Text files never do, "
                                "except UTF-16 without a byte-order mark (re-save that as UTF-8). Upload plain text "
                                "(txt, md, json, log, csv, py), not an archive, PDF or image.")
        encoding = "utf-8"
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        bad = data[exc.start:exc.start + 1].hex()
        raise DocumentError(
            f"{what}is not valid {encoding.upper().replace('-SIG', '')}: byte 0x{bad} at offset {exc.start} cannot be "
            f"decoded (tried UTF-8, UTF-8 with BOM and UTF-16 with BOM). It is probably Latin-1 or Windows-1252. "
            "Re-save it as UTF-8 (e.g. `iconv -f cp1252 -t utf-8 in.txt > out.txt`) and upload it again.") from None
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    check_text(text, name)
    return text


def check_text(text: str, name: str = "", limit_mb: int | None = None) -> None:
    """Pasted or decoded text: not empty, under the size limit, and not binary masquerading as text."""
    what = f"{name} " if name else "The text "
    if not text.strip():
        raise DocumentError(f"{what}is empty (only whitespace). Paste or upload a document.")
    _check_size(len(text.encode("utf-8", "surrogatepass")), limit_mb or upload_limit_mb())
    head = text[:65536]
    control = sum(1 for c in head if unicodedata.category(c) == "Cc" and c not in "\t\n\r\f")
    if control > MAX_CONTROL_SHARE * len(head):
        raise DocumentError(f"{what}looks binary: {100 * control / len(head):.0f}% of its first {len(head)} "
                            "characters are control characters. Upload plain text, not a binary file.")


def source_text() -> str:
    """The shipped source text after its introduction: headings, prose and fenced code, in file order."""
    text = SOURCE.read_text(encoding="utf-8")
    return text[text.index("\n## "):].strip()
