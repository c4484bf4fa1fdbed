"""What a person browses of earlier questions: conversations (threads) and their turns,
searchable. A thread is about one document, several, a folder or everything
(store/threads.py); an answer asked across several documents is listed under each of them.

A thin, Qt-free layer over the store (FTS5 over questions and answers) that the window and
any other front end share.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from app.qa.targets import EVERYTHING, FOLDER, AskTarget, detail, heading, short_path
from app.store import Store
from app.store.threads import get_thread, list_threads, thread_turns


@dataclass(frozen=True)
class PastAnswer:
    """One stored answer: a turn of a thread."""

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
    thread_id: int | None = None

    @classmethod
    def from_row(cls, row: dict) -> PastAnswer:
        return cls(id=row["id"], question=row["question"], answer=row["answer"],
                   citations=row.get("citations") or [], timings=row.get("timings") or {},
                   doc_ids=row.get("doc_ids") or [], created_at=row.get("created_at") or "",
                   model=row.get("model") or "", engine=row.get("engine") or "",
                   attended=row.get("attended") or [], thread_id=row.get("thread_id"))

    def label(self) -> str:
        """One line for a list: when, the question, and how many documents when several."""
        across = f"  ({len(self.doc_ids)} documents)" if len(self.doc_ids) > 1 else ""
        return f"{when(self.created_at)}  {self.question}{across}"


@dataclass(frozen=True)
class ThreadSummary:
    """A conversation as a list shows it: its title, turns, documents and when it was last continued."""

    id: int
    title: str
    kind: str
    doc_ids: tuple[int, ...]
    folder: str | None
    turns: int
    created_at: str
    updated_at: str

    @classmethod
    def from_row(cls, row: dict) -> ThreadSummary:
        return cls(id=row["id"], title=row["title"], kind=row.get("kind") or "selected",
                   doc_ids=tuple(row.get("doc_ids") or ()), folder=row.get("folder"),
                   turns=int(row.get("turns") or 0), created_at=row.get("created_at") or "",
                   updated_at=row.get("updated_at") or "")

    def label(self) -> str:
        """Two lines for a list: the title; the turns, when, and what it is about when not one document."""
        about = ""
        if self.kind == FOLDER and self.folder:
            about = f" · {short_path(self.folder)}"
        elif self.kind == EVERYTHING:
            about = " · everything"
        elif len(self.doc_ids) > 1:
            about = f" · {len(self.doc_ids)} documents"
        turns = f"{self.turns} turn" + ("" if self.turns == 1 else "s")
        return f"{self.title}\n{turns} · {when(self.updated_at)}{about}"


def when(stamp: str) -> str:
    """A stored UTC time as local "YYYY-MM-DD HH:MM" ("" when there is none)."""
    if not stamp:
        return ""
    try:
        return datetime.fromisoformat(stamp).astimezone().strftime("%Y-%m-%d %H:%M")
    except ValueError:
        return stamp[:16].replace("T", " ")


# ---- Threads -------------------------------------------------------------------------


def threads(store: Store, doc_id: int | None = None, search: str = "", limit: int = 200) -> list[ThreadSummary]:
    """Threads, the most recently continued first; about ``doc_id`` (None: all) and matching
    ``search`` in their titles or any turn's question or answer."""
    return [ThreadSummary.from_row(r) for r in list_threads(store, search.strip(), doc_id, limit)]


def thread(store: Store, thread_id: int) -> ThreadSummary | None:
    row = get_thread(store, thread_id)
    return ThreadSummary.from_row(row) if row else None


def turns(store: Store, thread_id: int) -> list[PastAnswer]:
    """The thread's answers in the order they were asked."""
    return [PastAnswer.from_row(r) for r in thread_turns(store, thread_id)]


def latest_thread(store: Store) -> ThreadSummary | None:
    """The most recently continued thread with at least one turn."""
    return next((t for t in threads(store, limit=20) if t.turns), None)


def same_documents(summary: ThreadSummary, doc_ids) -> bool:
    return bool(summary.doc_ids) and set(summary.doc_ids) == set(doc_ids)


def thread_target(summary: ThreadSummary, titles: dict[int, str]) -> AskTarget:
    """What a follow-up in the thread is asked about: its documents still in the library
    (``titles``), with a heading that says so, or why nothing can be asked."""
    ids = tuple(i for i in summary.doc_ids if i in titles)
    if not ids:
        return AskTarget(summary.kind, (), "The documents of this conversation are no longer in the library",
                         folder=summary.folder, problem="the documents of this conversation were removed")
    return AskTarget(summary.kind, ids, heading(summary.kind, ids, titles, summary.folder), detail(ids, titles),
                     summary.folder)


# ---- Single answers --------------------------------------------------------------------


def history(store: Store, doc_id: int, search: str = "", limit: int = 100) -> list[PastAnswer]:
    """Answers about ``doc_id``, newest first; only those matching ``search`` when given."""
    return [PastAnswer.from_row(r) for r in store.answers(doc_id=doc_id, search=search.strip() or None,
                                                          limit=limit)]


def latest(store: Store) -> PastAnswer | None:
    """The most recent answer about any document."""
    rows = store.answers(limit=1)
    return PastAnswer.from_row(rows[0]) if rows else None
