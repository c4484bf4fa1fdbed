"""``ellm doctor``: check a data directory and repair what can be repaired safely.

Checks, in order: stale lock notes, the store's own integrity (PRAGMA
integrity_check), rows whose document is gone, documents whose pages are
incomplete, the full-text indexes (rebuilt from their tables when broken),
documents whose files are gone, and leftovers in the cache folder.

A repair never deletes anything a person made: it rebuilds an index from the
rows it indexes, removes rows that belong to no document, marks documents, and
deletes temporary files that no running eLLM is writing. What cannot be
repaired (a damaged store file) is reported with what to do.
"""
from __future__ import annotations

import os
import sqlite3
import time
from dataclasses import dataclass, field

from app.settings import Paths
from app.library.locking import (
    LOCK_DIR,
    LOCK_SUFFIX,
    LockTimeout,
    file_lock,
    holder_of,
    is_held,
    remove_if_unheld,
)

OK, REPAIRED, PROBLEM = "ok", "repaired", "problem"
TEMP_MAX_AGE_S = 60
"""A temporary file in the cache older than this is left over from a crash: files are
written under a temporary name and renamed in one step when complete."""
TEMP_SUFFIXES = (".tmp", ".part", ".partial")
FTS_TABLES = (("chunks_fts", "passages"), ("answers_fts", "answer history"))
ORPHANS = (  # (table, what a row is, the condition of an orphan)
    ("pages", "page", "doc_id NOT IN (SELECT id FROM documents)"),
    ("chunks", "passage", "doc_id NOT IN (SELECT id FROM documents)"),
    ("summaries", "summary", "doc_id NOT IN (SELECT id FROM documents)"),
    ("answer_docs", "answer link", "answer_id NOT IN (SELECT id FROM answers)"),
)
NO_REPAIR_HINT = "run `ellm doctor` without --no-repair to fix it"


@dataclass
class _Report:
    repair: bool
    checks: list[dict] = field(default_factory=list)
    repairs: list[str] = field(default_factory=list)
    hint: str = NO_REPAIR_HINT  # what to do about a problem found but not repaired

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append({"name": name, "status": status, "detail": detail})

    def fixed(self, name: str, what: str, found: str) -> None:
        """Either repaired (with ``what`` was done) or reported, by the repair setting."""
        if self.repair:
            self.repairs.append(what)
            self.add(name, REPAIRED, f"{found}; {what}")
        else:
            self.add(name, PROBLEM, f"{found}; {self.hint}")


# ---- Public API ----------------------------------------------------------------------


def run_doctor(paths: Paths, repair: bool = True) -> dict:
    """Check the data directory at ``paths``; with ``repair``, fix what is safe to fix.

    Returns {"ok", "data_dir", "checks": [{"name", "status", "detail"}], "repairs": [str]};
    status is "ok", "repaired" or "problem", and ok is False when any problem remains.
    """
    report = _Report(repair)
    if not paths.root.is_dir():
        report.add("data directory", OK, f"{paths.root} does not exist yet: nothing to check")
        return _result(paths, report)
    _check_locks(paths, report)
    if paths.db.exists():
        _check_store(paths, report)
    else:
        report.add("store", OK, f"no store yet ({paths.db.name} is created by the first ingestion)")
    _check_cache(paths, report)
    return _result(paths, report)


def format_doctor(report: dict) -> str:
    """The report as lines a person reads: one per check, then what was repaired."""
    width = max(len(c["name"]) for c in report["checks"]) if report["checks"] else 0
    lines = [f"eLLM doctor: {report.get('data_dir', '')}".rstrip()]
    for c in report["checks"]:
        lines.append(f"  {c['status']:<8}  {c['name']:<{width}}  {c['detail']}")
    if report["repairs"]:
        lines.append("Repaired:")
        lines.extend(f"  - {r}" for r in report["repairs"])
    problems = sum(1 for c in report["checks"] if c["status"] == PROBLEM)
    if problems:
        lines.append(f"{problems} problem{'s' if problems > 1 else ''} remain{'s' if problems == 1 else ''}.")
    else:
        lines.append("All good." if not report["repairs"] else "All good after the repairs above.")
    return "\n".join(lines)


def _result(paths: Paths, report: _Report) -> dict:
    return {"ok": all(c["status"] != PROBLEM for c in report.checks), "data_dir": str(paths.root),
            "checks": report.checks, "repairs": report.repairs}


def _count(n: int, thing: str) -> str:
    plural = thing[:-1] + "ies" if thing.endswith("y") else thing + "s"
    return f"{n} {thing if n == 1 else plural}"


# ---- Locks -----------------------------------------------------------------------------


def _check_locks(paths: Paths, report: _Report) -> None:
    """A lock file nobody holds is harmless (the kernel dropped the lock when its
    process ended); one still naming a holder was left by a process that was killed."""
    folder = paths.root / LOCK_DIR
    files = sorted(folder.glob(f"*{LOCK_SUFFIX}")) if folder.is_dir() else []
    held, stale = [], []
    for path in files:
        if is_held(path):
            held.append(f"{path.stem} ({holder_of(path) or 'a running eLLM'})")
        elif holder_of(path):
            stale.append(path)
    if stale:
        names = ", ".join(f"{p.name} ({holder_of(p)})" for p in stale)
        if report.repair:
            stale = [p for p in stale if remove_if_unheld(p)]
        report.fixed("locks", f"removed {len(stale)} stale lock file{'s' if len(stale) > 1 else ''}",
                     f"lock files left by processes that ended without releasing them: {names}")
    else:
        report.add("locks", OK, f"held now: {', '.join(held)}" if held else "no lock is held")


# ---- The store -------------------------------------------------------------------------


def _check_store(paths: Paths, report: _Report) -> None:
    from app.store import Store
    from app.store.migrations import SchemaTooNew

    try:
        store = Store(paths.db)
    except SchemaTooNew as e:
        report.add("store", PROBLEM, str(e))
        return
    except sqlite3.DatabaseError as e:
        report.add("store", PROBLEM, f"{paths.db} cannot be opened as a SQLite database ({e}); {_DAMAGED_HINT}")
        return
    try:
        if not _check_integrity(store, report):
            return
        if not report.repair:
            _check_contents(store, report)  # changes nothing, so needs no lock (and touches no lock file)
            return
        # Another eLLM ingesting now would race with the repairs below: look, but do not touch.
        try:
            with file_lock(paths.root, "ingest", timeout=0, on_wait=lambda message: None):
                _check_contents(store, report)
        except LockTimeout:
            holder = holder_of(paths.root / LOCK_DIR / f"ingest{LOCK_SUFFIX}") or "another eLLM"
            report.add("repairs", OK, f"skipped: an ingestion is running ({holder}), so the store was only checked")
            report.repair, report.hint = False, "run `ellm doctor` again when the ingestion is done"
            _check_contents(store, report)
    finally:
        store.close()


_DAMAGED_HINT = ("copy ellm.db somewhere safe, then either recover it (`sqlite3 ellm.db .recover | "
                 "sqlite3 recovered.db`) or start a fresh data directory and ingest your folders again")


def _check_integrity(store, report: _Report) -> bool:
    try:
        rows = [r[0] for r in store.conn.execute("PRAGMA integrity_check").fetchall()]
    except sqlite3.DatabaseError as e:
        rows = [str(e)]
    if rows == ["ok"]:
        report.add("store integrity", OK, "PRAGMA integrity_check: ok")
        return True
    shown = "; ".join(rows[:3]) + (f" (and {len(rows) - 3} more)" if len(rows) > 3 else "")
    report.add("store integrity", PROBLEM, f"the store file is damaged: {shown}; {_DAMAGED_HINT}")
    return False


def _check_contents(store, report: _Report) -> None:
    _check_orphans(store, report)
    _check_page_counts(store, report)
    for table, what in FTS_TABLES:
        _check_fts(store, table, what, report)
    _check_missing_files(store, report)


def _check_orphans(store, report: _Report) -> None:
    found = {}
    for table, what, orphan in ORPHANS:
        n = store.conn.execute(f"SELECT count(*) FROM {table} WHERE {orphan}").fetchone()[0]
        if n:
            found[table] = (what, n)
    if not found:
        report.add("orphaned rows", OK, "every page, passage and summary belongs to a document")
        return
    listing = ", ".join(_count(n, what) for what, n in found.values())
    if report.repair:
        with store.transaction():
            for table, what, orphan in ORPHANS:
                if table in found:
                    store.conn.execute(f"DELETE FROM {table} WHERE {orphan}")
    report.fixed("orphaned rows", f"deleted {listing} that belonged to no document",
                 f"{listing} belong to no document")


def _check_page_counts(store, report: _Report) -> None:
    bad = store.query(
        """SELECT d.id, d.path, d.pages, (SELECT count(*) FROM pages p WHERE p.doc_id = d.id) AS stored
           FROM documents d WHERE d.status = 'ingested'
           AND d.pages != (SELECT count(*) FROM pages p WHERE p.doc_id = d.id)""")
    if not bad:
        report.add("pages", OK, "every ingested document has all its pages")
        return
    listing = "; ".join(f"{b['path']} ({b['stored']} of {b['pages']} pages)" for b in bad[:5])
    if report.repair:
        # Forget the content hash, so the next ingestion reads the file again instead of
        # calling it unchanged.
        with store.transaction():
            store.conn.executemany(
                "UPDATE documents SET status = 'failed', content_hash = NULL, error = ? WHERE id = ?",
                [("part of this document's pages were lost from the store; ingest the file again", b["id"])
                 for b in bad])
    report.fixed("pages", f"marked {len(bad)} document{'s' if len(bad) > 1 else ''} to be read again by the "
                          "next `ellm ingest`", f"pages missing from the store: {listing}")


def _check_fts(store, table: str, what: str, report: _Report) -> None:
    name = f"search index ({what})"
    problem = _fts_problem(store, table)
    if problem is None:
        report.add(name, OK, "consistent with its table")
        return
    if report.repair:
        with store.transaction():
            store.conn.execute(f"INSERT INTO {table}({table}) VALUES('rebuild')")
        after = _fts_problem(store, table)
        if after is not None:
            report.add(name, PROBLEM, f"still broken after a rebuild ({after}); {_DAMAGED_HINT}")
            return
    report.fixed(name, f"rebuilt the full-text index of {what} ({table})", f"the index is broken ({problem})")


def _fts_problem(store, table: str) -> str | None:
    # rank 1: also compare the index with the external content table (SQLite 3.38+).
    try:
        store.conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
    except sqlite3.DatabaseError as e:
        return str(e)
    return None


def _check_missing_files(store, report: _Report) -> None:
    docs = store.query("SELECT id, path, status FROM documents ORDER BY id")
    gone = [d for d in docs if d["status"] != "missing" and not os.path.lexists(d["path"])]
    back = [d for d in docs if d["status"] == "missing" and os.path.exists(d["path"])]
    note = f"; {len(back)} missing file{'s are' if len(back) > 1 else ' is'} back: `ellm ingest` to read them" \
        if back else ""
    if not gone:
        report.add("files", OK, f"every document's file is where it was{note}")
        return
    listing = ", ".join(d["path"] for d in gone[:5]) + (f" and {len(gone) - 5} more" if len(gone) > 5 else "")
    if report.repair:
        store.set_status([d["id"] for d in gone], "missing", "file no longer exists")
    report.fixed("files", f"marked {len(gone)} document{'s' if len(gone) > 1 else ''} missing (their stored text "
                          "is kept)", f"files no longer exist: {listing}{note}")


# ---- The cache folder ---------------------------------------------------------------


def _is_temporary(name: str) -> bool:
    return name.endswith(TEMP_SUFFIXES) or name.startswith(".tmp") or ".tmp." in name


def _check_cache(paths: Paths, report: _Report) -> None:
    folder = paths.cache_dir
    if not folder.is_dir():
        report.add("cache", OK, "no cache folder yet")
        return
    now = time.time()
    leftovers, recent, kept = [], 0, 0
    for path in sorted(p for p in folder.rglob("*") if p.is_file() or p.is_symlink()):
        if not _is_temporary(path.name):
            kept += 1
        elif now - path.lstat().st_mtime > TEMP_MAX_AGE_S:
            leftovers.append(path)
        else:
            recent += 1  # possibly being written by a running eLLM right now
    detail = f"{kept} cache file{'s' if kept != 1 else ''}"
    if recent:
        detail += f", {recent} being written now"
    if not leftovers:
        report.add("cache", OK, detail)
        return
    size = sum(p.lstat().st_size for p in leftovers)
    if report.repair:
        for p in leftovers:
            p.unlink(missing_ok=True)
    report.fixed("cache", f"removed {len(leftovers)} partial file{'s' if len(leftovers) > 1 else ''} "
                          f"({size / 2**20:.1f} MB) from {folder}",
                 f"{detail}; {len(leftovers)} partial file{'s' if len(leftovers) > 1 else ''} left by an "
                 f"interrupted write: {', '.join(p.name for p in leftovers[:5])}")
