"""Documents: files -> Document (pages of text with char offsets, and metadata).

Formats: PDF, EPUB, TXT, MD, HTML, DOCX. Pages are the unit of citation. Imports no Qt, store
or engine. pymupdf is not thread-safe: read documents from one worker thread at a time.
"""

from app.docs.document import PAGE_SEPARATOR, Document, DocumentError, Page
from app.docs.limits import PAGE_CHARS
from app.docs.reader import SUPPORTED_SUFFIXES, read
from app.docs.text import decode_text

__all__ = [
    "PAGE_CHARS",
    "PAGE_SEPARATOR",
    "SUPPORTED_SUFFIXES",
    "Document",
    "DocumentError",
    "Page",
    "decode_text",
    "read",
]
