"""Asking a question about whole documents, with page citations.

The prompt holds the document's text with page markers (see prompting.py). The
answer streams; its citations are the pages it relied on: the pages it cites
itself ([p. N]) and the passages of the context that best match what it says
(BM25 over the document's chunks).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Callable

from app.engine.backend import SamplingParams, stream_text
from app.prompting import (
    TEMPLATE_OVERHEAD, ContextPlan, format_pages, load_pages, plan_context, token_counter,
)
from app.attended import attended_passages
from app.doccache import DocCaches, store_cache_dir
from app.store import Store

SYSTEM_PROMPT = (
    "You are eLLM, an assistant that answers questions about the documents given to you. "
    "Answer from the documents only, clearly and briefly. After each fact, cite the page it comes "
    "from as [p. N]. If the documents do not contain the answer, say so."
)
MAX_CITATIONS = 3
PASSAGE_CHARS = 400
_CITE = re.compile(r"\[(?:p|pp|page|pages)\.?\s*(\d+)(?:\s*[-–,]\s*(\d+))?\]|\bpages?\s+(\d+)\b", re.IGNORECASE)


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


def build_messages(question: str, context_text: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{context_text}{QUESTION_LEAD}{question}"},
    ]


QUESTION_LEAD = "\n\nQuestion: "
_DOCS = "\u27e6documents\u27e7"
_SLOT = "\u27e6question\u27e7"


@dataclass
class Prompt:
    """A question's prompt in three parts. ``header`` (system prompt and the opening of the
    user turn) and ``doc`` (the pages) do not depend on the question: their KV cache is
    computed once per document (app/doccache.py). Both are padded with blank lines to whole
    KV blocks, so that several documents' caches can sit side by side (app/folder_ask.py)."""

    header: list[int]
    doc: list[int]
    suffix: list[int]
    header_text: str
    doc_text: str

    @property
    def prefix(self) -> list[int]:
        return self.header + self.doc

    @property
    def tokens(self) -> list[int]:
        return self.header + self.doc + self.suffix

    @property
    def prefix_text(self) -> str:
        return self.header_text + self.doc_text


def _padded(backend, tokens: list[int], text: str) -> tuple[list[int], str]:
    multiple = getattr(backend, "prefix_multiple", 1)
    if len(tokens) % multiple == 0:
        return tokens, text
    newline = backend.tokenize("\n", add_bos=False, special=False)[-1:]
    n_pad = multiple - len(tokens) % multiple
    return tokens + newline * n_pad, text + backend.token_bytes(newline[0]).decode("utf-8", "replace") * n_pad


def build_prompt(backend, question: str, context_text: str) -> Prompt:
    """The prompt of ``question`` about ``context_text`` (pages with markers). The pages are
    tokenized without special tokens: a document cannot smuggle in chat markup."""
    rendered = backend.apply_chat_template(build_messages(_SLOT, _DOCS))
    cut = rendered.index(_DOCS)
    header_text, rest = rendered[:cut], rendered[cut + len(_DOCS):]
    header, header_text = _padded(backend, backend.tokenize(header_text, add_bos=True, special=True), header_text)
    doc, doc_text = _padded(backend, backend.tokenize(context_text, add_bos=False, special=False), context_text)
    suffix = backend.tokenize(rest.replace(_SLOT, question), add_bos=False, special=True)
    return Prompt(header, doc, suffix, header_text, doc_text)


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


def cite(store: Store, answer: str, question: str, plan: ContextPlan) -> list[dict]:
    """Pages the answer relied on, most certain first: the pages it cites itself,
    then the context pages whose passages best match the answer."""
    in_context = {(p.doc_id, p.number): p for p in plan.pages}
    doc_ids = sorted({p.doc_id for p in plan.pages})
    chosen: list[tuple[int, int]] = []
    for m in _CITE.finditer(answer):
        first = int(m.group(1) or m.group(3))
        last = int(m.group(2)) if m.group(2) else first
        for n in range(first, min(last, first + 5) + 1):
            for d in doc_ids:
                if (d, n) in in_context and (d, n) not in chosen:
                    chosen.append((d, n))
    for hit in store.search_chunks(doc_ids, f"{answer} {answer} {question}", limit=20):
        key = (hit["doc_id"], hit["page"])
        if key in in_context and key not in chosen:
            chosen.append(key)
        if len(chosen) >= MAX_CITATIONS:
            break
    out = []
    for doc_id, page in chosen[:MAX_CITATIONS]:
        out.append({"doc": doc_id, "page": page, "text": passage(store, doc_id, page, answer, in_context)})
    return out


def passage(store: Store, doc_id: int, page: int, answer: str, in_context: dict) -> str:
    """The sentences of ``page`` that best match the answer: the best chunk (BM25),
    narrowed to the run of sentences that shares the most words with the answer."""
    hits = store.search_chunks([doc_id], answer, limit=1, pages=[page])
    text = hits[0]["text"] if hits else in_context[(doc_id, page)].text
    return best_window(" ".join(text.split()), answer, PASSAGE_CHARS)


_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def best_window(text: str, query: str, limit: int) -> str:
    """At most ~``limit`` chars of ``text``: the sentence sharing most content words
    with ``query``, grown with its neighbours while it fits."""
    if len(text) <= limit:
        return text
    wanted = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
    sentences = [x for x in _SENTENCE_END.split(text) if x]
    scores = [len(wanted & set(re.findall(r"\w+", x.lower()))) for x in sentences]
    best = max(range(len(sentences)), key=lambda i: (scores[i], -i))
    lo = hi = best
    size = len(sentences[best])
    while True:  # grow towards the side that adds more matching words
        options = [(scores[i], i) for i in (lo - 1, hi + 1)
                   if 0 <= i < len(sentences) and size + 1 + len(sentences[i]) <= limit]
        if not options:
            break
        _, i = max(options)
        size += 1 + len(sentences[i])
        lo, hi = min(lo, i), max(hi, i)
    window = " ".join(sentences[lo: hi + 1])
    if len(window) > limit:  # one giant sentence
        window = window[: limit - 1].rsplit(" ", 1)[0] + "…"
    return window
