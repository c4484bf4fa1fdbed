"""The passages a question's answer reads whatever its attention chooses: the store's own
relevance ranking (BM25 over the documents' ~800-character chunks, FTS5) points sparse
attention at the best-matching passages, so reading the whole document never leaves out what
the retrieval the usual document apps answer from would have read.

Why: with sparse attention over a read document, the question's votes choose the blocks an
answer reads (app/engine/attention/votes.py), and beyond the model's trained window the document
itself was read sparsely too. There, on two Debian manuals of 42K and 46K tokens, the answers were
right 17 of 23 times with these passages read and 12 of 23 without (docs/benchmarks.md).
The engine reads the focus blocks besides its top K, in every layer and head (``Backend.focus``),
and beyond the trained window lays them out nearest the question (engine/attention/select.py);
dense attention reads everything and needs none.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from app.qa.spans import LaidOut, PromptLayout
from app.store import Store

FOCUS_CHUNKS = 4   # passages (~200 tokens each) read besides the blocks attention chooses


def focus_ranges(store: Store, question: str, layout: PromptLayout,
                 chunks: int | None = None) -> list[tuple[int, int]]:
    """Token ranges [start, end) of the cache holding the ``chunks`` (default FOCUS_CHUNKS)
    passages of the laid-out prefixes' documents that rank highest for ``question``."""
    chunks = FOCUS_CHUNKS if chunks is None else chunks
    laid = layout.documents if chunks else []
    if not laid:
        return []
    doc_ids: list[int] = []
    for d in laid:
        doc_ids += sorted({doc for _, _, doc, _ in d.spans} - set(doc_ids))
    pages = [{(doc, page): (s, e) for s, e, doc, page in d.spans} for d in laid]
    ranges = []
    for hit in store.search_chunks(doc_ids, question, limit=4 * chunks):
        found = _locate(hit, laid, pages)
        if found is not None and found not in ranges:
            ranges.append(found)
            if len(ranges) == chunks:
                break
    return ranges


def _locate(hit: dict, laid: list[LaidOut], pages: list[dict]) -> tuple[int, int] | None:
    """The cached tokens spelling chunk ``hit``, if its page is in the prompt."""
    needle = hit["text"].strip().encode("utf-8")
    for d, spans in zip(laid, pages):
        span = spans.get((hit["doc_id"], hit["page"]))
        if span is None or not needle:
            continue
        at = d.prefix.find(needle, span[0], span[1])
        if at < 0:
            return None
        first = max(0, bisect_right(d.offsets, at) - 1)
        end = bisect_left(d.offsets, at + len(needle))
        return d.start + first, d.start + min(end, len(d.offsets) - 1)
    return None
