"""The store: one SQLite file (WAL) through sqlite-utils.

One connection per thread or process; WAL lets readers go on while a writer
writes (the datasette arrangement). Every multi-row change runs inside
``transaction()`` so a crash leaves either the old or the new state.
"""
from __future__ import annotations

import json
import sqlite3
import threading
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Iterable, Iterator

import sqlite_utils

from app.store.migrations import upgrade

BUSY_TIMEOUT_MS = 30_000


def _page_row(page: tuple) -> tuple:
    """(number, start, text, source, note, words as JSON) from a 3- or 6-tuple page."""
    number, start, text, *rest = page
    source, note, words = (rest + ["text", None, None][len(rest):])[:3]
    return number, start, text, source or "text", note or None, json.dumps(words) if words else None


NEW_THREAD = "New conversation"   # the title of a thread until its first question names it
TITLE_CHARS = 80                  # a thread's title: its first question, cut here


def thread_title(question: str) -> str:
    """The title a thread gets from its first question (one line, at most TITLE_CHARS)."""
    line = " ".join(question.split())
    return line if len(line) <= TITLE_CHARS else line[:TITLE_CHARS - 1].rstrip() + "\u2026"


def now(timespec: str = "seconds") -> str:
    return datetime.now(timezone.utc).isoformat(timespec=timespec)


def fts_query(text: str, max_terms: int = 64) -> str:
    """An FTS5 query that matches any of the words of ``text`` (quoted, so no
    user text is ever parsed as FTS syntax)."""
    words, seen = [], set()
    for raw in "".join(c if c.isalnum() else " " for c in text.lower()).split():
        if len(raw) < 2 or raw in _STOPWORDS or raw in seen:
            continue
        seen.add(raw)
        words.append(f'"{raw}"')
        if len(words) >= max_terms:
            break
    return " OR ".join(words)


_STOPWORDS = frozenset(
    "the a an and or of to in on at for by with from is are was were be been it its this that these those "
    "as not no but if then than so do does did what which who whom whose when where why how can could "
    "should would will shall may might must i you he she we they me him her us them my your our their "
    "about into over under there here all any some such only also more most very just".split()
)


class Store:
    """The documents, pages, chunks, answers, summaries, folders and settings of one data directory."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # isolation_level=None: we issue BEGIN/COMMIT ourselves (see transaction()).
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                               timeout=BUSY_TIMEOUT_MS / 1000)
        conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute("PRAGMA synchronous = NORMAL")
        conn.execute("PRAGMA foreign_keys = ON")
        self.conn = conn
        self.db = sqlite_utils.Database(conn, execute_plugins=False)
        self._lock = threading.RLock()
        self._depth = 0
        upgrade(conn, path=self.path)

    def close(self) -> None:
        with self._lock:
            self.conn.close()

    # ---- Transactions ------------------------------------------------------

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """All-or-nothing; nests (inner levels are savepoints)."""
        with self._lock:
            self._depth += 1
            name = f"sp{self._depth}"
            try:
                if self._depth == 1:
                    self.conn.execute("BEGIN IMMEDIATE")
                else:
                    self.conn.execute(f"SAVEPOINT {name}")
                try:
                    yield
                except BaseException:
                    if self._depth == 1:
                        self.conn.execute("ROLLBACK")
                    else:
                        self.conn.execute(f"ROLLBACK TO {name}")
                        self.conn.execute(f"RELEASE {name}")
                    raise
                if self._depth == 1:
                    self.conn.execute("COMMIT")
                else:
                    self.conn.execute(f"RELEASE {name}")
            finally:
                self._depth -= 1

    def query(self, sql: str, params: Iterable | dict = ()) -> list[dict]:
        with self._lock:
            return list(self.db.query(sql, params))

    def integrity_check(self) -> str:
        with self._lock:  # one connection serves every thread: each use holds the lock
            return self.conn.execute("PRAGMA integrity_check").fetchone()[0]

    # ---- Documents ---------------------------------------------------------

    def document(self, doc_id: int) -> dict | None:
        rows = self.query("SELECT * FROM documents WHERE id = ?", [doc_id])
        return rows[0] if rows else None

    def document_by_path(self, path: str) -> dict | None:
        rows = self.query("SELECT * FROM documents WHERE path = ?", [path])
        return rows[0] if rows else None

    def documents(self, folder: str | None = None) -> list[dict]:
        if folder is None:
            return self.query("SELECT * FROM documents ORDER BY id")
        prefix = folder.rstrip("/") + "/"
        return self.query(
            "SELECT * FROM documents WHERE path LIKE ? ESCAPE '\\' ORDER BY id",
            [prefix.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"],
        )

    def find_documents(self, ref: str) -> list[dict]:
        """Documents matching an id, an exact title, a path or a file name
        (in that order of preference; case-insensitive for titles and names)."""
        ref = str(ref).strip()
        if ref.isdigit():
            doc = self.document(int(ref))
            if doc:
                return [doc]
        for sql, arg in (
            ("SELECT * FROM documents WHERE path = ?", ref),
            ("SELECT * FROM documents WHERE lower(title) = lower(?)", ref),
            ("SELECT * FROM documents WHERE lower(path) LIKE '%/' || lower(?)", ref),
            ("SELECT * FROM documents WHERE lower(title) LIKE '%' || lower(?) || '%'", ref),
        ):
            rows = self.query(sql + " ORDER BY id", [arg])
            if rows:
                return rows
        return []

    def save_document(self, record: dict, pages: list[tuple] | None = None,
                      chunks: list[tuple[int, int, int, str]] | None = None) -> int:
        """Insert or replace the document at record['path'] with its pages
        ((number, start, text), or (number, start, text, source, note, words) where words are
        an OCR page's word tuples) and chunks ((page, start, end, text)) in one transaction.
        With pages None only the document row changes (e.g. a failed file keeps
        the content it had before, if any)."""
        with self.transaction():
            old = self.document_by_path(record["path"])
            record = dict(record, updated_at=now())
            if old is None:
                cols = ", ".join(record)
                marks = ", ".join("?" for _ in record)
                cur = self.conn.execute(f"INSERT INTO documents ({cols}) VALUES ({marks})", list(record.values()))
                doc_id = int(cur.lastrowid)
            else:
                doc_id = int(old["id"])
                sets = ", ".join(f"{k} = ?" for k in record)
                self.conn.execute(f"UPDATE documents SET {sets} WHERE id = ?", [*record.values(), doc_id])
            if pages is not None:
                self.conn.execute("DELETE FROM chunks WHERE doc_id = ?", [doc_id])
                self.conn.execute("DELETE FROM pages WHERE doc_id = ?", [doc_id])
                self.conn.executemany(
                    "INSERT INTO pages (doc_id, number, start, text, source, note, words)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    [(doc_id, *_page_row(page)) for page in pages])
                self.conn.executemany("INSERT INTO chunks (doc_id, page, start, end, text) VALUES (?, ?, ?, ?, ?)",
                                      [(doc_id, p, s, e, t) for p, s, e, t in (chunks or [])])
        return doc_id

    def set_status(self, doc_ids: Iterable[int], status: str, error: str | None = None) -> None:
        with self.transaction():
            self.conn.executemany("UPDATE documents SET status = ?, error = ?, updated_at = ? WHERE id = ?",
                                  [(status, error, now(), i) for i in doc_ids])

    def token_count(self, doc_id: int, content_hash: str, tokenizer: str) -> int | None:
        """The document's tokens by ``tokenizer`` (a model's, engines.tokenizer_key) for this
        content, or None when they were never counted."""
        rows = self.query("SELECT tokens FROM token_counts WHERE doc_id = ? AND content_hash = ? AND tokenizer = ?",
                          [doc_id, content_hash or "", tokenizer])
        return int(rows[0]["tokens"]) if rows else None

    def set_token_count(self, doc_id: int, content_hash: str, tokenizer: str, tokens: int) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR REPLACE INTO token_counts (doc_id, content_hash, tokenizer, tokens)"
                              " VALUES (?, ?, ?, ?)", [doc_id, content_hash or "", tokenizer, int(tokens)])

    def pages(self, doc_id: int) -> list[dict]:
        return self.query("SELECT number, start, text FROM pages WHERE doc_id = ? ORDER BY number", [doc_id])

    def page_words(self, doc_id: int, number: int) -> list[tuple]:
        """The recognised words of an OCR page as pymupdf word tuples (x0, y0, x1, y1, word,
        block, line, word_no) in PDF points; [] for a page read from its text layer."""
        rows = self.query("SELECT words FROM pages WHERE doc_id = ? AND number = ?", [doc_id, number])
        if not rows or not rows[0]["words"]:
            return []
        return [tuple(word) for word in json.loads(rows[0]["words"])]

    def page_sources(self, doc_id: int) -> list[dict]:
        """[{number, source, note}] for every page: which were OCRed, and any page's note."""
        return self.query("SELECT number, source, note FROM pages WHERE doc_id = ? ORDER BY number", [doc_id])

    def ocr_pages(self, doc_id: int) -> list[int]:
        return [row["number"] for row in self.page_sources(doc_id) if row["source"] == "ocr"]

    def search_chunks(self, doc_ids: list[int], text: str, limit: int = 10,
                      pages: Iterable[int] | None = None) -> list[dict]:
        """Chunks of ``doc_ids`` ranked by BM25 against the words of ``text``."""
        q = fts_query(text)
        if not q or not doc_ids:
            return []
        where = f"c.doc_id IN ({', '.join('?' for _ in doc_ids)})"
        args: list = [q, *doc_ids]
        if pages is not None:
            pages = list(pages)
            where += f" AND c.page IN ({', '.join('?' for _ in pages)})"
            args += pages
        return self.query(
            f"""SELECT c.id, c.doc_id, c.page, c.start, c.end, c.text, bm25(chunks_fts) AS score
                FROM chunks_fts JOIN chunks c ON c.id = chunks_fts.rowid
                WHERE chunks_fts MATCH ? AND {where}
                ORDER BY score LIMIT {int(limit)}""",
            args,
        )

    # ---- Answers and summaries -------------------------------------------

    def add_answer(self, doc_ids: list[int], question: str, answer: str, citations: list[dict],
                   model: str, engine: str, timings: dict, thread_id: int | None = None) -> int:
        """Store an answer as the next turn of ``thread_id`` (None: the first turn of a new thread,
        titled by the question; store/threads.py)."""
        stamp = now()
        with self.transaction():
            if thread_id is None:
                thread_id = self.add_thread(doc_ids, question)
            else:
                self.conn.execute("UPDATE threads SET updated_at = ?, title = CASE WHEN title = ? THEN ? ELSE title END"
                                  " WHERE id = ?", [stamp, NEW_THREAD, thread_title(question), int(thread_id)])
            cur = self.conn.execute(
                "INSERT INTO answers (doc_ids, question, answer, citations, model, engine, timings, created_at,"
                " thread_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [json.dumps(doc_ids), question, answer, json.dumps(citations), model, engine,
                 json.dumps(timings), stamp, int(thread_id)],
            )
            answer_id = int(cur.lastrowid)
            self.conn.executemany("INSERT INTO answer_docs (answer_id, doc_id) VALUES (?, ?)",
                                  [(answer_id, d) for d in doc_ids])
        return answer_id

    def add_thread(self, doc_ids: list[int], title: str = "", kind: str = "selected",
                   folder: str | None = None) -> int:
        """A new, empty thread about ``doc_ids`` (``kind``: "selected", "folder" or "everything"),
        titled by ``title`` (its first question) or NEW_THREAD until one names it."""
        stamp = now()
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO threads (title, kind, doc_ids, folder, created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?)",
                [thread_title(title) or NEW_THREAD, kind, json.dumps([int(d) for d in doc_ids]), folder, stamp, stamp])
        return int(cur.lastrowid)

    def answers(self, doc_id: int | None = None, search: str | None = None, limit: int = 100) -> list[dict]:
        """Answer history, newest first; per document and/or matching ``search`` (FTS5)."""
        where, args = [], []
        if doc_id is not None:
            where.append("a.id IN (SELECT answer_id FROM answer_docs WHERE doc_id = ?)")
            args.append(doc_id)
        if search:
            q = fts_query(search)
            if not q:
                return []
            where.append("a.id IN (SELECT rowid FROM answers_fts WHERE answers_fts MATCH ?)")
            args.append(q)
        sql = "SELECT a.* FROM answers a"
        if where:
            sql += " WHERE " + " AND ".join(where)
        rows = self.query(sql + f" ORDER BY a.id DESC LIMIT {int(limit)}", args)
        for r in rows:
            for key in ("doc_ids", "citations", "timings"):
                r[key] = json.loads(r[key]) if r[key] else None
        return rows

    def add_summary(self, doc_id: int, summary: str, model: str, engine: str, method: str,
                    settings_key: str | None = None) -> int:
        with self.transaction():
            cur = self.conn.execute(
                "INSERT INTO summaries (doc_id, summary, model, engine, method, created_at, settings_key) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                [doc_id, summary, model, engine, method, now(), settings_key],
            )
        return int(cur.lastrowid)

    def summary_for(self, doc_id: int, settings_key: str) -> dict | None:
        """The newest summary of ``doc_id`` made with ``settings_key`` (qa/summarize.py)."""
        rows = self.query("SELECT * FROM summaries WHERE doc_id = ? AND settings_key = ? ORDER BY id DESC LIMIT 1",
                          [doc_id, settings_key])
        return rows[0] if rows else None

    def summaries(self, doc_id: int) -> list[dict]:
        return self.query("SELECT * FROM summaries WHERE doc_id = ? ORDER BY id DESC", [doc_id])

    # ---- Folders and settings ----------------------------------------------

    def add_folder(self, path: str) -> None:
        with self.transaction():
            self.conn.execute("INSERT OR IGNORE INTO folders (path, added_at) VALUES (?, ?)", [path, now()])

    def remove_folder(self, path: str) -> None:
        with self.transaction():
            self.conn.execute("DELETE FROM folders WHERE path = ?", [path])

    def folders(self) -> list[str]:
        return [r["path"] for r in self.query("SELECT path FROM folders ORDER BY added_at, path")]

    # ---- KV cache registry --------------------------------------------------------

    def kv_cache(self, doc_id: int, cache_key: str) -> dict | None:
        rows = self.query("SELECT * FROM kv_caches WHERE doc_id = ? AND cache_key = ?", [doc_id, cache_key])
        return rows[0] if rows else None

    def kv_caches(self, doc_id: int | None = None) -> list[dict]:
        if doc_id is None:
            return self.query("SELECT * FROM kv_caches ORDER BY doc_id, created_at")
        return self.query("SELECT * FROM kv_caches WHERE doc_id = ? ORDER BY created_at", [doc_id])

    def add_kv_cache(self, doc_id: int, cache_key: str, path: str, model: str, kv: str, tokens: int,
                     nbytes: int) -> list[str]:
        """Register a cache file for ``doc_id``; older files of the same document and model
        are dropped from the registry and their paths returned (the caller deletes them)."""
        stamp = now("microseconds")   # the order of use decides which cache goes first (qa/cache_budget.py)
        with self.transaction():
            old = self.query("SELECT path FROM kv_caches WHERE doc_id = ? AND model = ? AND kv = ? "
                             "AND cache_key != ?", [doc_id, model, kv, cache_key])
            self.conn.execute("DELETE FROM kv_caches WHERE doc_id = ? AND model = ? AND kv = ? AND cache_key != ?",
                              [doc_id, model, kv, cache_key])
            self.conn.execute(
                "INSERT OR REPLACE INTO kv_caches (doc_id, cache_key, path, model, kv, tokens, bytes, created_at, "
                "used_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [doc_id, cache_key, path, model, kv, tokens, nbytes, stamp, stamp])
            self.conn.execute("UPDATE documents SET cache_note = NULL WHERE id = ?", [doc_id])
        return [r["path"] for r in old]

    def kv_caches_by_use(self) -> list[dict]:
        """Every registered cache with its document's title, least recently used first."""
        return self.query("SELECT k.*, d.title AS title, d.path AS doc_path, d.opened_at AS opened_at "
                          "FROM kv_caches k JOIN documents d ON d.id = k.doc_id "
                          "ORDER BY k.used_at, k.created_at, k.doc_id")

    def kv_cache_bytes(self) -> int:
        return int(self.query("SELECT COALESCE(SUM(bytes), 0) AS n FROM kv_caches")[0]["n"])

    def set_cache_note(self, doc_id: int, note: str | None) -> None:
        """Why ``doc_id``'s cache is not on disk (None: it is, or it was never read)."""
        with self.transaction():
            self.conn.execute("UPDATE documents SET cache_note = ? WHERE id = ?", [note or None, doc_id])

    def clear_cache_notes(self) -> None:
        """The budget changed: no document's cache is known to be too large for it any more."""
        with self.transaction():
            self.conn.execute("UPDATE documents SET cache_note = NULL WHERE cache_note IS NOT NULL")

    def mark_opened(self, doc_ids: Iterable[int]) -> None:
        """A person opened, asked about or summarized these documents (reading ahead takes them first)."""
        stamp = now()
        with self.transaction():
            self.conn.executemany("UPDATE documents SET opened_at = ? WHERE id = ?", [(stamp, d) for d in doc_ids])

    def touch_kv_cache(self, doc_id: int, cache_key: str) -> None:
        with self.transaction():
            self.conn.execute("UPDATE kv_caches SET used_at = ? WHERE doc_id = ? AND cache_key = ?",
                              [now("microseconds"), doc_id, cache_key])

    def remove_kv_cache(self, doc_id: int, cache_key: str) -> None:
        with self.transaction():
            self.conn.execute("DELETE FROM kv_caches WHERE doc_id = ? AND cache_key = ?", [doc_id, cache_key])

    def settings(self) -> dict:
        return {r["key"]: json.loads(r["value"]) for r in self.query("SELECT key, value FROM settings")}

    def set_settings(self, values: dict) -> None:
        with self.transaction():
            self.conn.executemany("INSERT OR REPLACE INTO settings (key, value) VALUES (?, ?)",
                                  [(k, json.dumps(v)) for k, v in values.items()])

    def clear_settings(self) -> None:
        with self.transaction():
            self.conn.execute("DELETE FROM settings")
