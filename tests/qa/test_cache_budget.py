"""The disk budget of document caches (qa/cache_budget.py) without a model: the least recently
used go first, a cache in use stays, a budget of zero keeps every cache in memory only, a full
disk loses only the file being written; reading ahead's order and its share of the budget."""
from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from app.engine.backend import Prefix, SamplingParams
from app.qa.answer import answer
from app.qa.cache_budget import (CacheBudget, automatic_budget, format_size, holding, in_use,
                                 parse_size)
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.qa.reading import MEMORY_ONLY, NOT_READ, READ, STOPPED, read_document, read_states, reading_order
from app.settings import AUTO_BUDGET, Settings
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import PAGES, add_document

PARAMS = SamplingParams.make_greedy(16)


def register(store, tmp_path, doc_id: int, nbytes: int, used_at: str) -> str:
    """A cache file of ``nbytes`` registered for ``doc_id``, last used at ``used_at``."""
    path = tmp_path / "cache" / "kv" / f"doc{doc_id}.kv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"\0" * nbytes)
    store.add_kv_cache(doc_id, f"key{doc_id}", str(path), "model", "f16", 10, nbytes)
    store.conn.execute("UPDATE kv_caches SET used_at = ? WHERE doc_id = ?", [used_at, doc_id])
    return str(path)


@pytest.fixture
def three(store, tmp_path):
    """Three documents with a cache of 100 bytes each, used on the 1st, 2nd and 3rd."""
    docs = [add_document(store, f"/docs/{n}.txt", n, ["Some text."]) for n in ("a", "b", "c")]
    paths = [register(store, tmp_path, d, 100, f"2026-12-0{i + 1}T10:00:00+00:00") for i, d in enumerate(docs)]
    return docs, paths


def budget_with(store, tmp_path, nbytes: int, share: float = 0.5) -> CacheBudget:
    return CacheBudget(store, tmp_path / "cache" / "kv", Settings(cache_budget=nbytes, read_ahead_share=share))


def test_sizes_are_read_and_written_in_powers_of_1024():
    assert [parse_size(s) for s in ("0", "1500000", "512M", "2.5G", "1t", "10 GiB", "auto")] == [
        0, 1500000, 512 << 20, int(2.5 * (1 << 30)), 1 << 40, 10 << 30, AUTO_BUDGET]
    with pytest.raises(ValueError, match="not a size: '12 parsecs'"):
        parse_size("12 parsecs")
    assert (format_size(512), format_size(931 << 20), format_size(int(2.5 * (1 << 30)))) == (
        "512 bytes", "931 MiB", "2.5 GiB")


def test_the_automatic_budget_is_a_quarter_of_the_disk_and_half_of_what_caches_could_have():
    assert automatic_budget(disk_total=1000, disk_free=900, cached=0) == 250
    assert automatic_budget(disk_total=1000, disk_free=100, cached=200) == 150   # a full disk: half of 300
    with pytest.raises(ValueError, match="cache budget"):
        Settings(cache_budget=-2)


def test_room_is_made_by_deleting_the_least_recently_used_first(store, tmp_path, three):
    docs, paths = three
    room = budget_with(store, tmp_path, 300).make_room(150)
    assert room.ok and [r["doc_id"] for r in room.evicted] == docs[:2]          # a (oldest), then b
    assert [os.path.exists(p) for p in paths] == [False, False, True]
    assert [r["doc_id"] for r in store.kv_caches()] == [docs[2]]
    assert store.kv_cache_bytes() == 100


def test_a_cache_in_use_is_never_deleted_and_the_documents_own_cache_is_kept(store, tmp_path, three):
    docs, paths = three
    budget = budget_with(store, tmp_path, 350)
    with holding([paths[0]]):                   # a question reads a's cache
        assert in_use(paths[0]) and not in_use(paths[1])
        room = budget.make_room(150, keep=[docs[1]])     # room for b's new cache
    assert room.ok and [r["doc_id"] for r in room.evicted] == [docs[2]]
    assert [os.path.exists(p) for p in paths] == [True, True, False]
    assert not in_use(paths[0])                 # released when the question ends


def test_when_the_caches_in_use_fill_the_budget_nothing_is_written(store, tmp_path, three):
    docs, paths = three
    budget = budget_with(store, tmp_path, 300)
    with holding(paths[:2]):
        room = budget.make_room(250)
    assert not room.ok and [r["doc_id"] for r in room.evicted] == [docs[2]]
    assert "the caches in use fill the cache budget" in room.note
    assert [os.path.exists(p) for p in paths] == [True, True, False]


def test_a_smaller_budget_prunes_and_clear_keeps_what_is_in_use(store, tmp_path, three):
    docs, paths = three
    assert [r["doc_id"] for r in budget_with(store, tmp_path, 150).prune()] == docs[:2]
    assert store.kv_cache_bytes() == 100
    with holding([paths[2]]):
        deleted, busy = budget_with(store, tmp_path, 150).clear()
    assert (deleted, [r["doc_id"] for r in busy]) == ([], [docs[2]])
    deleted, busy = budget_with(store, tmp_path, 150).clear([docs[2]])
    assert [r["doc_id"] for r in deleted] == [docs[2]] and busy == [] and store.kv_caches() == []


def test_a_budget_of_zero_keeps_a_read_document_in_memory_only_and_says_so(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    store.set_settings({"cache_budget": 0})
    backend = FakeBackend(model_file, composes=True)
    caches = DocCaches(store, store_cache_dir(store))
    result = read_document(store, backend, doc, caches)
    assert result.status == "kept in memory" and "larger than the whole cache budget (0 bytes)" in result.note
    assert store.kv_caches() == [] and not list(caches.dir.glob("*"))
    assert read_states(store, model_file) == {doc: MEMORY_ONLY}
    assert store.document(doc)["cache_note"] == result.note
    a = answer(store, backend, "What was the signal?", [doc], PARAMS)      # the same process: from memory
    assert a.timings["kv_cache"] == "hit" and a.answered_from == "document"
    store.set_settings({"cache_budget": AUTO_BUDGET})                       # room again: written, the note gone
    backend.cache = []
    assert read_document(store, backend, doc, DocCaches(store, store_cache_dir(store))).status == READ
    assert store.document(doc)["cache_note"] is None and read_states(store, model_file) == {doc: READ}


class ReadOtherwise(FakeBackend):
    """Reads the same document under another cache key (as other attention settings would)."""

    def cache_signature(self) -> dict:
        return {"kv": "f16", "attention": "read otherwise"}


def test_a_copied_data_directory_never_deletes_the_originals_caches(store, model_file, tmp_path):
    """The registry keeps whole paths, so a copy of a data directory names the original's files:
    replacing a cache or making room deletes the copy's own files only."""
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    other = add_document(store, "/docs/b.txt", "b", ["Some text."])
    assert read_document(store, FakeBackend(model_file, composes=True), doc,
                         DocCaches(store, store_cache_dir(store))).status == READ
    original = Path(store.kv_caches(doc)[0]["path"])
    copied = tmp_path / "copy" / "cache"
    shutil.copytree(store_cache_dir(store), copied)          # the copy's store: this one, same registry
    caches = DocCaches(store, copied)
    assert read_document(store, ReadOtherwise(model_file, composes=True), doc, caches).status == READ
    assert original.exists() and not (copied / "kv" / original.name).exists()     # the copy's old one went
    newer = Path(store.kv_caches(doc)[0]["path"])
    assert newer.parent == copied / "kv"
    twin = tmp_path / "cache" / "kv" / newer.name                      # as the original registered it
    shutil.copy(newer, twin)
    store.conn.execute("UPDATE kv_caches SET path = ? WHERE doc_id = ?", [str(twin), doc])
    with caches.holding(ReadOtherwise(model_file, composes=True), [doc]):     # a question in the copy
        assert in_use(newer) and not in_use(twin)
    register(store, tmp_path, other, 10, "2026-01-01T00:00:00+00:00")           # the original's, used first
    shutil.copy(tmp_path / "cache" / "kv" / f"doc{other}.kv", copied / "kv")
    room = CacheBudget(store, copied / "kv", Settings(cache_budget=newer.stat().st_size + 5)).make_room(1)
    assert room.ok and [r["doc_id"] for r in room.evicted] == [other]
    assert (tmp_path / "cache" / "kv" / f"doc{other}.kv").exists() and not (copied / "kv" / f"doc{other}.kv").exists()


class FullDisk(FakeBackend):
    """A backend whose cache file cannot be written (the disk filled up while writing)."""

    def ensure_prefix(self, tokens, file=None, cancel=None, progress=None):
        self.cache = list(tokens)
        return Prefix("miss", "computed", 0, save_error=f"{file.path}: No space left on device" if file else "")


def test_a_full_disk_while_writing_a_cache_drops_it_and_leaves_the_store_untouched(store, model_file, tmp_path):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    other = add_document(store, "/docs/other.txt", "Other", ["Nothing to see."])
    kept = register(store, tmp_path, other, 100, "2026-12-01T10:00:00+00:00")
    before = store.kv_caches()
    result = read_document(store, FullDisk(model_file, composes=True), doc, DocCaches(store, store_cache_dir(store)))
    assert result.status == "kept in memory"
    assert store.kv_caches() == before and os.path.exists(kept)
    assert read_states(store, model_file)[doc] == NOT_READ        # read again when there is room


def test_reading_order_opened_first_then_the_latest_added_small_before_large():
    docs = [
        {"id": 1, "opened_at": None, "ingested_at": "2026-12-01T09:00:00+00:00", "tokens": 10},
        {"id": 2, "opened_at": None, "ingested_at": "2026-12-05T09:00:00+00:00", "tokens": 9000},
        {"id": 3, "opened_at": None, "ingested_at": "2026-12-05T09:00:07+00:00", "tokens": 300},
        {"id": 4, "opened_at": "2026-12-02T10:00:00+00:00", "ingested_at": "2026-11-01T09:00:00+00:00", "tokens": 1},
        {"id": 5, "opened_at": "2026-12-04T10:00:00+00:00", "ingested_at": "2026-11-01T09:00:00+00:00", "tokens": 5},
        {"id": 6, "opened_at": None, "ingested_at": "2026-11-01T09:00:00+00:00", "tokens": 50},
    ]
    assert [d["id"] for d in reading_order(docs)] == [5, 4, 3, 2, 1, 6]
    assert [d["id"] for d in reading_order(docs, preferred=[6, 2])] == [6, 2, 5, 4, 3, 1]


def test_reading_ahead_keeps_to_its_share_and_never_evicts_while_a_person_s_read_does(store, model_file, tmp_path):
    """Reading ahead reads a document nobody opened only within its share of the budget; one a
    person opened (asked about) it reads with room made from caches of documents nobody opened."""
    docs = [add_document(store, f"/docs/{n}.txt", n.title(), PAGES) for n in ("a", "b", "c")]
    backend = FakeBackend(model_file, composes=True)
    caches = DocCaches(store, store_cache_dir(store))
    assert read_document(store, backend, docs[0], caches, ahead=True).status == READ
    need = caches.room(backend, docs[1], backend.cached_tokens(), ahead=True).need     # b's prefix: as long as a's
    store.conn.execute("UPDATE kv_caches SET bytes = ?", [3 * need])                     # a's cache: big
    # b alone fits the 50 % share; beside a's cache it does not, and reading ahead deletes nothing
    store.set_settings({"cache_budget": 2 * need + 10, "read_ahead_share": 0.5})
    caches = DocCaches(store, store_cache_dir(store))
    stopped = read_document(store, backend, docs[1], caches, ahead=True)
    assert stopped.status == STOPPED and "reading ahead stops at 50% of the cache budget" in stopped.note
    assert [r["doc_id"] for r in store.kv_caches()] == [docs[0]]
    store.mark_opened([docs[1]])                 # a person asked about b: reading ahead takes it, room is made
    assert read_document(store, backend, docs[1], caches, ahead=True).status == READ
    assert [r["doc_id"] for r in store.kv_caches()] == [docs[1]]     # a, opened by nobody, went
    # Now c is opened too, but b's cache is an opened document's: reading ahead does not delete it
    store.conn.execute("UPDATE kv_caches SET bytes = ?", [2 * need])
    store.mark_opened([docs[2]])
    kept = read_document(store, backend, docs[2], caches, ahead=True)
    assert kept.status == STOPPED and "the caches of opened documents fill" in kept.note
    assert [r["doc_id"] for r in store.kv_caches()] == [docs[1]]


def test_reading_ahead_passes_over_a_document_larger_than_the_budget_and_says_so(store, model_file):
    big = add_document(store, "/docs/big.txt", "Big", PAGES)
    small = add_document(store, "/docs/small.txt", "Small", ["Short."])
    store.set_settings({"cache_budget": 1000})
    backend = FakeBackend(model_file, composes=True)
    caches = DocCaches(store, store_cache_dir(store))
    result = read_document(store, backend, big, caches, ahead=True)
    assert result.status == NOT_READ and "larger than the whole cache budget" in result.note
    assert backend.cache == [] and read_states(store, model_file)[big] == MEMORY_ONLY    # not computed
    assert [d["id"] for d in reading_order(store.documents()) if read_states(store, model_file)[d["id"]] == NOT_READ] \
        == [small]                                                                      # not queued again
    store.clear_cache_notes()                                                           # the budget changed
    assert read_states(store, model_file)[big] == NOT_READ


def test_a_question_keeps_its_documents_caches_and_marks_them_used(store, model_file, tmp_path):
    docs = [add_document(store, f"/docs/{n}.txt", n.title(), PAGES) for n in ("a", "b")]
    backend = FakeBackend(model_file, composes=True)
    caches = DocCaches(store, store_cache_dir(store))
    for d in docs:
        assert read_document(store, backend, d, caches).status == READ
    store.conn.execute("UPDATE kv_caches SET used_at = '2026-01-01T00:00:00+00:00'")
    backend.cache = []
    answer(store, backend, "What was the signal?", docs, PARAMS, caches=caches)     # across both, from their files
    assert all(r["used_at"] > "2026-12" for r in store.kv_caches())                  # laid side by side: used
    # While a question is about a and b, making room for another document deletes neither.
    other = backend.tokenize("a new document " * 30)
    need = caches.room(backend, 999, other, ahead=True).need
    store.conn.execute("UPDATE kv_caches SET bytes = ?", [need])
    store.set_settings({"cache_budget": 2 * need + 10})                  # room for two of the three
    caches = DocCaches(store, store_cache_dir(store))
    with caches.holding(backend, docs):
        room = caches.room(backend, 999, other)
    assert not room.ok and room.evicted == [] and len(store.kv_caches()) == 2
    room = caches.room(backend, 999, other)                             # afterwards: the older goes
    assert room.ok and len(room.evicted) == 1 and len(store.kv_caches()) == 1


