"""Batches in the store: what a batch asks, the results it has, the documents that failed.

One writer: the driver of `ellm batch` (app/batch/driver.py) alone calls the writing functions,
so a batch's workers never open the store. A result's key is (batch, document, kind, question,
model, settings), unique in the table, and every result is written with INSERT OR IGNORE: a
document answered a second time (its worker was killed after answering and the task retried,
or the driver died before it heard back) leaves the row that was there. Resuming a batch is
asking the store which keys it has (``done_keys``) and sending only the rest.
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from app.store.db import Store, now


@dataclass(frozen=True)
class ResultRow:
    """One answer of a batch, as the driver writes it."""

    doc_id: int
    kind: str            # "ask" | "summary"
    question: str        # the question; "" for a summary
    model: str           # the model's file name
    settings: str        # the settings' key (app/batch/spec.py)
    answer: str
    citations: list      # [{"doc", "page", "text"}]
    engine: str = ""
    worker: str = ""     # which worker answered (host:pid), for the record
    timings: dict | None = None


def open_batch(store: Store, batch_id: str, spec: dict, documents: int, tasks: int) -> bool:
    """Register the batch (or note that it runs again); True when it is new."""
    stamp = now()
    with store.transaction():
        cur = store.conn.execute(
            "INSERT OR IGNORE INTO batches (id, spec, documents, tasks, created_at, updated_at)"
            " VALUES (?, ?, ?, ?, ?, ?)", [batch_id, json.dumps(spec, sort_keys=True), documents, tasks, stamp, stamp])
        if cur.rowcount == 0:
            store.conn.execute("UPDATE batches SET documents = ?, tasks = ?, updated_at = ? WHERE id = ?",
                               [documents, tasks, stamp, batch_id])
    return cur.rowcount == 1


def batch(store: Store, batch_id: str) -> dict | None:
    rows = store.query("SELECT * FROM batches WHERE id = ?", [batch_id])
    if not rows:
        return None
    return {**rows[0], "spec": json.loads(rows[0]["spec"])}


def batches(store: Store) -> list[dict]:
    """Every batch, newest first, with how many results and failures it has."""
    return store.query(
        "SELECT b.id, b.documents, b.tasks, b.created_at, b.updated_at,"
        " (SELECT COUNT(*) FROM batch_results r WHERE r.batch_id = b.id) AS results,"
        " (SELECT COUNT(*) FROM batch_failures f WHERE f.batch_id = b.id) AS failures"
        " FROM batches b ORDER BY b.updated_at DESC, b.id")


def done_keys(store: Store, batch_id: str, model: str, settings: str) -> set[tuple[int, str, str]]:
    """(doc_id, kind, question) of every result the batch has for this model and settings."""
    rows = store.query("SELECT doc_id, kind, question FROM batch_results WHERE batch_id = ? AND model = ? "
                       "AND settings = ?", [batch_id, model, settings])
    return {(r["doc_id"], r["kind"], r["question"]) for r in rows}


def add_results(store: Store, batch_id: str, rows: list[ResultRow], doc_id: int | None = None) -> int:
    """Write ``rows`` in one transaction, each only if its key is new; returns how many were
    new. With ``doc_id`` the document's failure, if one was recorded, is cleared: it is done."""
    stamp = now()
    with store.transaction():
        before = store.conn.total_changes
        store.conn.executemany(
            "INSERT OR IGNORE INTO batch_results (batch_id, doc_id, kind, question, model, settings, answer,"
            " citations, engine, worker, timings, created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(batch_id, r.doc_id, r.kind, r.question, r.model, r.settings, r.answer, json.dumps(r.citations),
              r.engine, r.worker, json.dumps(r.timings or {}), stamp) for r in rows])
        added = store.conn.total_changes - before
        if doc_id is not None:
            store.conn.execute("DELETE FROM batch_failures WHERE batch_id = ? AND doc_id = ?", [batch_id, doc_id])
    return added


def record_failure(store: Store, batch_id: str, doc_id: int, reason: str) -> None:
    """The document failed (its reason kept); a later run that fails it again counts the attempt."""
    with store.transaction():
        store.conn.execute(
            "INSERT INTO batch_failures (batch_id, doc_id, reason, attempts, failed_at) VALUES (?, ?, ?, 1, ?)"
            " ON CONFLICT (batch_id, doc_id) DO UPDATE SET reason = excluded.reason,"
            " attempts = attempts + 1, failed_at = excluded.failed_at",
            [batch_id, doc_id, reason, now()])


def failures(store: Store, batch_id: str) -> list[dict]:
    return store.query("SELECT doc_id, reason, attempts, failed_at FROM batch_failures WHERE batch_id = ? "
                       "ORDER BY doc_id", [batch_id])


def results(store: Store, batch_id: str) -> list[dict]:
    """The batch's results in document and then writing order, with each document's title and
    path; citations and timings decoded."""
    rows = store.query(
        "SELECT r.*, d.title, d.path FROM batch_results r LEFT JOIN documents d ON d.id = r.doc_id"
        " WHERE r.batch_id = ? ORDER BY r.doc_id, r.id", [batch_id])
    for r in rows:
        r["citations"] = json.loads(r["citations"]) if r["citations"] else []
        r["timings"] = json.loads(r["timings"]) if r["timings"] else {}
    return rows
