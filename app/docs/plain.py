"""TXT and Markdown readers. Markdown is kept as written: it is meant to be read as is."""

from __future__ import annotations

import io
import re
from pathlib import Path

from app.docs.document import Extracted, Refused
from app.docs.limits import MAX_TEXT_BYTES
from app.docs.text import (
    clean_title,
    decode_text,
    looks_binary,
    normalise,
    paginate,
    short_title,
)

_FENCE = re.compile(r"^\s{0,3}(```|~~~)")
_H1 = re.compile(r"^\s{0,3}#[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FRONT_MATTER_FIELD = re.compile(r"^(title|author)\s*:\s*(.*?)\s*$", re.IGNORECASE)


def extract_txt(path: Path, size: int) -> Extracted:
    return Extracted(pages=paginate(_read_text(path, size)))


def extract_md(path: Path, size: int) -> Extracted:
    text = _read_text(path, size)
    fields = _front_matter(text)
    return Extracted(
        pages=paginate(text),
        title=fields.get("title", ""),
        heading=_first_h1(text),
        author=fields.get("author", ""),
    )


def _read_text(path: Path, size: int) -> str:
    if size > MAX_TEXT_BYTES:
        raise Refused(
            f"file is {size / 2**20:.0f} MB; text files over {MAX_TEXT_BYTES // 2**20} MB are "
            "not read (split it into smaller files)"
        )
    text = decode_text(path.read_bytes())
    if looks_binary(text):
        raise Refused(
            "file is binary data, not text (if it is UTF-16 text without a byte-order mark, "
            "save it as UTF-8)"
        )
    return normalise(text)


def _first_h1(text: str) -> str:
    """First ATX '# ' heading outside code fences."""
    in_fence = False
    for line in io.StringIO(text):  # lazily: the heading is near the top of a 200 MB file
        line = line.rstrip("\n")
        if _FENCE.match(line):
            in_fence = not in_fence
        elif not in_fence and (match := _H1.match(line)):
            return short_title(match.group(1))
    return ""


def _front_matter(text: str) -> dict[str, str]:
    """title/author from a YAML front-matter block (Jekyll, Hugo, Pandoc, Obsidian), read
    line by line: a YAML parser for two scalar fields is not worth a dependency."""
    lines = text.split("\n", 200)
    if not lines or lines[0].strip() != "---":
        return {}
    fields: dict[str, str] = {}
    for line in lines[1:200]:
        if line.strip() in ("---", "..."):
            return fields
        if match := _FRONT_MATTER_FIELD.match(line):
            fields.setdefault(match.group(1).lower(), clean_title(match.group(2).strip("\"'")))
    return {}  # no closing fence: it was a horizontal rule, not front matter
