"""The store's batches without Ray: a result's key is unique and written once, what a batch
has is what resuming skips, failures keep their reason and count their attempts."""
from __future__ import annotations

import pytest

from app.store import Store
from app.store import batches
from app.store.batches import ResultRow


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ellm.db")
    yield s
    s.close()


def row(doc: int, question: str = "Q1", answer: str = "A", model: str = "m.gguf", settings: str = "s1") -> ResultRow:
    return ResultRow(doc, "ask", question, model, settings, answer, [{"doc": doc, "page": 1, "text": "t"}])


def test_a_batch_is_registered_once_and_counted_again(store):
    assert batches.open_batch(store, "b1", {"target": "all"}, documents=3, tasks=2) is True
    assert batches.open_batch(store, "b1", {"target": "all"}, documents=4, tasks=2) is False
    b = batches.batch(store, "b1")
    assert (b["spec"], b["documents"], b["tasks"]) == ({"target": "all"}, 4, 2)
    assert [(x["id"], x["results"], x["failures"]) for x in batches.batches(store)] == [("b1", 0, 0)]


def test_the_same_result_written_twice_leaves_one_row_and_the_first_answer(store):
    batches.open_batch(store, "b1", {}, 2, 2)
    assert batches.add_results(store, "b1", [row(1, "Q1", "first"), row(1, "Q2")]) == 2
    # a retried worker answers the same document again: nothing new, nothing replaced
    assert batches.add_results(store, "b1", [row(1, "Q1", "second"), row(1, "Q2"), row(2, "Q1")]) == 1
    got = [(r["doc_id"], r["question"], r["answer"]) for r in batches.results(store, "b1")]
    assert got == [(1, "Q1", "first"), (1, "Q2", "A"), (2, "Q1", "A")]
    assert batches.results(store, "b1")[0]["citations"] == [{"doc": 1, "page": 1, "text": "t"}]


def test_done_keys_are_per_batch_model_and_settings(store):
    for b in ("b1", "b2"):
        batches.open_batch(store, b, {}, 2, 1)
    batches.add_results(store, "b1", [row(1), row(2, settings="s2"), row(3, model="other.gguf")])
    batches.add_results(store, "b2", [row(4)])
    assert batches.done_keys(store, "b1", "m.gguf", "s1") == {(1, "ask", "Q1")}
    assert batches.done_keys(store, "b1", "m.gguf", "s2") == {(2, "ask", "Q1")}
    assert batches.done_keys(store, "b2", "m.gguf", "s1") == {(4, "ask", "Q1")}


def test_a_failure_keeps_its_reason_counts_attempts_and_clears_when_the_document_is_done(store):
    batches.open_batch(store, "b1", {}, 2, 1)
    batches.record_failure(store, "b1", 7, "no text")
    batches.record_failure(store, "b1", 7, "still no text")
    assert [(f["doc_id"], f["reason"], f["attempts"]) for f in batches.failures(store, "b1")] == [(7, "still no text", 2)]
    batches.add_results(store, "b1", [row(8)], doc_id=8)  # another document: the failure stays
    assert len(batches.failures(store, "b1")) == 1
    batches.add_results(store, "b1", [row(7)], doc_id=7)
    assert batches.failures(store, "b1") == []


def test_the_unique_key_is_enforced_by_the_table_itself(store):
    import sqlite3

    batches.open_batch(store, "b1", {}, 1, 1)
    batches.add_results(store, "b1", [row(1)])
    with pytest.raises(sqlite3.IntegrityError):
        store.conn.execute("INSERT INTO batch_results (batch_id, doc_id, kind, question, model, settings, answer,"
                           " citations, created_at) VALUES ('b1', 1, 'ask', 'Q1', 'm.gguf', 's1', 'x', '[]', '')")
