"""The passages a question is answered from when its documents are not read, and the ones a
read document's answer sees again beside the question: the store's chunks (~800 characters
within a page, app/library/ingest.py) that BM25 ranks best for the question (FTS5).

The usual document apps answer from the six chunks of ~1,000 characters their retrieval ranks
best (AnythingLLM, GPT4All, Open WebUI); the chunks here keep to one page, so every passage
has the page a citation names. The passages are laid out as pages are (qa/pages.py
``format_pages``: one ``[Page N]`` marker a page, in document order, which answers more often
right than the ranking's order: Yu et al. 2024, "In Defense of RAG in the Era of Long-Context
Language Models", order-preserving RAG), so citations and the page spans of a prompt read them
as they read whole pages.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from app.qa.pages import PAGE_MARKER_TOKENS, PageText
from app.store import Store

PASSAGES = 6             # chunks of ~800 characters (the apps take six of ~1,000): on the tuning half they
                         # held 58 of the 59 questions' facts (eight held all 59) in a prompt short enough
                         # for a quick first answer on a small CPU (docs/benchmarks.md, "Retrieval")
CANDIDATES = 4           # chunks ranked per passage kept (the same chunk text may repeat)


@dataclass(frozen=True)
class Passage:
    doc_id: int
    title: str
    page: int
    start: int           # where it starts on its page (characters)
    text: str
    rank: int            # 0: the best


def best_passages(store: Store, doc_ids: list[int], question: str, k: int = PASSAGES) -> list[Passage]:
    """The ``k`` chunks of ``doc_ids`` that BM25 ranks best for ``question``, best first; the
    same text twice (a running header) counts once. Empty when no word of the question is
    in the documents."""
    titles: dict[int, str] = {}
    out, seen = [], set()
    for hit in store.search_chunks(list(doc_ids), question, limit=CANDIDATES * k):
        text = " ".join(hit["text"].split())
        if not text or text in seen:
            continue
        seen.add(text)
        doc_id = hit["doc_id"]
        if doc_id not in titles:
            titles[doc_id] = (store.document(doc_id) or {}).get("title") or f"document {doc_id}"
        out.append(Passage(doc_id, titles[doc_id], hit["page"], int(hit["start"]), hit["text"].strip(), len(out)))
        if len(out) == k:
            break
    return out


def passage_pages(passages: list[Passage], count_tokens, doc_order: list[int] | None = None) -> list[PageText]:
    """The passages as pages for a prompt (qa/pages.py ``format_pages``): one entry a page, its
    passages joined in the order they stand on it, the pages in document order (the documents
    in ``doc_order``, else by id)."""
    order = {d: i for i, d in enumerate(doc_order or [])}
    by_page: dict[tuple[int, int], list[Passage]] = {}
    for p in passages:
        by_page.setdefault((p.doc_id, p.page), []).append(p)
    pages = []
    for (doc_id, number), found in sorted(by_page.items(), key=lambda kv: (order.get(kv[0][0], kv[0][0]),
                                                                             kv[0][1])):
        text = "\n\n".join(p.text for p in sorted(found, key=lambda p: p.start))
        pages.append(PageText(doc_id, found[0].title, number, text, count_tokens(text) + PAGE_MARKER_TOKENS))
    return pages


def fitted(pages: list[PageText], budget: int, passages: list[Passage],
           size: Callable[[list[PageText]], int] | None = None) -> list[PageText]:
    """``pages`` cut to ``budget`` tokens, dropping the pages of the worst-ranked passages
    first (a page goes with its best passage's rank); ``size(pages)``: their tokens as laid out
    (default: the pages' own counts)."""
    size = size or (lambda kept: sum(p.tokens for p in kept))
    best = {}
    for p in passages:
        best.setdefault((p.doc_id, p.page), p.rank)
    kept = list(pages)
    for key in sorted(best, key=best.get, reverse=True):
        if size(kept) <= budget:
            break
        kept = [p for p in kept if (p.doc_id, p.number) != key]
    return kept if kept and size(kept) <= budget else []


__all__ = ["PASSAGES", "Passage", "best_passages", "fitted", "passage_pages"]
