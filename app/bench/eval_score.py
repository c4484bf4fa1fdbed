"""Scoring one answer of the question set: is it right, does it point at the right pages, did
it read the whole document.

* right, strictly: every part of the question has one of its accepted phrases in the answer
  (a single-page question has one part), and the answer names none of the question's ``wrong``
  candidates (an answer listing several candidates is not an answer); phrases compared
  normalised the same way (Unicode NFKC, case folded, runs of whitespace made one space), so
  "DPKG  -i" matches "dpkg -i"; the answer's page citations ("[p. 15]") are not read, and a
  number must stand alone ("150" does not answer "15");
* cited: for every page of the question, a page the answer cites (``Answer.citations``) or
  attended to (``Answer.attended``, blocked cache only) is that page or its neighbour: a fact
  printed at the foot of a page is often read as the head of the next;
* whole: the answer's context held every page of the document, not a relevance selection
  (``ContextPlan``).
"""
from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:   # the scorer reads answers; importing the answer service would load the engine
    from app.qa.answer import Answer

PAGE_SLACK = 1   # a cited page this far from the answer's page still counts


def normalise(text: str) -> str:
    return re.sub(r"\s+", " ", unicodedata.normalize("NFKC", text).casefold()).strip()


_CITATION = re.compile(r"\[(?:p|pp|page|pages)\.?\s*[\d\s,–-]*\]", re.IGNORECASE)
_NUMBER = re.compile(r"[\d.,]+")


def answer_right(text: str, phrases) -> bool:
    """One of ``phrases`` occurs in ``text`` (normalised), not counting its page citations
    ("[p. 15]" does not answer "15"); a number must stand alone ("150" and "2015" are not "15")."""
    said = normalise(_CITATION.sub(" ", text))
    return any(_occurs(normalise(p), said) for p in phrases if normalise(p))


def _occurs(phrase: str, said: str) -> bool:
    if not _NUMBER.fullmatch(phrase):
        return phrase in said
    return re.search(rf"(?<![\d.]){re.escape(phrase)}(?!\.?\d)", said) is not None


def strictly_right(text: str, parts, wrong=()) -> bool:
    """Every part answered and no wrong candidate named."""
    return all(answer_right(text, part) for part in parts) and not answer_right(text, wrong)


def pointed_pages(result: Answer, doc_id: int) -> tuple[list[int], list[int]]:
    """The pages of ``doc_id`` the answer cites and those it attended to, in order, each once."""
    cited = list(dict.fromkeys(c["page"] for c in result.citations if c.get("doc") == doc_id))
    attended = list(dict.fromkeys(a["page"] for a in result.attended if a.get("doc") == doc_id))
    return cited, attended


def citation_right(result: Answer, doc_id: int, pages) -> bool:
    """Every page of ``pages`` (or the one page) pointed at, give or take PAGE_SLACK."""
    cited, attended = pointed_pages(result, doc_id)
    wanted = [pages] if isinstance(pages, int) else list(pages)
    return all(any(abs(p - page) <= PAGE_SLACK for p in cited + attended) for page in wanted)


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


def score(result: Answer, doc_id: int, question) -> Score:
    """The score of ``result`` for ``question`` (an EvalQuestion) about ``doc_id``."""
    cited, attended = pointed_pages(result, doc_id)
    return Score(right=strictly_right(result.answer, question.parts, question.wrong),
                 cited=citation_right(result, doc_id, question.pages),
                 whole=read_whole(result, doc_id), cited_pages=cited, attended_pages=attended)
