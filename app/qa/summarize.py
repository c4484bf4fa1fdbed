"""Whole-document summaries.

One pass when the document fits the context — through the answer service (qa/answer.py), so
the summary reads the document's own KV cache, the one its questions use, computed once;
otherwise section by section in document order (each section as large as the context allows),
then the section summaries are combined — again in stages if even they do not fit.

A summary is stored with the key of what made it (``summary_key``: the document's text, the
model, the engine's cache settings and the sampling), so asking again with the same ones — to
export it in another format — returns the stored summary without running the model.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass
from typing import Callable

from app.engine.backend import SamplingParams, stream_text
from app.qa.pages import PageText, TEMPLATE_OVERHEAD, format_pages, load_pages, page_ranges, token_counter
from app.store import Store

SUMMARY_SYSTEM = (
    "You are eLLM. You write faithful, well-organised summaries of documents. Use only what the "
    "text says. Mention page numbers as [p. N] for key points."
)
WHOLE = "Summarize the document above: its purpose, main points and conclusions, in a few paragraphs."
SECTION = "Summarize this section of the document ({where}): its main points, in one paragraph."
COMBINE = ("Below are summaries of consecutive sections of the document '{title}', in order. "
           "Write one summary of the whole document from them: its purpose, main points and conclusions, "
           "in a few paragraphs.\n\n{parts}")


class SummaryError(Exception):
    pass


@dataclass
class Summary:
    doc_id: int
    title: str
    text: str
    method: str  # "single pass" | "N sections"
    sections: list[str]
    seconds: float
    cancelled: bool = False
    summary_id: int | None = None
    reused: bool = False      # the stored summary of the same document, model and settings

    def as_dict(self) -> dict:
        return {"doc": self.doc_id, "title": self.title, "summary": self.text, "method": self.method,
                "sections": len(self.sections), "seconds": round(self.seconds, 2),
                "cancelled": self.cancelled, "summary_id": self.summary_id, "reused": self.reused}


def summary_key(doc: dict, backend, params: SamplingParams) -> str:
    """What a summary depends on: the document's text (its content hash), the model file, the
    engine and its cache settings, the context and the sampling."""
    from app.qa.doc_cache import model_fingerprint

    made_of = {"doc": doc.get("content_hash") or doc.get("path"), "model": model_fingerprint(backend.model_path),
               "engine": backend.name, "cache": backend.cache_signature(), "n_ctx": backend.n_ctx,
               "sampling": asdict(params), "prompts": [SUMMARY_SYSTEM, WHOLE, SECTION, COMBINE]}
    return hashlib.sha256(json.dumps(made_of, sort_keys=True, default=str).encode()).hexdigest()[:32]


Progress = Callable[[int, int, str], None]  # (step, steps, what)


def _generate(backend, messages: list[dict], params: SamplingParams, cancel) -> str:
    prompt = backend.tokenize(backend.apply_chat_template(messages), add_bos=True, special=True)
    return "".join(stream_text(backend, backend.generate(prompt, params, cancel), params.stop)).strip()


def _groups(pages: list[PageText], budget: int) -> list[list[PageText]]:
    """Consecutive pages packed into groups of at most ``budget`` tokens (a page
    larger than the budget is cut to fit)."""
    groups, current, used = [], [], 0
    for p in pages:
        if p.tokens > budget:  # a giant page: keep the share of it that fits
            keep = max(1, int(len(p.text) * budget / p.tokens * 0.9))
            p = PageText(p.doc_id, p.title, p.number, p.text[:keep], budget)
        if current and used + p.tokens > budget:
            groups.append(current)
            current, used = [], 0
        current.append(p)
        used += p.tokens
    if current:
        groups.append(current)
    return groups


def summarize(store: Store, backend, doc_id: int, params: SamplingParams, model_name: str = "",
              progress: Progress | None = None, cancel: Callable[[], bool] | None = None,
              save: bool = True, again: bool = False) -> Summary:
    """Summarize ``doc_id``; the stored summary of the same document, model and settings is
    returned as it is (``reused``) unless ``again``."""
    t0 = time.perf_counter()
    doc = store.document(doc_id)
    if doc is None:
        raise SummaryError(f"no document with id {doc_id}")
    if save:
        store.mark_opened([doc_id])     # reading ahead takes what a person summarized first (qa/reading.py)
    key = summary_key(doc, backend, params)
    stored = None if again else store.summary_for(doc_id, key)
    if stored is not None:
        return Summary(doc_id, doc["title"] or doc["path"], stored["summary"], stored["method"], [],
                       time.perf_counter() - t0, summary_id=stored["id"], reused=True)
    count = token_counter(backend)
    pages = load_pages(store, [doc_id], count)
    if not pages:
        raise SummaryError(f"{doc['path']}: no text in the store; ingest it again")
    title = doc["title"] or doc["path"]
    budget = backend.n_ctx - params.max_tokens - count(SUMMARY_SYSTEM) - count(COMBINE) - TEMPLATE_OVERHEAD
    if budget < 128:
        raise SummaryError(f"the context of {backend.n_ctx} tokens is too small to summarize with "
                           f"{params.max_tokens} answer tokens; raise the context length")
    stopped = lambda: bool(cancel and cancel())  # noqa: E731
    report = progress or (lambda *a: None)

    def system_and(user: str) -> list[dict]:
        return [{"role": "system", "content": SUMMARY_SYSTEM}, {"role": "user", "content": user}]

    groups = _groups(pages, budget)
    if len(groups) == 1:
        return _single_pass(store, backend, doc_id, title, params, report, stopped, model_name, save, key, t0)

    steps = len(groups) + 1
    sections: list[str] = []
    for i, group in enumerate(groups):
        if stopped():
            return _finish(store, doc_id, title, "\n\n".join(sections), f"{len(groups)} sections", sections,
                           t0, True, model_name, backend.name, False, key)
        where = page_ranges(group)
        report(i, steps, f"section {i + 1} of {len(groups)} ({where})")
        part = _generate(backend, system_and(f"{format_pages(group)}\n\n{SECTION.format(where=where)}"),
                         params, stopped)
        sections.append(f"({where}) {part}")
    # Combine; if the section summaries themselves overflow, combine in stages.
    level = sections
    while True:
        report(steps - 1, steps, "combining the section summaries")
        as_pages = [PageText(doc_id, title, i + 1, s, count(s) + 8) for i, s in enumerate(level)]
        packs = _groups(as_pages, budget)
        combined = [
            _generate(backend, system_and(COMBINE.format(title=title, parts="\n\n".join(p.text for p in pack))),
                      params, stopped)
            for pack in packs
        ]
        if len(combined) == 1 or stopped():
            break
        level = combined
    report(steps, steps, "done")
    return _finish(store, doc_id, title, "\n\n".join(combined), f"{len(groups)} sections", sections, t0,
                   stopped(), model_name, backend.name, save, key)


def _single_pass(store, backend, doc_id, title, params, report, stopped, model_name, save, key, t0) -> Summary:
    """The whole document in one pass, asked as a question about it: the answer service reads
    the document's prefix cache (from memory or its file, else computed and kept for the
    questions that follow), showing the tokens read while it reads."""
    from app.qa.answer import DOCUMENT, AnswerOptions, AskError, answer
    from app.qa.stream import Listeners

    def reading(done: int, total: int, what: str) -> None:
        report(done, total, what)      # the bar counts the document's tokens while it is read

    report(0, 1, "summarizing the whole document")
    try:
        result = answer(store, backend, WHOLE, [doc_id], params, Listeners(progress=reading, cancel=stopped),
                        save=False, options=AnswerOptions(source=DOCUMENT, beside="none"))
    except AskError as e:
        raise SummaryError(str(e)) from e
    report(1, 1, "done")
    return _finish(store, doc_id, title, result.answer, "single pass", [result.answer], t0,
                   result.cancelled or stopped(), model_name, backend.name, save, key)


def _finish(store, doc_id, title, text, method, sections, t0, cancelled, model_name, engine, save,
            key=None) -> Summary:
    s = Summary(doc_id, title, text, method, sections, time.perf_counter() - t0, cancelled)
    if save and text and not cancelled:
        s.summary_id = store.add_summary(doc_id, text, model_name, engine, method, key)
    return s
