"""Documents: files -> Document (pages of text with char offsets, and metadata).

Formats: PDF, EPUB, TXT, MD, HTML, DOCX. Pages are the unit of citation. PDF pages without a
text layer are OCRed (app.docs.ocr); tables become Markdown rows (app.docs.tables). Imports no Qt, store
or engine. pymupdf is not thread-safe: extract documents from one worker thread at a time.
"""

from app.docs.document import (
    NO_WATCH,
    PAGE_SEPARATOR,
    Document,
    DocumentError,
    Page,
    PageExtra,
    ExtractCancelled,
    ExtractWatch,
)
from app.docs.limits import PAGE_CHARS
from app.docs.extract import SUPPORTED_SUFFIXES, extract
from app.docs.text import decode_text

__all__ = [
    "PAGE_CHARS",
    "PAGE_SEPARATOR",
    "SUPPORTED_SUFFIXES",
    "NO_WATCH",
    "Document",
    "DocumentError",
    "Page",
    "PageExtra",
    "ExtractCancelled",
    "ExtractWatch",
    "decode_text",
    "extract",
]
