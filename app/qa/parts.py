"""A question that asks two things, answered as two turns of one conversation.

"Which command submits a bug report about ESS, and which R function generates one for R
itself?" asks two questions whose answers often stand pages apart. Asked at once, the model
must find both facts in one answer; asked one after the other in the same conversation, each
turn has its own focus passages (qa/focus.py) and the second still sees the first turn (its
"them" or "it" keeps its meaning). This is the decomposition of least-to-most prompting (Zhou
et al. 2023, "Least-to-Most Prompting Enables Complex Reasoning in Large Language Models"), with
the parts found by the question's own grammar rather than by the model: a comma or semicolon,
"and" and a second question word, or a second question after a question mark. Whether it
answers more is measured, not assumed: the answer service asks in parts only where
``AnswerOptions.parts`` says so (docs/benchmarks.md, the eval's ``parts`` mode).

Only that is split: "which X and Y does Z need" (one question about two things), "how many ...,
and is it ..." (no question word after "and"), "the file is ..., and which ..." (the first piece
asks nothing) and a comma inside quotation marks stay whole.
"""
from __future__ import annotations

import re

MAX_PARTS = 3      # more pieces than this are more likely a list than separate questions
MIN_WORDS = 3      # a piece shorter than this is not a question of its own
_WH = r"(?:which|what|where|when|who|whom|whose|how|why)"
_AUX = r"(?:is|are|was|were|do|does|did|can|could|should|must|may|will|would)"
# words that may stand between "and" and the question word: "and in which file", "and at most how many"
_LEAD = r"(?:(?:in|into|on|at|from|to|for|with|by|under|of|most|least|roughly|about|approximately)\s+){0,3}"
# where a second question begins: ", and which ...", "; and in which ...", "...? What ..."
_BREAK = re.compile(rf"(?:[,;]\s+and\s+(?={_LEAD}{_WH}\b)|\?\s+(?={_LEAD}{_WH}\b))", re.IGNORECASE)
# a piece that asks: a question word in it, or an auxiliary first (after a phrase and a comma at most)
_ASKS = re.compile(rf"\b{_WH}\b|^(?:[^,]*,\s*)?{_AUX}\b", re.IGNORECASE)
_QUOTES = ('"', "`", "\u201c")


def question_parts(question: str) -> list[str]:
    """The questions ``question`` asks, each as it is asked in its own turn: the first as a
    question of its own, the later ones opening with "And"; ``[question]`` as it is when it
    asks one thing."""
    text = " ".join(question.split())
    pieces, start = [], 0
    for found in _BREAK.finditer(text):
        if any(text[:found.start()].count(q) % 2 for q in _QUOTES):
            continue          # inside a quotation: "what does 'cut, and which fields' mean"
        pieces.append(text[start:found.start()])
        start = found.end()
    pieces.append(text[start:])
    if not 2 <= len(pieces) <= MAX_PARTS:
        return [question]
    if any(len(p.split()) < MIN_WORDS or not _ASKS.search(p) for p in pieces):
        return [question]
    return [_as_question(pieces[0])] + [_as_question("And " + p[0].lower() + p[1:]) for p in pieces[1:]]


def _as_question(text: str) -> str:
    text = text.strip().rstrip(",;")
    return text if text.endswith("?") else text.rstrip(".") + "?"


__all__ = ["question_parts"]
