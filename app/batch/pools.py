"""Where a batch's documents are answered: the interface the driver uses, and the pool that
answers them in the calling process (the window's Batch tab with one worker, and tests that
need no Ray). batch/ray_pool.py is the same interface over Ray actors."""
from __future__ import annotations

from typing import Callable, Iterable, Iterator, Protocol

from app.batch.worker import DocumentJob, DocumentOutcome, DocumentWorker
from app.engine.backend import SamplingParams


def size_workers(workers: int | None, threads: int, cores: int, cluster: bool = False) -> tuple[int, int]:
    """(workers, threads per worker) so that workers x threads <= ``cores`` (this machine's
    physical cores, the engine's thread plan). Without ``workers``: as many workers as the
    threads leave room for (on a cluster 0: as many as its CPUs hold, asked when connected);
    without ``threads`` (0): the cores shared out among the workers."""
    if workers is not None and workers < 1:
        raise ValueError(f"workers must be 1 or more, not {workers}")
    if threads < 0:
        raise ValueError(f"threads must be 0 (one per physical core) or more, not {threads}")
    if workers is None:
        threads = threads or cores
        return (0 if cluster else max(1, cores // threads)), threads
    threads = threads or max(1, cores // workers)
    if not cluster and workers * threads > cores:
        raise ValueError(f"{workers} workers x {threads} threads is more than the {cores} physical cores of this "
                         f"machine; use fewer workers or threads")
    return workers, threads


class Pool(Protocol):
    workers: int
    threads: int      # each worker's threads

    def outcomes(self, jobs: Iterable[DocumentJob], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[DocumentOutcome]:
        """Each job's outcome as it completes (any order); stops taking jobs once ``cancel``."""
        ...

    def close(self) -> None:
        ...


class LocalPool:
    """One worker in this process: the documents one after the other."""

    def __init__(self, worker: DocumentWorker):
        self.worker = worker
        self.workers = 1
        self.threads = getattr(worker.engine_spec, "threads", 0)

    def outcomes(self, jobs: Iterable[DocumentJob], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[DocumentOutcome]:
        for job in jobs:
            if cancel is not None and cancel():
                return
            try:
                yield self.worker.run(job, params, cancel)
            except Exception as e:  # one document's failure is recorded; the batch goes on
                yield DocumentOutcome(job.content.doc_id, error=f"{type(e).__name__}: {e}",
                                      worker=self.worker.name)

    def close(self) -> None:
        self.worker.close()
