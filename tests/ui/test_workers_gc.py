"""Cycle collection never runs in a worker thread once work has started (a worker that
collects garbage can finalise the GUI thread's Qt objects: a CI segfault)."""
from __future__ import annotations

import gc
import threading
import weakref

from PySide6.QtCore import QThreadPool

from app.ui.workers import Job, start


class _Node:
    pass


def _cycles(count: int) -> None:
    for _ in range(count):
        a, b = _Node(), _Node()
        a.other, b.other = b, a


def test_garbage_made_in_a_worker_is_collected_on_the_gui_thread(qtbot):
    threads = []

    def record(phase, info):
        if phase == "start":
            threads.append(threading.get_ident())

    garbage = _Node()
    garbage.self = garbage
    dead = weakref.ref(garbage)
    del garbage
    pool = QThreadPool()
    gc.callbacks.append(record)
    try:
        job = start(Job(lambda ctl: _cycles(200_000)), pool)  # ~285 automatic collections' worth
        with qtbot.waitSignal(job.signals.sig_finished, timeout=60_000):
            pass
        pool.waitForDone()
        qtbot.waitUntil(lambda: dead() is None, timeout=5_000)  # the timer collected it
    finally:
        gc.callbacks.remove(record)
    assert threads, "nothing was collected"
    assert set(threads) == {threading.main_thread().ident}
