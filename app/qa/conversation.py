"""A conversation's turns after the documents: follow-up questions that see the earlier ones.

A thread (store/threads.py) is a list of turns. Its next question is asked with the earlier
turns laid after the documents' prefix, as the chat template writes a conversation::

    header + pages [+ passages beside]       the documents' prefix: cached once (qa/doc_cache.py)
    question 1, end of turn, answer 1        the first turn, as a single question is asked
    end of turn, question 2, ...             each later turn (``next_turn``)
    end of turn, this question               and the question asked now

so the prefix of every turn is the whole of the previous turn: while the backend still holds
it, a follow-up prefills only its own tokens (``Conversation.held``, the exact tokens of the
last prompt and its answer as they were generated; the engine keeps what its cache shares
with a prompt). After a restart the documents' prefix comes back from its file and only the
turns are read again (answers retokenized from their text). When the turns outgrow the
context, the oldest are left out, and the answer says how many.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

from app.qa.prompt import QUESTION_LEAD, SYSTEM_PROMPT, question_suffix

_DOCS, _QUESTION, _ANSWER, _NEXT = "\u27e6d\u27e7", "\u27e6q\u27e7", "\u27e6a\u27e7", "\u27e6n\u27e7"
RECALL_QUESTIONS = 1    # earlier questions whose words join the retrieval query of a follow-up


@dataclass(frozen=True)
class Turn:
    """One question and its answer; ``tokens``: the answer's ids as generated, while the
    conversation that made them lives (retokenized from the text otherwise)."""

    question: str
    answer: str
    tokens: tuple[int, ...] | None = None


@dataclass
class Conversation:
    """The turns of a thread so far, and what the backend computed of the last one.

    thread_id  the store's thread the answers are saved to (None: not saved)
    held       the tokens of the last prompt and its answer, as the backend holds them
    base       how many of ``held`` are the documents' part (prefix and passages beside): a
               follow-up continues ``held`` only while the backend still holds that part"""

    thread_id: int | None = None
    turns: list[Turn] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    base: int = 0

    @classmethod
    def from_rows(cls, thread_id: int | None, rows: Sequence[dict]) -> "Conversation":
        """A stored thread's turns (store/threads.py ``thread_turns``), nothing held yet."""
        return cls(thread_id, [Turn(r["question"], r["answer"]) for r in rows if r.get("answer")])

    def query(self, question: str) -> str:
        """What retrieval looks for: the question, with the last earlier question's words (a
        follow-up such as "and on Windows?" names little of what it is about)."""
        earlier = [t.question for t in self.turns[-RECALL_QUESTIONS:]] if RECALL_QUESTIONS else []
        return " ".join([*earlier, question])

    def continues(self, backend, base: Sequence[int]) -> bool:
        """Whether the next prompt can continue ``held``: it starts with the same documents'
        part ``base`` and the backend still holds that part."""
        n = self.base
        return (bool(self.held) and n >= len(base) and self.held[:len(base)] == list(base)
                and backend.cached_tokens(0, n) == self.held[:n])

    def tokens_after(self, backend, question: str, beside: str, room: int,
                     continuing: bool) -> tuple[list[int], int, int]:
        """The tokens after the documents' part: the earlier turns that fit ``room`` tokens (the
        newest kept), then ``question``; how many earlier turns were left out; and how many of
        the tokens are the new turn (0 when no earlier turn is kept: the question is the first).
        With ``continuing``, the turns are ``held`` as the backend computed them."""
        ask = next_turn(backend, question)
        if continuing and len(self.held) - self.base + len(ask) <= room:
            return self.held[self.base:] + ask, 0, len(ask)
        kept: list[tuple[list[int], list[int], list[int]]] = []   # (as the first turn, as a later one, answer)
        later = 0                 # tokens of the turns after the first kept one, each opened by next_turn
        for turn in reversed(self.turns):
            answer = list(turn.tokens) if turn.tokens is not None else backend.tokenize(turn.answer, add_bos=False,
                                                                                        special=False)
            first = question_suffix(backend, turn.question, beside)
            if len(first) + len(answer) + later + len(ask) > room:
                break
            opened = next_turn(backend, turn.question)
            kept.append((first, opened, answer))
            later += len(opened) + len(answer)
        if not kept:
            return question_suffix(backend, question, beside), len(self.turns), 0
        kept.reverse()
        first, _, answer = kept[0]
        tokens = first + answer + [t for _, opened, answer in kept[1:] for t in opened + answer]
        return tokens + ask, len(self.turns) - len(kept), len(ask)

    def record(self, question: str, answer: str, prompt: Sequence[int], generated: Sequence[int],
               base: int, as_generated: bool = True) -> None:
        """Add the turn just answered; the backend holds ``prompt`` and the ``generated`` ids,
        which are the turn's answer ``as_generated`` (not where the question was asked in parts,
        qa/parts.py: the answer is then the text of all of them, retokenized when needed)."""
        self.turns.append(Turn(question, answer, tuple(generated) if as_generated else None))
        self.held = [int(t) for t in prompt] + [int(t) for t in generated]
        self.base = base


def next_turn(backend, question: str) -> list[int]:
    """The tokens that end the previous answer's turn and ask ``question`` in a new user turn,
    up to where the assistant's answer begins: the chat template's own markup."""
    rendered = backend.apply_chat_template([
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{_DOCS}{QUESTION_LEAD}{_QUESTION}"},
        {"role": "assistant", "content": _ANSWER},
        {"role": "user", "content": _NEXT},
    ])
    after = rendered[rendered.index(_ANSWER) + len(_ANSWER):]
    return backend.tokenize(after.replace(_NEXT, question), add_bos=False, special=True)
