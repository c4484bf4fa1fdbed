"""Reading documents ahead: each document's KV cache computed before anyone asks, so the first
question about it only reads the question.

A document's prefix (system prompt + all its pages, qa/prompt.py) does not depend on the
question, and the answer service and the summarizer use that same prefix whenever the whole
document fits the context — the automatic settings make it fit (runtime/auto.py). Reading a
document is therefore ``DocCaches.prepare`` of that prefix: computed once, written to its file
on a backend that keeps prefix files (eLLM's blocked cache), found there afterwards.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from app.engine.backend import Backend
from app.qa.answer import ProgressSink, ReadingProgress
from app.qa.doc_cache import DocCaches, model_fingerprint
from app.qa.pages import format_pages, load_pages, token_counter
from app.qa.prompt import build_prompt
from app.store import Store

NOT_READ, READ = "not read", "read"


@dataclass
class ReadResult:
    doc_id: int
    title: str
    status: str          # "read" (computed now) | "already read" | "cancelled" | "no text" | "kept in memory"
    tokens: int = 0
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"doc": self.doc_id, "title": self.title, "status": self.status, "tokens": self.tokens,
                "seconds": round(self.seconds, 2)}


def read_document(store: Store, backend: Backend, doc_id: int, caches: DocCaches,
                  cancel: Callable[[], bool] | None = None, progress: ProgressSink | None = None,
                  nth: int = 1, of: int = 1) -> ReadResult:
    """Compute (or find) ``doc_id``'s prefix cache on ``backend``; ``progress(done, total, line)``
    while it reads."""
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
    if caches.registered(backend, doc_id, prefix) is not None and backend.capabilities.prefix_files:
        return ReadResult(doc_id, title, "already read", len(prefix), time.perf_counter() - t0)
    reading = ReadingProgress(progress, title, nth, of)
    reading.start(len(prefix))
    status = caches.prepare(backend, doc_id, prefix, cancel, reading)
    seconds = time.perf_counter() - t0
    if status is None:
        return ReadResult(doc_id, title, "cancelled", len(prefix), seconds)
    if not backend.capabilities.prefix_files:
        return ReadResult(doc_id, title, "kept in memory", len(prefix), seconds)
    return ReadResult(doc_id, title, "already read" if status == "hit" else READ, len(prefix), seconds)


def read_states(store: Store, model_path) -> dict[int, str]:
    """Each document's state for this model: "read" when a KV cache file of it is registered
    (any settings), else "not read"."""
    fp = model_fingerprint(model_path)
    done = {r["doc_id"] for r in store.kv_caches() if r["model"] == fp}
    return {d["id"]: READ if d["id"] in done else NOT_READ for d in store.documents()}


__all__ = ["NOT_READ", "READ", "ReadResult", "read_document", "read_states"]
