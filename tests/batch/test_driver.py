"""The batch driver without Ray: a pool in this process over a backend without a model
(tests/qa/fake_backend.py). Resuming after a crash, results delivered twice, a document that
fails, the document's prefix computed once for all its questions, progress, and the export."""
from __future__ import annotations

import csv
import json

import pytest

from app.batch.driver import pending, run_batch
from app.batch.results_file import BatchExportError, export_rows, format_for, write_results
from app.batch.pools import LocalPool
from app.batch.spec import SUMMARY, BatchSpec, EngineSpec, tasks_from
from app.batch.worker import DocumentWorker
from app.engine.backend import SamplingParams
from app.store import Store
from app.store import batches
from tests.qa.fake_backend import FakeBackend
from tests.qa.test_answer_service import add_document

QUESTIONS = ["Who kept the lamp?", "When did the storm come?"]


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "ellm.db")
    yield s
    s.close()


@pytest.fixture
def docs(store):
    return [add_document(store, f"/docs/log{i}.txt", f"Log {i}",
                         [f"Keeper {i} kept the lamp of lighthouse {i}.", f"The storm of year {1900 + i} came."])
            for i in range(10)]


@pytest.fixture
def model_file(tmp_path):
    path = tmp_path / "fake.gguf"
    path.write_bytes(b"GGUF fake model bytes")
    return path


def make_spec(doc_ids, model_file, questions=QUESTIONS, summarize=False) -> BatchSpec:
    engine = EngineSpec("auto", str(model_file), model_file.name, 4096, 1)
    return BatchSpec("all", tuple(doc_ids), tasks_from(questions, summarize), engine,
                     SamplingParams.make_greedy(16), "fp")


def make_pool(model_file, tmp_path, answer="It was kept [p. 1].", composes=True):
    backend = FakeBackend(model_file, answer=answer, composes=composes)
    return LocalPool(DocumentWorker(make_spec([], model_file).engine, tmp_path / "wcache", backend=backend)), backend


class Crash(Exception):
    pass


class CrashingPool:
    """Delivers ``after`` outcomes, then dies as a killed driver would: nothing more is written."""

    def __init__(self, pool, after: int):
        self.pool, self.after, self.workers, self.threads = pool, after, 1, 1

    def outcomes(self, jobs, params, cancel=None):
        for i, outcome in enumerate(self.pool.outcomes(jobs, params, cancel)):
            if i == self.after:
                raise Crash()
            yield outcome


class TwicePool:
    """Delivers every outcome twice, as a worker retried after answering would."""

    def __init__(self, pool):
        self.pool, self.workers, self.threads = pool, 1, 1

    def outcomes(self, jobs, params, cancel=None):
        for outcome in self.pool.outcomes(jobs, params, cancel):
            yield outcome
            yield outcome


def keys(store, spec):
    return sorted((r["doc_id"], r["question"]) for r in batches.results(store, spec.batch_id))


def test_a_batch_answers_every_document_and_question_once_with_citations(store, docs, model_file, tmp_path):
    spec = make_spec(docs, model_file)
    pool, backend = make_pool(model_file, tmp_path)
    seen = []
    report = run_batch(store, spec, pool, on_progress=seen.append)
    assert report.complete and (report.done, report.total, report.answers, report.skipped) == (10, 10, 20, 0)
    assert keys(store, spec) == sorted((d, q) for d in docs for q in QUESTIONS)
    rows = batches.results(store, spec.batch_id)
    assert all(r["citations"][0] == {"doc": r["doc_id"], "page": 1, "text": r["citations"][0]["text"]}
               for r in rows), "a citation names the driver's document and the page"
    # The document's prefix is computed by its first question and held for the second.
    assert [r["timings"]["kv_cache"] for r in rows[:2]] == ["miss", "hit"]
    assert len(backend.prompts) == 20
    assert [p.done for p in seen] == list(range(11)) and seen[-1].eta_s == 0.0 and seen[-1].failed == 0
    assert seen[-1].answers == 20 and "[10/10 documents]" in seen[-1].line()


def test_after_a_crash_the_same_batch_answers_only_what_is_missing(store, docs, model_file, tmp_path):
    spec = make_spec(docs, model_file)
    pool, backend = make_pool(model_file, tmp_path)
    with pytest.raises(Crash):
        run_batch(store, spec, CrashingPool(pool, after=4))
    assert len(keys(store, spec)) == 8 and len(pending(store, spec)[0]) == 6
    asked = len(backend.prompts)
    report = run_batch(store, make_spec(docs, model_file), pool)
    assert (report.skipped, report.answers, report.done) == (4, 12, 10)
    assert len(backend.prompts) - asked == 12, "only the six unfinished documents were asked again"
    assert keys(store, spec) == sorted((d, q) for d in docs for q in QUESTIONS)
    again = run_batch(store, spec, pool)
    assert (again.skipped, again.answers) == (10, 0)


def test_a_new_question_is_a_new_batch_and_a_partly_answered_document_gets_only_its_missing_tasks(
        store, docs, model_file, tmp_path):
    spec = make_spec(docs[:2], model_file)
    pool, backend = make_pool(model_file, tmp_path)
    batches.open_batch(store, spec.batch_id, spec.as_dict(), 2, 2)
    first = run_batch(store, make_spec(docs[:2], model_file, QUESTIONS[:1]), pool)
    assert first.batch_id != spec.batch_id
    # one question of the first document already in the batch: only the other is asked
    batches.add_results(store, spec.batch_id, [batches.ResultRow(docs[0], "ask", QUESTIONS[0], spec.model,
                                                                 spec.settings_key, "done before", [])])
    asked = len(backend.prompts)
    report = run_batch(store, spec, pool)
    assert len(backend.prompts) - asked == 3 and report.answers == 3
    assert [r["answer"] for r in batches.results(store, spec.batch_id)][0] == "done before"


def test_results_delivered_twice_are_written_once(store, docs, model_file, tmp_path):
    spec = make_spec(docs, model_file)
    pool, _ = make_pool(model_file, tmp_path)
    report = run_batch(store, spec, TwicePool(pool))
    assert report.answers == 20 and len(batches.results(store, spec.batch_id)) == 20
    assert (report.done, report.docs_this_run) == (10, 10) and report.complete


def test_a_document_that_fails_is_recorded_with_its_reason_and_the_batch_goes_on(store, docs, model_file, tmp_path):
    empty = store.save_document({"path": "/docs/empty.txt", "title": "Empty", "status": "ingested"}, [], [])
    spec = make_spec([docs[0], empty, docs[1]], model_file)
    pool, _ = make_pool(model_file, tmp_path)
    report = run_batch(store, spec, pool)
    assert not report.complete and (report.done, report.answers) == (2, 4)
    assert [(f["doc"], f["attempts"]) for f in report.failures] == [(empty, 1)]
    assert "no text in the store" in report.failures[0]["reason"]
    assert run_batch(store, spec, pool).failures[0]["attempts"] == 2, "the next run tries it again"


def test_a_document_removed_before_its_turn_is_a_failure_not_a_crash(store, docs, model_file, tmp_path):
    spec = make_spec([docs[0], 999, docs[1]], model_file)
    pool, _ = make_pool(model_file, tmp_path)
    report = run_batch(store, spec, pool)
    assert report.done == 2 and [(f["doc"], f["reason"]) for f in report.failures] == [
        (999, f"no document with id 999 in {store.path}")]


def test_summaries_are_a_task_of_their_own(store, docs, model_file, tmp_path):
    spec = make_spec(docs[:2], model_file, questions=[], summarize=True)
    pool, _ = make_pool(model_file, tmp_path, answer="Keeper 0 kept the lamp [p. 1].", composes=False)
    run_batch(store, spec, pool)
    rows = batches.results(store, spec.batch_id)
    assert [(r["kind"], r["question"]) for r in rows] == [(SUMMARY, ""), (SUMMARY, "")]
    assert rows[0]["answer"] == "Keeper 0 kept the lamp [p. 1]." and rows[0]["citations"][0]["page"] == 1


def test_the_export_formats_hold_the_same_rows(store, docs, model_file, tmp_path):
    spec = make_spec(docs[:3], model_file)
    pool, _ = make_pool(model_file, tmp_path)
    run_batch(store, spec, pool)
    rows = export_rows(batches.results(store, spec.batch_id))
    write_results(tmp_path / "out.jsonl", rows)
    lines = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and set(lines[0]) == {"batch", "doc", "title", "path", "kind", "question", "answer",
                                                  "citations", "model", "engine", "settings", "worker",
                                                  "created_at"}
    assert lines[0]["title"] == "Log 0" and lines[0]["citations"][0]["page"] == 1
    write_results(tmp_path / "out.csv", rows)
    with open(tmp_path / "out.csv", newline="") as f:
        table = list(csv.DictReader(f))
    assert [(int(r["doc"]), r["question"]) for r in table] == [(r["doc"], r["question"]) for r in lines]
    assert table[0]["pages"] == f"{docs[0]}:1" and json.loads(table[0]["citations"]) == lines[0]["citations"]
    write_results(tmp_path / "out.md", rows)
    md = (tmp_path / "out.md").read_text()
    assert md.count("## Log") == 3 and md.count(f"### {QUESTIONS[0]}") == 3 and "- p. 1" in md
    with pytest.raises(BatchExportError, match="must end in .csv, .jsonl or .md"):
        format_for(tmp_path / "out.txt")


def test_the_key_ignores_speed_and_names_what_changes_answers(model_file):
    a = make_spec([1, 2], model_file)
    faster = BatchSpec(a.target, a.doc_ids, a.tasks, EngineSpec("auto", "/elsewhere/fake.gguf", "fake.gguf", 4096, 8),
                       a.params, a.model_fingerprint)
    assert faster.batch_id == a.batch_id and faster.settings_key == a.settings_key
    longer = BatchSpec(a.target, a.doc_ids, a.tasks, a.engine, SamplingParams.make_greedy(32), a.model_fingerprint)
    assert longer.batch_id != a.batch_id and longer.settings_key != a.settings_key
    assert tasks_from(["  Q  ", "Q", "", "R"], False) == tasks_from(["Q", "R"], False)
