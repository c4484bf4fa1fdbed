"""Schema versions of the store, one numbered upgrade function each.

``PRAGMA user_version`` holds the version a file is at; ``upgrade`` runs every
newer function in order inside one transaction, so a failed upgrade leaves the
file exactly as it was (the calibre ``schema_upgrades.py`` pattern).
"""
from __future__ import annotations

import sqlite3
from typing import Callable


def _script(conn: sqlite3.Connection, sql: str) -> None:
    """Run statements one by one: ``executescript`` would COMMIT the open
    transaction first and break the all-or-nothing upgrade."""
    statement = ""
    for line in sql.splitlines(keepends=True):
        statement += line
        if sqlite3.complete_statement(statement):
            conn.execute(statement)
            statement = ""
    if statement.strip():
        raise ValueError(f"incomplete SQL statement in migration: {statement!r}")


def _v1_documents(conn: sqlite3.Connection) -> None:
    """Documents, their pages and searchable chunks; settings."""
    _script(conn, 
        """
        CREATE TABLE documents (
            id INTEGER PRIMARY KEY,
            path TEXT NOT NULL UNIQUE,
            folder TEXT,
            content_hash TEXT,
            size INTEGER,
            mtime REAL,
            format TEXT,
            title TEXT,
            author TEXT,
            pages INTEGER NOT NULL DEFAULT 0,
            tokens INTEGER NOT NULL DEFAULT 0,
            status TEXT NOT NULL,
            error TEXT,
            ingested_at TEXT,
            updated_at TEXT
        );
        CREATE TABLE pages (
            doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            number INTEGER NOT NULL,
            start INTEGER NOT NULL,
            text TEXT NOT NULL,
            PRIMARY KEY (doc_id, number)
        );
        CREATE TABLE chunks (
            id INTEGER PRIMARY KEY,
            doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            page INTEGER NOT NULL,
            start INTEGER NOT NULL,
            end INTEGER NOT NULL,
            text TEXT NOT NULL
        );
        CREATE INDEX chunks_doc ON chunks(doc_id, page);
        CREATE VIRTUAL TABLE chunks_fts USING fts5(text, content='chunks', content_rowid='id');
        CREATE TRIGGER chunks_ai AFTER INSERT ON chunks BEGIN
            INSERT INTO chunks_fts(rowid, text) VALUES (new.id, new.text);
        END;
        CREATE TRIGGER chunks_ad AFTER DELETE ON chunks BEGIN
            INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES ('delete', old.id, old.text);
        END;
        CREATE TABLE settings (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        );
        """
    )


def _v2_answers(conn: sqlite3.Connection) -> None:
    """Answers with citations and timings, and summaries."""
    _script(conn, 
        """
        CREATE TABLE answers (
            id INTEGER PRIMARY KEY,
            doc_ids TEXT NOT NULL,
            question TEXT NOT NULL,
            answer TEXT NOT NULL,
            citations TEXT NOT NULL,
            model TEXT,
            engine TEXT,
            timings TEXT,
            created_at TEXT NOT NULL
        );
        CREATE TABLE summaries (
            id INTEGER PRIMARY KEY,
            doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            summary TEXT NOT NULL,
            model TEXT,
            engine TEXT,
            method TEXT,
            created_at TEXT NOT NULL
        );
        """
    )


def _v3_history_and_folders(conn: sqlite3.Connection) -> None:
    """Searchable answer history (per document) and the folders a person opened."""
    _script(conn, 
        """
        CREATE TABLE answer_docs (
            answer_id INTEGER NOT NULL REFERENCES answers(id) ON DELETE CASCADE,
            doc_id INTEGER NOT NULL,
            PRIMARY KEY (answer_id, doc_id)
        );
        INSERT INTO answer_docs(answer_id, doc_id)
            SELECT answers.id, json_each.value FROM answers, json_each(answers.doc_ids);
        CREATE VIRTUAL TABLE answers_fts USING fts5(question, answer, content='answers', content_rowid='id');
        INSERT INTO answers_fts(rowid, question, answer) SELECT id, question, answer FROM answers;
        CREATE TRIGGER answers_ai AFTER INSERT ON answers BEGIN
            INSERT INTO answers_fts(rowid, question, answer) VALUES (new.id, new.question, new.answer);
        END;
        CREATE TRIGGER answers_ad AFTER DELETE ON answers BEGIN
            INSERT INTO answers_fts(answers_fts, rowid, question, answer)
                VALUES ('delete', old.id, old.question, old.answer);
        END;
        CREATE TABLE folders (
            path TEXT PRIMARY KEY,
            added_at TEXT NOT NULL
        );
        INSERT OR IGNORE INTO folders(path, added_at)
            SELECT DISTINCT folder, COALESCE(ingested_at, '') FROM documents WHERE folder IS NOT NULL;
        """
    )


def _v4_kv_caches(conn: sqlite3.Connection) -> None:
    """Registry of persisted KV caches: one file per (document, cache key); the key covers the
    model, the KV settings and the exact prefix tokens, so any change means another key."""
    _script(conn,
        """
        CREATE TABLE kv_caches (
            doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            cache_key TEXT NOT NULL,
            path TEXT NOT NULL,
            model TEXT NOT NULL,
            kv TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            bytes INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            used_at TEXT NOT NULL,
            PRIMARY KEY (doc_id, cache_key)
        );
        """
    )


def _v5_summary_keys(conn: sqlite3.Connection) -> None:
    """A summary remembers what made it (document text, model, settings: qa/summarize.py
    ``summary_key``), so exporting it again in another format reuses it."""
    _script(conn,
        """
        ALTER TABLE summaries ADD COLUMN settings_key TEXT;
        CREATE INDEX summaries_by_key ON summaries(doc_id, settings_key);
        """
    )


def _v6_batches(conn: sqlite3.Connection) -> None:
    """Batches (`ellm batch`): one row per batch, one result per (batch, document, task, model,
    settings) and the documents that failed. The unique key is what makes a batch resumable:
    the driver writes with INSERT OR IGNORE, so a document answered twice (a worker retried
    after a crash) still leaves one row."""
    _script(conn,
        """
        CREATE TABLE batches (
            id TEXT PRIMARY KEY,
            spec TEXT NOT NULL,
            documents INTEGER NOT NULL,
            tasks INTEGER NOT NULL,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        CREATE TABLE batch_results (
            id INTEGER PRIMARY KEY,
            batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
            doc_id INTEGER NOT NULL,
            kind TEXT NOT NULL,
            question TEXT NOT NULL,
            model TEXT NOT NULL,
            settings TEXT NOT NULL,
            answer TEXT NOT NULL,
            citations TEXT NOT NULL,
            engine TEXT,
            worker TEXT,
            timings TEXT,
            created_at TEXT NOT NULL,
            UNIQUE (batch_id, doc_id, kind, question, model, settings)
        );
        CREATE TABLE batch_failures (
            batch_id TEXT NOT NULL REFERENCES batches(id) ON DELETE CASCADE,
            doc_id INTEGER NOT NULL,
            reason TEXT NOT NULL,
            attempts INTEGER NOT NULL DEFAULT 1,
            failed_at TEXT NOT NULL,
            PRIMARY KEY (batch_id, doc_id)
        );
        """
    )


def _v7_page_sources(conn: sqlite3.Connection) -> None:
    """How each page was read: 'text' (the file's own text) or 'ocr' (recognised from the page
    image), a note for a person (why a page is empty), and an OCR page's word boxes as JSON
    pymupdf word tuples, which the viewer highlights since the PDF itself has no words there."""
    _script(conn,
        """
        ALTER TABLE pages ADD COLUMN source TEXT NOT NULL DEFAULT 'text';
        ALTER TABLE pages ADD COLUMN note TEXT;
        ALTER TABLE pages ADD COLUMN words TEXT;
        """
    )


def _v8_token_counts(conn: sqlite3.Connection) -> None:
    """A document's tokens by each model's tokenizer: ingestion counts with the model of the
    moment, and a question asked with another model sizes its automatic context by that
    model's count (Qwen2.5 and SmolLM2 differ by 7 % on the R FAQ: enough to push a document
    out of the trained window). Keyed by the text's content hash, so a changed file is counted
    anew."""
    _script(conn,
        """
        CREATE TABLE token_counts (
            doc_id INTEGER NOT NULL REFERENCES documents(id) ON DELETE CASCADE,
            content_hash TEXT NOT NULL,
            tokenizer TEXT NOT NULL,
            tokens INTEGER NOT NULL,
            PRIMARY KEY (doc_id, content_hash, tokenizer)
        );
        """
    )


def _v9_threads(conn: sqlite3.Connection) -> None:
    """Conversations: a thread is about documents (the ones chosen, a folder or everything) and
    holds its turns, the answers whose ``thread_id`` it is, in the order they were asked. Each
    answer stored before threads becomes a thread of one turn (same id), so the history a person
    had is the thread list they get; deleting a thread deletes its turns."""
    _script(conn,
        """
        CREATE TABLE threads (
            id INTEGER PRIMARY KEY,
            title TEXT NOT NULL,
            kind TEXT NOT NULL DEFAULT 'selected',
            doc_ids TEXT NOT NULL,
            folder TEXT,
            created_at TEXT NOT NULL,
            updated_at TEXT NOT NULL
        );
        ALTER TABLE answers ADD COLUMN thread_id INTEGER REFERENCES threads(id) ON DELETE CASCADE;
        INSERT INTO threads (id, title, kind, doc_ids, created_at, updated_at)
            SELECT id, substr(question, 1, 80), 'selected', doc_ids, created_at, created_at FROM answers;
        UPDATE answers SET thread_id = id;
        CREATE INDEX answers_by_thread ON answers(thread_id, id);
        """
    )


def _v10_cache_budget(conn: sqlite3.Connection) -> None:
    """Libraries within a disk budget: when a person last opened, asked about or summarized a
    document (``opened_at``: reading ahead takes those first), and why a document's cache is
    not on disk (``cache_note``: larger than the whole cache budget, kept in memory only)."""
    _script(conn,
        """
        ALTER TABLE documents ADD COLUMN opened_at TEXT;
        ALTER TABLE documents ADD COLUMN cache_note TEXT;
        CREATE INDEX kv_caches_by_use ON kv_caches(used_at);
        """
    )


# Index i holds the upgrade from version i to i + 1. Never edit a released entry: append.
MIGRATIONS: list[Callable[[sqlite3.Connection], None]] = [
    _v1_documents,
    _v2_answers,
    _v3_history_and_folders,
    _v4_kv_caches,
    _v5_summary_keys,
    _v6_batches,
    _v7_page_sources,
    _v8_token_counts,
    _v9_threads,
    _v10_cache_budget,
]
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    pass


def current_version(conn: sqlite3.Connection) -> int:
    return int(conn.execute("PRAGMA user_version").fetchone()[0])


def upgrade(conn: sqlite3.Connection, target: int = SCHEMA_VERSION, path: str = "") -> int:
    """Bring ``conn`` to ``target``; returns the version it started at."""
    start = current_version(conn)
    if start > SCHEMA_VERSION:
        raise SchemaTooNew(
            f"{path or 'store'}: schema version {start} is newer than this eLLM knows ({SCHEMA_VERSION}); "
            "upgrade eLLM or point --data-dir elsewhere"
        )
    if start >= target:
        return start
    # BEGIN IMMEDIATE takes the write lock first, so two processes opening a new
    # data directory at once cannot both run the same upgrade.
    conn.execute("BEGIN IMMEDIATE")
    try:
        version = current_version(conn)  # another process may have upgraded meanwhile
        for step in range(version, target):
            MIGRATIONS[step](conn)
            conn.execute(f"PRAGMA user_version = {step + 1}")
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return start
