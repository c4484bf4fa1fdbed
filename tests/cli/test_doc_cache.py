"""Persisted document KV caches, end to end with the default model on our engine."""
from __future__ import annotations

from pathlib import Path

import pytest

from app.qa.answer import answer
from app.settings import Paths
from app.engine.kv.files import read_header
from app.session import Session

SETTINGS = {"engine": "ellm", "kv": "k8v4", "attention": "sparse", "n_ctx": 2048}


@pytest.fixture
def session(cli, corpus, data_dir):
    rc, _, _ = cli("ingest", str(corpus))
    assert rc == 0
    return Session(Paths.resolve(data_dir), SETTINGS)    # a fresh session: nothing loaded, as a new process


def _ask(session, question: str, doc: str = "treaty.pdf"):
    doc_id = session.store.find_documents(doc)[0]["id"]
    a = answer(session.store, session.backend(), question, [doc_id], session.sampling(greedy=True, max_tokens=12))
    return a, doc_id


def _cache_files(session) -> list[Path]:
    return sorted((session.paths.cache_dir / "kv").glob("*.kv"))


def test_a_document_prefix_is_computed_once_and_reused(session):
    first, doc_id = _ask(session, "Who kept the lamp burning?")
    assert first.timings["kv_cache"] == "miss"
    rows = session.store.kv_caches(doc_id)
    assert len(rows) == 1 and Path(rows[0]["path"]).exists() and rows[0]["kv"] == "k8v4"
    second, _ = _ask(session, "When was the treaty signed?")
    assert second.timings["kv_cache"] == "hit"
    # Only the question is prefilled on a hit: the document and the copies of its best passages
    # laid beside the question (qa/answer.py) come from the cache.
    t = second.timings
    assert t["reused_prompt_tokens"] >= rows[0]["tokens"] and t["prompt_tokens"] - t["reused_prompt_tokens"] < 64

    session.backends.clear()           # a new process: the prefix comes from the file
    again, _ = _ask(session, "Who kept the lamp burning?")
    assert again.timings["kv_cache"] == "hit"
    assert again.answer == first.answer


def test_a_corrupt_cache_file_is_rebuilt_not_used(session):
    first, doc_id = _ask(session, "Who kept the lamp burning?")
    (path,) = _cache_files(session)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x5A
    path.write_bytes(bytes(data))
    session.backends.clear()
    again, _ = _ask(session, "Who kept the lamp burning?")
    assert again.timings["kv_cache"] == "miss"
    assert again.answer == first.answer
    (rebuilt,) = _cache_files(session)
    header = read_header(rebuilt)
    assert header["n_tokens"] == session.store.kv_caches(doc_id)[0]["tokens"]


def test_a_changed_setting_or_document_gets_a_new_cache(session, cli, corpus):
    _ask(session, "Who kept the lamp burning?")
    _ask(session, "What do owls eat?", doc="owls")
    assert len(_cache_files(session)) == 2
    other = Session(session.paths, {**SETTINGS, "kv": "k8v8"})
    a = answer(other.store, other.backend(), "Who kept the lamp?", [other.store.find_documents("treaty.pdf")[0]["id"]],
            other.sampling(greedy=True, max_tokens=4))
    assert a.timings["kv_cache"] == "miss"
    assert len(_cache_files(session)) == 3      # the k8v4 files stay valid for k8v4
    # Editing a document replaces its cache; the other documents' caches stay.
    notes = corpus / "notes.txt"
    notes.write_text("Meeting notes\n\nThe budget for 2026 is 15 million euros.\n")
    session.backends.clear()
    _ask(session, "What is the budget?", doc="notes.txt")
    owls_before = [p for p in _cache_files(session) if p.name.startswith(f"doc{session.store.find_documents('owls')[0]['id']}-")]
    assert cli("ingest", str(corpus))[0] == 0
    session.backends.clear()
    b, _ = _ask(session, "What is the budget?", doc="notes.txt")
    assert b.timings["kv_cache"] == "miss"
    files = _cache_files(session)
    assert all(p in files for p in owls_before)


def test_attended_passages_point_at_the_page_that_holds_the_fact(session, cli, tmp_path):
    from tests.docs.make_samples import make_pdf

    filler = "The committee reviewed routine matters of the harbour, the roads and the market. " * 12
    pages = [filler] * 5
    pages[2] = filler[:400] + " The secret password of the harbour master is AMBERGRIS. " + filler[400:]
    folder = tmp_path / "planted"
    folder.mkdir()
    make_pdf(folder / "harbour.pdf", pages, title="Harbour minutes")
    assert cli("ingest", str(folder))[0] == 0
    doc_id = session.store.find_documents("harbour.pdf")[0]["id"]
    a = answer(session.store, session.backend(), "What is the secret password of the harbour master?", [doc_id],
            session.sampling(greedy=True, max_tokens=16))
    attended = a.as_dict()["attended"]
    assert attended and set(attended[0]) == {"doc", "page", "text", "weight"}
    assert attended[0]["page"] == 3, attended
    assert abs(sum(x["weight"] for x in attended) - 1.0) < 0.05 or len(attended) == 5
