"""`extract`: pick the extractor for a file's suffix (its text, page by page) and turn every
failure into a DocumentError."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from app.docs.document import (
    NO_WATCH,
    Document,
    DocumentError,
    Extracted,
    ExtractCancelled,
    ExtractWatch,
    Refused,
    brief,
)
from app.docs.epub import extract_epub
from app.docs.markup import extract_html
from app.docs.ocr import NOTHING_RECOGNISED
from app.docs.pdf import extract_pdf
from app.docs.plain import extract_md, extract_txt
from app.docs.text import first_line
from app.docs.word import extract_docx

Reader = Callable[[Path, int], Extracted]

# suffix -> (Document.format, reader)
_READERS: dict[str, tuple[str, Reader]] = {
    ".pdf": ("pdf", extract_pdf),
    ".epub": ("epub", extract_epub),
    ".txt": ("txt", extract_txt),
    ".md": ("md", extract_md),
    ".markdown": ("md", extract_md),
    ".html": ("html", extract_html),
    ".htm": ("html", extract_html),
    ".docx": ("docx", extract_docx),
}
SUPPORTED_SUFFIXES: frozenset[str] = frozenset(_READERS)

_NO_TEXT_HINTS = {
    "pdf": "no text layer, and OCR recognised no text in the page images",
    "epub": "only images? books of scanned pages need OCR first",
    "docx": "only images or empty paragraphs?",
}


def extract(path: str | os.PathLike, watch: ExtractWatch = NO_WATCH) -> Document:
    """Read a document file. Every failure is a DocumentError whose reason says what to do;
    ExtractCancelled when `watch.cancel` stopped it."""
    name = os.fspath(path)
    try:
        format, extracted = _run_reader(Path(name), watch)
    except ExtractCancelled:
        raise
    except Refused as refusal:
        raise DocumentError(name, refusal.reason) from None
    except DocumentError:
        raise
    except MemoryError:
        raise DocumentError(
            name, "not enough memory to read the file; close other programs or split it"
        ) from None
    except PermissionError:
        raise DocumentError(name, "permission denied; check that you may read the file") from None
    except OSError as error:
        raise DocumentError(name, f"cannot read the file ({error.strerror or error})") from None
    except Exception as error:  # a parser's surprise must not crash an ingest of 500 files
        kind = Path(name).suffix.lower().lstrip(".").upper()
        raise DocumentError(
            name, f"file is damaged or not a valid {kind} ({type(error).__name__}: {brief(error)})"
        ) from error

    if not any(page.strip() for page in extracted.pages):
        hint = _NO_TEXT_HINTS.get(format, "the file holds only whitespace or markup")
        notes = sorted({extra.note for extra in extracted.extras.values()
                        if extra.note and extra.note != NOTHING_RECOGNISED})
        if notes:  # say why OCR found nothing, when it could not run
            hint += "; " + "; ".join(notes[:2])
        raise DocumentError(name, f"no extractable text ({hint})")
    title = extracted.title or extracted.heading or first_line(extracted.pages) or Path(name).stem
    return Document.from_page_texts(name, format, title, extracted.author, extracted.pages,
                                    extracted.extras)


def _run_reader(path: Path, watch: ExtractWatch) -> tuple[str, Extracted]:
    suffix = path.suffix.lower()
    if suffix not in _READERS:
        raise Refused(
            f"unsupported file type {suffix}" if suffix else "unsupported file type (no suffix)"
        )
    if not path.exists():
        raise Refused("file not found")
    if not path.is_file():
        raise Refused("not a regular file (a folder?)")
    size = path.stat().st_size
    if size == 0:
        raise Refused("file is empty")
    format, reader = _READERS[suffix]
    if reader is extract_pdf:  # the one reader with long per-page work (OCR)
        return format, extract_pdf(path, size, watch)
    return format, reader(path, size)
