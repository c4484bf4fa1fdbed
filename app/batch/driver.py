"""The batch driver: what is left to do, handing it to a pool, and writing what comes back.

The driver is the only writer of a batch's results (app/store/batches.py). It asks the store
which (document, task) pairs the batch already has, sends each unfinished document to the
pool with only its missing tasks, and writes each document's results in one transaction as
it arrives, keyed uniquely and inserted only if new. So killing the driver (or a worker) at
any moment loses at most the documents in flight, the same command picks up there, and no
result is ever written twice. A document that fails is recorded with its reason and the
batch goes on; the next run tries it again.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from app.batch.content import DocumentContent
from app.batch.pools import Pool
from app.batch.spec import BatchSpec, EngineSpec, Task
from app.batch.worker import DocumentJob
from app.store import Store
from app.store import batches
from app.store.batches import ResultRow


@dataclass
class Progress:
    """Where a batch stands, as the command line and the Batch tab show it."""

    done: int            # documents finished (this run and earlier ones)
    total: int           # documents in the batch
    answers: int         # results written by this run
    failed: int          # documents that failed in this run
    elapsed_s: float
    docs_this_run: int = 0   # documents finished by this run (the rate's basis)
    last: str = ""           # the document just finished: its title, or why it failed

    @property
    def answers_per_min(self) -> float:
        return 60.0 * self.answers / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def docs_per_min(self) -> float:
        return 60.0 * self.docs_this_run / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        """Seconds left at this run's pace; None before the first document is done."""
        left = self.total - self.done - self.failed
        if left <= 0:
            return 0.0
        if self.docs_this_run == 0:
            return None
        return left * self.elapsed_s / self.docs_this_run

    def line(self) -> str:
        eta = self.eta_s
        left = "time left unknown" if eta is None else f"about {format_seconds(eta)} left"
        return (f"[{self.done}/{self.total} documents] {self.answers_per_min:.1f} answers/min, {left}, "
                f"{self.failed} failed" + (f" - {self.last}" if self.last else ""))


@dataclass
class BatchReport:
    batch_id: str
    total: int
    done: int
    answers: int                 # results written by this run
    skipped: int                 # documents that were already complete
    failures: list[dict] = field(default_factory=list)   # this batch's failed documents {"doc", "reason"}
    seconds: float = 0.0
    docs_this_run: int = 0
    cancelled: bool = False

    @property
    def complete(self) -> bool:
        return self.done == self.total

    def as_dict(self) -> dict:
        return {"batch": self.batch_id, "documents": self.total, "done": self.done, "answers": self.answers,
                "skipped": self.skipped, "failed": self.failures, "seconds": round(self.seconds, 2),
                "docs_per_min": round(60 * self.docs_this_run / self.seconds, 2) if self.seconds > 0 else 0.0,
                "complete": self.complete, "cancelled": self.cancelled}


def format_seconds(s: float) -> str:
    s = int(round(s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def session_spec(session, target: str, doc_ids, tasks: tuple[Task, ...], params, threads: int) -> BatchSpec:
    """The batch of ``tasks`` over ``doc_ids`` with the session's model and settings (the
    command line's options on top), each worker running ``threads`` threads."""
    from app.qa.doc_cache import model_fingerprint

    s, path = session.settings, session.model_path
    plan = session.batch_plan(doc_ids)     # sized for the largest document: one engine serves them all
    engine = EngineSpec(s.engine, str(path), path.name, plan.n_ctx, threads, s.numa, plan.kv, plan.attention)
    return BatchSpec(target, tuple(doc_ids), tasks, engine, params, model_fingerprint(path))


def pending(store: Store, spec: BatchSpec) -> tuple[list[tuple[int, tuple]], int]:
    """([(doc_id, missing tasks)] of the unfinished documents, how many are complete)."""
    done = batches.done_keys(store, spec.batch_id, spec.model, spec.settings_key)
    todo, complete = [], 0
    for doc_id in spec.doc_ids:
        missing = tuple(t for t in spec.tasks if (doc_id, t.kind, t.question) not in done)
        if missing:
            todo.append((doc_id, missing))
        else:
            complete += 1
    return todo, complete


def run_batch(store: Store, spec: BatchSpec, pool: Pool, on_progress: Callable[[Progress], None] | None = None,
              cancel: Callable[[], bool] | None = None) -> BatchReport:
    """Answer what the batch is missing; returns what this run did."""
    t0 = time.perf_counter()
    batches.open_batch(store, spec.batch_id, spec.as_dict(), len(spec.doc_ids), len(spec.tasks))
    todo, complete = pending(store, spec)
    report = BatchReport(spec.batch_id, len(spec.doc_ids), complete, 0, complete)
    titles = {d["id"]: d["title"] or d["path"] for d in store.documents()}
    failed = 0
    missing_of = dict(todo)

    finished: set[int] = set()

    def jobs() -> Iterator[DocumentJob]:
        # Read lazily: a pool takes a document's content only when a worker is ready for it.
        nonlocal failed
        for doc_id, missing in todo:
            try:
                content = DocumentContent.from_store(store, doc_id)
            except KeyError as e:   # removed from the library since the batch was resolved
                batches.record_failure(store, spec.batch_id, doc_id, str(e).strip("'\""))
                failed += 1
                continue
            yield DocumentJob(content, missing)

    def note(what: str) -> None:
        if on_progress is not None:
            on_progress(Progress(report.done, report.total, report.answers, failed,
                                 time.perf_counter() - t0, report.docs_this_run, what))

    if on_progress is not None:
        note("")
    try:
        for outcome in pool.outcomes(jobs(), spec.params, cancel):
            rows = [ResultRow(outcome.doc_id, r["kind"], r["question"], spec.model, spec.settings_key,
                              r["answer"], r["citations"], r.get("engine", ""), outcome.worker, r.get("timings"))
                    for r in outcome.results]
            title = titles.get(outcome.doc_id, str(outcome.doc_id))
            if outcome.error:
                report.answers += batches.add_results(store, spec.batch_id, rows)
                batches.record_failure(store, spec.batch_id, outcome.doc_id, outcome.error)
                failed += 1
                note(f"{title} failed: {outcome.error}")
                continue
            expected = len(missing_of[outcome.doc_id])
            report.answers += batches.add_results(store, spec.batch_id, rows,
                                                  doc_id=outcome.doc_id if len(rows) == expected else None)
            if len(rows) == expected and outcome.doc_id not in finished:  # once, were it delivered twice
                finished.add(outcome.doc_id)
                report.done += 1
                report.docs_this_run += 1
            note(title)
    finally:
        report.seconds = time.perf_counter() - t0
        report.cancelled = bool(cancel and cancel())
        report.failures = [{"doc": f["doc_id"], "title": titles.get(f["doc_id"], ""), "reason": f["reason"],
                            "attempts": f["attempts"]} for f in batches.failures(store, spec.batch_id)]
    return report
