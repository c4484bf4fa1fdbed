"""What a person would use instead of eLLM, asked the same questions in the same run.

* ``topk``: the usual document apps' retrieval (AnythingLLM, GPT4All, Open WebUI): the
  document's text cut into chunks of ~1,000 characters (a small overlap, across pages), the
  ``TOPK`` chunks BM25 ranks best for the question put in the prompt, best first, and nothing
  else of the document. BM25 is SQLite's FTS5 over the chunks, with the query the store uses
  (app/store/db.py ``fts_query``), so the ranking is the same function as eLLM's own retrieval,
  on the apps' chunks.
* ``closed``: the model with no document at all: what it answers from its own training. A
  question it gets right this way does not show that a document was read (the report flags it).

Both answer through the answer service's stream (qa/answer.py) with the model's chat template and
the sampling eLLM's answers get; ``topk`` with eLLM's prompt (app/qa/prompt.py), ``closed`` with a
system prompt that asks for a brief answer (eLLM's asks for one from the documents only).
"""
from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass

from app.engine.backend import Backend, SamplingParams
from app.qa.answer import Answer, AskError
from app.qa.citations import cite
from app.qa.pages import PAGE_MARKER_TOKENS, ContextPlan, PageText, format_pages, token_counter
from app.qa.prompt import build_prompt
from app.qa.stream import AnswerStream, Listeners
from app.store import Store
from app.store.db import fts_query

TOPK = 6                  # chunks in the prompt (the apps' defaults are 4-6)
CHUNK_CHARS = 1000        # the apps' chunk size
OVERLAP_CHARS = 20        # and overlap (AnythingLLM's text splitter)
CLOSED_BOOK_PROMPT = "You are a helpful assistant. Answer the question clearly and briefly."


@dataclass(frozen=True)
class Chunk:
    page: int             # the page the chunk starts on
    text: str


def chunks_of(pages: list[tuple[int, str]], chars: int = CHUNK_CHARS, overlap: int = OVERLAP_CHARS) -> list[Chunk]:
    """The text of ``pages`` ((number, text) in order) cut into chunks of at most ``chars``
    characters at whitespace, each starting ``overlap`` characters before the last one ended;
    a chunk belongs to the page it starts on."""
    text, starts = "", []          # starts: (offset in text, page number)
    for number, page_text in pages:
        starts.append((len(text), number))
        text += page_text.strip() + "\n\n"
    out, at = [], 0
    while at < len(text):
        end = min(len(text), at + chars)
        if end < len(text):
            cut = text.rfind(" ", at + chars // 2, end)
            end = cut if cut > at else end
        piece = text[at:end].strip()
        if piece:
            page = max((n for off, n in starts if off <= at), default=starts[0][1] if starts else 1)
            out.append(Chunk(page, piece))
        if end >= len(text):
            break
        at = max(at + 1, end - overlap)
    return out


def rank_chunks(chunks: list[Chunk], question: str, k: int = TOPK) -> list[Chunk]:
    """The ``k`` chunks BM25 ranks best for ``question`` (an in-memory FTS5 table)."""
    query = fts_query(question)
    if not query or not chunks:
        return []
    db = sqlite3.connect(":memory:")
    try:
        db.execute("CREATE VIRTUAL TABLE c USING fts5(text)")
        db.executemany("INSERT INTO c (rowid, text) VALUES (?, ?)", [(i, ch.text) for i, ch in enumerate(chunks)])
        rows = db.execute("SELECT rowid FROM c WHERE c MATCH ? ORDER BY bm25(c) LIMIT ?", (query, k)).fetchall()
    finally:
        db.close()
    return [chunks[r[0]] for r in rows]


def answer_topk(store: Store, backend: Backend, question: str, doc_id: int, params: SamplingParams,
                model_name: str = "", k: int = TOPK) -> Answer:
    """``question`` answered from the ``k`` best chunks of ``doc_id``, the apps' way."""
    t0 = time.perf_counter()
    doc = store.document(doc_id) or {}
    title = doc.get("title") or f"document {doc_id}"
    best = rank_chunks(chunks_of([(p["number"], p["text"]) for p in store.pages(doc_id)]), question, k)
    if not best:
        raise AskError("no chunk of the document shares a word with the question")
    count = token_counter(backend)
    pages = [PageText(doc_id, title, ch.page, ch.text, count(ch.text) + PAGE_MARKER_TOKENS) for ch in best]
    plan = ContextPlan(pages=pages, doc_tokens=int(doc.get("tokens") or 0),
                       used_tokens=sum(p.tokens for p in pages), budget=backend.n_ctx,
                       total_pages=int(doc.get("pages") or 0), passages=True)
    prompt = build_prompt(backend, question, format_pages(pages))
    return _answered(backend, prompt.tokens, params, question, model_name, plan, [doc_id], t0,
                     lambda text: cite(store, text, question, plan))


def answer_closed(backend: Backend, question: str, params: SamplingParams, model_name: str = "") -> Answer:
    """``question`` answered by the model alone."""
    t0 = time.perf_counter()
    text = backend.apply_chat_template([{"role": "system", "content": CLOSED_BOOK_PROMPT},
                                        {"role": "user", "content": question}])
    tokens = backend.tokenize(text, add_bos=True, special=True)
    return _answered(backend, tokens, params, question, model_name, ContextPlan(), [], t0, lambda text: [])


def _answered(backend, tokens, params, question, model_name, plan, doc_ids, t0, citations) -> Answer:
    stream = AnswerStream(backend, params, Listeners(), t0)
    text = stream.run(tokens)
    return Answer(question, text, citations(text) if text else [], stream.timings(), plan, backend.name, model_name,
                  list(doc_ids), answered_from="passages" if doc_ids else "none")


__all__ = ["CHUNK_CHARS", "TOPK", "Chunk", "answer_closed", "answer_topk", "chunks_of", "rank_chunks"]
