"""Conversations in the store: a thread is about documents and holds its turns in order.

A turn is an answer (``answers``) whose ``thread_id`` is the thread's; the turns are ordered by
the answers' ids, the order they were asked in. ``Store.add_answer`` without a thread starts a
thread of one turn, so every answer belongs to one. Searching covers the titles and every turn's
question and answer (the answers' FTS5 index).
"""
from __future__ import annotations

import json

from app.store.db import Store, fts_query


def create_thread(store: Store, doc_ids: list[int], title: str = "", kind: str = "selected",
                  folder: str | None = None) -> int:
    """A new, empty thread about ``doc_ids`` (``kind``: "selected", "folder" or "everything")."""
    return store.add_thread(doc_ids, title, kind, folder)


def _thread_row(row: dict) -> dict:
    row["doc_ids"] = json.loads(row["doc_ids"]) if row["doc_ids"] else []
    return row


def get_thread(store: Store, thread_id: int) -> dict | None:
    """The thread's row with its number of turns (``turns``), or None."""
    rows = store.query("SELECT t.*, (SELECT COUNT(*) FROM answers a WHERE a.thread_id = t.id) AS turns "
                       "FROM threads t WHERE t.id = ?", [int(thread_id)])
    return _thread_row(rows[0]) if rows else None


def list_threads(store: Store, search: str = "", doc_id: int | None = None, limit: int = 200) -> list[dict]:
    """Threads, the most recently continued first, each with its number of turns (``turns``);
    only those about ``doc_id`` and/or whose title or turns match ``search``."""
    where, args = [], []
    if doc_id is not None:
        where.append("EXISTS (SELECT 1 FROM json_each(t.doc_ids) WHERE json_each.value = ?)")
        args.append(int(doc_id))
    if search.strip():
        q = fts_query(search)
        like = f"%{search.strip()}%"
        if q:
            where.append("(t.title LIKE ? OR t.id IN (SELECT a.thread_id FROM answers a WHERE a.id IN "
                         "(SELECT rowid FROM answers_fts WHERE answers_fts MATCH ?)))")
            args += [like, q]
        else:
            where.append("t.title LIKE ?")
            args.append(like)
    sql = ("SELECT t.*, (SELECT COUNT(*) FROM answers a WHERE a.thread_id = t.id) AS turns FROM threads t"
           + (" WHERE " + " AND ".join(where) if where else "")
           + f" ORDER BY t.updated_at DESC, t.id DESC LIMIT {int(limit)}")
    return [_thread_row(r) for r in store.query(sql, args)]


def thread_turns(store: Store, thread_id: int) -> list[dict]:
    """The thread's answers in the order they were asked (rows as ``Store.answers`` gives them)."""
    rows = store.query("SELECT * FROM answers WHERE thread_id = ? ORDER BY id", [int(thread_id)])
    for r in rows:
        for key in ("doc_ids", "citations", "timings"):
            r[key] = json.loads(r[key]) if r[key] else None
    return rows


def rename_thread(store: Store, thread_id: int, title: str) -> None:
    title = " ".join(title.split())
    if not title:
        raise ValueError("a thread's title cannot be empty")
    with store.transaction():
        store.conn.execute("UPDATE threads SET title = ? WHERE id = ?", [title, int(thread_id)])


def delete_thread(store: Store, thread_id: int) -> bool:
    """Delete the thread and its turns; False when there was no such thread."""
    with store.transaction():
        store.conn.execute("DELETE FROM answers WHERE thread_id = ?", [int(thread_id)])
        cur = store.conn.execute("DELETE FROM threads WHERE id = ?", [int(thread_id)])
    return cur.rowcount > 0


def answer_thread(store: Store, answer_id: int) -> int | None:
    """The thread an answer is a turn of."""
    rows = store.query("SELECT thread_id FROM answers WHERE id = ?", [int(answer_id)])
    return rows[0]["thread_id"] if rows else None
