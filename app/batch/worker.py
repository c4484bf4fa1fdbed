"""One batch worker: the engine loaded once, then whole documents, one after the other.

For each document the worker builds a store in memory from the document's content
(batch/content.py) and asks every question of it through the answer service the window and
`ellm ask` use (app/qa/answer.py); the KV caches live in the worker's own cache folder, so
the document's prefix is computed once, where the work runs, and every later question of
the document reuses it. A summary goes through app/qa/summarize.py. Nothing is written to
the data directory's store here: the outcome goes back to the driver, which alone writes.

No Ray in this module: batch/ray_pool.py wraps it in an actor, batch/pools.py runs it in
the calling process.
"""
from __future__ import annotations

import os
import shutil
import socket
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.batch.content import DocumentContent
from app.batch.spec import ASK, EngineSpec, Task
from app.engine.backend import SamplingParams


@dataclass(frozen=True)
class DocumentJob:
    content: DocumentContent
    tasks: tuple[Task, ...]      # only those the batch has no result for yet


@dataclass
class DocumentOutcome:
    doc_id: int
    results: list[dict] = field(default_factory=list)  # {"kind", "question", "answer", "citations", ...}
    error: str = ""              # why the document (or its remaining tasks) failed; "" when it did not
    worker: str = ""
    seconds: float = 0.0


class WorkerError(RuntimeError):
    """The worker cannot start: no model file where it runs, or the engine refused it."""


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def locate_model(engine: EngineSpec) -> Path:
    """The model file on this machine: the driver's path when it exists here, else the same
    file name in this machine's models folder (ELLM_DATA_DIR/models or the default)."""
    path = Path(engine.model_path)
    if path.is_file():
        return path
    from app.settings import Paths

    local = Paths.resolve().models_dir / engine.model_name
    if local.is_file():
        return local
    raise WorkerError(f"{worker_name()}: the model {engine.model_name} is neither at {path} nor at {local}; "
                      f"copy it to one of them on every worker machine")


def own_cache_dir() -> Path:
    """This process's cache folder on this machine, ``TMP/ellm-batch-UID/PID``. The folders of
    workers that are gone (killed: nobody deleted theirs) are deleted first."""
    base = Path(tempfile.gettempdir()) / f"ellm-batch-{os.getuid()}"
    base.mkdir(parents=True, exist_ok=True)
    for old in base.iterdir():
        if old.name.isdigit() and int(old.name) != os.getpid() and not Path(f"/proc/{old.name}").exists():
            shutil.rmtree(old, ignore_errors=True)
    mine = base / str(os.getpid())
    mine.mkdir(exist_ok=True)
    return mine


class DocumentWorker:
    """The engine of one worker and the documents it answers."""

    def __init__(self, engine: EngineSpec, cache_dir: str | os.PathLike | None = None, backend=None):
        self.engine_spec = engine
        self.name = worker_name()
        self._own_cache = cache_dir is None
        self.cache_dir = Path(cache_dir) if cache_dir is not None else own_cache_dir()
        if backend is None:
            from app.runtime.backends import Backends
            from app.runtime.model_files import ModelError
            from app.runtime.plan import run_plan

            path = locate_model(engine)
            try:
                backend = Backends().get(run_plan(engine.engine, path, engine.n_ctx, engine.threads, engine.numa,
                                                  kv=engine.kv, attention=engine.attention, documents=True))
            except (ModelError, ValueError) as e:
                raise WorkerError(f"{self.name}: cannot open {path}: {e}") from e
        self.backend = backend

    def run(self, job: DocumentJob, params: SamplingParams, cancel=None) -> DocumentOutcome:
        """Every task of ``job``; a task that fails ends the document with its reason (the
        results before it are kept)."""
        from app.qa.answer import DOCUMENT, AnswerOptions, AskError, answer
        from app.qa.doc_cache import DocCaches
        from app.qa.stream import Listeners
        from app.qa.summarize import SummaryError

        t0 = time.perf_counter()
        out = DocumentOutcome(job.content.doc_id, worker=self.name)
        store = job.content.into_store()
        caches = DocCaches(store, self.cache_dir)
        try:
            for task in job.tasks:
                if cancel is not None and cancel():
                    break
                try:
                    if task.kind == ASK:
                        a = answer(store, self.backend, task.question, [job.content.doc_id], params,
                                   Listeners(cancel=cancel), save=False, caches=caches,
                                   options=AnswerOptions(source=DOCUMENT))
                        if a.cancelled:
                            break
                        out.results.append({"kind": task.kind, "question": task.question, "answer": a.answer,
                                            "citations": a.citations, "engine": a.engine, "timings": a.timings})
                    else:
                        out.results.append(self.summary(store, job.content, params, cancel))
                except (AskError, SummaryError, ValueError) as e:
                    out.error = f"{task.label}: {e}"
                    break
        finally:
            store.close()
            # The document's cache file served all its questions; no later document reads it.
            shutil.rmtree(caches.dir, ignore_errors=True)
        out.seconds = time.perf_counter() - t0
        return out

    def summary(self, store, content: DocumentContent, params: SamplingParams, cancel) -> dict:
        """The summary, with citations: the pages it names, then those its text matches best."""
        from app.qa.citations import cite
        from app.qa.pages import ContextPlan, PageText
        from app.qa.summarize import summarize

        s = summarize(store, self.backend, content.doc_id, params, model_name=self.engine_spec.model_name,
                      cancel=cancel, save=False)
        pages = [PageText(content.doc_id, content.title, n, text, 0) for n, _, text in content.pages]
        citations = cite(store, s.text, content.title, ContextPlan(pages=pages)) if s.text else []
        return {"kind": "summary", "question": "", "answer": s.text, "citations": citations,
                "engine": self.backend.name, "timings": {"total_s": round(s.seconds, 3), "method": s.method}}

    def close(self) -> None:
        if self._own_cache:
            shutil.rmtree(self.cache_dir, ignore_errors=True)
