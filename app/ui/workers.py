"""Running long work off the GUI thread, with progress and cancel.

A ``Job`` wraps a plain function from the services layer. The function gets a
``JobControl`` through which it reports progress and streamed text and asks
whether it should stop; the GUI hears about it through the job's signals.
"""
from __future__ import annotations

import threading
import traceback
from typing import Callable

from PySide6.QtCore import QObject, QRunnable, QThreadPool, Signal


class JobSignals(QObject):
    sig_progress = Signal(int, int, str)
    """(done, total, what) — as work advances."""
    sig_text = Signal(str)
    """A piece of streamed text (answer tokens)."""
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


def start(job: Job, pool: QThreadPool | None = None) -> Job:
    (pool or QThreadPool.globalInstance()).start(job)
    return job
