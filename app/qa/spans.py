"""Where the pages of a question's prompt lie: the byte span of each page's text inside a
document prefix (qa/prompt.py lays pages out with ``[Page N]`` markers) and the byte offset of
each cached token. Attention-grounded citations (qa/attended.py) map attended blocks to pages
through them; the focus (qa/focus.py) maps passages the other way, to token ranges. Both read
one ``PromptLayout``, worked out once per answer.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from app.qa.pages import ContextPlan

Segment = tuple[int, int, str, ContextPlan]   # (first token, token count, prefix text, plan)


@dataclass(frozen=True)
class LaidOut:
    """One document prefix in the cache, with pages: tokens [start, end) spell ``prefix``."""
    start: int
    end: int
    prefix: bytes
    offsets: list[int]                          # (end - start + 1,) byte offset where each token starts
    spans: list[tuple[int, int, int, int]]      # (start byte, end byte, doc_id, page) of each page's text


class PromptLayout:
    """The laid-out document prefixes of one answer's cache, computed on first use: one pass over
    the tokens of every prefix (tens of ms at 40K tokens) serves the focus before the answer and
    the attended passages after it."""

    def __init__(self, backend, segments: list[Segment]):
        self._backend, self.segments = backend, segments

    @cached_property
    def documents(self) -> list[LaidOut]:
        laid = []
        for start, count, text, plan in self.segments:
            prefix = text.encode("utf-8")
            spans = page_spans(prefix, plan)
            tokens = self._backend.cached_tokens(start, start + count) if spans else []
            if spans and len(tokens) == count:   # not when a cancelled reading left part of it
                laid.append(LaidOut(start, start + count, prefix,
                                    token_offsets(self._backend, tokens, prefix), spans))
        return laid


def page_spans(prefix: bytes, plan: ContextPlan) -> list[tuple[int, int, int, int]]:
    """(start, end, doc_id, page) byte spans of each page's text inside the prompt prefix,
    found by walking the page markers in the order format_pages wrote them."""
    spans, at = [], 0
    for p in plan.pages:
        marker = f"[Page {p.number}]\n".encode()
        i = prefix.find(marker, at)
        if i < 0:
            continue
        start = i + len(marker)
        spans.append([start, len(prefix), p.doc_id, p.number])
        if len(spans) > 1:
            spans[-2][1] = min(spans[-2][1], i)
        at = start
    return [tuple(s) for s in spans]


def token_offsets(backend, tokens: list[int], text: bytes) -> list[int]:
    """Byte offset in ``text`` where each token starts (len(tokens) + 1 entries). Tokens
    the text does not spell (a BOS added in front) map to offset 0."""
    ends, total = [0], 0
    for t in tokens:
        total += len(backend.token_bytes(t))
        ends.append(total)
    shift = max(0, total - len(text))
    return [max(0, e - shift) for e in ends]
