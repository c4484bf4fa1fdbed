"""Folder ingestion: files -> documents, pages and searchable chunks in the store.

Recursive and incremental by content hash: an unchanged file is skipped, a
changed one replaced, a deleted one marked ``missing``. One bad file never stops
the batch: it is stored as ``failed`` with a reason a person can act on.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
import time
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator

from app import docs
from app.library.locking import LockWaitCancelled, file_lock
from app.library.time_left import duration, time_left
from app.store import Store
from app.store.db import now

CHUNK_CHARS = 800  # a chunk is a passage that a citation can point at
HASH_BLOCK = 1 << 20
TOKEN_COUNT_CHARS = 1 << 20
"""Tokens are counted this many characters of pages at a time: llama.cpp's tokenizer
allocates a token buffer as long as its input, so counting a 30 MB text in one call
took ~20x its size in memory."""
INGEST_LOCK = "ingest"  # app.library.locking purpose: one ingestion per data directory at a time


@dataclass(frozen=True)
class IngestEvent:
    """What happened to one file; ``index`` counts from 1 up to ``total``."""

    index: int
    total: int
    path: str
    status: str  # "ingested" | "updated" | "unchanged" | "failed" | "missing" | "reading"
    reason: str = ""  # for "reading": what is being done to the file, e.g. "OCR page 3 of 40"
    doc_id: int | None = None
    title: str = ""
    pages: int = 0
    tokens: int = 0
    ocr_pages: int = 0  # pages whose text was recognised from their image
    left_s: float | None = None  # the time the files still to do will take, from the rate so far (by bytes)

    @property
    def left(self) -> str:
        """The time left once there is a rate ("2 min left"), else ""."""
        return f"{duration(self.left_s)} left" if self.left_s else ""

    def count(self) -> str:
        """Where the ingestion is: "[3/200]", with the time left ("[3/200, 2 min left]")."""
        return f"[{self.index}/{self.total}" + (f", {self.left}]" if self.left else "]")

    def line(self) -> str:
        if self.status == "reading":
            return f"{self.path}: {self.reason}"
        if self.status == "failed":
            return f"{self.path}: failed: {self.reason}"
        if self.status in ("ingested", "updated"):
            extra = " (changed since last time)" if self.status == "updated" else ""
            ocr = f", {self.ocr_pages} OCRed" if self.ocr_pages else ""
            return f"{self.path}: ingested{extra} ({self.pages} pages{ocr}, {self.tokens} tokens)"
        return f"{self.path}: {self.status}"

    def as_dict(self) -> dict:
        return {"path": self.path, "status": self.status, "reason": self.reason, "doc_id": self.doc_id,
                "title": self.title, "pages": self.pages, "tokens": self.tokens, "ocr_pages": self.ocr_pages}


@dataclass
class IngestReport:
    events: list[IngestEvent] = field(default_factory=list)
    cancelled: bool = False

    def count(self, *statuses: str) -> int:
        return sum(1 for e in self.events if e.status in statuses)

    @property
    def readable(self) -> int:
        """Files whose text is in the store now (new, changed or unchanged)."""
        return self.count("ingested", "updated", "unchanged")

    def summary(self) -> str:
        parts = [f"{self.count('ingested', 'updated')} ingested", f"{self.count('unchanged')} unchanged",
                 f"{self.count('failed')} failed"]
        if self.count("missing"):
            parts.append(f"{self.count('missing')} missing")
        return ", ".join(parts) + (" (cancelled)" if self.cancelled else "")


# ---- Finding files -----------------------------------------------------------


@dataclass(frozen=True)
class Candidate:
    path: str  # absolute
    folder: str | None  # the folder it was found under, None for a file named directly
    problem: str = ""  # set when the path itself cannot be used


def walk_files(root: str, on_error: Callable[[OSError], None]) -> Iterator[str]:
    """Paths of the files under ``root`` in ``os.walk`` order (depth first, sorted),
    skipping hidden entries and never following a symlinked folder (no loops).

    Iterative, with a stack of its own: ``os.walk`` recurses once per level and
    raised RecursionError on a tree about 1000 folders deep (Python 3.11)."""
    stack = [root]
    while stack:
        top = stack.pop()
        try:
            with os.scandir(top) as it:
                entries = list(it)
        except OSError as err:
            on_error(err)
            continue
        folders, files = [], []
        for entry in entries:
            if entry.name.startswith("."):
                continue
            try:
                is_dir = entry.is_dir()  # follows a link: a link to a folder is a folder
            except OSError:
                is_dir = False
            if not is_dir:
                files.append(entry.name)  # includes broken and looping links: reported when read
            elif not entry.is_symlink():
                folders.append(entry.name)
        for name in sorted(files):
            yield os.path.join(top, name)
        stack.extend(os.path.join(top, name) for name in sorted(folders, reverse=True))


def collect(paths: Iterable[str | os.PathLike]) -> tuple[list[Candidate], list[str]]:
    """Files to ingest and the folders they came from. Folders are walked
    recursively without following directory symlinks (no loops); hidden entries
    and unsupported types inside folders are skipped."""
    found: list[Candidate] = []
    folders: list[str] = []
    seen: set[str] = set()

    def add(c: Candidate) -> None:
        if c.path not in seen:
            seen.add(c.path)
            found.append(c)

    for raw in paths:
        p = Path(raw).expanduser().absolute()
        if p.is_dir():
            root = str(p)
            folders.append(root)

            def on_error(err: OSError, root=root) -> None:
                add(Candidate(str(err.filename), root, f"cannot read folder ({err.strerror})"))

            for path in walk_files(root, on_error):
                if Path(path).suffix.lower() in docs.SUPPORTED_SUFFIXES:
                    add(Candidate(path, root))
        elif p.exists() or p.is_symlink():
            add(Candidate(str(p), None))
        else:
            add(Candidate(str(p), None, "no such file or folder"))
    return found, folders


def file_hash(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


# ---- Chunks ------------------------------------------------------------------


def chunk_page(text: str, limit: int = CHUNK_CHARS) -> list[tuple[int, int]]:
    """(start, end) spans of ``text`` of at most ~``limit`` chars, cut at a
    paragraph, sentence or word boundary; together they cover every non-blank char."""
    spans, start, n = [], 0, len(text)
    while start < n:
        while start < n and text[start].isspace():
            start += 1
        if start >= n:
            break
        end = min(n, start + limit)
        if end < n:
            window = text[start:end]
            for sep in ("\n\n", ". ", "\n", " "):
                cut = window.rfind(sep)
                if cut > limit // 3:
                    end = start + cut + len(sep)
                    break
        spans.append((start, end))
        start = end
    return spans


def count_document_tokens(document: docs.Document, count_tokens: TokenCounter) -> int:
    """Tokens of ``document.text`` (count_page_tokens over its pages)."""
    return count_page_tokens((page.text for page in document.pages), count_tokens)


def count_page_tokens(texts: Iterable[str], count_tokens: TokenCounter) -> int:
    """Tokens of pages' texts joined as a document's, counted in slices of whole pages of about
    TOKEN_COUNT_CHARS so memory stays bounded. A document shorter than a slice is
    counted in one call, exactly; a longer one may differ by the few tokens that a
    page separator merges with at the cut."""
    total, batch, size = 0, [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= TOKEN_COUNT_CHARS:
            total += count_tokens(docs.PAGE_SEPARATOR.join(batch))
            batch, size = [], 0
    if batch:
        total += count_tokens(docs.PAGE_SEPARATOR.join(batch))
    return total


# ---- Ingestion -----------------------------------------------------------------


TokenCounter = Callable[[str], int]


def _data_dir_lock(store: Store, cancel: Callable[[], bool] | None):
    """The data directory's ingest lock (app.library.locking), so two eLLM processes ingesting
    at once take turns; none for a store that is not a file."""
    if store.path == ":memory:" or store.path.startswith("file:"):
        return nullcontext()
    return file_lock(Path(store.path).parent, INGEST_LOCK, cancel=cancel)


def ingest(store: Store, paths: Iterable[str | os.PathLike], count_tokens: TokenCounter,
           progress: Callable[[IngestEvent], None] | None = None,
           cancel: Callable[[], bool] | None = None) -> IngestReport:
    """Ingest files and folders; ``progress`` hears about every file as it is done, and
    about each page of long work inside a file (OCR) as a "reading" event whose ``index`` is
    the files done so far (these are not in the report); ``cancel`` is asked between files
    and between such pages, and a file cancelled half-read is left as it was. Another ingestion into the same data
    directory (another process or thread) is waited for, then this one runs and
    finds the files it already did unchanged."""
    try:
        with _data_dir_lock(store, cancel):
            return _ingest(store, paths, count_tokens, progress, cancel)
    except LockWaitCancelled:
        return IngestReport(cancelled=True)


def _ingest(store: Store, paths: Iterable[str | os.PathLike], count_tokens: TokenCounter,
            progress: Callable[[IngestEvent], None] | None,
            cancel: Callable[[], bool] | None) -> IngestReport:
    candidates, folders = collect(paths)
    report = IngestReport()
    total = len(candidates)
    for folder in folders:
        store.add_folder(folder)

    sizes = [_size(c.path) for c in candidates]    # the time left goes by bytes: files differ a thousandfold
    todo, done, t0 = sum(sizes), 0, time.perf_counter()

    def emit(event: IngestEvent, size: int = 0) -> None:
        nonlocal done
        done += size
        left = time_left(time.perf_counter() - t0, done, todo) if size else None
        event = replace(event, left_s=left)
        report.events.append(event)
        if progress:
            progress(event)

    for i, cand in enumerate(candidates, 1):
        if cancel and cancel():
            report.cancelled = True
            return report

        def page_progress(done: int, pages: int, what: str, i=i, cand=cand) -> None:
            if progress:
                progress(IngestEvent(i - 1, total, cand.path, "reading", what, pages=pages))

        watch = docs.ExtractWatch(progress=page_progress, cancel=cancel or (lambda: False))
        try:
            event = _ingest_one(store, cand, i, total, count_tokens, watch)
        except docs.ExtractCancelled:
            report.cancelled = True
            return report
        emit(event, sizes[i - 1])

    # Files that were in an ingested folder before and are gone now.
    present = {c.path for c in candidates}
    for folder in folders:
        for doc in store.documents(folder):
            if doc["path"] not in present and doc["status"] != "missing" and not os.path.exists(doc["path"]):
                store.set_status([doc["id"]], "missing", "file no longer exists")
                emit(IngestEvent(len(report.events) + 1, total, doc["path"], "missing",
                                 "file no longer exists", doc["id"], doc["title"] or ""))
    return report


def _size(path: str) -> int:
    try:
        return max(1, os.path.getsize(path))
    except OSError:
        return 1


GONE = "file disappeared while it was being read (moved or deleted?); ingest again if it comes back"


def _ingest_one(store: Store, cand: Candidate, index: int, total: int, count_tokens: TokenCounter,
                watch: docs.ExtractWatch = docs.NO_WATCH) -> IngestEvent:
    path = cand.path
    old = store.document_by_path(path)
    base = {"path": path, "folder": cand.folder}

    def failed(reason: str, **extra) -> IngestEvent:
        record = dict(base, status="failed", error=reason, **extra)
        if old is None:
            record["title"] = Path(path).name
        # A previously good version keeps its pages: nothing stored is lost.
        doc_id = store.save_document(record)
        return IngestEvent(index, total, path, "failed", reason, doc_id, record.get("title") or old["title"])

    if cand.problem:
        return failed(cand.problem)
    suffix = Path(path).suffix.lower()
    if suffix not in docs.SUPPORTED_SUFFIXES:
        kinds = ", ".join(sorted(docs.SUPPORTED_SUFFIXES))
        return failed(f"unsupported file type '{suffix or '(none)'}'; eLLM reads {kinds}")
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode) and not stat.S_ISDIR(st.st_mode):
            # Opening a named pipe would wait forever for a writer.
            return failed("not a regular file (a named pipe, socket or device); eLLM reads ordinary files only")
        digest = file_hash(path)
    except FileNotFoundError:
        if os.path.islink(path):
            return failed(f"is a symbolic link to {os.readlink(path)}, which does not exist; "
                          "fix or remove the link")
        return failed(GONE)
    except PermissionError:
        return failed("permission denied; make the file readable and ingest again")
    except IsADirectoryError:
        return failed("is a folder, not a file")
    except OSError as e:
        if e.errno == errno.ELOOP:
            return failed("is a symbolic link that loops back on itself; fix or remove the link")
        return failed(f"cannot read the file ({e.strerror or e})")
    meta = {"content_hash": digest, "size": st.st_size, "mtime": st.st_mtime}

    if old is not None and old["content_hash"] == digest and old["status"] == "ingested":
        if old["folder"] != cand.folder or old["mtime"] != st.st_mtime:
            store.save_document(dict(base, status="ingested", mtime=st.st_mtime,
                                     folder=cand.folder or old["folder"]))
        return IngestEvent(index, total, path, "unchanged", "", old["id"], old["title"] or "", old["pages"],
                           old["tokens"])

    try:
        document = docs.extract(path, watch)
    except docs.ExtractCancelled:
        raise
    except docs.DocumentError as e:
        if not os.path.lexists(path):
            return failed(GONE, **meta)
        return failed(e.reason, **meta)
    except MemoryError:
        return failed("file is too large to read into memory", **meta)
    except Exception as e:  # a reader bug must not stop the batch; say what happened
        return failed(f"unexpected error while reading ({type(e).__name__}: {e})", **meta)

    pages = [(p.number, p.start, p.text, p.source, p.note, [list(w) for w in p.words])
             for p in document.pages]
    chunks = [(p.number, p.start + s, p.start + e, p.text[s:e]) for p in document.pages
              for s, e in chunk_page(p.text)]
    tokens = count_document_tokens(document, count_tokens)
    record = dict(base, **meta, format=document.format, title=document.title, author=document.author,
                  pages=document.page_count, tokens=tokens, status="ingested", error=None, ingested_at=now())
    doc_id = store.save_document(record, pages, chunks)
    tokenizer = getattr(count_tokens, "tokenizer", None)
    if tokenizer:                  # the count is this model's: a question with another recounts
        store.set_token_count(doc_id, digest, tokenizer, tokens)
    status = "ingested" if old is None or old["status"] != "ingested" else "updated"
    return IngestEvent(index, total, path, status, "", doc_id, document.title, document.page_count, tokens,
                       len(document.ocr_pages))
