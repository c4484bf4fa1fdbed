"""`ellm doctor` (app/library/doctor.py): finds what is wrong in a data directory, repairs what
is safe to repair, reports what it did, and changes nothing with repair=False."""
from __future__ import annotations

import os
import sqlite3
import time

import pytest

from app.settings import Paths
from app.library.doctor import format_doctor, run_doctor
from app.library.locking import file_lock, holder_of, lock_path
from app.store import Store
from tests.reliability.helpers import store_problems


def statuses(report) -> dict[str, str]:
    return {c["name"]: c["status"] for c in report["checks"]}


@pytest.fixture
def paths(cli, corpus, data_dir) -> Paths:
    rc, _, _ = cli("ingest", str(corpus))
    assert rc == 0
    return Paths.resolve(data_dir)


def break_everything(paths: Paths, corpus) -> dict:
    """One of each thing doctor repairs; returns what the test checks afterwards."""
    conn = sqlite3.connect(paths.db)
    conn.execute("PRAGMA foreign_keys = OFF")
    # The full-text index loses a passage (as a crash of an older SQLite or a bad copy could leave it).
    chunk_id, chunk_text = conn.execute(
        "SELECT c.id, c.text FROM chunks c JOIN documents d ON d.id = c.doc_id WHERE d.path LIKE '%notes.txt'"
    ).fetchone()
    conn.execute("INSERT INTO chunks_fts(chunks_fts, rowid, text) VALUES('delete', ?, ?)", [chunk_id, chunk_text])
    # A document row deleted without its pages and passages (foreign keys off).
    conn.execute("DELETE FROM documents WHERE path LIKE '%page.html'")
    # A document that lost one of its pages.
    conn.execute("DELETE FROM pages WHERE number = 2 AND doc_id = (SELECT id FROM documents WHERE path LIKE '%treaty.pdf')")
    conn.commit()
    conn.close()
    # A file deleted from its folder since it was ingested.
    (corpus / "sub" / "owls.epub").unlink()
    # Cache: a partial file left by a crash two minutes ago, one being written now, a real cache file.
    paths.cache_dir.mkdir(parents=True, exist_ok=True)
    old_tmp = paths.cache_dir / "doc-3.kv.tmp"
    old_tmp.write_bytes(b"\0" * 4096)
    two_minutes_ago = time.time() - 120
    os.utime(old_tmp, (two_minutes_ago, two_minutes_ago))
    fresh_tmp = paths.cache_dir / "doc-4.kv.tmp"
    fresh_tmp.write_bytes(b"\0" * 10)
    kept = paths.cache_dir / "doc-1.kv"
    kept.write_bytes(b"KV")
    # A lock file still naming a process that was killed while it held the lock.
    stale = lock_path(paths.root, "ingest")
    stale.parent.mkdir(exist_ok=True)
    stale.write_text("pid 999999, ingest, since 2025-01-01 00:00:00\n")
    return {"chunk": (chunk_id, chunk_text), "old_tmp": old_tmp, "fresh_tmp": fresh_tmp, "kept": kept,
            "stale": stale}


def test_a_healthy_data_directory(paths):
    report = run_doctor(paths)
    assert report["ok"] is True and report["repairs"] == []
    assert set(statuses(report).values()) == {"ok"}
    assert set(statuses(report)) == {"locks", "store integrity", "orphaned rows", "pages", "search index (passages)",
                                     "search index (answer history)", "files", "cache"}
    assert format_doctor(report).endswith("All good.")


def test_doctor_without_repair_reports_and_changes_nothing(paths, corpus):
    broken = break_everything(paths, corpus)
    before = paths.db.read_bytes()
    report = run_doctor(paths, repair=False)
    assert report["ok"] is False and report["repairs"] == []
    assert statuses(report) == {
        "locks": "problem", "store integrity": "ok", "orphaned rows": "problem", "pages": "problem",
        "search index (passages)": "problem", "search index (answer history)": "ok", "files": "problem",
        "cache": "problem",
    }
    assert all("without --no-repair" in c["detail"] for c in report["checks"] if c["status"] == "problem")
    assert paths.db.read_bytes() == before
    assert broken["old_tmp"].exists() and holder_of(broken["stale"]).startswith("pid 999999")
    assert "6 problems remain." in format_doctor(report)


def test_doctor_repairs_and_says_what_it_did(paths, corpus, cli):
    broken = break_everything(paths, corpus)
    report = run_doctor(paths)
    assert report["ok"] is True
    assert statuses(report) == {
        "locks": "repaired", "store integrity": "ok", "orphaned rows": "repaired", "pages": "repaired",
        "search index (passages)": "repaired", "search index (answer history)": "ok", "files": "repaired",
        "cache": "repaired",
    }
    details = {c["name"]: c["detail"] for c in report["checks"]}
    assert "owls.epub" in details["files"] and "treaty.pdf (2 of 3 pages)" in details["pages"]
    assert "doc-3.kv.tmp" in details["cache"]
    assert report["repairs"] == [
        "removed 1 stale lock file",
        "deleted 1 page, 1 passage that belonged to no document",
        "marked 1 document to be read again by the next `ellm ingest`",
        "rebuilt the full-text index of passages (chunks_fts)",
        "marked 1 document missing (their stored text is kept)",
        "removed 1 partial file (0.0 MB) from " + str(paths.cache_dir),
    ]
    text = format_doctor(report)
    assert "Repaired:\n  - removed 1 stale lock file" in text and text.endswith("All good after the repairs above.")

    # What was repaired is really so.
    assert not broken["old_tmp"].exists() and broken["fresh_tmp"].exists() and broken["kept"].exists()
    assert holder_of(broken["stale"]) == ""  # removed (doctor's own use of the lock left an empty file)
    store = Store(paths.db)
    owls = store.find_documents("owls.epub")[0]
    assert (owls["status"], owls["pages"]) == ("missing", 2)  # marked, text kept
    chunk_id, _ = broken["chunk"]
    notes = store.find_documents("notes.txt")[0]["id"]
    assert [h["id"] for h in store.search_chunks([notes], "budget")] == [chunk_id]
    store.close()
    assert store_problems(paths.db) == []

    # A second run finds nothing to do; the next ingestion reads the damaged document again.
    again = run_doctor(paths)
    assert again["ok"] is True and again["repairs"] == []
    rc, out, _ = cli("ingest", str(corpus))
    assert rc == 0 and "treaty.pdf: ingested (3 pages" in out
    assert store_problems(paths.db) == []


def test_doctor_only_checks_while_an_ingestion_runs(paths, corpus):
    broken = break_everything(paths, corpus)
    broken["stale"].unlink()
    with file_lock(paths.root, "ingest"):  # as a running `ellm ingest` holds it
        report = run_doctor(paths)
    s = statuses(report)
    assert report["repairs"] == [] and s["repairs"] == "ok"
    details = {c["name"]: c["detail"] for c in report["checks"]}
    assert "skipped: an ingestion is running" in details["repairs"]
    assert (s["orphaned rows"], s["search index (passages)"], s["files"]) == ("problem",) * 3
    assert "run `ellm doctor` again when the ingestion is done" in details["files"]
    store = Store(paths.db)
    assert store.find_documents("owls.epub")[0]["status"] == "ingested"  # untouched
    store.close()
    assert broken["old_tmp"].exists()


def test_a_damaged_store_file_is_reported_with_what_to_do(tmp_path):
    paths = Paths(tmp_path / "data")
    store = Store(paths.db)
    store.save_document({"path": "/a.txt", "status": "ingested", "pages": 1}, [(1, 0, "x" * 5000)],
                        [(1, 0, 10, "xxxxxxxxxx")])
    store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    store.close()
    data = bytearray(paths.db.read_bytes())
    page = 4096
    assert len(data) > 4 * page
    data[3 * page: 4 * page] = b"\xff" * page  # a b-tree page overwritten
    paths.db.write_bytes(bytes(data))
    report = run_doctor(paths)
    assert report["ok"] is False
    [integrity] = [c for c in report["checks"] if c["name"] in ("store integrity", "store")]
    assert integrity["status"] == "problem"
    assert "sqlite3 ellm.db .recover" in integrity["detail"]

    paths.db.write_bytes(b"this is not a database" * 100)
    report = run_doctor(paths)
    assert report["ok"] is False
    assert any(c["status"] == "problem" and "cannot be opened as a SQLite database" in c["detail"]
               for c in report["checks"])
