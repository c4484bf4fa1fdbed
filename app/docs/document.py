"""The document model every reader produces: pages of text with their offsets, and metadata."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property

PAGE_SEPARATOR = "\n\n"

WordBox = tuple[float, float, float, float, str, int, int, int]
"""A word on a page as pymupdf's page.get_text("words") gives it: (x0, y0, x1, y1, word,
block, line, word_no), in PDF points from the page's top left. OCR produces the same shape,
so the viewer highlights a recognised word exactly as it highlights a PDF's own."""


@dataclass(frozen=True)
class PageExtra:
    """How a page was read, when it was not simply from the file's own text."""

    source: str = "text"  # "text": the file's own text; "ocr": recognised from the page image
    note: str = ""  # for a person: why the page is empty, or what OCR could not do
    words: tuple[WordBox, ...] = ()  # OCR pages only: the recognised words and their boxes


PLAIN = PageExtra()


@dataclass(frozen=True)
class Page:
    number: int  # 1-based, the number a citation shows
    text: str
    start: int  # char offset of this page in Document.text
    source: str = "text"  # PageExtra.source
    note: str = ""
    words: tuple[WordBox, ...] = ()


@dataclass(frozen=True)
class Document:
    path: str
    format: str  # "pdf" | "epub" | "txt" | "md" | "html" | "docx"
    title: str
    author: str
    pages: tuple[Page, ...]

    def __post_init__(self) -> None:
        # Offsets are what map an answer's attended tokens back to pages; a Document built by
        # hand (say, loaded back from the store) must not be able to carry wrong ones.
        expected = 0
        for index, page in enumerate(self.pages):
            if page.number != index + 1 or page.start != expected:
                raise ValueError(
                    f"page {index + 1} of {self.path} has number {page.number} and start "
                    f"{page.start}; expected number {index + 1} and start {expected}"
                )
            expected += len(page.text) + len(PAGE_SEPARATOR)

    @classmethod
    def from_page_texts(
        cls, path: str, format: str, title: str, author: str, texts: Sequence[str],
        extras: Mapping[int, PageExtra] | None = None,
    ) -> Document:
        """Number the pages and compute their offsets in the joined text; `extras` is keyed
        by the 0-based index of a page in `texts`."""
        pages, start = [], 0
        for number, text in enumerate(texts, start=1):
            extra = (extras or {}).get(number - 1, PLAIN)
            pages.append(Page(number=number, text=text, start=start, source=extra.source,
                              note=extra.note, words=extra.words))
            start += len(text) + len(PAGE_SEPARATOR)
        return cls(path=path, format=format, title=title, author=author, pages=tuple(pages))

    # cached_property stores into the instance __dict__ directly, so it works on a frozen
    # dataclass; the joined text of a book is megabytes and is asked for repeatedly.
    @cached_property
    def text(self) -> str:
        return PAGE_SEPARATOR.join(page.text for page in self.pages)

    @property
    def page_count(self) -> int:
        return len(self.pages)

    @property
    def ocr_pages(self) -> list[int]:
        """Numbers of the pages whose text was recognised from their image."""
        return [page.number for page in self.pages if page.source == "ocr"]

    @cached_property
    def _starts(self) -> list[int]:
        return [page.start for page in self.pages]

    def page_at(self, offset: int) -> int:
        """Page number holding char `offset` of `text`.

        A separator belongs to the page before it, and `offset == len(text)` (the end of an
        end-exclusive span) is on the last page.
        """
        if not self.pages or not 0 <= offset <= len(self.text):
            raise ValueError(f"offset {offset} is outside the text of {self.path} "
                             f"(0..{len(self.text)})")
        return bisect.bisect_right(self._starts, offset)


class DocumentError(Exception):
    """A file could not be read as a document; `reason` says what a person can do about it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self):
        # The default pickling calls cls(message) and fails; ingest workers may run in
        # another process and send this back.
        return (type(self), (self.path, self.reason))


def brief(error: BaseException, limit: int = 160) -> str:
    """An exception as a short line: some quote whole binary headers."""
    text = f"{error}".replace("\n", " ")
    return text if len(text) <= limit else text[: limit - 1] + "…"


class ExtractCancelled(Exception):
    """Reading stopped because the caller's `cancel` said so (between two pages)."""


@dataclass(frozen=True)
class ExtractWatch:
    """Per-page progress and cancel for readers that do long work per page (OCR)."""

    progress: Callable[[int, int, str], None] = lambda done, total, what: None
    """(pages before this one, pages in the file, what is being done) as each page of long
    work begins."""
    cancel: Callable[[], bool] = lambda: False
    """Asked before each page of long work; True stops reading with ExtractCancelled."""


NO_WATCH = ExtractWatch()


class Refused(Exception):
    """Raised inside a reader with only the reason; `read` adds the path as the caller gave it."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Extracted:
    """What a format reader found, before `read` settles the title and builds the Document."""

    pages: list[str]
    extras: dict[int, PageExtra] = field(default_factory=dict)  # by 0-based page index
    title: str = ""  # from the file's metadata
    heading: str = ""  # first heading, when the format marks headings
    author: str = ""
