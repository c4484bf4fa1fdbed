"""Attention-grounded citations: the passages the model attended to while it answered.

The engine sums, per KV block, the attention mass every layer and head gave it during the
answer (app/engine/attention/blocks.py). Here those blocks, spans of prompt tokens, are mapped
through byte offsets to the pages of the prompt (qa/spans.py) and to the text they hold. Blocks
outside the documents (system prompt, question, the answer itself) are left out; the weights
are shares of the mass the documents received.
"""
from __future__ import annotations

from app.engine.backend import Backend
from app.qa.spans import PromptLayout

MAX_ATTENDED = 5
PASSAGE_CHARS = 300
_BLOCKS_CONSIDERED = 64


def attended_passages(backend: Backend, layout: PromptLayout) -> list[dict]:
    """[{"doc", "page", "text", "weight"}] of the pages the answer attended to most, over the
    document prefixes the cache holds (one, or several side by side)."""
    blocks = backend.attended_blocks(_BLOCKS_CONSIDERED)
    if not blocks:
        return []
    by_page: dict[tuple[int, int], dict] = {}
    total = 0.0
    for first, end, weight in blocks:
        seg = next((d for d in layout.documents if d.start <= first < d.end), None)
        if seg is None:
            continue
        prefix = seg.prefix
        lo, hi = seg.offsets[first - seg.start], seg.offsets[min(end, seg.end) - seg.start]
        best, overlap = None, 0
        for s, e, doc_id, page in seg.spans:
            o = min(hi, e) - max(lo, s)
            if o > overlap:
                best, overlap = (s, e, doc_id, page), o
        if best is None:
            continue
        s, e, doc_id, page = best
        total += weight
        entry = by_page.setdefault((doc_id, page), {"doc": doc_id, "page": page, "weight": 0.0,
                                                    "_best": -1.0, "text": ""})
        entry["weight"] += weight
        if weight > entry["_best"]:
            entry["_best"] = weight
            entry["text"] = _passage(prefix, max(lo, s), min(hi, e), s, e)
    out = sorted(by_page.values(), key=lambda x: -x["weight"])[:MAX_ATTENDED]
    for x in out:
        x.pop("_best")
        x["weight"] = round(x["weight"] / total, 4) if total else 0.0
    return out


def _passage(prefix: bytes, lo: int, hi: int, page_start: int, page_end: int) -> str:
    """The attended bytes widened to about PASSAGE_CHARS within the page, on word edges."""
    pad = max(0, (PASSAGE_CHARS - (hi - lo)) // 2)
    a, b = max(page_start, lo - pad), min(page_end, hi + pad)
    text = prefix[a:b].decode("utf-8", errors="ignore")
    words = text.split()
    if a > page_start and len(words) > 2:
        words = words[1:]
    if b < page_end and len(words) > 2:
        words = words[:-1]
    return " ".join(words)
