"""Ingesting scans: OCR pages stored with their source, note and word boxes, per-page
progress, cancel between pages, and a v4 store upgraded to hold all of it."""
from __future__ import annotations

import sqlite3

import pytest

from app.docs import ocr
from app.docs.ocr_layout import Segment
from app.library.ingest import ingest
from app.library.passages import locate_in_pdf_words
from app.store import Store
from app.store.migrations import MIGRATIONS, SCHEMA_VERSION, current_version
from tests.docs.make_samples import (
    make_damaged_image_pdf,
    make_image_only_pdf,
    make_text,
)


def count(text: str) -> int:
    return len(text.split())


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "data" / "ellm.db")
    yield s
    s.close()


def test_a_scan_is_ingested_with_its_ocr_pages_words_and_progress(tmp_path, store):
    pages = ["Minutes of the river board, typed and signed.",
             "The ferryman asked for a new rope and two oars.\nThe board agreed to pay for both."]
    path = make_image_only_pdf(tmp_path / "minutes.pdf", pages, text_pages=(1,), height=140)
    events = []
    report = ingest(store, [path], count, progress=events.append)

    [done] = report.events  # page progress is not in the report
    assert done.status == "ingested" and done.pages == 2 and done.ocr_pages == 1
    assert done.line().endswith(f"(2 pages, 1 OCRed, {done.tokens} tokens)")
    reading = [(e.index, e.total, e.status, e.reason) for e in events if e.status == "reading"]
    assert reading == [(0, 1, "reading", "OCR page 2 of 2")]
    assert events[-1] is done

    assert store.ocr_pages(done.doc_id) == [2]
    assert [(p["number"], p["source"], p["note"]) for p in store.page_sources(done.doc_id)] == [
        (1, "text", None), (2, "ocr", None)]
    assert store.page_words(done.doc_id, 1) == []
    words = store.page_words(done.doc_id, 2)
    assert all(len(w) == 8 and isinstance(w[0], float) and isinstance(w[4], str) for w in words)
    # a passage found by search on the scanned page is highlighted on its first line
    [hit] = store.search_chunks([done.doc_id], "ferryman oars")
    assert hit["page"] == 2
    boxes = [words[i] for i in locate_in_pdf_words(words, "The ferryman asked for a new rope")]
    assert boxes and {w[6] for w in boxes} == {0} and all(60 < w[1] < w[3] < 80 for w in boxes)


class OneWordEngine:
    def __init__(self):
        self.pages = 0

    def segments(self, image):
        self.pages += 1
        return [Segment((10, 10, 50, 30), (("o", 10, 20), ("k", 20, 30)))]


def test_cancel_during_ocr_stops_before_the_next_page_and_stores_nothing_of_the_file(
        tmp_path, store, monkeypatch):
    engine = OneWordEngine()
    monkeypatch.setattr(ocr, "rapid_engine", lambda: (engine, ""))
    folder = tmp_path / "docs"
    folder.mkdir()
    make_image_only_pdf(folder / "a.pdf", ["one", "two", "three", "four"], dpi=40)
    make_text(folder / "b.txt", "A text file after the scan.")
    events = []
    report = ingest(store, [folder], count, progress=events.append,
                    cancel=lambda: any(e.status == "reading" for e in events))
    assert report.cancelled and report.events == []
    assert engine.pages == 1
    assert store.document_by_path(str(folder / "a.pdf")) is None
    assert store.document_by_path(str(folder / "b.txt")) is None


def test_a_page_that_cannot_be_recognised_is_stored_empty_with_its_note(tmp_path, store):
    path = make_damaged_image_pdf(tmp_path / "damaged.pdf", "The first page reads well.")
    [done] = ingest(store, [path], count).events
    assert done.status == "ingested" and done.ocr_pages == 1
    rows = store.page_sources(done.doc_id)
    assert [r["source"] for r in rows] == ["text", "ocr"]
    assert rows[0]["note"] is None and rows[1]["note"].startswith("the page image is damaged")
    assert [p["text"] for p in store.pages(done.doc_id)] == ["The first page reads well.", ""]


def test_a_version_4_store_gets_page_sources(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in range(4):
        MIGRATIONS[step](conn)
    conn.execute("PRAGMA user_version = 4")
    conn.execute("INSERT INTO documents (path, title, status, pages) VALUES ('/a.pdf', 'A', 'ingested', 1)")
    conn.execute("INSERT INTO pages (doc_id, number, start, text) VALUES (1, 1, 0, 'old text')")
    conn.close()
    store = Store(path)
    assert current_version(store.conn) == SCHEMA_VERSION == 10
    assert store.page_sources(1) == [{"number": 1, "source": "text", "note": None}]
    assert store.page_words(1, 1) == [] and store.ocr_pages(1) == []
    store.close()
