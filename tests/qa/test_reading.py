"""Reading ahead, honest time and stored summaries without a model (tests/qa/fake_backend.py):
a document read once is found again; the answer's ttft counts from the question; a summary is
made once per document, model and settings."""
from __future__ import annotations


from app.engine.backend import SamplingParams
from app.qa.answer import ReadingProgress, answer
from app.qa.doc_cache import DocCaches, store_cache_dir
from app.qa.pages import format_pages, load_pages, token_counter
from app.qa.prompt import build_prompt
from app.qa.reading import NOT_READ, READ, read_document, read_states
from app.qa.summarize import summarize
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import PAGES, add_document

PARAMS = SamplingParams.make_greedy(16)


def test_a_document_read_ahead_is_found_by_its_first_question(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    other = add_document(store, "/docs/other.txt", "Other", ["Nothing to see."])
    backend = FakeBackend(model_file, composes=True)
    caches = DocCaches(store, store_cache_dir(store))
    assert read_states(store, model_file) == {doc: NOT_READ, other: NOT_READ}
    seen = []
    first = read_document(store, backend, doc, caches, progress=lambda *r: seen.append(r))
    assert first.status == READ and first.tokens > 0
    assert seen[0][:2] == (0, first.tokens) and seen[-1][:2] == (first.tokens, first.tokens)
    assert seen[0][2].startswith("reading Harbour Log: 0 of ")
    assert read_states(store, model_file) == {doc: READ, other: NOT_READ}
    assert read_document(store, backend, doc, caches).status == "already read"
    backend.cache = []                        # a new process: nothing in memory, the file is there
    a = answer(store, backend, "What was the signal?", [doc], PARAMS)
    assert a.timings["kv_cache"] == "hit"


def test_a_backend_without_prefix_files_keeps_a_read_document_in_memory_only(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    result = read_document(store, FakeBackend(model_file), doc, DocCaches(store, store_cache_dir(store)))
    assert result.status == "kept in memory"
    assert read_states(store, model_file) == {doc: NOT_READ}


def test_ttft_counts_from_the_question_and_lists_its_parts(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    a = answer(store, FakeBackend(model_file, composes=True), "What was the signal?", [doc], PARAMS)
    t = a.timings
    assert t["ttft_s"] == t["first_token_s"] > 0
    assert t["ttft_s"] >= t["prefix_s"] and "engine_ttft_s" in t


def test_reading_progress_says_the_time_left_from_the_rate_so_far():
    lines = []
    clock = iter([100.0, 100.0, 100.0, 110.0])
    reading = ReadingProgress(lambda *r: lines.append(r), "Manual", 2, 3, clock=lambda: next(clock))
    reading(1000, 31000)            # resumed at 1,000 tokens: the rate counts from there
    reading(4000, 31000)            # 3,000 tokens in 10 s -> 27,000 left at 300/s = 90 s
    assert lines[0] == (1000, 31000, "reading Manual (2 of 3): 1,000 of 31,000 tokens")
    assert lines[1] == (4000, 31000, "reading Manual (2 of 3): 4,000 of 31,000 tokens, 2 min left")


def test_a_summary_is_reused_for_the_same_document_model_and_settings(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = FakeBackend(model_file, answer="A logbook of a harbour year [p. 1].", composes=True)
    first = summarize(store, backend, doc, PARAMS)
    assert not first.reused and first.method == "single pass" and first.summary_id is not None
    asked = len(backend.prompts)
    again = summarize(store, backend, doc, PARAMS)
    assert again.reused and again.text == first.text and again.summary_id == first.summary_id
    assert len(backend.prompts) == asked                     # the model did not run
    other = summarize(store, backend, doc, SamplingParams.make_greedy(32))   # other settings: made anew
    assert not other.reused and len(backend.prompts) == asked + 1
    forced = summarize(store, backend, doc, PARAMS, again=True)
    assert not forced.reused and forced.summary_id != first.summary_id


def test_a_whole_document_summary_reads_the_documents_own_cache(store, model_file):
    doc = add_document(store, "/docs/log.txt", "Harbour Log", PAGES)
    backend = FakeBackend(model_file, composes=True)
    answer(store, backend, "What was the signal?", [doc], PARAMS)       # the question reads the document
    backend.cache = []
    summarize(store, backend, doc, PARAMS)
    # The summary's prompt starts with the question's prefix: the same cache file served it.
    prefix = build_prompt(backend, "", format_pages(load_pages(store, [doc], token_counter(backend)))).prefix
    assert backend.prompts[-1][:len(prefix)] == backend.prompts[0][:len(prefix)] == prefix
    assert len(store.kv_caches(doc)) == 1
