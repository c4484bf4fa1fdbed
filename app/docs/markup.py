"""HTML to readable text (shared by the HTML and EPUB readers), and the HTML reader."""

from __future__ import annotations

import codecs
import re
from pathlib import Path

from bs4 import BeautifulSoup, Tag

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

# ---- Decoding

_DECLARED_CHARSET = re.compile(
    rb"""<meta[^>]*?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)"""
    rb"""|<\?xml[^>]*?encoding\s*=\s*["']([A-Za-z0-9_.:-]+)""",
    re.IGNORECASE,
)
# Browsers read these labels as windows-1252 (WHATWG Encoding), which is decode_text's fallback.
_SINGLE_BYTE_LABELS = {"ascii", "iso8859-1", "latin-1", "cp1252"}
_BOMS = (codecs.BOM_UTF8, codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)


def decode_markup(data: bytes) -> str:
    """Decode HTML/XHTML bytes: a BOM wins, then a declared charset that decodes cleanly, then
    decode_text's guess. Never raises."""
    if not data.startswith(_BOMS):
        declared = _DECLARED_CHARSET.search(data[:4096])
        if declared:
            label = (declared.group(1) or declared.group(2)).decode("ascii")
            try:
                codec = codecs.lookup(label).name
                if codec not in _SINGLE_BYTE_LABELS:
                    return data.decode(codec)
            except (LookupError, UnicodeError, ValueError):
                pass  # unknown label, not a text codec, or a false declaration
    return decode_text(data)


# ---- Text extraction

# Private-use characters mark structure through BeautifulSoup's get-text pass; any already in
# the document are removed first so they cannot fake structure.
_PARAGRAPH, _LINE, _CELL, _PAGE = "\ue000", "\ue001", "\ue002", "\ue003"
_MARKERS = {ord(marker): None for marker in (_PARAGRAPH, _LINE, _CELL, _PAGE)}

_DROPPED = ["script", "style", "nav", "noscript", "template", "head", "svg", "iframe", "object"]
_BLOCKS = [
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "dialog",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3",
    "h4", "h5", "h6", "header", "hr", "li", "main", "ol", "p", "pre", "section", "summary",
    "table", "tbody", "tfoot", "thead", "tr", "ul",
]
# Word and LibreOffice write their page breaks into HTML exports this way.
_PAGE_BREAK_STYLE = re.compile(
    r"(?:page-)?break-(before|after)\s*:\s*(?:always|page)", re.IGNORECASE
)
_HTML_WHITESPACE = re.compile(r"[ \t\n\r\f]+")
_AROUND_LINE = re.compile(rf" *{_LINE} *")


_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*>")


def parse_html(text: str) -> BeautifulSoup:
    # The text is decoded already, so an XHTML file's XML declaration says nothing more; left
    # in, it makes BeautifulSoup warn that XML is being parsed as HTML.
    text = _XML_DECLARATION.sub("", normalise(text), count=1)
    return BeautifulSoup(text.translate(_MARKERS), "lxml")


def html_title(soup: BeautifulSoup) -> str:
    """<title> from the head (an <svg> in the body may have its own <title>)."""
    head = soup.head
    tag = head.find("title") if head else None
    return clean_title(tag.get_text(" ")) if tag else ""


def html_heading(soup: BeautifulSoup) -> str:
    tag = soup.find("h1")
    return short_title(tag.get_text(" ")) if tag else ""


def html_author(soup: BeautifulSoup) -> str:
    tag = soup.find("meta", attrs={"name": re.compile(r"^\s*author\s*$", re.IGNORECASE)})
    return clean_title(tag.get("content")) if isinstance(tag, Tag) else ""


def html_body_text(soup: BeautifulSoup) -> str:
    """Readable text: headings, paragraphs and list items as paragraphs separated by a blank
    line, table rows as `cell | cell`, <pre> kept as written, CSS page breaks as form feeds.

    Destroys `soup` (takes metadata out first). Works through find_all and strings, which
    BeautifulSoup walks iteratively, so deeply nested markup cannot overflow the stack.
    """
    for tag in soup.find_all(_DROPPED):
        tag.decompose()
    for tag in soup.find_all(style=_PAGE_BREAK_STYLE):
        for side in _PAGE_BREAK_STYLE.findall(tag["style"]):
            _mark(tag, _PAGE, before=side.lower() == "before")
    for tag in soup.find_all(_BLOCKS):
        _mark(tag, _PARAGRAPH, before=True)
        _mark(tag, _PARAGRAPH, before=False)
    for tag in soup.find_all("br"):
        _mark(tag, _LINE, before=True)
    for tag in soup.find_all(["td", "th"]):
        _mark(tag, _CELL, before=False)

    preformatted = {id(string) for pre in soup.find_all("pre") for string in pre.strings}
    raw = "".join(
        string if id(string) in preformatted else _HTML_WHITESPACE.sub(" ", string)
        for string in soup.strings
    )
    raw = raw.replace(_PAGE, f"{_PARAGRAPH}\f{_PARAGRAPH}")

    paragraphs = []
    for chunk in raw.split(_PARAGRAPH):
        chunk = _AROUND_LINE.sub("\n", chunk)
        if _CELL in chunk:
            chunk = " | ".join(cell.strip() for cell in chunk.split(_CELL) if cell.strip())
        chunk = chunk.strip(" \n")
        if chunk:
            paragraphs.append(chunk)
    return normalise("\n\n".join(paragraphs))


def _mark(tag: Tag, marker: str, before: bool) -> None:
    if tag.parent is None:
        return
    if before:
        tag.insert_before(marker)
    else:
        tag.insert_after(marker)


# ---- HTML reader


def read_html(path: Path, size: int) -> Extracted:
    if size > MAX_TEXT_BYTES:
        raise Refused(
            f"file is {size / 2**20:.0f} MB; HTML over {MAX_TEXT_BYTES // 2**20} MB is not "
            "read (split it into smaller files)"
        )
    text = decode_markup(path.read_bytes())
    if looks_binary(text):
        raise Refused("file is binary data, not HTML (is the file name's suffix wrong?)")
    soup = parse_html(text)
    title, heading, author = html_title(soup), html_heading(soup), html_author(soup)
    return Extracted(
        pages=paginate(html_body_text(soup)), title=title, heading=heading, author=author
    )
