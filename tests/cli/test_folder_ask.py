"""Questions across a folder: document caches side by side, one generation."""
from __future__ import annotations

import shutil

import pytest

from app.runtime import engines
from app.runtime.auto import AUTO_KV
from app.settings import Paths
from app.qa.across import ROOM
from app.qa.answer import PASSAGES_ROOM, AnswerOptions, answer
from app.session import Session
from tests.docs.make_samples import make_pdf

SETTINGS = {"engine": "ellm", "kv": "k8v4", "attention": "sparse", "n_ctx": 2048}
FILLER = "The committee reviewed routine matters of the harbour, the roads and the market. " * 6
FACT = " The secret password of the harbour master is AMBERGRIS. "


@pytest.fixture
def folder(tmp_path, cli):
    folder = tmp_path / "minutes"
    folder.mkdir()
    for i in range(3):
        pages = [FILLER, FILLER]
        if i == 1:
            pages[1] = FILLER[:200] + FACT + FILLER[200:]
        make_pdf(folder / f"minutes{i}.pdf", pages, title=f"Minutes {i}")
    assert cli("ingest", str(folder))[0] == 0
    yield folder


def _session(data_dir, **extra):
    return Session(Paths.resolve(data_dir), {**SETTINGS, **extra})


def _ids(session, folder):
    return [d["id"] for d in session.store.documents(str(folder))]


def test_a_question_spans_every_document_and_cites_the_right_one(folder, data_dir):
    s = _session(data_dir)
    ids = _ids(s, folder)
    a = answer(s.store, s.backend(), "What is the secret password of the harbour master?", ids,
                 s.sampling(greedy=True, max_tokens=12))
    d = a.as_dict()
    assert [c["doc"] for c in d["considered"]] == ids and d["note"] == ""
    holder = s.store.find_documents("minutes1.pdf")[0]["id"]
    assert (d["citations"][0]["doc"], d["citations"][0]["page"]) == (holder, 2)
    assert "AMBERGRIS" in d["citations"][0]["text"]
    assert d["attended"] and all(x["doc"] in ids for x in d["attended"])
    # All three documents' caches were made once; the context held them all.
    assert len(list((s.paths.cache_dir / "kv").glob("*.kv"))) == 3
    assert d["timings"]["prompt_tokens"] > 3 * 220   # three documents of ~250 tokens each


def test_adding_a_document_invalidates_nothing_else(folder, data_dir, cli):
    s = _session(data_dir)
    answer(s.store, s.backend(), "What is on the agenda?", _ids(s, folder), s.sampling(greedy=True, max_tokens=4))
    before = {p.name: p.stat().st_mtime_ns for p in (s.paths.cache_dir / "kv").glob("*.kv")}
    make_pdf(folder / "minutes9.pdf", [FILLER], title="Minutes 9")
    assert cli("ingest", str(folder))[0] == 0
    s.backends.clear()
    again = answer(s.store, s.backend(), "What is on the agenda?", _ids(s, folder),
                     s.sampling(greedy=True, max_tokens=4))
    after = {p.name: p.stat().st_mtime_ns for p in (s.paths.cache_dir / "kv").glob("*.kv")}
    assert len(after) == 4 and all(after[name] == t for name, t in before.items())
    assert again.timings["kv_cache"] == "miss"   # the new document's cache was made
    third = answer(s.store, s.backend(), "Who chaired?", _ids(s, folder), s.sampling(greedy=True, max_tokens=4))
    assert third.timings["kv_cache"] == "hit"


def test_over_the_memory_budget_the_most_relevant_documents_are_considered(folder, data_dir):
    s = _session(data_dir)
    ids = _ids(s, folder)
    per_token = s.backend().kv_bytes_per_token()
    a = answer(s.store, s.backend(), "What is the secret password of the harbour master?", ids,
                 s.sampling(greedy=True, max_tokens=4),
                 options=AnswerOptions(memory_budget=400 * per_token))   # one document (~320 tokens) fits
    d = a.as_dict()
    holder = s.store.find_documents("minutes1.pdf")[0]["id"]
    assert [c["doc"] for c in d["considered"]] == [holder]
    assert "most relevant" in d["note"] and "Minutes 1" in d["note"]


def test_cli_asks_a_folder_and_everything(folder, cli):
    rc, obj, _ = cli("ask", "What is the secret password?", "--folder", str(folder), "--engine", "ellm",
                     "--kv", "k8v4", "--attention", "sparse", "--ctx", "2048", "--greedy", "--max-tokens", "6",
                     "--json", json_out=True)
    assert rc == 0 and len(obj["considered"]) == 3 and obj["timings"]["kv_cache"] in ("hit", "miss")
    rc, out, err = cli("ask", "What is the secret password?", "--all", "--engine", "ellm", "--kv", "k8v4",
                       "--attention", "sparse", "--ctx", "2048", "--greedy", "--max-tokens", "6")
    assert rc == 0 and "Sources:" in out
    rc, _, err = cli("ask", "Anything?", "--folder", str(folder / "nowhere"))
    assert rc == 1 and "no ingested documents" in err


def test_with_the_defaults_a_question_across_eight_documents_reads_every_one(tmp_path, cli, data_dir):
    """Nothing chosen but the model: the automatic context holds the whole folder, which eLLM's
    blocked cache lays side by side — every document read, none chosen by relevance."""
    folder = tmp_path / "eight"
    folder.mkdir()
    for i in range(8):
        pages = [FILLER, FILLER[:200] + FACT + FILLER[200:] if i == 5 else FILLER]
        make_pdf(folder / f"minutes{i}.pdf", pages, title=f"Minutes {i}")
    assert cli("ingest", str(folder))[0] == 0
    s = Session(Paths.resolve(data_dir))                 # the defaults
    ids = _ids(s, folder)
    chosen = s.plan(s.doc_tokens(ids))
    assert (chosen.kv, chosen.attention, chosen.note) == (AUTO_KV, "dense", "")
    backend = s.backend(s.doc_tokens(ids))
    assert backend.name == "ellm" and backend.n_ctx >= chosen.wanted
    a = answer(s.store, backend, "What is the secret password of the harbour master?", ids,
               s.sampling(greedy=True, max_tokens=12))
    assert [c["doc"] for c in a.considered] == ids and a.note == ""
    assert a.timings["prompt_tokens"] > 8 * 2 * 100          # both pages of all eight documents
    holder = s.store.find_documents("minutes5.pdf")[0]["id"]
    assert (a.citations[0]["doc"], a.citations[0]["page"]) == (holder, 2)


def test_the_automatic_context_counts_documents_by_the_asked_models_tokenizer(tmp_path, cli, data_dir,
                                                                               monkeypatch):
    """Ingestion counts a document's tokens with the model of the moment and keeps that count
    as that model's; asked with another model, the session counts the text with that model's
    tokenizer once, keeps it, and sizes the automatic context by it."""
    make_pdf(tmp_path / "minutes.pdf", [FILLER, FILLER + FACT], title="Minutes")
    assert cli("ingest", str(tmp_path / "minutes.pdf"))[0] == 0
    s = Session(Paths.resolve(data_dir))
    doc = s.store.documents()[0]
    first = engines.tokenizer_key(s.model_path)
    assert s.store.token_count(doc["id"], doc["content_hash"], first) == doc["tokens"] > 0
    assert s.doc_tokens([doc["id"]]) == doc["tokens"] + 2 * 8             # and the page markers

    other = tmp_path / "other.gguf"                   # another model file: another tokenizer key
    shutil.copyfile(s.model_path, other)
    calls = []

    def by_characters(path, engine="auto"):
        def count(text):
            calls.append(len(text))
            return len(text)
        count.tokenizer = engines.tokenizer_key(path)
        return count

    monkeypatch.setattr(engines, "token_counter", by_characters)
    s.save_settings(s.settings.with_(model=str(other)))
    s = Session(Paths.resolve(data_dir))
    chars = sum(len(p["text"]) for p in s.store.pages(doc["id"])) + 2      # the "\n\n" between the two pages
    assert chars > 2 * doc["tokens"]
    assert s.doc_tokens([doc["id"]]) == chars + 2 * 8
    assert s.store.token_count(doc["id"], doc["content_hash"], engines.tokenizer_key(other)) == chars
    n = len(calls)
    assert s.doc_tokens([doc["id"]]) == chars + 2 * 8 and len(calls) == n   # kept, not counted again
    assert s.plan(s.doc_tokens([doc["id"]])).wanted >= chars


def test_a_folder_with_some_documents_read_reads_those_whole_and_the_others_passages(tmp_path, cli, data_dir):
    """The defaults, one long document read and another not: `ellm ask --folder` answers at once,
    the read one whole (its cache from `ellm read`, the context sized for it) and the best passages
    of the unread one beside the question, and says so."""
    folder = tmp_path / "two"
    folder.mkdir()
    make_pdf(folder / "harbour.pdf", [FILLER * 2] * 6, title="Harbour")                  # ~1,000 tokens: read
    log = [FILLER * 3] * 12
    log[7] = FILLER[:200] + FACT + FILLER[200:]
    make_pdf(folder / "log.pdf", log, title="Harbour Log")                               # past READ_AT_ONCE
    assert cli("ingest", str(folder))[0] == 0
    rc, rows, _ = cli("--json", "read", "harbour.pdf", "--engine", "ellm", json_out=True)
    assert rc == 0 and rows[0]["status"] == "read"
    rc, a, _ = cli("--json", "ask", "What is the secret password of the harbour master?", "--folder",
                   str(folder), "--engine", "ellm", "--greedy", "--max-tokens", "12", json_out=True)
    assert rc == 0 and a["answered_from"] == "document"
    assert [c["title"] for c in a["considered"]] == ["Harbour"] and a["timings"]["kv_cache"] == "hit"
    assert a["note"].startswith("Read whole: Harbour; from the other 1, their best passages (Harbour Log is")
    s = Session(Paths.resolve(data_dir))          # the context is sized for what it reads: not the log
    harbour = a["considered"][0]["doc"]
    assert s.question_tokens(a["documents"]) == s.doc_tokens([harbour]) + PASSAGES_ROOM + ROOM
    log_id = next(d for d in a["documents"] if d != a["considered"][0]["doc"])
    assert (log_id, 8) in {(c["doc"], c["page"]) for c in a["citations"]}
    rc, report, _ = cli("--json", "cache", json_out=True)
    assert [c["title"] for c in report["caches"]] == ["Harbour"]      # nothing else was read


def test_on_a_backend_that_keeps_nothing_read_the_context_holds_every_document(folder, data_dir):
    """llama.cpp keeps no document read between questions: a question across the folder reads all
    of it, as before, so its context is sized for all of it."""
    s = Session(Paths.resolve(data_dir), {"engine": "llamacpp"})
    ids = _ids(s, folder)
    assert not s.backend_keeps_files()
    assert s.question_tokens(ids) == s.doc_tokens(ids) > 0
    ellm = Session(Paths.resolve(data_dir), {"engine": "ellm"})   # short documents, read at once: all of them too
    assert ellm.backend_keeps_files() and ellm.question_tokens(ids) == ellm.doc_tokens(ids)
