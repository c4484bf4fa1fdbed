"""Running long work off the GUI thread, with progress and cancel.

A ``Job`` wraps a plain function from the services layer. The function gets a
``JobControl`` through which it reports progress and streamed text and asks
whether it should stop; the GUI hears about it through the job's signals.
"""
from __future__ import annotations

import gc
import threading
import traceback
from typing import Callable

from PySide6.QtCore import QCoreApplication, QObject, QRunnable, QThreadPool, QTimer, Signal

COLLECT_EVERY_MS = 200


class JobSignals(QObject):
    sig_progress = Signal(int, int, str)
    """(done, total, what) — as work advances."""
    sig_text = Signal(str)
    """A piece of streamed text (answer tokens)."""
    sig_stats = Signal(float, float)
    """(tokens/s, GB/s read) — the engine's own decode figures while it generates."""
    sig_done = Signal(object)
    """The function's return value."""
    sig_error = Signal(str)
    """A message a person can read; the traceback goes to stderr only."""
    sig_finished = Signal()
    """Always emitted last, after done or error."""


class JobControl:
    def __init__(self, signals: JobSignals):
        self._signals = signals
        self._cancel = threading.Event()

    def progress(self, done: int, total: int, what: str = "") -> None:
        self._emit(self._signals.sig_progress, done, total, what)

    def text(self, piece: str) -> None:
        self._emit(self._signals.sig_text, piece)

    def stats(self, tok_s: float, gb_s: float) -> None:
        self._emit(self._signals.sig_stats, float(tok_s), float(gb_s))

    def _emit(self, signal, *args) -> None:
        """Emit, or stop the work when nobody can hear it any more (the window that
        started it was closed and its signal object deleted)."""
        try:
            signal.emit(*args)
        except RuntimeError:
            self._cancel.set()

    def cancel(self) -> None:
        self._cancel.set()

    def cancelled(self) -> bool:
        return self._cancel.is_set()


class Job(QRunnable):
    def __init__(self, fn: Callable[[JobControl], object]):
        super().__init__()
        self.fn = fn
        self.signals = JobSignals()
        self.control = JobControl(self.signals)
        self.setAutoDelete(False)

    def run(self) -> None:
        emit = self.control._emit
        try:
            result = self.fn(self.control)
        except Exception as e:  # shown as a message, never a traceback dialog
            traceback.print_exc()
            message = str(e) or type(e).__name__
            emit(self.signals.sig_error, message)
        else:
            emit(self.signals.sig_done, result)
        finally:
            emit(self.signals.sig_finished)

    def cancel(self) -> None:
        self.control.cancel()


class MainThreadCollector(QObject):
    """Python's cycle collector, run only on the GUI thread.

    Left automatic, the collector runs in whichever thread happens to allocate when a
    generation's count passes its threshold: often a worker deep in an ingestion or a
    prefill. It then finalises whatever garbage exists, including Qt objects that belong
    to the GUI thread (a closed viewer's timers and pixmaps); Qt forbids that ("Timers
    cannot be stopped from another thread") and it can crash the process (CI: a
    segfault while "Garbage-collecting" inside an ingestion worker). So automatic
    collection is switched off and a GUI-thread timer does what it would have done: the
    same generations at the same thresholds, checked every ``COLLECT_EVERY_MS``.
    The same remedy as pyqtgraph's GarbageCollector."""

    def __init__(self, parent: QObject):
        super().__init__(parent)
        gc.disable()
        self.timer = QTimer(self)
        self.timer.timeout.connect(self.collect_due)
        self.timer.start(COLLECT_EVERY_MS)

    def collect_due(self) -> None:
        counts, thresholds = gc.get_count(), gc.get_threshold()  # (3,), (3,)
        for generation in (2, 1, 0):  # the oldest due generation, which includes the younger
            if counts[generation] > thresholds[generation]:
                gc.collect(generation)
                return


_collector: MainThreadCollector | None = None


def collect_on_gui_thread() -> None:
    """Installs the collector once per process (idempotent); called before a worker starts."""
    global _collector
    app = QCoreApplication.instance()
    if _collector is None and app is not None:
        _collector = MainThreadCollector(app)


def start(job: Job, pool: QThreadPool | None = None) -> Job:
    collect_on_gui_thread()
    (pool or QThreadPool.globalInstance()).start(job)
    return job
