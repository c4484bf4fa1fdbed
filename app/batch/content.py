"""A document travelling to a worker by content: its text and page offsets from the store,
never a path the worker may not see.

On the worker the content becomes a store of its own in memory, with the document under the
driver's id, so the answer service (app/qa/answer.py) reads pages, searches passages and
cites pages exactly as it does against the data directory's store, and its citations name
the driver's document ids.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.store import Store


@dataclass(frozen=True)
class DocumentContent:
    doc_id: int
    title: str
    path: str                                       # a label only: the worker never opens it
    pages: tuple[tuple[int, int, str], ...]         # (number, start offset, text)
    chunks: tuple[tuple[int, int, int, str], ...]   # (page, start, end, text): the searchable passages

    @classmethod
    def from_store(cls, store: Store, doc_id: int) -> "DocumentContent":
        doc = store.document(doc_id)
        if doc is None:
            raise KeyError(f"no document with id {doc_id} in {store.path}")
        pages = tuple((r["number"], r["start"], r["text"]) for r in store.pages(doc_id))
        chunks = tuple((r["page"], r["start"], r["end"], r["text"]) for r in store.query(
            "SELECT page, start, end, text FROM chunks WHERE doc_id = ? ORDER BY id", [doc_id]))
        return cls(doc_id, doc["title"] or "", doc["path"], pages, chunks)

    @property
    def chars(self) -> int:
        return sum(len(t) for _, _, t in self.pages)

    def into_store(self) -> Store:
        """A store in memory that holds only this document, under its own id."""
        store = Store(":memory:")
        store.save_document({"id": self.doc_id, "path": self.path, "title": self.title, "status": "ingested",
                             "pages": len(self.pages)}, list(self.pages), list(self.chunks))
        return store
