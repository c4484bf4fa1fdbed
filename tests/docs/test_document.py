"""The Document model: offsets, page_at, and DocumentError."""

import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from app.docs import PAGE_SEPARATOR, Document, DocumentError, Page


def _document(*texts: str) -> Document:
    return Document.from_page_texts("/books/a.txt", "txt", "A", "", list(texts))


def test_from_page_texts_numbers_pages_and_offsets():
    document = _document("one", "", "three!")
    assert document.pages == (
        Page(number=1, text="one", start=0),
        Page(number=2, text="", start=5),
        Page(number=3, text="three!", start=7),
    )
    assert document.text == "one\n\n\n\nthree!"
    assert PAGE_SEPARATOR == "\n\n"
    assert document.page_count == 3


def test_page_at_every_offset():
    document = _document("one", "", "three!")
    pages = [document.page_at(offset) for offset in range(len(document.text) + 1)]
    #        o  n  e  \n \n | \n \n | t  h  r  e  e  !  end
    assert pages == [1, 1, 1, 1, 1, 2, 2, 3, 3, 3, 3, 3, 3, 3]


@pytest.mark.parametrize("offset", [-1, 14])
def test_page_at_outside_the_text(offset):
    with pytest.raises(ValueError, match="outside the text"):
        _document("one", "", "three!").page_at(offset)


def test_inconsistent_offsets_are_refused():
    with pytest.raises(ValueError, match="expected number 2 and start 5"):
        Document("/a.txt", "txt", "A", "", (Page(1, "one", 0), Page(2, "two", 4)))
    with pytest.raises(ValueError, match="expected number 1 and start 0"):
        Document("/a.txt", "txt", "A", "", (Page(0, "one", 0),))


def test_document_is_frozen_and_comparable():
    document = _document("one")
    with pytest.raises(AttributeError):
        document.title = "B"
    assert document == _document("one")
    assert document.text == "one"  # the cached text does not break equality
    assert document == _document("one")


def test_document_error_message_and_pickling():
    error = DocumentError("/books/a.pdf", "file is empty")
    assert (str(error), error.path, error.reason) == (
        "/books/a.pdf: file is empty", "/books/a.pdf", "file is empty"
    )
    copy = pickle.loads(pickle.dumps(error))
    assert (type(copy), str(copy), copy.path, copy.reason) == (
        DocumentError, str(error), error.path, error.reason
    )


def test_package_imports_no_qt_store_or_engine():
    # Layering (docs/ARCHITECTURE.md): docs sits below the services and beside store and engine.
    code = (
        "import sys, app.docs; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'PySide6' "
        "or m.startswith(('app.store', 'app.engine', 'app.ui'))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert result.stdout.strip() == "[]"
