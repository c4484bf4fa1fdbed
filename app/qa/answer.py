"""The answer service: one question about one document, several, a folder or everything.

The command line (``ellm ask``) and the window both call ``answer``. A question is answered in
one generation (one turn a part where it asks several things, qa/parts.py), from what its
documents offer now (``AnswerOptions.source``):

* a document that is read (its prefix cache is in memory or in its file, qa/doc_cache.py), or
  small enough to read at once, is answered from the whole of it: over several documents on a
  backend that composes prefix caches (eLLM's blocked cache), each document's prefix cache is
  laid beside the others' and the question read across all of them (qa/across.py); otherwise in
  one context, the documents' pages with page markers (qa/prompt.py), all of them when they fit,
  else the pages most relevant to the question (qa/pages.py), and the answer says so. The
  passages retrieval ranks best are shown to the model again beside the question
  (``beside``, qa/retrieval.py);
* a document that is not read yet is answered at once from those passages alone, and the answer
  says so (``answered_from`` "passages"): reading a whole manual takes minutes, the passages
  seconds. Reading it (``ellm read``, the window's reading ahead, ``source`` "document") makes
  the next question use the whole document.

Either way the answer streams; with sparse attention it also reads the passages that BM25 ranks
best for the question (qa/focus.py). Its citations are the pages it relied on (qa/citations.py)
and, where the engine reports attention, the passages it attended to (qa/attended.py).

Time is counted honestly: ``timings["ttft_s"]`` runs from the question to the first answer
token, everything included (reading a document into its cache, laying caches side by side,
choosing blocks, prefilling the question); its parts are listed beside it (``prefix_s``,
``compose_s``, ``engine_ttft_s``). While a document is read, ``progress(done, total, line)``
reports its tokens read of total and the time left.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from app.engine.backend import Backend, SamplingParams
from app.library.time_left import duration
from app.qa import across
from app.qa.attended import attended_passages
from app.qa.citations import cite
from app.qa.conversation import Conversation, next_turn
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.qa.focus import focus_ranges
from app.qa.pages import (TEMPLATE_OVERHEAD, ContextPlan, PageText, format_pages, load_pages, page_ranges,
                          plan_context, token_counter)
from app.qa.parts import question_parts
from app.qa.prompt import BESIDE_LEAD, SYSTEM_PROMPT, Prompt, build_prompt, question_suffix
from app.qa.retrieval import PASSAGES, best_passages, fitted, passage_pages
from app.qa.spans import PromptLayout
from app.qa.stream import AnswerStream, Listeners, ProgressSink
from app.runtime.auto import ANSWER_FLOOR, BESIDE_ROOM
from app.store import Store
from app.store.threads import answer_thread

AUTO, DOCUMENT, FROM_PASSAGES = "auto", "document", "passages"
SOURCES = (AUTO, DOCUMENT, FROM_PASSAGES)
READ_AT_ONCE = 2048   # a document prefix this short is read for its first question: about the passages' cost
BESIDE = "blocks"     # how a read document's answer sees the best passages again (AnswerOptions.beside)
BESIDE_MODES = ("blocks", "text", "none", "alone")
COPYING = ("blocks", "alone")   # the beside modes that copy the passages' cached blocks (Backend.beside)
BESIDE_SPARE = 16     # tokens the passages beside leave free (their lead, tokens merging at the seams)
PART_BREAK = "\n\n"   # between the answers to the parts of a question that asks several things
PASSAGES_ROOM = 2048  # tokens for the passages of documents not read, beside whole read ones (six of ~200)


class AskError(Exception):
    """A question that cannot be answered as asked; the message says why and what to do."""


@dataclass(frozen=True)
class AnswerOptions:
    """What a question is answered from.

    source   "auto": the whole documents where they are read (or short), else the passages
             retrieval ranks best, at once; "document": the whole documents, read now if they are
             not (``ellm ask --whole``, summaries, batches); "passages": the passages only.
    beside   how an answer from whole documents sees those passages again, just before the
             question: "blocks", copies of their cached blocks (no prefill: engine/kv/blocked.py
             ``copy_blocks``), every one of them read by every token of the answer (as "text"
             where the backend has no blocks); "text", their text
             after the documents; "none"; "alone", the same copies, the answer reading only them
             and the prompt's header (the view of engine/attention/select.py): the passages as the
             whole document's reading left them, nothing else of it. On the tuning half it
             answered fewer questions than "blocks" (72 of 90 against 77), its first token much
             sooner (docs/benchmarks.md): not the default.
    passages how many passages (qa/retrieval.py).
    parts    a question that asks several things, answered from whole documents in one context
             (not from passages, nor across documents' caches laid side by side), is asked one
             part a turn where the context has room for every turn (qa/parts.py). Off: on the
             tuning half it answered fewer two-page questions than one turn did (docs/benchmarks.md).
    memory_budget  bytes the caches of several documents laid side by side may take (the most
             relevant documents that fit are read, qa/across.py); None: a share of the memory
             available."""

    source: str = AUTO
    beside: str = BESIDE
    passages: int = PASSAGES
    parts: bool = False
    memory_budget: int | None = None

    def __post_init__(self):
        if self.source not in SOURCES:
            raise ValueError(f"source must be one of {', '.join(SOURCES)}, not {self.source!r}")
        if self.beside not in BESIDE_MODES:
            raise ValueError(f"beside must be one of {', '.join(BESIDE_MODES)}, not {self.beside!r}")
        if self.passages < 1:
            raise ValueError("passages must be at least 1")


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
    attended: list[dict] = field(default_factory=list)   # passages attended to (blocked cache only)
    considered: list[dict] | None = None  # several documents in one context: the ones read
    note: str = ""                        # why some of the documents asked about were left out
    answered_from: str = DOCUMENT         # "document" (whole, or its most relevant pages) | "passages"
    thread_id: int | None = None          # the conversation the answer is a turn of (store/threads.py)
    turns_left_out: int = 0               # earlier turns of the conversation that no longer fit the context

    @property
    def notes(self) -> str:
        """Everything a person should know about what the answer read, in one line."""
        return " ".join(n for n in (self.note, self.plan.note, self.turns_note) if n)

    @property
    def turns_note(self) -> str:
        n = self.turns_left_out
        if not n:
            return ""
        return (f"The {'oldest turn' if n == 1 else f'{n} oldest turns'} of this conversation no longer "
                f"{'fits' if n == 1 else 'fit'} the context and {'was' if n == 1 else 'were'} left out.")

    def as_dict(self) -> dict:
        d = {"answer": self.answer, "citations": self.citations, "timings": self.timings,
             "engine": self.engine, "model": self.model, "documents": self.doc_ids,
             "context": self.plan.as_dict(), "cancelled": self.cancelled, "answer_id": self.answer_id,
             "attended": self.attended, "answered_from": self.answered_from, "note": self.note,
             "thread": self.thread_id, "turns_left_out": self.turns_left_out}
        if self.considered is not None:
            d.update(considered=self.considered)
        return d


class ReadingProgress:
    """Reports a document being read into its cache: tokens read of total and the time left,
    from the rate so far."""

    def __init__(self, sink: ProgressSink | None, title: str, nth: int = 1, of: int = 1,
                 clock: Callable[[], float] = time.perf_counter):
        self.sink, self.title, self.nth, self.of, self.clock = sink, title, nth, of, clock
        self.t0 = clock()
        self.first_done: int | None = None

    def __call__(self, done: int, total: int) -> None:
        if self.sink is None:
            return
        if self.first_done is None:           # a resumed prefix starts past 0
            self.first_done, self.t0 = done, self.clock()
        self.sink(done, total, self.line(done, total, self.clock() - self.t0))

    def start(self, total: int) -> None:
        if self.sink is not None:
            self.sink(0, total, self.line(0, total, 0.0))

    def line(self, done: int, total: int, elapsed: float) -> str:
        which = f" ({self.nth} of {self.of})" if self.of > 1 else ""
        text = f"reading {self.title}{which}: {done:,} of {total:,} tokens"
        rate = (done - (self.first_done or 0)) / elapsed if elapsed > 0 else 0.0
        if 0 < done < total and rate > 0:
            text += f", {duration((total - done) / rate)} left"
        return text


def _titles(titles) -> str:
    return "; ".join(titles[:3]) + (f" and {len(titles) - 3} more" if len(titles) > 3 else "")


def answer(store: Store, backend: Backend, question: str, doc_ids: list[int], params: SamplingParams,
           listen: Listeners = Listeners(), *, options: AnswerOptions = AnswerOptions(),
           conversation: Conversation | None = None, save: bool = True, caches: DocCaches | None = None) -> Answer:
    """Answer ``question`` about ``doc_ids`` in one generation (or a turn a part, qa/parts.py),
    from what ``options`` says; as the next turn of ``conversation`` when given
    (qa/conversation.py: the earlier turns after the documents, the turn added to it and saved
    to its thread). ``listen``: who follows it (qa/stream.py Listeners: the streamed text, the
    engine's statistics, a document being read, cancelling). ``save``: the answer goes to the
    history, under the backend's model file's name; ``caches``: the documents' prefix caches
    (qa/doc_cache.py), the store's by default."""
    question = question.strip()
    if not question:
        raise AskError("the question is empty")
    if not doc_ids:
        raise AskError("no documents to ask: ingest some first (`ellm ingest FOLDER`)")
    caches = caches or DocCaches(store, store_cache_dir(store))
    job = _Job(store, backend, question, params, listen, caches, options, save, conversation)
    with caches.holding(backend, doc_ids):    # no cache budget deletes what this question reads
        result = job.run(doc_ids)
    opened = {c["doc"] for c in result.citations} | (set(doc_ids) if len(doc_ids) == 1 else set())
    store.mark_opened(sorted(opened))      # what a person asked about is read ahead first (qa/reading.py)
    return result


@dataclass
class _Job:
    """One question on its way to an answer: what both paths share."""

    store: Store
    backend: Backend
    question: str
    params: SamplingParams
    listen: Listeners
    caches: DocCaches
    options: AnswerOptions
    save: bool = True
    conversation: Conversation | None = None
    t_start: float = field(default_factory=time.perf_counter)
    left_out: int = 0         # earlier turns of the conversation this question leaves out (``turns``)
    split: bool = False       # the question was asked in parts, one turn each (``in_turns``)

    @property
    def model_name(self) -> str:
        """The name the answer is recorded under: the model file's."""
        return Path(self.backend.model_path).name

    def run(self, doc_ids: list[int]) -> Answer:
        options = self.options
        if options.source == FROM_PASSAGES:
            return self.from_passages(doc_ids)
        if options.source == AUTO:
            unread = self.unread(doc_ids)
            if unread:
                whole = self.read_among_best(doc_ids)
                if whole:
                    return self.across(whole, [d for d in doc_ids if d not in whole], unread)
                return self.from_passages(doc_ids, unread)
        if len(doc_ids) > 1 and self.backend.capabilities.composes:
            return self.across(doc_ids)
        return self.in_one_context(doc_ids)

    @property
    def query(self) -> str:
        """What retrieval looks for: the question, in a conversation with the one before it."""
        return self.query_of(self.question)

    def query_of(self, asked: str) -> str:
        """What retrieval looks for when ``asked`` is asked (the question or a part of it)."""
        return self.conversation.query(asked) if self.conversation else asked

    def turns(self, stream: AnswerStream, base: list[int], suffix: list[int], beside: str = "",
              continuing: bool = False, question: str | None = None, later: int = 0) -> list[int]:
        """The prompt after the documents' part ``base``: the question's ``suffix``, or in a
        conversation its earlier turns that fit before the answer ``stream`` will write (and
        ``later`` tokens of the question's later parts), and then the question
        (qa/conversation.py); ``question``: what is asked, if not the whole question (its first
        part, qa/parts.py)."""
        conv = self.conversation
        if conv is None:
            return suffix
        room = self.backend.n_ctx - len(base) - stream.params.max_tokens - later
        after, self.left_out, new = conv.tokens_after(self.backend, question or self.question, beside, room,
                                                      continuing)
        if new:
            self.backend.question_at(len(base) + len(after) - new)
        return after

    def unread(self, doc_ids: list[int]) -> list[str]:
        """The titles of the documents an answer from the whole of them would have to read first:
        neither held by the backend (memory or cache file) nor short enough to read at once
        (READ_AT_ONCE), and, asked alone, whose whole text fits the context (one that does not is
        answered from its most relevant pages, qa/pages.py, which reading would not change; among
        several, one that does not fit gives passages, Session.question_tokens). None on a
        backend that keeps no prefix files (llama.cpp, Gemma 3's contiguous cache): nothing read stays
        read there, so every question reads its documents, as it always has."""
        if not self.backend.capabilities.prefix_files:
            return []           # nothing stays read on this backend: every question reads its documents
        count = token_counter(self.backend)
        reserve = min(self.params.max_tokens, ANSWER_FLOOR)
        unread = []
        for doc_id in doc_ids:
            pages = load_pages(self.store, [doc_id], count)
            if not pages:
                continue
            prefix = build_prompt(self.backend, "", format_pages(pages)).prefix
            if len(prefix) <= READ_AT_ONCE or (len(doc_ids) == 1 and len(prefix) + reserve >= self.backend.n_ctx):
                continue
            if self.caches.is_read(self.backend, doc_id, prefix):
                continue
            unread.append(pages[0].title)
        return unread

    def read_among_best(self, doc_ids: list[int]) -> list[int]:
        """Several documents, some not read: the read ones the best passages come from, whole
        (qa/across.py ``ready_among_best``), with room for the others' passages."""
        if len(doc_ids) < 2 or not self.backend.capabilities.composes:
            return []
        room = self.backend.n_ctx - self.params.max_tokens - PASSAGES_ROOM - BESIDE_ROOM - across.ROOM
        ranked = best_passages(self.store, doc_ids, self.query, self.options.passages)
        return across.ready_among_best(self.store, self.backend, self.caches, [p.doc_id for p in ranked], room)

    def passages_of(self, doc_ids: list[int], room: int) -> tuple[str, list[PageText]]:
        """The passages of ``doc_ids`` that retrieval ranks best, as pages with markers within
        ``room`` tokens (to lie beside the question after whole documents), and those pages."""
        if not doc_ids or room <= 0:
            return "", []
        count = token_counter(self.backend)
        passages = best_passages(self.store, doc_ids, self.query, self.options.passages)
        laid_out = lambda pages: count(BESIDE_LEAD + format_pages(pages))  # noqa: E731
        pages = fitted(passage_pages(passages, count, doc_ids), room, passages, laid_out)
        return format_pages(pages), pages

    def from_passages(self, doc_ids: list[int], unread: list[str] = ()) -> Answer:
        """The passages retrieval ranks best, in one short prompt: an answer in seconds, before
        (or instead of) reading the documents. ``unread``: the titles not read yet, for the note."""
        backend, params = self.backend, self.params
        count = token_counter(backend)
        docs = [self.store.document(d) or {} for d in doc_ids]
        if not any(d.get("pages") for d in docs):
            raise AskError(f"{'the document has' if len(docs) == 1 else 'none of the documents has'} no text in the "
                           f"store; ingest it again (see `ellm docs` for its status)")
        passages = best_passages(self.store, doc_ids, self.query, self.options.passages)
        if not passages:
            raise AskError("no passage of the documents shares a word with the question: ask it in the "
                           "documents' own words, or ask again once they are read (`ellm read`, the window's "
                           "reading ahead, `ellm ask --whole`)")
        budget = backend.n_ctx - params.max_tokens
        prompt_size = lambda pages: len(build_prompt(backend, self.question, format_pages(pages)).tokens)  # noqa: E731
        pages = fitted(passage_pages(passages, count, doc_ids), budget, passages, prompt_size)
        if not pages:
            raise AskError(f"the context of {backend.n_ctx} tokens leaves no room for a passage after the question "
                           f"and {params.max_tokens} answer tokens; raise the context length or lower max tokens")
        plan = ContextPlan(pages=pages, doc_tokens=sum(int(d.get("tokens") or 0) for d in docs),
                           used_tokens=sum(p.tokens for p in pages), budget=budget,
                           total_pages=sum(int(d.get("pages") or 0) for d in docs), passages=True)
        prompt = build_prompt(backend, self.question, format_pages(pages))
        stream = AnswerStream(backend, params, self.listen, self.t_start)
        text = stream.run(prompt.prefix + self.turns(stream, prompt.prefix, prompt.suffix), len(prompt.prefix))
        result = self._finish(text, stream, stream.timings(kv_cache="none"), plan, list(doc_ids),
                              PromptLayout(backend, []), keep=False)
        result.answered_from = FROM_PASSAGES
        n = sum(1 for p in passages if any(p.doc_id == pg.doc_id and p.page == pg.number for pg in pages))
        result.note = f"Answered from {n} passage{'' if n == 1 else 's'} ({page_ranges(pages)})" + (
            f": {_titles(unread)} {'is' if len(unread) == 1 else 'are'} not read yet; once read, questions see "
            f"the whole text." if unread else ".")
        self._save(result)
        return result

    @property
    def beside_mode(self) -> str:
        """AnswerOptions.beside as this backend can do it: "blocks" needs a blocked cache, else
        the passages go beside the question as text."""
        mode = self.options.beside
        return "text" if mode in COPYING and not self.backend.capabilities.beside else mode

    def beside_blocks(self, layout: PromptLayout, room: int, head: int) -> list[int]:
        """With "blocks": copies of the cached blocks that hold the best passages, laid after the
        document prefix the backend holds now; the tokens they spell (empty otherwise)."""
        if self.beside_mode not in COPYING or room <= 0:
            return []
        return self.backend.beside(focus_ranges(self.store, self.query, layout, self.options.passages), room,
                                   head if self.beside_mode == "alone" else None)

    def beside_text(self, doc_ids: list[int], room: int) -> str:
        """With "text": the best passages as pages with markers, within ``room`` tokens, to be
        shown again after whole documents ("" otherwise, or when nothing matches)."""
        if self.beside_mode != "text":
            return ""
        return self.passages_of(doc_ids, room)[0]

    def in_one_context(self, doc_ids: list[int]) -> Answer:
        """The documents' pages in one prompt: whole when they fit, else the most relevant."""
        backend, params = self.backend, self.params
        count = token_counter(backend)
        pages = load_pages(self.store, doc_ids, count)
        if not pages:
            raise AskError("the document has no text in the store; ingest it again (see `ellm docs` for its status)")
        fixed = count(SYSTEM_PROMPT) + count(self.question) + TEMPLATE_OVERHEAD
        # A whole document that fits with a short answer stays whole, its answer capped by what the
        # context leaves (runtime/auto.py keeps such a document inside the trained window, read once:
        # a longer answer must not turn it into a selection of pages, another prefix to read).
        reserve = min(params.max_tokens, ANSWER_FLOOR)
        if sum(p.tokens for p in pages) > backend.n_ctx - reserve - fixed:
            reserve = params.max_tokens
        budget = backend.n_ctx - reserve - fixed
        if budget < 64:
            raise AskError(f"the context of {backend.n_ctx} tokens leaves no room for the document after the "
                           f"question and {params.max_tokens} answer tokens; raise the context length or lower "
                           f"max tokens")
        plan = plan_context(self.store, pages, budget, self.question)
        prompt = build_prompt(backend, self.question, format_pages(plan.pages))
        if len(prompt.tokens) + reserve > backend.n_ctx:  # page estimates were low: drop pages until it fits
            while plan.pages and len(prompt.tokens) + reserve > backend.n_ctx:
                plan.pages.pop()
                prompt = build_prompt(backend, self.question, format_pages(plan.pages))
            plan.used_tokens = sum(p.tokens for p in plan.pages)
        params = replace(params, max_tokens=min(params.max_tokens, backend.n_ctx - len(prompt.tokens)))
        parts, later = self.parts_that_fit(len(prompt.tokens), params.max_tokens)
        room = self.beside_room(backend.n_ctx - len(prompt.tokens) - params.max_tokens - later - BESIDE_SPARE)
        beside = self.beside_text(doc_ids, room)
        if beside:
            prompt = build_prompt(backend, self.question, format_pages(plan.pages), beside)
        stream = AnswerStream(backend, params, self.listen, self.t_start)
        t_prefix = time.perf_counter()
        single = doc_ids[0] if len(doc_ids) == 1 else None
        title = plan.pages[0].title if plan.pages and len(doc_ids) == 1 else f"{len(doc_ids)} documents"
        continuing = self.conversation is not None and self.conversation.continues(backend, prompt.prefix)
        status = "hit" if continuing else self.caches.prepare(backend, single, prompt.prefix, stream.stop_now,
                                                              ReadingProgress(self.listen.progress, title))
        prefix_s = time.perf_counter() - t_prefix
        layout = PromptLayout(backend, [(0, len(prompt.prefix), prompt.prefix_text, plan)])
        text = ""
        if status is not None:
            base = (self.conversation.held[:self.conversation.base] if continuing
                    else prompt.prefix + self.beside_blocks(layout, room, len(prompt.header)))
            text = self.in_turns(stream, base, prompt.suffix, beside, continuing, layout, parts, later)
        timings = stream.timings(kv_cache=status or "miss", prefix_s=round(prefix_s, 4))
        return self._finish(text, stream, timings, plan, list(doc_ids), layout)

    def parts_that_fit(self, prompt_tokens: int, max_tokens: int) -> tuple[list[str], int]:
        """The parts the question is asked in, one turn each (qa/parts.py), and the tokens their
        later turns take; the whole question in one turn where the options say so or where the
        later turns would not fit the context after a prompt of ``prompt_tokens``."""
        parts = question_parts(self.question) if self.options.parts else [self.question]
        later = sum(len(next_turn(self.backend, part)) + max_tokens for part in parts[1:])
        if len(parts) == 1 or prompt_tokens + max_tokens + later > self.backend.n_ctx:
            return [self.question], 0
        return parts, later

    def in_turns(self, stream: AnswerStream, base: list[int], suffix: list[int], beside: str, continuing: bool,
                 layout: PromptLayout, parts: list[str], later: int) -> str:
        """The answer after the documents' part ``base``: the question in one turn, or its
        ``parts`` one turn each (``later``: the tokens the turns after the first take), each later
        one continuing what the backend holds of the one before, with its own focus passages; the
        answers joined by a blank line. The engine's statistics are the last turn's."""
        if len(parts) > 1:
            suffix = question_suffix(self.backend, parts[0], beside)
        self._focus(layout, self.query_of(parts[0]))
        texts = [stream.run(base + self.turns(stream, base, suffix, beside, continuing, parts[0], later),
                            len(base))]
        self.split = len(parts) > 1
        for before, part in zip(parts, parts[1:]):
            held = stream.prompt + stream.generated
            ask = next_turn(self.backend, part)
            if stream.stop_now() or len(held) + len(ask) + stream.params.max_tokens > self.backend.n_ctx:
                break            # cancelled; the room was left by parts_that_fit and turns(), this guards it
            self.backend.question_at(len(held))       # this part alone chooses what sparse decoding reads
            self._focus(layout, f"{before} {part}")  # "And which ... them?": the part before names what it is about
            texts.append(stream.run(held + ask, len(base), PART_BREAK if any(texts) else ""))
        return PART_BREAK.join(t for t in texts if t)

    def across(self, doc_ids: list[int], others: list[int] = (),
               unread: list[str] = ()) -> Answer:
        """Several documents' prefix caches side by side, the question read across all of them;
        with ``others`` (documents not read, ``unread`` their titles), their best passages too,
        beside the question."""
        backend = self.backend
        parts = across.document_parts(self.store, backend, self.question, doc_ids)
        if not parts:
            raise AskError("none of the documents has text in the store; see `ellm docs`")
        try:
            considered, note = across.fit(self.store, backend, self.question, parts, self.options.memory_budget)
        except across.OverBudget as e:
            raise AskError(str(e)) from e
        stream = AnswerStream(backend, self.params, self.listen, self.t_start)
        first = considered[0].prompt
        composed = first.prefix + [t for p in considered[1:] for t in p.prompt.doc]
        extra = self.passages_of(list(others), PASSAGES_ROOM)
        if others:
            whole = _titles([p.title for p in considered])
            note = (f"Read whole: {whole}; from the other {len(others)}, their best passages"
                    + (f" ({_titles(unread)} {'is' if len(unread) == 1 else 'are'} not read yet; once read, "
                       f"questions see the whole text)." if unread else ".") + (f" {note}" if note else ""))
        if self.conversation is not None and self.conversation.continues(backend, composed):
            return self._across_answer(considered, composed, parts, note, stream, ["hit"], 0.0, continuing=True,
                                       extra=extra)
        statuses = []
        for i, p in enumerate(considered):
            if self.caches.registered(backend, p.doc_id, p.prefix) is not None:
                statuses.append("hit")
                continue
            reading = ReadingProgress(self.listen.progress, p.title, i + 1, len(considered))
            reading.start(len(p.prefix))
            status = self.caches.prepare(backend, p.doc_id, p.prefix, stream.stop_now, reading)
            if status is None:
                return self._cancelled(doc_ids)
            statuses.append(status)
        t_compose = time.perf_counter()
        try:
            offsets = across.compose(backend, self.caches, considered, stream.stop_now,
                                     room=(0 if self.options.beside == "none" else BESIDE_ROOM)
                                     + (PASSAGES_ROOM if extra[0] else 0))
        except across.ComposeError as e:
            raise AskError(str(e)) from e
        compose_s = time.perf_counter() - t_compose
        return self._across_answer(considered, composed, parts, note, stream, statuses, compose_s, offsets,
                                   extra=extra)

    def _across_answer(self, considered: list, composed: list[int], parts: list, note: str, stream: AnswerStream,
                       statuses: list[str], compose_s: float, offsets: list[int] | None = None,
                       continuing: bool = False, extra: tuple[str, list[PageText]] = ("", [])) -> Answer:
        """The question read across the documents' caches laid side by side, ``composed`` (or,
        ``continuing`` a conversation, still there from its last turn); ``extra``: passages of
        other documents (as text, and their pages) to lay beside the question."""
        backend = self.backend
        first = considered[0].prompt
        if offsets is None:          # where compose laid each document: the first after the header
            offsets, end = [len(first.header)], len(first.prefix)
            for p in considered[1:]:
                offsets.append(end)
                end += len(p.prompt.doc)
        segments = [(0, len(first.prefix), first.prefix_text, ContextPlan(pages=considered[0].pages))]
        segments += [(off, len(p.prompt.doc), p.prompt.doc_text, ContextPlan(pages=p.pages))
                     for off, p in zip(offsets[1:], considered[1:])]
        layout = PromptLayout(backend, segments)
        self._focus(layout)
        suffix = first.suffix
        others = "" if continuing else extra[0]           # the passages of documents not read, laid first
        room = self.beside_room(backend.n_ctx - len(composed) - len(suffix) - self.params.max_tokens - BESIDE_SPARE
                                - (token_counter(backend)(others) if others else 0))
        beside = "" if continuing else self.beside_text([p.doc_id for p in considered], room)
        beside = "\n\n".join(t for t in (beside, others) if t)
        if beside:
            suffix = question_suffix(backend, self.question, beside)
        base = (self.conversation.held[:self.conversation.base] if continuing
                else composed + self.beside_blocks(layout, room, len(first.header)))
        text = stream.run(base + self.turns(stream, base, suffix, beside, continuing), len(base))
        timings = stream.timings(kv_cache="hit" if all(s == "hit" for s in statuses) else "miss",
                                compose_s=round(compose_s, 4))
        pages = [pg for p in considered for pg in p.pages] + extra[1]
        plan = ContextPlan(pages=pages, doc_tokens=sum(len(p.prefix) for p in parts),
                           used_tokens=sum(len(p.prefix) for p in considered), budget=backend.n_ctx,
                           total_pages=len(pages))
        asked = [p.doc_id for p in considered] + [d for d in dict.fromkeys(pg.doc_id for pg in extra[1])]
        result = self._finish(text, stream, timings, plan, asked, layout, keep=False)
        result.considered = [{"doc": p.doc_id, "title": p.title} for p in considered]
        result.note = note
        self._save(result)
        return result

    # ---- shared ------------------------------------------------------------------------

    def beside_room(self, room: int) -> int:
        """The room the passages beside the question may take: in a conversation with earlier
        turns, half of it (the turns need the rest)."""
        return room // 2 if self.conversation is not None and self.conversation.turns else room

    def _focus(self, layout: PromptLayout, query: str | None = None) -> None:
        """Sparse attention: the answer also reads the passages BM25 ranks best for ``query``
        (default: the question's, qa/focus.py)."""
        if self.backend.capabilities.focus:
            self.backend.focus(focus_ranges(self.store, query or self.query, layout))

    def _finish(self, text: str, stream: AnswerStream, timings: dict, plan: ContextPlan, doc_ids: list[int],
                layout: PromptLayout, keep: bool = True) -> Answer:
        backend = self.backend
        citations = cite(self.store, text, self.query, plan) if text else []
        result = Answer(self.question, text, citations, timings, plan, backend.name, self.model_name, doc_ids,
                        stream.cancelled)
        conv = self.conversation
        if conv is not None:
            result.thread_id, result.turns_left_out = conv.thread_id, self.left_out
            if stream.prompt:      # a question asked in parts: its turn is its text, the answers joined
                conv.record(self.question, text, stream.prompt, stream.generated, stream.base,
                            as_generated=not self.split)
        if backend.capabilities.attended_blocks:
            result.attended = attended_passages(backend, layout)
        if keep:
            self._save(result)
        return result

    def _save(self, result: Answer) -> None:
        """Store the answer (with what it said so far, if it was stopped); nothing when empty."""
        if result.answer and self.save:
            thread = self.conversation.thread_id if self.conversation is not None else None
            result.answer_id = self.store.add_answer(result.doc_ids, result.question, result.answer,
                                                     result.citations, self.model_name, self.backend.name,
                                                     result.timings, thread_id=thread)
            result.thread_id = thread if thread is not None else answer_thread(self.store, result.answer_id)

    def _cancelled(self, doc_ids: list[int]) -> Answer:
        return Answer(self.question, "", [], {"total_s": round(time.perf_counter() - self.t_start, 3),
                                              "kv_cache": "miss"},
                      ContextPlan(), self.backend.name, self.model_name, list(doc_ids), cancelled=True)


__all__ = ["AUTO", "DOCUMENT", "FROM_PASSAGES", "Answer", "AnswerOptions", "AskError", "Prompt",
           "answer"]
