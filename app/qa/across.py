"""Questions across many documents at once: their KV caches side by side, one sparse context.

Each document's prefix (system prompt + its pages, padded to whole KV blocks, qa/prompt.py)
has its own persisted cache (qa/doc_cache.py), computed once. For a question over a folder,
the caches are laid one after another in the engine's cache and the question is appended:
sparse retrieval attention then reads, per token and head, only the blocks that matter across
all the documents, and places them inside the model's trained window. No top-k snippet stage
decides beforehand what the model may read, except when the caches together exceed the memory
budget: then BM25 over the chunks ranks the documents and the most relevant that fit are taken,
and the answer says which were considered.

The answer service (qa/answer.py) runs the question; this module prepares its parts. Engines
that cannot compose caches answer from the most relevant pages that fit their context instead.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.engine.backend import Backend, CacheFileError
from app.qa.doc_cache import DocCaches
from app.qa.pages import PageText, format_pages, load_pages, token_counter
from app.qa.prompt import Prompt, build_prompt
from app.runtime.model_files import mem_available
from app.store import Store

MEMORY_FRACTION = 0.5   # of available memory the caches of one question may take
ROOM = 1024             # tokens to spare after the composed caches and the question (the answer)


class OverBudget(ValueError):
    """Not even the most relevant document's cache fits the memory budget."""


class ComposeError(ValueError):
    """A document's cache file failed its checks twice."""


@dataclass
class Part:
    """One document of the question: its pages and its prompt (header + pages + question)."""

    doc_id: int
    title: str
    pages: list[PageText]
    prompt: Prompt

    @property
    def prefix(self) -> list[int]:
        return self.prompt.prefix


def document_parts(store: Store, backend: Backend, question: str, doc_ids: list[int]) -> list[Part]:
    """The documents that have text, each with its whole pages in its own prompt."""
    count = token_counter(backend)
    parts = []
    for doc_id in doc_ids:
        pages = load_pages(store, [doc_id], count)
        if pages:
            parts.append(Part(doc_id, pages[0].title, pages, build_prompt(backend, question, format_pages(pages))))
    return parts


def fit(store: Store, backend: Backend, question: str, parts: list[Part],
        budget: int | None = None) -> tuple[list[Part], str]:
    """The documents whose caches fit the memory budget, most relevant first (BM25 over
    chunks), kept in their original order; and a note when some were left out."""
    per_token = backend.kv_bytes_per_token()
    need = sum(len(p.prefix) for p in parts) * per_token
    if budget is None:
        budget = int((mem_available() or 8 << 30) * MEMORY_FRACTION)
    if need <= budget:
        return parts, ""
    order: list[int] = []
    for hit in store.search_chunks([p.doc_id for p in parts], question, limit=max(200, 20 * len(parts))):
        if hit["doc_id"] not in order:
            order.append(hit["doc_id"])
    order += [p.doc_id for p in parts if p.doc_id not in order]
    by_id = {p.doc_id: p for p in parts}
    chosen, used = set(), 0
    for doc_id in order:
        size = len(by_id[doc_id].prefix) * per_token
        if used + size <= budget:
            chosen.add(doc_id)
            used += size
    if not chosen:
        raise OverBudget(f"even the most relevant document needs more KV cache memory than the budget of "
                         f"{budget / 1e6:.0f} MB; choose a smaller KV setting (k8v4, k4v4)")
    kept = [p for p in parts if p.doc_id in chosen]
    note = (f"The {len(parts)} documents need {need / 1e6:.0f} MB of KV cache, more than the memory budget of "
            f"{budget / 1e6:.0f} MB: the answer considered the {len(kept)} most relevant (by BM25): "
            + "; ".join(p.title for p in kept) + ".")
    return kept, note


def ready_among_best(store: Store, backend: Backend, caches: DocCaches, ranked: list[int], room: int) -> list[int]:
    """Of the documents ``ranked`` (the documents of the best passages, best first, repeats
    allowed), those that are read (qa/doc_cache.py ``DocCaches.is_read``), as many as ``room``
    tokens hold: a question across a folder of hundreds reads whole the documents that matter
    and are ready, and passages of the rest, at once."""
    count = token_counter(backend)
    whole = []
    for doc_id in dict.fromkeys(ranked):
        pages = load_pages(store, [doc_id], count)
        prefix = build_prompt(backend, "", format_pages(pages)).prefix if pages else []
        if prefix and len(prefix) <= room and caches.is_read(backend, doc_id, prefix):
            whole.append(doc_id)
            room -= len(prefix)
    return whole


def compose(backend: Backend, caches: DocCaches, parts: list[Part], cancel: Callable[[], bool] | None,
            room: int = 0, retry: bool = True) -> list[int]:
    """Lay the documents' caches one after another in the backend's cache: the first file
    whole, then each other document without its header (the same tokens, already there), with
    ``room`` tokens to spare besides the question and the answer. Returns each document's first
    token. A file that fails its checks is rebuilt, once."""
    files = []
    for p in parts:
        found = caches.registered(backend, p.doc_id, p.prefix)
        if found is None:
            caches.prepare(backend, p.doc_id, p.prefix, cancel)
            found = caches.registered(backend, p.doc_id, p.prefix)
        elif retry:
            caches.touch(p.doc_id, found)      # used: the last the cache budget deletes
        if found is None:      # a full disk, or a cache the budget keeps in memory only (its note says)
            note = (caches.store.document(p.doc_id) or {}).get("cache_note")
            raise ComposeError(f"{p.title}: its KV cache file could not be written"
                               + (f" ({note}; `ellm cache --budget SIZE` raises the budget)" if note else ""))
        files.append(found)
    header = len(parts[0].prompt.header)
    try:
        return backend.compose(files, skip=header, room=len(parts[-1].prompt.suffix) + ROOM + room)
    except CacheFileError as e:
        bad = next((p for p, f in zip(parts, files) if f.path == e.path), None)
        if not retry or bad is None:
            raise ComposeError(f"{bad.title if bad else 'a document'}: {e}") from e
        caches.forget(backend, bad.doc_id, bad.prefix)
        return compose(backend, caches, parts, cancel, room, retry=False)
