"""Reading ahead in the window: the documents of the library read into their KV caches in the
background, one at a time, so that the first question about each starts answering at once
(app/qa/reading.py does the reading; this is its Qt side).

It starts after ingestion and when the window opens, yields to the person: a question or a
summary pauses it (``suspend``) and it carries on afterwards (``carry_on``), with the documents
just asked about first (``prefer``: their first answer came from passages, the next one should
see all of them); *Pause reading* stops it until the person resumes. Each document's state goes to the library
(``sig_state``: "reading 42 %, 3 min left", "read").
"""
from __future__ import annotations

from PySide6.QtCore import QObject, QThreadPool, Signal

from app.qa.reading import MEMORY_ONLY, NOT_READ, READ, STOPPED, read_states, reading_order
from app.ui.workers import Job, JobControl, start


class ReadAhead(QObject):
    sig_state = Signal(int, str)
    """(document id, its reading state for the library)."""
    sig_idle = Signal()
    """Nothing is being read (every document read, paused, or suspended)."""

    def __init__(self, session, pool: QThreadPool, parent=None):
        super().__init__(parent)
        self.session, self.pool = session, pool
        self.job: Job | None = None
        self.paused = False
        self.suspended = 0
        self.preferred: list[int] = []     # documents to read before the others
        self._doc: int | None = None

    # ---- Public API --------------------------------------------------------

    def states(self) -> dict[int, str]:
        try:
            return read_states(self.session.store, self.session.model_path)
        except Exception:   # no model yet: nothing is read
            return {}

    def queue(self) -> list[int]:
        """The documents still to read, in the order reading ahead takes them (qa/reading.py)."""
        states = self.states()
        docs = [d for d in self.session.store.documents()
                if states.get(d["id"]) == NOT_READ and d["status"] == "ingested" and d["pages"] > 0]
        return [d["id"] for d in reading_order(docs, self.preferred)]

    def start(self) -> Job | None:
        """Read the documents not read yet (nothing when paused, suspended or already reading)."""
        if self.paused or self.suspended or self.job is not None:
            return self.job
        try:
            if not self.session.backend_keeps_files():
                return None   # llama.cpp or gemma3's contiguous cache: nothing would persist
        except Exception:
            return None
        todo = self.queue()
        if not todo:
            return None
        session = self.session

        def work(ctl: JobControl):
            from app.qa.doc_cache import DocCaches, store_cache_dir

            caches = DocCaches(session.store, store_cache_dir(session.store))
            done = []
            for i, doc_id in enumerate(todo):
                if ctl.cancelled():
                    break
                with session.engine_lock:
                    result = session.read(doc_id, caches, cancel=ctl.cancelled,
                                          progress=lambda d, t, line, doc=doc_id: ctl.progress(d, t, f"{doc}\t{line}"),
                                          nth=i + 1, of=len(todo), ahead=True)
                done.append(result)
                ctl.progress(1, 1, f"{doc_id}\t{result.status}")
                if result.status == STOPPED:     # its share of the cache budget is full
                    break
            return done

        job = Job(work)
        job.signals.sig_progress.connect(self._progress)
        job.signals.sig_finished.connect(self._finished)
        self.job = start(job, self.pool)
        return job

    def pause(self) -> None:
        """The person paused reading: stop after the current chunk, until ``resume``."""
        self.paused = True
        self._stop()

    def resume(self) -> None:
        self.paused = False
        self.start()

    def prefer(self, doc_ids) -> None:
        """Read these documents next (a question was asked about them)."""
        self.preferred = list(dict.fromkeys([*doc_ids, *self.preferred]))

    def suspend(self) -> None:
        """A question or a summary needs the engine: stop reading after the current chunk."""
        self.suspended += 1
        self._stop()

    def carry_on(self) -> None:
        self.suspended = max(0, self.suspended - 1)
        self.start()

    def stop(self) -> None:
        """The window closes."""
        self.paused = True
        self._stop()

    # ---- Internals ---------------------------------------------------------

    def _stop(self) -> None:
        if self.job is not None:
            self.job.cancel()
            if self._doc is not None:
                self.sig_state.emit(self._doc, "paused" if self.paused else NOT_READ)

    def _progress(self, done: int, total: int, what: str) -> None:
        doc, _, line = what.partition("\t")
        self._doc = int(doc)
        if line in (READ, "already read"):
            self.sig_state.emit(self._doc, READ)
            self._doc = None
        elif line in (STOPPED, NOT_READ, "kept in memory"):   # NOT_READ: larger than the whole cache budget
            self.sig_state.emit(self._doc, NOT_READ if line == STOPPED else MEMORY_ONLY)
            self._doc = None
        elif total > 0 and line.startswith("reading"):
            left = line.rsplit(", ", 1)[1] if line.endswith(" left") else ""
            self.sig_state.emit(self._doc, f"reading {100 * done // total} %" + (f", {left}" if left else ""))

    def _finished(self) -> None:
        self.job = None
        self._doc = None
        self.sig_idle.emit()
