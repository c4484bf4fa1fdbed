"""Plain-text helpers shared by the readers: decoding, normalising, paginating, titles."""

from __future__ import annotations

import codecs
import re

from app.docs.limits import (
    BINARY_CONTROL_SHARE,
    MAX_EXPLICIT_PAGE_CHARS,
    PAGE_CHARS,
    TITLE_MAX_CHARS,
)

# ---- Decoding

# Longest BOMs first: the UTF-32-LE BOM begins with the UTF-16-LE one.
_BOMS = (
    (codecs.BOM_UTF32_LE, "utf-32-le"),
    (codecs.BOM_UTF32_BE, "utf-32-be"),
    (codecs.BOM_UTF8, "utf-8"),
    (codecs.BOM_UTF16_LE, "utf-16-le"),
    (codecs.BOM_UTF16_BE, "utf-16-be"),
)


def _single_byte_table() -> str:
    """cp1252 where it maps a byte, latin-1 for the five bytes cp1252 leaves undefined."""
    chars = []
    for byte in range(256):
        try:
            chars.append(bytes([byte]).decode("cp1252"))
        except UnicodeDecodeError:
            chars.append(chr(byte))
    return "".join(chars)


# latin-1 decodes byte b to chr(b), so translating through this table is a total cp1252.
_SINGLE_BYTE = {byte: char for byte, char in enumerate(_single_byte_table()) if ord(char) != byte}


def decode_text(data: bytes) -> str:
    """Decode a text file's bytes. Never raises.

    UTF-8 (with or without BOM), UTF-16 and UTF-32 with a BOM; anything else is taken as the
    single-byte Windows encoding most legacy text is in (cp1252, latin-1 for its gaps).
    """
    for bom, encoding in _BOMS:
        if data.startswith(bom):
            return data[len(bom):].decode(encoding, errors="replace")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        # A file cut off mid-character (a truncated download) is still UTF-8: decoding the
        # whole of it as cp1252 would garble every other accented letter.
        if error.start >= len(data) - 3 and error.reason == "unexpected end of data":
            return data[: error.start].decode("utf-8") + "\ufffd"
    return data.decode("latin-1").translate(_SINGLE_BYTE)


_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f]")
_BINARY_SAMPLE_CHARS = 2**20


def looks_binary(text: str) -> bool:
    """True when too many characters are control characters for this to be text."""
    sample = text[:_BINARY_SAMPLE_CHARS]  # as git and grep do, judge by the start of the file
    if not sample:
        return False
    return len(_CONTROL.findall(sample)) > BINARY_CONTROL_SHARE * len(sample)


# ---- Normalising

# Control characters (form feed aside: it is a page break), lone surrogates that could not be
# stored as UTF-8, and byte-order marks left inside the text.
_STRIP = re.compile(r"[\x00-\x08\x0e-\x1f\x7f-\x9f\ud800-\udfff\ufeff]")
_TRAILING_SPACE = re.compile(r"[ \t\u00a0]+(?=[\n\f]|\Z)")
_BLANK_RUN = re.compile(r"\n{3,}")


def normalise(text: str) -> str:
    """Unix newlines, no control characters, no trailing spaces, at most one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n")
    text = text.replace("\x0b", "\n").replace("\u2028", "\n").replace("\u2029", "\n\n")
    text = _STRIP.sub("", text)
    text = _TRAILING_SPACE.sub("", text)
    return _BLANK_RUN.sub("\n\n", text)


# ---- Paginating


def paginate(text: str, page_chars: int = PAGE_CHARS) -> list[str]:
    """Split normalised text into page texts.

    Form feeds are page breaks the author made, so they win; without any, the text is filled
    into pages of at most `page_chars` at paragraph boundaries. Empty pages between breaks are
    kept (page numbers must match the source's), trailing ones are not.
    """
    if "\f" not in text:
        return split_at_paragraphs(text, page_chars)
    pages = [sheet.strip() for sheet in text.split("\f")]
    while pages and not pages[-1]:
        pages.pop()
    result = []
    for page in pages:
        if len(page) > MAX_EXPLICIT_PAGE_CHARS:
            result.extend(split_at_paragraphs(page, page_chars))
        else:
            result.append(page)
    return result


def split_at_paragraphs(text: str, page_chars: int = PAGE_CHARS) -> list[str]:
    """Greedily fill pages of at most `page_chars` with whole paragraphs (blank-line separated).

    A paragraph longer than a page is cut at whitespace; only a single word longer than a page
    is cut inside itself.
    """
    pages: list[str] = []
    current: list[str] = []
    size = 0

    def flush() -> None:
        nonlocal current, size
        if current:
            pages.append("\n\n".join(current))
        current, size = [], 0

    for paragraph in text.split("\n\n"):
        paragraph = paragraph.strip()
        if not paragraph:
            continue
        if len(paragraph) > page_chars:
            flush()
            pieces = cut_at_whitespace(paragraph, page_chars)
            pages.extend(pieces[:-1])
            current, size = [pieces[-1]], len(pieces[-1])
            continue
        added = len(paragraph) + (2 if current else 0)
        if size + added > page_chars:
            flush()
            added = len(paragraph)
        current.append(paragraph)
        size += added
    flush()
    return pages


def cut_at_whitespace(text: str, limit: int) -> list[str]:
    """Cut `text` into pieces of at most `limit` chars, at the last line break in the second
    half of each window, else its last space or tab."""
    pieces = []
    position = 0  # an index rather than re-slicing the rest: a 100 MB paragraph stays linear
    while len(text) - position > limit:
        window = text[position : position + limit + 1]  # whitespace just past the limit is fine
        cut = window.rfind("\n")
        if cut < limit // 2:
            cut = max(cut, window.rfind(" "), window.rfind("\t"))
        if cut <= 0:
            cut = limit  # one "word" longer than a page (a URL, base64): no gentler cut exists
        piece = window[:cut].strip()
        if piece:
            pieces.append(piece)
        position += cut
        while position < len(text) and text[position] in " \t\n":
            position += 1
    rest = text[position:].strip()
    if rest or not pieces:
        pieces.append(rest)
    return pieces


# ---- Titles

_WHITESPACE = re.compile(r"\s+")


def clean_title(title: str | None) -> str:
    """One line, no control characters, no surrounding space."""
    if not title:
        return ""
    return _WHITESPACE.sub(" ", _STRIP.sub("", title)).strip()


def short_title(line: str | None) -> str:
    """`line` as a title when it is short enough to be one, else ""."""
    title = clean_title(line)
    return title if len(title) <= TITLE_MAX_CHARS else ""


def first_line(pages: list[str]) -> str:
    """First non-blank line of the text, when short enough to be a title."""
    for page in pages:
        for line in page.split("\n", 50):
            if line.strip():
                return short_title(line)
    return ""
