"""Scoring one answer of the question set: is it right, does it point at the right page, did
it read the whole document.

* right: one of the accepted phrases occurs in the answer, both normalised the same way
  (Unicode NFKC, case folded, runs of whitespace made one space), so "DPKG  -i" matches "dpkg -i";
* cited: a page the answer cites (``Answer.citations``) or attended to (``Answer.attended``,
  blocked cache only) is the answer's page or its neighbour: a fact printed at the foot of a
  page is often read as the head of the next;
* whole: the answer's context held every page of the document, not a relevance selection
  (``ContextPlan``).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass

from app.qa.answer import Answer

PAGE_SLACK = 1   # a cited page this far from the answer's page still counts


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


def answer_right(text: str, phrases) -> bool:
    said = normalise(text)
    return any(normalise(p) in said for p in phrases if normalise(p))


def pointed_pages(result: Answer, doc_id: int) -> tuple[list[int], list[int]]:
    """The pages of ``doc_id`` the answer cites and those it attended to, in order, each once."""
    cited = list(dict.fromkeys(c["page"] for c in result.citations if c.get("doc") == doc_id))
    attended = list(dict.fromkeys(a["page"] for a in result.attended if a.get("doc") == doc_id))
    return cited, attended


def citation_right(result: Answer, doc_id: int, page: int) -> bool:
    cited, attended = pointed_pages(result, doc_id)
    return any(abs(p - page) <= PAGE_SLACK for p in cited + attended)


def read_whole(result: Answer, doc_id: int) -> bool:
    """Every page of the document was in the answer's context."""
    plan = result.plan
    used = {p.number for p in plan.pages if p.doc_id == doc_id}
    return plan.total_pages > 0 and not plan.truncated and len(used) == plan.total_pages


@dataclass(frozen=True)
class Score:
    right: bool
    cited: bool
    whole: bool
    cited_pages: list[int]
    attended_pages: list[int]


def score(result: Answer, doc_id: int, phrases, page: int) -> Score:
    cited, attended = pointed_pages(result, doc_id)
    return Score(right=answer_right(result.answer, phrases), cited=citation_right(result, doc_id, page),
                 whole=read_whole(result, doc_id), cited_pages=cited, attended_pages=attended)
