"""HTML to readable text (shared by the HTML and EPUB readers), and the HTML reader."""

from __future__ import annotations

import codecs
import re
from pathlib import Path

import lxml.html
from lxml import etree

from app.docs.document import Extracted, Refused
from app.docs.limits import MAX_TEXT_BYTES
from app.docs.tables import table_text
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

# Private-use characters mark structure in the flat list of strings built by the walk; any
# already in the document are removed first so they cannot fake structure.
_PARAGRAPH, _LINE, _CELL, _PAGE, _ROW = "\ue000", "\ue001", "\ue002", "\ue003", "\ue004"
_MARKERS = {ord(marker): None for marker in (_PARAGRAPH, _LINE, _CELL, _PAGE, _ROW)}

_DROPPED = {"script", "style", "nav", "noscript", "template", "head", "svg", "iframe", "object"}
_BLOCKS = {
    "address", "article", "aside", "blockquote", "body", "caption", "dd", "details", "dialog",
    "div", "dl", "dt", "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3",
    "h4", "h5", "h6", "header", "hr", "li", "main", "ol", "p", "pre", "section", "summary",
    "table", "ul",
}
# Rows and row groups are not paragraphs: a table's rows stay together, one line each.
_CELLS = {"td", "th"}
# Word and LibreOffice write their page breaks into HTML exports this way.
_PAGE_BREAK_STYLE = re.compile(
    r"(?:page-)?break-(before|after)\s*:\s*(?:always|page)", re.IGNORECASE
)
_HTML_WHITESPACE = re.compile(r"[ \t\n\r\f]+")
_AROUND_LINE = re.compile(rf" *{_LINE} *")
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*>")


def parse_html(text: str) -> lxml.html.HtmlElement:
    """Parse with lxml directly: BeautifulSoup builds its tree in Python, far slower on a large
    page."""
    # The text is decoded already, so an XHTML file's XML declaration says nothing more, and
    # lxml refuses a str that carries one.
    text = _XML_DECLARATION.sub("", normalise(text), count=1).translate(_MARKERS)
    # huge_tree: a text node over 10 MB (a log in one <pre>) would otherwise be cut silently.
    # A parser per call because lxml parsers must not be shared between threads.
    parser = lxml.html.HTMLParser(huge_tree=True)
    try:
        return lxml.html.document_fromstring(text, parser=parser)
    except etree.ParserError:  # "Document is empty"
        return lxml.html.document_fromstring("<html><body></body></html>", parser=parser)


def html_title(root: lxml.html.HtmlElement) -> str:
    """<title> from the head (an <svg> in the body may have its own <title>)."""
    tag = root.find("head/title")
    return clean_title(tag.text_content()) if tag is not None else ""


def html_heading(root: lxml.html.HtmlElement) -> str:
    tag = root.find(".//h1")
    return short_title(tag.text_content()) if tag is not None else ""


def html_author(root: lxml.html.HtmlElement) -> str:
    for meta in root.iter("meta"):
        if (meta.get("name") or "").strip().lower() == "author":
            return clean_title(meta.get("content"))
    return ""


def html_body_text(root: lxml.html.HtmlElement) -> str:
    """Readable text: headings, paragraphs and list items as paragraphs separated by a blank
    line, table rows as `| cell | cell |` lines (app.docs.tables), <pre> kept as written, CSS page breaks as form feeds.

    One iterative walk (etree.iterwalk), so deeply nested markup cannot overflow the stack.
    """
    body = root.find("body")
    if body is None:
        body = root  # a frameset page, or a fragment
    out: list[str] = []
    in_pre = 0  # depth of <pre> elements around the current one
    in_cell = 0  # depth of table cells around it: inside one, blocks and breaks are spaces

    def add(text: str | None) -> None:
        if text:
            out.append(text if in_pre else _HTML_WHITESPACE.sub(" ", text))

    walker = etree.iterwalk(body, events=("start", "end", "comment", "pi"))
    for event, element in walker:
        if event in ("comment", "pi"):
            add(element.tail)  # the comment's text is not content; what follows it is
            continue
        tag = element.tag.lower() if isinstance(element.tag, str) else ""
        breaks = _PAGE_BREAK_STYLE.findall(element.get("style") or "")
        if event == "start":
            if tag in _DROPPED:
                walker.skip_subtree()  # its "end" still comes, and brings its tail
                continue
            if in_cell and (tag in _BLOCKS or tag in ("br", "tr") or breaks):
                out.append(" ")
            else:
                if any(side.lower() == "before" for side in breaks):
                    out.append(_PAGE)
                if tag in _BLOCKS:
                    out.append(_PARAGRAPH)
                elif tag == "br":
                    out.append(_LINE)
            if tag in _CELLS:
                in_cell += 1
            if tag == "pre":
                in_pre += 1
            add(element.text)
        else:
            if tag not in _DROPPED:
                if tag == "pre":
                    in_pre -= 1
                if tag in _CELLS:
                    in_cell -= 1
                if in_cell:
                    out.append(" ")  # the end of a block, row or cell inside a cell
                elif tag in _CELLS:
                    out.append(_CELL)
                elif tag == "tr":
                    out.append(_ROW)
                else:
                    if tag in _BLOCKS:
                        out.append(_PARAGRAPH)
                    if any(side.lower() == "after" for side in breaks):
                        out.append(_PAGE)
            if element is not body:
                add(element.tail)
    return _join_marked("".join(out))


def _join_marked(raw: str) -> str:
    raw = raw.replace(_PAGE, f"{_PARAGRAPH}\f{_PARAGRAPH}")
    paragraphs = []
    for chunk in raw.split(_PARAGRAPH):
        chunk = _AROUND_LINE.sub("\n", chunk)
        if _CELL in chunk or _ROW in chunk:
            chunk = table_text(_row_cells(row) for row in chunk.split(_ROW))
        chunk = chunk.strip(" \n")
        if chunk:
            paragraphs.append(chunk)
    return normalise("\n\n".join(paragraphs))


def _row_cells(row: str) -> list[str]:
    """The cells of one row: the text before each cell marker, and any text after the last."""
    *cells, rest = row.split(_CELL)
    return [*cells, rest] if rest.strip() else cells


# ---- HTML reader


def extract_html(path: Path, size: int) -> Extracted:
    if size > MAX_TEXT_BYTES:
        raise Refused(
            f"file is {size / 2**20:.0f} MB; HTML over {MAX_TEXT_BYTES // 2**20} MB is not "
            "read (split it into smaller files)"
        )
    text = decode_markup(path.read_bytes())
    if looks_binary(text):
        raise Refused("file is binary data, not HTML (is the file name's suffix wrong?)")
    root = parse_html(text)
    return Extracted(
        pages=paginate(html_body_text(root)),
        title=html_title(root),
        heading=html_heading(root),
        author=html_author(root),
    )
