"""Reading documents ahead: each document's KV cache computed before anyone asks, so the first
question about it only reads the question.

A document's prefix (system prompt + all its pages, qa/prompt.py) does not depend on the
question, and the answer service and the summarizer use that same prefix whenever the whole
document fits the context — the automatic settings make it fit (runtime/auto.py). Reading a
document is therefore ``DocCaches.prepare`` of that prefix: computed once, written to its file
on a backend that keeps prefix files (eLLM's blocked cache), found there afterwards.

Reading ahead goes in a useful order (``reading_order``): the documents a person opened, asked
about or summarized, latest first; then the most recently added, small before large among those
added the same day. It keeps within its share of the cache budget (qa/cache_budget.py) and stops
there: documents nobody opened never push out the caches of those a person used.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.backend import Backend
from app.qa.answer import ReadingProgress
from app.qa.stream import ProgressSink
from app.qa.doc_cache import DocCaches, model_fingerprint
from app.qa.pages import format_pages, load_pages, token_counter
from app.qa.prompt import build_prompt
from app.store import Store

NOT_READ, READ, MEMORY_ONLY = "not read", "read", "in memory only"
STOPPED = "stopped"   # ReadResult.status: reading ahead reached its share of the cache budget


@dataclass
class ReadResult:
    doc_id: int
    title: str
    status: str          # "read" (computed now) | "already read" | "cancelled" | "no text" | "kept in memory"
                         # | "stopped" (reading ahead: its share of the cache budget is full) | "not read"
                         # (reading ahead: its cache is larger than the whole budget)
    tokens: int = 0
    seconds: float = 0.0
    note: str = ""       # why it is kept in memory, or why reading ahead stopped

    def as_dict(self) -> dict:
        return {"doc": self.doc_id, "title": self.title, "status": self.status, "tokens": self.tokens,
                "seconds": round(self.seconds, 2), "note": self.note}


def read_document(store: Store, backend: Backend, doc_id: int, caches: DocCaches,
                  cancel: Callable[[], bool] | None = None, progress: ProgressSink | None = None,
                  nth: int = 1, of: int = 1, ahead: bool = False) -> ReadResult:
    """Compute (or find) ``doc_id``'s prefix cache on ``backend``; ``progress(done, total, line)``
    while it reads. ``ahead``: reading ahead, which reads a document nobody opened only within its
    share of the cache budget (status "stopped" when it is full) and never one that would stay in
    memory only."""
    t0 = time.perf_counter()
    doc = store.document(doc_id) or {}
    title = doc.get("title") or doc.get("path") or f"document {doc_id}"
    pages = load_pages(store, [doc_id], token_counter(backend))
    if not pages:
        return ReadResult(doc_id, title, "no text")
    prefix = build_prompt(backend, "", format_pages(pages)).prefix
    if len(prefix) >= backend.n_ctx:
        return ReadResult(doc_id, title, f"longer than the context ({len(prefix):,} of {backend.n_ctx:,} tokens)",
                          len(prefix))
    found = caches.registered(backend, doc_id, prefix) if backend.capabilities.prefix_files else None
    if found is not None:
        if not ahead:
            caches.touch(doc_id, found)            # a person asked for it: used
        return ReadResult(doc_id, title, "already read", len(prefix), time.perf_counter() - t0)
    opened = bool(doc.get("opened_at"))
    if ahead and backend.capabilities.prefix_files:
        room = caches.room(backend, doc_id, prefix, ahead=True, opened=opened)
        if room.too_large:                         # read only when asked about, into memory
            store.set_cache_note(doc_id, room.note)
            return ReadResult(doc_id, title, NOT_READ, len(prefix), time.perf_counter() - t0, room.note)
        if not room.ok:
            return ReadResult(doc_id, title, STOPPED, len(prefix), time.perf_counter() - t0, room.note)
    reading = ReadingProgress(progress, title, nth, of)
    reading.start(len(prefix))
    status = caches.prepare(backend, doc_id, prefix, cancel, reading, ahead=ahead, opened=opened)
    seconds = time.perf_counter() - t0
    if status is None:
        return ReadResult(doc_id, title, "cancelled", len(prefix), seconds)
    if not backend.capabilities.prefix_files:
        return ReadResult(doc_id, title, "kept in memory", len(prefix), seconds)
    if caches.registered(backend, doc_id, prefix) is None:
        return ReadResult(doc_id, title, "kept in memory", len(prefix), seconds,
                          (store.document(doc_id) or {}).get("cache_note") or "")
    return ReadResult(doc_id, title, "already read" if status == "hit" else READ, len(prefix), seconds)


def read_states(store: Store, model_path) -> dict[int, str]:
    """Each document's state for this model: "read" when a KV cache file of it is registered
    (any settings), "in memory only" when its cache is larger than the cache budget, else
    "not read"."""
    fp = model_fingerprint(model_path)
    done = {r["doc_id"] for r in store.kv_caches() if r["model"] == fp}
    return {d["id"]: READ if d["id"] in done else MEMORY_ONLY if d.get("cache_note") else NOT_READ
            for d in store.documents()}


def reading_order(docs: list[dict], preferred: list[int] = ()) -> list[dict]:
    """``docs`` (store rows) in the order reading ahead takes them: ``preferred`` first (the
    window's documents just asked about), then those a person opened, asked about or
    summarized, latest first; then the rest, the most recently added first, and among those
    added the same day the smaller (fewer tokens) first."""
    preferred = list(preferred)
    first = sorted((d for d in docs if d["id"] in preferred), key=lambda d: preferred.index(d["id"]))
    opened = [d for d in docs if d["id"] not in preferred and d.get("opened_at")]
    rest = [d for d in docs if d["id"] not in preferred and not d.get("opened_at")]
    opened.sort(key=lambda d: d["opened_at"], reverse=True)
    rest.sort(key=lambda d: (int(d.get("tokens") or 0), d["id"]))            # the smaller first ...
    rest.sort(key=lambda d: (d.get("ingested_at") or "")[:10], reverse=True)  # ... within a day, latest day first
    return first + opened + rest


__all__ = ["MEMORY_ONLY", "NOT_READ", "READ", "STOPPED", "ReadResult", "read_document", "read_states",
           "reading_order"]
