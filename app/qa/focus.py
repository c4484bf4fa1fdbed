"""The passages a question's answer reads whatever its attention chooses: the store's own
relevance ranking (BM25 over the documents' ~800-character chunks, FTS5) points sparse
attention at the best-matching passages, so reading the whole document never leaves out what
the retrieval the usual document apps answer from would have read.

Why: with sparse attention over a read document, the question's votes choose the blocks an
answer reads (app/engine/attention/votes.py), and beyond the model's trained window the document
itself was read sparsely too. There, on two Debian manuals of 42K and 46K tokens, the answers were
right 17 of 23 times with these passages read and 12 of 23 without (README, "Sparse attention").
The engine reads the focus blocks besides its top K, in every layer and head (``Backend.focus``);
dense attention reads everything and needs none.
"""
from __future__ import annotations

from bisect import bisect_left, bisect_right

from app.engine.backend import Backend
from app.qa.spans import Segment, page_spans, token_offsets
from app.store import Store

FOCUS_CHUNKS = 4   # passages (~200 tokens each) read besides the blocks attention chooses


def focus_ranges(store: Store, backend: Backend, question: str, segments: list[Segment],
                 chunks: int | None = None) -> list[tuple[int, int]]:
    """Token ranges [start, end) of the cache holding the ``chunks`` (default FOCUS_CHUNKS)
    passages of the segments' documents that rank highest for ``question``: segments = (first
    token, token count, prefix text, plan) of each document prefix the cache holds."""
    chunks = FOCUS_CHUNKS if chunks is None else chunks
    laid = []       # (first token, token byte offsets, prefix bytes, {(doc, page): byte span})
    doc_ids: list[int] = []
    for start, count, text, plan in segments:
        prefix = text.encode("utf-8")
        spans = {(d, p): (s, e) for s, e, d, p in page_spans(prefix, plan)}
        if spans:
            offsets = token_offsets(backend, backend.cached_tokens(start, start + count), prefix)
            laid.append((start, offsets, prefix, spans))
            doc_ids += sorted({d for d, _ in spans} - set(doc_ids))
    if not chunks or not laid:
        return []
    ranges = []
    for hit in store.search_chunks(doc_ids, question, limit=4 * chunks):
        found = _locate(hit, laid)
        if found is not None and found not in ranges:
            ranges.append(found)
            if len(ranges) == chunks:
                break
    return ranges


def _locate(hit: dict, laid) -> tuple[int, int] | None:
    """The cached tokens spelling chunk ``hit``, if its page is in the prompt."""
    needle = hit["text"].strip().encode("utf-8")
    for start, offsets, prefix, spans in laid:
        span = spans.get((hit["doc_id"], hit["page"]))
        if span is None or not needle:
            continue
        at = prefix.find(needle, span[0], span[1])
        if at < 0:
            return None
        first = max(0, bisect_right(offsets, at) - 1)
        end = bisect_left(offsets, at + len(needle))
        return start + first, start + min(end, len(offsets) - 1)
    return None
