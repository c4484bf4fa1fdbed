"""Steps the window tests share: ingest a folder, ask a question, find a row."""
from __future__ import annotations

from PySide6.QtCore import Qt

ANSWER_TIMEOUT_MS = 180_000  # two cores shared with other work: be patient, never flaky


def ingest(qtbot, window, folder):
    """Ingest ``folder`` through the window and wait until the library shows the result."""
    job = window.ingest([str(folder)])
    # The window clears ingest_job when the job has finished; waiting on that cannot miss a
    # signal emitted before the test could connect to it.
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
    return job


def ask_and_wait(qtbot, window, question: str):
    """Type ``question``, click Ask, wait for the answer; returns (answer, streamed pieces)."""
    window.ask_pane.question.clear()
    qtbot.keyClicks(window.ask_pane.question, question)
    pieces: list[str] = []
    answers: list = []
    pane = window.ask_pane
    # Recorded from the job's start: no early piece is missed, nor the answer of a job that
    # finished while the click was still being processed (a fake service answers at once).
    real_append, real_answered = pane.append, window._answered
    pane.append = lambda piece: (pieces.append(piece), real_append(piece))
    window._answered = lambda answer: (answers.append(answer), real_answered(answer))
    try:
        qtbot.mouseClick(pane.ask_button, Qt.LeftButton)
        assert window.ask_job is not None or answers, window.statusBar().currentMessage()
        qtbot.waitUntil(lambda: window.ask_job is None, timeout=ANSWER_TIMEOUT_MS)
    finally:
        del pane.append, window._answered
    assert len(answers) == 1, window.statusBar().currentMessage()
    return answers[0], pieces


def row_of(window, title: str) -> int:
    t = window.library.table
    for r in range(t.rowCount()):
        if t.item(r, 0).text() == title:
            return r
    raise AssertionError(f"{title} not in the library: {[t.item(r, 0).text() for r in range(t.rowCount())]}")


def doc_id(window, filename: str) -> int:
    return window.session.store.find_documents(filename)[0]["id"]
