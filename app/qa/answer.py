"""Asking a question about whole documents, with page citations.

The prompt holds the document's text with page markers (see prompting.py). The
answer streams; its citations are the pages it relied on: the pages it cites
itself ([p. N]) and the passages of the context that best match what it says
(BM25 over the document's chunks).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from app.engine.backend import SamplingParams, stream_text
from app.qa.pages import ContextPlan, TEMPLATE_OVERHEAD, format_pages, load_pages, plan_context, token_counter
from app.qa.attended import attended_passages
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.qa.citations import cite
from app.qa.prompt import SYSTEM_PROMPT, build_prompt
from app.store import Store


class AskError(Exception):
    pass


@dataclass
class Answer:
    question: str
    answer: str
    citations: list[dict]
    timings: dict
    plan: ContextPlan
    engine: str
    model: str
    doc_ids: list[int]
    cancelled: bool = False
    answer_id: int | None = None
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"answer": self.answer, "citations": self.citations, "timings": self.timings,
                "engine": self.engine, "model": self.model, "documents": self.doc_ids,
                "context": self.plan.as_dict(), "cancelled": self.cancelled, "answer_id": self.answer_id,
                **self.extra}


def ask(store: Store, backend, question: str, doc_ids: list[int], params: SamplingParams,
        model_name: str = "", on_text: Callable[[str], None] | None = None,
        cancel: Callable[[], bool] | None = None, save: bool = True,
        caches: DocCaches | None = None) -> Answer:
    """Answer ``question`` about ``doc_ids``; ``on_text`` receives the answer as it streams."""
    question = question.strip()
    if not question:
        raise AskError("the question is empty")
    t_start = time.perf_counter()
    count = token_counter(backend)
    pages = load_pages(store, doc_ids, count)
    if not pages:
        raise AskError("the document has no text in the store; ingest it again (see `ellm docs` for its status)")
    fixed = count(SYSTEM_PROMPT) + count(question) + TEMPLATE_OVERHEAD
    budget = backend.n_ctx - params.max_tokens - fixed
    if budget < 64:
        raise AskError(f"the context of {backend.n_ctx} tokens leaves no room for the document after the "
                       f"question and {params.max_tokens} answer tokens; raise the context length or lower max tokens")
    plan = plan_context(store, pages, budget, question)
    prompt = build_prompt(backend, question, format_pages(plan.pages))
    if len(prompt.tokens) + params.max_tokens > backend.n_ctx:  # page estimates were low: drop pages until it fits
        while plan.pages and len(prompt.tokens) + params.max_tokens > backend.n_ctx:
            plan.pages.pop()
            prompt = build_prompt(backend, question, format_pages(plan.pages))
        plan.used_tokens = sum(p.tokens for p in plan.pages)
    tokens, n_prefix = prompt.tokens, len(prompt.prefix)

    stream = AnswerStream(backend, params, cancel, on_text, t_start)
    t_prefix = time.perf_counter()
    caches = caches or DocCaches(store, store_cache_dir(store))
    kv_cache = caches.prepare(backend, doc_ids[0] if len(doc_ids) == 1 else None, tokens[:n_prefix], stream.stop_now)
    prefix_s = time.perf_counter() - t_prefix
    text = stream.run(tokens) if kv_cache is not None else ""
    cancelled, first_token_s = stream.cancelled, stream.first_token_s
    stats = backend.stats
    timings = stats.as_dict()
    timings["kv_cache"] = kv_cache or "miss"
    timings["prefix_s"] = round(prefix_s, 4)
    timings["first_token_s"] = round(first_token_s if first_token_s is not None else 0.0, 4)
    timings["total_s"] = round(time.perf_counter() - t_start, 3)
    citations = cite(store, text, question, plan) if text else []
    result = Answer(question, text, citations, timings, plan, backend.name, model_name, list(doc_ids), cancelled)
    if hasattr(backend, "attended_blocks"):
        result.extra["attended"] = attended_passages(backend, plan, prompt.prefix_text, n_prefix)
    if save and text:
        result.answer_id = store.add_answer(list(doc_ids), question, text, citations, model_name,
                                            backend.name, timings)
    return result


class AnswerStream:
    """Generates an answer from prompt tokens, streaming its text to ``on_text`` and noting
    when the first piece came (seconds after ``t_start``) and whether ``cancel`` stopped it."""

    def __init__(self, backend, params: SamplingParams, cancel, on_text, t_start: float):
        self.backend, self.params, self.cancel, self.on_text = backend, params, cancel, on_text
        self.t_start = t_start
        self.cancelled = False
        self.first_token_s: float | None = None

    def stop_now(self) -> bool:
        if self.cancel is not None and self.cancel():
            self.cancelled = True
        return self.cancelled

    def run(self, tokens: list[int]) -> str:
        pieces = []
        for piece in stream_text(self.backend, self.backend.generate(tokens, self.params, self.stop_now),
                                 self.params.stop):
            if self.first_token_s is None:
                self.first_token_s = time.perf_counter() - self.t_start
            pieces.append(piece)
            if self.on_text:
                self.on_text(piece)
        return "".join(pieces).strip()


