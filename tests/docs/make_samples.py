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


def make_image_only_pdf(
    path: str | os.PathLike, pages: list[str], dpi: int = 150, text_pages: tuple[int, ...] = (),
    height: float | None = None,
) -> Path:
    """A scan: each page of make_pdf(pages) rendered to a PNG at `dpi` and placed as the only
    content of a page of the same size, so the file has no text layer. Pages whose 1-based
    number is in `text_pages` are kept as text, as in a scan with some pages born digital.
    `height` keeps only the top of each page, in points (OCR time grows with the page's area,
    and test pages hold a few lines at the top)."""
    source = make_pdf(Path(path).with_suffix(".source.pdf"), pages)
    scan = pymupdf.open()
    with pymupdf.open(source) as original:
        for number, page in enumerate(original, start=1):
            if number in text_pages:
                scan.insert_pdf(original, from_page=number - 1, to_page=number - 1)
                continue
            clip = pymupdf.Rect(0, 0, page.rect.width, height or page.rect.height)
            image = page.get_pixmap(dpi=dpi, clip=clip).tobytes("png")
            sheet = scan.new_page(width=clip.width, height=clip.height)
            sheet.insert_image(sheet.rect, stream=image)
    scan.save(path)
    scan.close()
    source.unlink()
    return Path(path)


def make_damaged_image_pdf(path: str | os.PathLike, text: str) -> Path:
    """Page 1 holds `text` as text; page 2 is a scan whose JPEG data is garbage, as a file
    damaged on disk leaves it (the image's dictionary still says DCTDecode)."""
    make_pdf(path, [text])
    document = pymupdf.open(path)
    picture = pymupdf.open()
    picture.new_page().insert_text((72, 72), "Unreadable words", fontsize=30)
    jpeg = picture[0].get_pixmap(dpi=100).tobytes("jpeg")
    page = document.new_page()
    page.insert_image(page.rect, stream=jpeg)
    xref = page.get_images()[0][0]
    document.update_stream(xref, b"\xff\xd8\xff not a JPEG any more " * 20, compress=False)
    document.xref_set_key(xref, "Filter", "/DCTDecode")
    data = document.tobytes()
    document.close()
    Path(path).write_bytes(data)
    return Path(path)


def make_table_pdf(
    path: str | os.PathLike, before: str, rows: list[list[str]], after: str
) -> Path:
    """One page: `before`, a table of `rows` ruled with lines as a word processor draws one,
    then `after`."""
    document = pymupdf.open()
    page = document.new_page()
    page.insert_text((72, 72), before, fontsize=_PDF_FONT_SIZE)
    top, width, height = 100, 140, 20
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            box = pymupdf.Rect(72 + c * width, top + r * height, 72 + (c + 1) * width,
                               top + (r + 1) * height)
            page.draw_rect(box, color=(0, 0, 0), width=0.5)
            page.insert_text((box.x0 + 4, box.y1 - 6), cell, fontsize=_PDF_FONT_SIZE)
    page.insert_text((72, top + len(rows) * height + 30), after, fontsize=_PDF_FONT_SIZE)
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
