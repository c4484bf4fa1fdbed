"""Build real document files for tests: `from tests.docs.make_samples import make_pdf`.

Each function writes `path` and returns it as a Path. The files come from the same libraries
people's documents come from (pymupdf, ebooklib, python-docx), not from hand-written bytes.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pymupdf

_PDF_FONT_SIZE = 10
_PDF_LINE_CHARS = 90  # fits an A4 page between 72 pt margins at 10 pt Helvetica
_PDF_LINES_PER_PAGE = 50


# ---- PDF


def make_pdf(
    path: str | os.PathLike, pages: list[str], title: str = "", author: str = ""
) -> Path:
    """One PDF page per string. Lines longer than 90 characters are wrapped; blank lines do not
    survive text extraction, so `read` gives back each page's non-blank lines."""
    document = pymupdf.open()
    for text in pages:
        page = document.new_page()  # A4
        lines = [
            wrapped
            for line in text.split("\n")
            for wrapped in textwrap.wrap(line, _PDF_LINE_CHARS) or [""]
        ]
        if len(lines) > _PDF_LINES_PER_PAGE:
            raise ValueError(
                f"a sample PDF page holds {_PDF_LINES_PER_PAGE} lines, not {len(lines)}"
            )
        if text:
            page.insert_text((72, 72), "\n".join(lines), fontsize=_PDF_FONT_SIZE)
    document.set_metadata({"title": title, "author": author})
    document.save(path)
    document.close()
    return Path(path)


def make_scanned_pdf(path: str | os.PathLike, page_count: int = 2) -> Path:
    """Pages with only drawings on them, as a scan without OCR has only images."""
    document = pymupdf.open()
    for _ in range(page_count):
        page = document.new_page()
        page.draw_rect(pymupdf.Rect(72, 72, 300, 300), color=(0, 0, 0), fill=(0.5, 0.5, 0.5))
    document.save(path)
    document.close()
    return Path(path)


def make_encrypted_pdf(
    path: str | os.PathLike, pages: list[str], password: str = "secret"
) -> Path:
    """AES-256 with a user password, so the file cannot be opened without it."""
    make_pdf(path, pages)
    document = pymupdf.open(path)
    data = document.tobytes(
        encryption=pymupdf.PDF_ENCRYPT_AES_256, user_pw=password, owner_pw=password + "-owner"
    )
    document.close()
    Path(path).write_bytes(data)
    return Path(path)


def make_truncated_pdf(
    path: str | os.PathLike, pages: list[str] | None = None, keep: float = 0.5
) -> Path:
    """The first `keep` share of a good PDF's bytes, as a copy cut short leaves it."""
    make_pdf(path, pages or [f"Page {n} of a document that was cut short." for n in (1, 2, 3)])
    data = Path(path).read_bytes()
    Path(path).write_bytes(data[: int(len(data) * keep)])
    return Path(path)


# ---- EPUB


def make_epub(
    path: str | os.PathLike,
    chapters: list[tuple[str, str]],
    title: str = "Sample Book",
    author: str = "",
) -> Path:
    """`chapters` are (heading, text) pairs; text paragraphs are separated by blank lines.
    Each chapter is an XHTML file with an <h1> and <p>s; a nav document comes first in the
    spine, as ebooklib writes books."""
    from ebooklib import epub

    book = epub.EpubBook()
    book.set_identifier(f"sample-{Path(path).stem}")
    book.set_title(title)
    book.set_language("en")
    if author:
        book.add_author(author)
    items = []
    for number, (heading, text) in enumerate(chapters, start=1):
        item = epub.EpubHtml(title=heading, file_name=f"chapter{number}.xhtml", lang="en")
        item.content = f"<h1>{_escape(heading)}</h1>" + "".join(
            f"<p>{_escape(paragraph)}</p>" for paragraph in text.split("\n\n")
        )
        book.add_item(item)
        items.append(item)
    book.toc = tuple(items)
    book.add_item(epub.EpubNcx())
    book.add_item(epub.EpubNav())
    book.spine = ["nav", *items]
    epub.write_epub(os.fspath(path), book)
    return Path(path)


# ---- DOCX


def make_docx(
    path: str | os.PathLike,
    pages: list[str],
    title: str = "",
    author: str = "",
    heading: str = "",
) -> Path:
    """One Word page per string, with explicit page breaks between them; text paragraphs are
    separated by blank lines. `heading` becomes a Heading 1 paragraph at the top."""
    import docx

    document = docx.Document()
    # python-docx's template says the author is "python-docx"; say what the caller said.
    document.core_properties.title = title
    document.core_properties.author = author
    if heading:
        document.add_heading(heading, level=1)
    for number, text in enumerate(pages):
        if number:
            document.add_page_break()
        for paragraph in text.split("\n\n"):
            document.add_paragraph(paragraph)
    document.save(path)
    return Path(path)


# ---- HTML, Markdown, plain text


def make_html(
    path: str | os.PathLike,
    paragraphs: list[str],
    title: str = "",
    author: str = "",
    heading: str = "",
    encoding: str = "utf-8",
) -> Path:
    """A page with <title>, meta author, an <h1>, the paragraphs, and a script, a style and a
    nav bar whose text must not be read."""
    head = f'<meta charset="{encoding}">'
    if title:
        head += f"<title>{_escape(title)}</title>"
    if author:
        head += f'<meta name="author" content="{_escape(author)}">'
    head += "<style>body { color: black } /* STYLE-NOISE */</style>"
    body = '<nav><a href="/">NAV-NOISE home</a></nav>'
    if heading:
        body += f"<h1>{_escape(heading)}</h1>"
    body += "".join(f"<p>{_escape(paragraph)}</p>\n" for paragraph in paragraphs)
    body += "<script>var noise = 'SCRIPT-NOISE';</script>"
    html = f"<!DOCTYPE html>\n<html><head>{head}</head>\n<body>{body}</body></html>\n"
    Path(path).write_bytes(html.encode(encoding))
    return Path(path)


def make_text(
    path: str | os.PathLike, text: str, encoding: str = "utf-8", bom: bool = False
) -> Path:
    """A TXT or MD file in `encoding`, with its byte-order mark when `bom` (give an encoding
    with its byte order, "utf-16-le", not "utf-16", which writes a BOM of its own)."""
    data = text.encode(encoding)
    if bom:
        data = "\ufeff".encode(encoding) + data
    Path(path).write_bytes(data)
    return Path(path)


def _escape(text: str) -> str:
    return (
        text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
        .replace('"', "&quot;")
    )
