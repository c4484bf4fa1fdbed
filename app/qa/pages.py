"""Fitting document pages into a model's context, honestly.

A document that fits is given whole, with page markers. One that does not is
given as the pages most relevant to the request (BM25 over its chunks), in
document order, and the plan says so: nothing is silently truncated.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from app.store import Store

TEMPLATE_OVERHEAD = 48  # tokens of chat-template markup around the messages


@dataclass(frozen=True)
class PageText:
    doc_id: int
    title: str
    number: int
    text: str
    tokens: int


@dataclass
class ContextPlan:
    """Which pages went into the prompt and why."""

    pages: list[PageText] = field(default_factory=list)
    doc_tokens: int = 0  # tokens of all pages of the requested documents
    used_tokens: int = 0  # tokens of the pages in the prompt
    budget: int = 0
    total_pages: int = 0
    passages: bool = False   # the pages hold passages retrieval chose, not whole pages (qa/retrieval.py)

    @property
    def truncated(self) -> bool:
        return self.passages or len(self.pages) < self.total_pages

    @property
    def note(self) -> str:
        """Why not every page was read (the answer's own note says it of passages)."""
        if not self.truncated or self.passages:
            return ""
        return (f"The document{'s have' if len({p.doc_id for p in self.pages}) > 1 else ' has'} "
                f"{self.doc_tokens} tokens but the context holds {self.budget} for it: "
                f"answered from {len(self.pages)} of {self.total_pages} pages chosen by relevance "
                f"({page_ranges(self.pages)}).")

    def as_dict(self) -> dict:
        return {"doc_tokens": self.doc_tokens, "used_tokens": self.used_tokens, "budget": self.budget,
                "pages_used": [{"doc": p.doc_id, "page": p.number} for p in self.pages],
                "total_pages": self.total_pages, "truncated": self.truncated, "note": self.note}


def page_ranges(pages: list[PageText]) -> str:
    """'pages 1-3, 7 of Title' style, per document."""
    out = []
    by_doc: dict[int, list[PageText]] = {}
    for p in pages:
        by_doc.setdefault(p.doc_id, []).append(p)
    for doc_pages in by_doc.values():
        nums = sorted(p.number for p in doc_pages)
        spans, start, prev = [], nums[0], nums[0]
        for n in nums[1:] + [None]:
            if n is not None and n == prev + 1:
                prev = n
                continue
            spans.append(f"{start}-{prev}" if prev != start else f"{start}")
            if n is not None:
                start = prev = n
        out.append(f"pages {', '.join(spans)} of {doc_pages[0].title}")
    return "; ".join(out)


def token_counter(backend):
    """count(text) -> tokens of ``text`` for ``backend``'s tokenizer (no BOS, no special tokens)."""
    return lambda text: len(backend.tokenize(text, add_bos=False, special=False))


def format_pages(pages: list[PageText]) -> str:
    """Document text with page markers the model can cite."""
    parts, current = [], None
    for p in pages:
        if p.doc_id != current:
            current = p.doc_id
            parts.append(f"=== Document: {p.title} ===")
        parts.append(f"[Page {p.number}]\n{p.text.strip()}")
    return "\n\n".join(parts)


PAGE_MARKER_TOKENS = 8   # "[Page N]" and the blank lines around it


def load_pages(store: Store, doc_ids: list[int], count_tokens) -> list[PageText]:
    pages = []
    for doc_id in doc_ids:
        doc = store.document(doc_id)
        title = (doc or {}).get("title") or f"document {doc_id}"
        for row in store.pages(doc_id):
            pages.append(PageText(doc_id, title, row["number"], row["text"],
                                  count_tokens(row["text"]) + PAGE_MARKER_TOKENS))
    return pages


def plan_context(store: Store, pages: list[PageText], budget: int, relevance_text: str) -> ContextPlan:
    """Every page if they fit ``budget`` tokens, else the most relevant ones."""
    plan = ContextPlan(doc_tokens=sum(p.tokens for p in pages), budget=budget, total_pages=len(pages))
    if plan.doc_tokens <= budget:
        plan.pages = list(pages)
        plan.used_tokens = plan.doc_tokens
        return plan
    order: list[tuple[int, int]] = []
    doc_ids = sorted({p.doc_id for p in pages})
    for hit in store.search_chunks(doc_ids, relevance_text, limit=max(50, len(pages) * 4)):
        key = (hit["doc_id"], hit["page"])
        if key not in order:
            order.append(key)
    # The opening pages carry title and framing; then the rest in document order.
    firsts = [(d, min(p.number for p in pages if p.doc_id == d)) for d in doc_ids]
    rest = [(p.doc_id, p.number) for p in pages]
    ranked = [k for k in order] + [k for k in firsts if k not in order] + [k for k in rest]
    by_key = {(p.doc_id, p.number): p for p in pages}
    chosen, used = set(), 0
    for key in ranked:
        if key in chosen:
            continue
        p = by_key[key]
        if used + p.tokens <= budget:
            chosen.add(key)
            used += p.tokens
    plan.pages = [p for p in pages if (p.doc_id, p.number) in chosen]
    plan.used_tokens = used
    return plan
