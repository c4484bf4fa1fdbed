"""Folder ingestion: files -> documents, pages and searchable chunks in the store.

Recursive and incremental by content hash: an unchanged file is skipped, a
changed one replaced, a deleted one marked ``missing``. One bad file never stops
the batch: it is stored as ``failed`` with a reason a person can act on.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from app import docs
from app.store import Store
from app.store.db import now

CHUNK_CHARS = 800  # a chunk is a passage that a citation can point at
HASH_BLOCK = 1 << 20


@dataclass(frozen=True)
class IngestEvent:
    """What happened to one file; ``index`` counts from 1 up to ``total``."""

    index: int
    total: int
    path: str
    status: str  # "ingested" | "updated" | "unchanged" | "failed" | "missing"
    reason: str = ""
    doc_id: int | None = None
    title: str = ""
    pages: int = 0
    tokens: int = 0

    def line(self) -> str:
        if self.status == "failed":
            return f"{self.path}: failed: {self.reason}"
        if self.status in ("ingested", "updated"):
            extra = " (changed since last time)" if self.status == "updated" else ""
            return f"{self.path}: ingested{extra} ({self.pages} pages, {self.tokens} tokens)"
        return f"{self.path}: {self.status}"

    def as_dict(self) -> dict:
        return {"path": self.path, "status": self.status, "reason": self.reason, "doc_id": self.doc_id,
                "title": self.title, "pages": self.pages, "tokens": self.tokens}


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

            for dirpath, dirnames, filenames in os.walk(root, onerror=on_error, followlinks=False):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                for name in sorted(filenames):
                    if name.startswith(".") or Path(name).suffix.lower() not in docs.SUPPORTED_SUFFIXES:
                        continue
                    add(Candidate(os.path.join(dirpath, name), root))
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


# ---- Ingestion -----------------------------------------------------------------


TokenCounter = Callable[[str], int]


def ingest(store: Store, paths: Iterable[str | os.PathLike], count_tokens: TokenCounter,
           progress: Callable[[IngestEvent], None] | None = None,
           cancel: Callable[[], bool] | None = None) -> IngestReport:
    """Ingest files and folders; ``progress`` hears about every file as it is done;
    ``cancel`` is asked between files."""
    candidates, folders = collect(paths)
    report = IngestReport()
    total = len(candidates)
    for folder in folders:
        store.add_folder(folder)

    def emit(event: IngestEvent) -> None:
        report.events.append(event)
        if progress:
            progress(event)

    for i, cand in enumerate(candidates, 1):
        if cancel and cancel():
            report.cancelled = True
            return report
        emit(_ingest_one(store, cand, i, total, count_tokens))

    # Files that were in an ingested folder before and are gone now.
    present = {c.path for c in candidates}
    for folder in folders:
        for doc in store.documents(folder):
            if doc["path"] not in present and doc["status"] != "missing" and not os.path.exists(doc["path"]):
                store.set_status([doc["id"]], "missing", "file no longer exists")
                emit(IngestEvent(len(report.events) + 1, total, doc["path"], "missing",
                                 "file no longer exists", doc["id"], doc["title"] or ""))
    return report


def _ingest_one(store: Store, cand: Candidate, index: int, total: int, count_tokens: TokenCounter) -> IngestEvent:
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
        digest = file_hash(path)
    except FileNotFoundError:
        return failed("file disappeared while it was being read")
    except PermissionError:
        return failed("permission denied; make the file readable and ingest again")
    except IsADirectoryError:
        return failed("is a folder, not a file")
    except OSError as e:
        return failed(f"cannot read the file ({e.strerror or e})")
    meta = {"content_hash": digest, "size": st.st_size, "mtime": st.st_mtime}

    if old is not None and old["content_hash"] == digest and old["status"] == "ingested":
        if old["folder"] != cand.folder or old["mtime"] != st.st_mtime:
            store.save_document(dict(base, status="ingested", mtime=st.st_mtime,
                                     folder=cand.folder or old["folder"]))
        return IngestEvent(index, total, path, "unchanged", "", old["id"], old["title"] or "", old["pages"],
                           old["tokens"])

    try:
        document = docs.read(path)
    except docs.DocumentError as e:
        return failed(e.reason, **meta)
    except MemoryError:
        return failed("file is too large to read into memory", **meta)
    except Exception as e:  # a reader bug must not stop the batch; say what happened
        return failed(f"unexpected error while reading ({type(e).__name__}: {e})", **meta)

    pages = [(p.number, p.start, p.text) for p in document.pages]
    chunks = [(p.number, p.start + s, p.start + e, p.text[s:e]) for p in document.pages
              for s, e in chunk_page(p.text)]
    tokens = count_tokens(document.text)
    record = dict(base, **meta, format=document.format, title=document.title, author=document.author,
                  pages=document.page_count, tokens=tokens, status="ingested", error=None, ingested_at=now())
    doc_id = store.save_document(record, pages, chunks)
    status = "ingested" if old is None or old["status"] != "ingested" else "updated"
    return IngestEvent(index, total, path, status, "", doc_id, document.title, document.page_count, tokens)
