"""Citations: the pages an answer relied on, and the passage of each that it drew from.

The pages it cites itself ([p. N]) come first, then the context pages whose passages best
match what it says (BM25 over the document's chunks, the store's FTS5 index).
"""
from __future__ import annotations

import re

from app.qa.pages import ContextPlan
from app.store import Store

MAX_CITATIONS = 3
PASSAGE_CHARS = 400
_CITE = re.compile(r"\[(?:p|pp|page|pages)\.?\s*(\d+)(?:\s*[-–,]\s*(\d+))?\]|\bpages?\s+(\d+)\b", re.IGNORECASE)


def cite(store: Store, answer: str, question: str, plan: ContextPlan) -> list[dict]:
    """Pages the answer relied on, most certain first: the pages it cites itself, then the
    context pages whose passages best match the answer. Across several documents a "[p. N]"
    names the page N that matches the answer best (the documents all have a page 2)."""
    in_context = {(p.doc_id, p.number): p for p in plan.pages}
    doc_ids = sorted({p.doc_id for p in plan.pages})
    ranked = [(hit["doc_id"], hit["page"]) for hit in
              store.search_chunks(doc_ids, f"{answer} {answer} {question}", limit=20)]
    rank = {key: i for i, key in reversed(list(enumerate(ranked)))}
    chosen: list[tuple[int, int]] = []
    for m in _CITE.finditer(answer):
        first = int(m.group(1) or m.group(3))
        last = int(m.group(2)) if m.group(2) else first
        for n in range(first, min(last, first + 5) + 1):
            candidates = [(d, n) for d in doc_ids if (d, n) in in_context]
            if candidates:
                best = min(candidates, key=lambda key: (rank.get(key, len(ranked)), key))
                if best not in chosen:
                    chosen.append(best)
    for key in ranked:
        if len(chosen) >= MAX_CITATIONS:
            break
        if key in in_context and key not in chosen:
            chosen.append(key)
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
