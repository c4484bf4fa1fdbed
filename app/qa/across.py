"""Questions across many documents at once: their KV caches side by side, one sparse context.

Each document's prefix (system prompt + its pages, padded to whole KV blocks, ask.py) has
its own persisted cache (doccache.py), computed once. For a question over a folder, the
caches are laid one after another in the engine's cache and the question is appended: sparse
retrieval attention then reads, per token and head, only the blocks that matter across all
the documents (DESIGN.md, "Sparse retrieval attention"), and places them inside the model's
trained window. No top-k snippet stage decides beforehand what the model may read, except when
the caches together exceed the memory budget: then BM25 over the chunks ranks the documents
and the most relevant that fit are taken, and the answer says which were considered.

Engines without the blocked cache (llama.cpp, our dense f16) answer from the most relevant
pages that fit their context instead (ask.py), and say so.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from app.qa.answer import Answer, AnswerStream, AskError, ask
from app.qa.citations import cite
from app.qa.prompt import Prompt, build_prompt
from app.qa.attended import attended_across
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.engine.backend import SamplingParams
from app.runtime.model_files import mem_available
from app.qa.pages import ContextPlan, PageText, format_pages, load_pages, token_counter
from app.store import Store

MEMORY_FRACTION = 0.5   # of available memory the caches of one question may take


@dataclass
class _Part:
    doc_id: int
    title: str
    pages: list[PageText]
    prompt: Prompt           # header + this document + the question

    @property
    def prefix(self) -> list[int]:
        return self.prompt.prefix


def ask_many(store: Store, backend, question: str, doc_ids: list[int], params: SamplingParams,
             model_name: str = "", on_text: Callable[[str], None] | None = None,
             cancel: Callable[[], bool] | None = None, save: bool = True,
             progress: Callable[[str], None] | None = None, memory_budget: int | None = None) -> Answer:
    """Answer ``question`` over all of ``doc_ids`` in one generation."""
    question = question.strip()
    if not question:
        raise AskError("the question is empty")
    if not doc_ids:
        raise AskError("no documents to ask: ingest some first (`ellm ingest FOLDER`)")
    if len(doc_ids) == 1 or not getattr(backend, "blocked", False):
        return ask(store, backend, question, doc_ids, params, model_name, on_text, cancel, save)
    t_start = time.perf_counter()
    say = progress or (lambda _: None)
    count = token_counter(backend)
    parts = []
    for doc_id in doc_ids:
        pages = load_pages(store, [doc_id], count)
        if not pages:
            continue
        parts.append(_Part(doc_id, pages[0].title, pages, build_prompt(backend, question, format_pages(pages))))
    if not parts:
        raise AskError("none of the documents has text in the store; see `ellm docs`")
    considered, note = _fit(store, backend, question, parts, memory_budget)

    caches = DocCaches(store, store_cache_dir(store))
    statuses = []
    for i, p in enumerate(considered):
        if caches.registered(backend, p.doc_id, p.prefix) is not None:
            statuses.append("hit")
            continue
        say(f"reading {p.title} ({i + 1} of {len(considered)}, {len(p.prefix)} tokens)")
        status = caches.prepare(backend, p.doc_id, p.prefix, cancel)
        if status is None:
            return _cancelled(question, backend, model_name, doc_ids, t_start)
        statuses.append(status)
    t_compose = time.perf_counter()
    offsets = _compose(backend, caches, considered, cancel)
    compose_s = time.perf_counter() - t_compose

    first = considered[0].prompt
    prompt = first.prefix + [t for p in considered[1:] for t in p.prompt.doc] + first.suffix
    stream = AnswerStream(backend, params, cancel, on_text, t_start)
    text = stream.run(prompt)
    cancelled, first_token_s = stream.cancelled, stream.first_token_s
    timings = backend.stats.as_dict()
    timings["kv_cache"] = "hit" if all(s == "hit" for s in statuses) else "miss"
    timings["compose_s"] = round(compose_s, 4)
    timings["first_token_s"] = round(first_token_s or 0.0, 4)
    timings["total_s"] = round(time.perf_counter() - t_start, 3)
    pages = [pg for p in considered for pg in p.pages]
    plan = ContextPlan(pages=pages, doc_tokens=sum(len(p.prefix) for p in parts),
                       used_tokens=sum(len(p.prefix) for p in considered), budget=backend.n_ctx,
                       total_pages=len(pages))
    citations = cite(store, text, question, plan) if text else []
    ids = [p.doc_id for p in considered]
    result = Answer(question, text, citations, timings, plan, backend.name, model_name, ids, cancelled)
    result.extra["considered"] = [{"doc": p.doc_id, "title": p.title} for p in considered]
    result.extra["note"] = note
    segments = [(0, len(first.prefix), first.prefix_text, ContextPlan(pages=considered[0].pages))]
    segments += [(off, len(p.prompt.doc), p.prompt.doc_text, ContextPlan(pages=p.pages))
                 for off, p in zip(offsets[1:], considered[1:])]
    result.extra["attended"] = attended_across(backend, segments)
    if save and text:
        result.answer_id = store.add_answer(ids, question, text, citations, model_name, backend.name, timings)
    return result


def _fit(store: Store, backend, question: str, parts: list[_Part], budget: int | None) -> tuple[list[_Part], str]:
    """The documents whose caches fit the memory budget, most relevant first (BM25 over
    chunks), kept in their original order; and a note when some were left out."""
    per_token = backend.kv_stats()["kv_bytes_per_token"]
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
        raise AskError(f"even the most relevant document needs more KV cache memory than the budget of "
                       f"{budget / 1e6:.0f} MB; choose a smaller KV setting (k8v4, k4v4)")
    kept = [p for p in parts if p.doc_id in chosen]
    note = (f"The {len(parts)} documents need {need / 1e6:.0f} MB of KV cache, more than the memory budget of "
            f"{budget / 1e6:.0f} MB: the answer considered the {len(kept)} most relevant (by BM25): "
            + "; ".join(p.title for p in kept) + ".")
    return kept, note


def _compose(backend, caches: DocCaches, parts: list[_Part], cancel, retry: bool = True) -> list[int]:
    """Lay the documents' caches one after another in the backend's cache: the first file
    whole (memory-mapped), then each other document without its header (the same tokens,
    already there). Returns each document's first token. A file that fails its checks is
    rebuilt, once."""
    from app.engine.kv.files import KVFileError, append, load

    cache = backend.cache
    cache.clear()
    header = len(parts[0].prompt.header)
    total = header + sum(len(p.prompt.doc) for p in parts)
    backend.reserve(total + len(parts[-1].prompt.suffix) + 1024)
    offsets = []
    for i, p in enumerate(parts):
        offsets.append(cache.n_tokens if i else header)
        found = caches.registered(backend, p.doc_id, p.prefix)
        try:
            if found is None:
                raise KVFileError(f"document {p.doc_id}: its KV cache file is missing")
            if i == 0:
                load(cache, *found)
            else:
                append(cache, *found, skip=header)
        except KVFileError as e:
            if not retry:
                raise AskError(f"{p.title}: {e}") from e
            caches.forget(backend, p.doc_id, p.prefix)
            caches.prepare(backend, p.doc_id, p.prefix, cancel)
            return _compose(backend, caches, parts, cancel, retry=False)
    cache.set_checkpoint()
    return offsets


def _cancelled(question, backend, model_name, doc_ids, t_start) -> Answer:
    return Answer(question, "", [], {"total_s": round(time.perf_counter() - t_start, 3), "kv_cache": "miss"},
                  ContextPlan(), backend.name, model_name, list(doc_ids), cancelled=True)
