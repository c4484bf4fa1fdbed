"""PDF reader: one page of text per PDF page, so citations match the page numbers a reader
sees in their viewer. Ruled tables become Markdown rows (app.docs.tables); a page without a
text layer is OCRed (app.docs.ocr), one page at a time, with progress and cancel."""

from __future__ import annotations

from pathlib import Path

import pymupdf

from app.docs import ocr
from app.docs.document import (
    NO_WATCH,
    Extracted,
    PageExtra,
    ExtractCancelled,
    ExtractWatch,
    Refused,
)
from app.docs.limits import MAX_TEXT_BYTES, OCR_MIN_TEXT_CHARS
from app.docs.tables import pdf_text_with_tables
from app.docs.text import clean_title, normalise

# pymupdf's "text" flags minus TEXT_PRESERVE_LIGATURES: "ﬁnd" becomes "find", which is what a
# person types in a question and what full-text search must match.
_TEXT_FLAGS = pymupdf.TEXTFLAGS_TEXT & ~pymupdf.TEXT_PRESERVE_LIGATURES

# MuPDF silently "repairs" a file cut short: half a PDF can open with every page but the first
# blank. A complete file ends with %%EOF in its last 1024 bytes (ISO 32000-1, 7.5.5).
_EOF_MARKER = b"%%EOF"
_EOF_WINDOW = 1024


def extract_pdf(path: Path, size: int, watch: ExtractWatch = NO_WATCH) -> Extracted:
    try:
        document = pymupdf.open(path, filetype="pdf")
    except (pymupdf.FileDataError, RuntimeError) as error:
        raise Refused(f"file is truncated or not a valid PDF (pymupdf: {error})") from None
    with document:
        if document.needs_pass:
            raise Refused("PDF is encrypted; remove the password and ingest it again")
        if document.is_repaired and not _ends_with_eof_marker(path, size):
            raise Refused(
                "file is truncated or not a valid PDF (pymupdf: the file is damaged and "
                "has no %%EOF at its end; it was probably cut short while copying or "
                "downloading)"
            )
        if document.page_count == 0:
            raise Refused("file is truncated or not a valid PDF (pymupdf: it has no pages)")
        pages, chars, extras = [], 0, {}
        for index in range(document.page_count):
            text = _page_text(document, index)
            if _has_no_text_layer(text):
                if watch.cancel():
                    raise ExtractCancelled(f"{path}: cancelled before page {index + 1}")
                # Said before the page, so a person sees the page being read, not the last one.
                watch.progress(index, document.page_count,
                               f"OCR page {index + 1} of {document.page_count}")
                recognised = ocr.recognise_page(document[index])
                if recognised.ocred:  # the page's text is what OCR read, if anything
                    text = normalise(recognised.text).strip() or text
                    extras[index] = PageExtra("ocr", recognised.note, recognised.words)
                elif recognised.note:
                    extras[index] = PageExtra("text", recognised.note)
            pages.append(text)
            chars += len(pages[-1])
            if chars > MAX_TEXT_BYTES:  # the pages' text is kept: bound it as a text file is
                raise Refused(
                    f"the PDF holds more than {MAX_TEXT_BYTES // 2**20} MB of text ({index + 1} of "
                    f"{document.page_count} pages read); split it into smaller files"
                )
        metadata = document.metadata or {}
    return Extracted(
        pages=pages,
        extras=extras,
        title=clean_title(metadata.get("title")),
        author=clean_title(metadata.get("author")),
    )


def _has_no_text_layer(text: str) -> bool:
    return sum(1 for char in text if not char.isspace()) < OCR_MIN_TEXT_CHARS


def _page_text(document: pymupdf.Document, index: int) -> str:
    try:
        page = document[index]
        text = pdf_text_with_tables(page, _TEXT_FLAGS)
        if text is None:
            text = page.get_text("text", flags=_TEXT_FLAGS)
    except (RuntimeError, ValueError) as error:
        # Refuse rather than leave the page out: answers would silently miss it.
        raise Refused(
            f"page {index + 1} cannot be read; the PDF is damaged (pymupdf: {error})"
        ) from None
    return normalise(text).strip()


def _ends_with_eof_marker(path: Path, size: int) -> bool:
    with open(path, "rb") as file:
        file.seek(max(0, size - _EOF_WINDOW))
        return _EOF_MARKER in file.read()
