"""The store: schema versions, transactions, search, history, settings."""
from __future__ import annotations

import sqlite3

import pytest

from app.store import SCHEMA_VERSION, SchemaTooNew, Store
from app.store.migrations import MIGRATIONS, current_version


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ellm.db")
    yield s
    s.close()


def add_doc(store, path="/docs/a.txt", pages=((1, 0, "alpha beta"),), chunks=((1, 0, 10, "alpha beta"),)):
    return store.save_document({"path": path, "title": "A", "status": "ingested", "pages": len(pages)},
                               list(pages), list(chunks))


def test_fresh_store_is_at_current_version_in_wal_mode(store):
    assert current_version(store.conn) == SCHEMA_VERSION == len(MIGRATIONS)
    assert store.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    tables = {r["name"] for r in store.query("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"documents", "pages", "chunks", "chunks_fts", "answers", "answers_fts", "summaries",
            "settings", "folders", "answer_docs"} <= tables
    assert store.integrity_check() == "ok"


def test_upgrade_from_version_1_keeps_documents_and_fills_new_tables(tmp_path):
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.execute("INSERT INTO documents (path, folder, title, status, pages) "
                 "VALUES ('/lib/old.txt', '/lib', 'Old', 'ingested', 1)")
    conn.execute("INSERT INTO pages (doc_id, number, start, text) VALUES (1, 1, 0, 'kept text')")
    conn.execute("INSERT INTO chunks (doc_id, page, start, end, text) VALUES (1, 1, 0, 9, 'kept text')")
    conn.close()

    store = Store(path)
    assert current_version(store.conn) == SCHEMA_VERSION
    assert [(d["path"], d["title"]) for d in store.documents()] == [("/lib/old.txt", "Old")]
    assert store.pages(1) == [{"number": 1, "start": 0, "text": "kept text"}]
    assert [h["page"] for h in store.search_chunks([1], "kept")] == [1]
    assert store.folders() == ["/lib"]  # v3 filled folders from the documents it found
    answer_id = store.add_answer([1], "what is kept?", "the text is kept", [], "m", "e", {})
    assert [a["id"] for a in store.answers(doc_id=1, search="kept")] == [answer_id]
    store.close()


def store_at_version(tmp_path, version: int, titles: list[str]):
    """A store file as eLLM left it at schema ``version``, with a document of each title; (path, connection)."""
    path = tmp_path / f"v{version}.db"
    conn = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:version]:
        step(conn)
    conn.execute(f"PRAGMA user_version = {version}")
    for title in titles:
        conn.execute("INSERT INTO documents (path, title, status, pages) VALUES (?, ?, 'ingested', 1)",
                     [f"/lib/{title.lower()}.txt", title])
    return path, conn


def test_upgrade_to_threads_makes_each_earlier_answer_a_thread_of_one_turn(tmp_path):
    from app.store.threads import delete_thread, list_threads, thread_turns

    path, conn = store_at_version(tmp_path, 8, ["A"])
    for q in ("When was the treaty signed?", "Who kept the lamp?"):
        conn.execute("INSERT INTO answers (doc_ids, question, answer, citations, created_at) "
                     "VALUES ('[1]', ?, 'an answer', '[]', '2026-01-01T00:00:00')", [q])
    conn.close()

    store = Store(path)
    threads = list_threads(store)
    assert sorted((t["id"], t["title"], t["turns"], t["doc_ids"]) for t in threads) == [
        (1, "When was the treaty signed?", 1, [1]), (2, "Who kept the lamp?", 1, [1])]
    assert [r["question"] for r in thread_turns(store, 2)] == ["Who kept the lamp?"]
    follow = store.add_answer([1], "For how long?", "forty years", [], "m", "e", {}, thread_id=2)
    assert [r["id"] for r in thread_turns(store, 2)] == [2, follow]
    assert [t["id"] for t in list_threads(store, search="forty")] == [2]
    assert delete_thread(store, 2) and [a["id"] for a in store.answers()] == [1]
    assert store.answers(search="forty") == []                     # the search index forgot the deleted turns
    store.close()


def test_failed_upgrade_leaves_the_file_as_it_was(tmp_path, monkeypatch):
    from app.store import migrations

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    MIGRATIONS[0](conn)
    conn.execute("PRAGMA user_version = 1")
    conn.close()

    def broken(conn):
        conn.execute("CREATE TABLE half_done (x)")
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(migrations, "MIGRATIONS", [MIGRATIONS[0], broken, MIGRATIONS[2]])
    with pytest.raises(RuntimeError, match="disk on fire"):
        Store(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 1
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert "half_done" not in names and "answers" not in names


def test_newer_schema_is_refused_with_a_message(tmp_path):
    path = tmp_path / "new.db"
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(SchemaTooNew, match="newer than this eLLM knows"):
        Store(path)


def test_replacing_a_document_replaces_pages_and_chunks(store):
    doc_id = add_doc(store)
    same = store.save_document({"path": "/docs/a.txt", "title": "A2", "status": "ingested", "pages": 2},
                               [(1, 0, "gamma"), (2, 7, "delta")], [(1, 0, 5, "gamma"), (2, 7, 12, "delta")])
    assert same == doc_id
    assert [p["text"] for p in store.pages(doc_id)] == ["gamma", "delta"]
    assert store.search_chunks([doc_id], "alpha") == []
    assert [h["page"] for h in store.search_chunks([doc_id], "delta")] == [2]


def test_a_failing_write_rolls_back_everything(store):
    doc_id = add_doc(store)
    with pytest.raises(sqlite3.IntegrityError):
        # duplicate page numbers violate the primary key half-way through
        store.save_document({"path": "/docs/a.txt", "title": "B", "status": "ingested"},
                            [(1, 0, "new"), (1, 0, "dup")], [])
    assert store.document(doc_id)["title"] == "A"
    assert [p["text"] for p in store.pages(doc_id)] == ["alpha beta"]


def test_nested_transactions_roll_back_only_the_inner_part(store):
    with store.transaction():
        store.set_settings({"engine": "llamacpp"})
        with pytest.raises(ValueError):
            with store.transaction():
                store.set_settings({"n_ctx": 4096})
                raise ValueError("inner")
    assert store.settings() == {"engine": "llamacpp"}


def test_search_is_bm25_ranked_and_ignores_fts_syntax(store):
    doc_id = add_doc(store, pages=((1, 0, "x"), (2, 2, "y")),
                     chunks=((1, 0, 30, "owls owls owls hunt at night"), (2, 31, 60, "owls sleep by day")))
    hits = store.search_chunks([doc_id], 'owls AND "NEAR( hunt')
    assert [h["page"] for h in hits] == [1, 2]
    assert store.search_chunks([doc_id], "the of and") == []  # stopwords only


def test_answer_history_per_document_and_searchable(store):
    a = add_doc(store, "/d/a.txt")
    b = add_doc(store, "/d/b.txt")
    first = store.add_answer([a], "Who kept the lamp?", "Marta Quill [p. 2]", [{"doc": a, "page": 2}], "m", "e",
                             {"ttft_s": 1.0})
    second = store.add_answer([a, b], "When was it signed?", "In 1848", [], "m", "e", {})
    assert [x["id"] for x in store.answers(doc_id=a)] == [second, first]
    assert [x["id"] for x in store.answers(doc_id=b)] == [second]
    assert [x["id"] for x in store.answers(search="lamp")] == [first]
    assert store.answers(doc_id=a, search="lamp")[0]["citations"] == [{"doc": a, "page": 2}]


def test_find_documents_by_id_title_and_file_name(store):
    a = store.save_document({"path": "/d/River.pdf", "title": "River Treaty", "status": "ingested"})
    b = store.save_document({"path": "/d/owls.epub", "title": "Owls", "status": "ingested"})
    assert [d["id"] for d in store.find_documents(str(b))] == [b]
    assert [d["id"] for d in store.find_documents("river treaty")] == [a]
    assert [d["id"] for d in store.find_documents("owls.epub")] == [b]
    assert [d["id"] for d in store.find_documents("Treaty")] == [a]
    assert store.find_documents("nothing-like-it") == []


def test_documents_of_a_folder_do_not_leak_into_a_sibling_with_a_common_prefix(store):
    store.save_document({"path": "/lib/a.txt", "status": "ingested"})
    store.save_document({"path": "/library/b.txt", "status": "ingested"})
    assert [d["path"] for d in store.documents("/lib")] == ["/lib/a.txt"]


def test_two_connections_see_each_others_writes(tmp_path):
    one, two = Store(tmp_path / "x.db"), Store(tmp_path / "x.db")
    one.save_document({"path": "/a", "status": "ingested"})
    assert [d["path"] for d in two.documents()] == ["/a"]
    one.close(), two.close()


def test_upgrade_to_the_cache_budget_keeps_the_documents_and_orders_caches_by_use(tmp_path):
    path, conn = store_at_version(tmp_path, 9, ["A", "B"])
    conn.close()

    store = Store(path)
    a, b = (d["id"] for d in store.documents())
    assert all(d["opened_at"] is None and d["cache_note"] is None for d in store.documents())
    store.add_kv_cache(b, "kb", "/cache/b.kv", "m", "f16", 10, 300)
    store.add_kv_cache(a, "ka", "/cache/a.kv", "m", "f16", 10, 200)
    assert [r["doc_id"] for r in store.kv_caches_by_use()] == [b, a] and store.kv_cache_bytes() == 500
    store.touch_kv_cache(b, "kb")
    assert [(r["doc_id"], r["title"]) for r in store.kv_caches_by_use()] == [(a, "A"), (b, "B")]
    store.set_cache_note(a, "kept in memory only")
    store.mark_opened([a])
    assert store.document(a)["cache_note"] == "kept in memory only" and store.document(a)["opened_at"]
    store.add_kv_cache(a, "ka2", "/cache/a2.kv", "m", "f16", 10, 200)       # written after all: the note goes
    assert store.document(a)["cache_note"] is None
    store.close()
