"""The answer history a person browses: past questions per document, searchable.
An answer asked across several documents is stored once and listed under each of them.

A thin, Qt-free layer over ``Store.answers`` (FTS5 over questions and answers)
that the window and any other front end share.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from app.store import Store


@dataclass(frozen=True)
class PastAnswer:
    id: int
    question: str
    answer: str
    citations: list[dict]
    timings: dict
    doc_ids: list[int]
    created_at: str
    model: str = ""
    engine: str = ""
    attended: list[dict] = field(default_factory=list)  # attention-grounded passages, when the engine gave them

    @classmethod
    def from_row(cls, row: dict) -> PastAnswer:
        return cls(id=row["id"], question=row["question"], answer=row["answer"],
                   citations=row.get("citations") or [], timings=row.get("timings") or {},
                   doc_ids=row.get("doc_ids") or [], created_at=row.get("created_at") or "",
                   model=row.get("model") or "", engine=row.get("engine") or "",
                   attended=row.get("attended") or [])

    def label(self) -> str:
        """One line for a list: when, the question, and how many documents when several."""
        when = self.created_at[:16].replace("T", " ")
        across = f"  ({len(self.doc_ids)} documents)" if len(self.doc_ids) > 1 else ""
        return f"{when}  {self.question}{across}"


def history(store: Store, doc_id: int, search: str = "", limit: int = 100) -> list[PastAnswer]:
    """Answers about ``doc_id``, newest first; only those matching ``search`` when given."""
    return [PastAnswer.from_row(r) for r in store.answers(doc_id=doc_id, search=search.strip() or None,
                                                          limit=limit)]


def latest(store: Store) -> PastAnswer | None:
    """The most recent answer about any document."""
    rows = store.answers(limit=1)
    return PastAnswer.from_row(rows[0]) if rows else None
