"""The main window driven through its real widgets (pytest-qt, offscreen)."""
from __future__ import annotations

import subprocess
import sys

from PySide6.QtCore import Qt

from app.settings import Settings
from tests.ui.helpers import ingest


def status_of(window, title):
    t = window.library.table
    for r in range(t.rowCount()):
        if t.item(r, 0).text() == title:
            return t.item(r, 3).text()
    raise AssertionError(f"{title} not in the library")


def test_ingest_shows_documents_and_failure_reasons(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    assert window.library.table.rowCount() == 5
    assert status_of(window, "River Treaty History") == "ingested"
    assert status_of(window, "broken.pdf").startswith("failed: file is truncated or not a valid PDF")
    assert window.session.store.folders() == [str(corpus)]
    assert not window.library.progress.isVisible()


def test_ingest_can_be_cancelled(qtbot, window, corpus, monkeypatch):
    reports = []
    real = window._ingested  # recorded from the job's start: a fast job's report is not missed
    monkeypatch.setattr(window, "_ingested", lambda report: (reports.append(report), real(report)))
    job = window.ingest([str(corpus)])
    job.cancel()
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=60_000)
    assert len(reports) == 1
    assert reports[0].cancelled is True
    assert len(reports[0].events) < 5


def test_ask_streams_an_answer_with_clickable_citations(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    doc = window.session.store.find_documents("treaty.pdf")[0]
    window.library.select_id(doc["id"])
    assert window.ask_pane.heading.text() == "River Treaty History"
    qtbot.keyClicks(window.ask_pane.question, "Who kept the lighthouse lamp burning?")
    pieces = []
    with qtbot.waitSignal(window.ask_pane.sig_ask, timeout=5_000):
        qtbot.mouseClick(window.ask_pane.ask_button, Qt.LeftButton)
    job = window.ask_job
    job.signals.sig_text.connect(pieces.append)
    assert window.ask_pane.stop_button.isEnabled()
    qtbot.waitUntil(lambda: window.ask_job is None, timeout=120_000)
    assert window.ask_pane.citations.count() >= 1
    assert "prompt tokens" in window.ask_pane.stats.text()
    assert window.session.store.answers(doc_id=doc["id"])
    item = window.ask_pane.citations.item(0)
    with qtbot.waitSignal(window.ask_pane.sig_citation) as clicked:
        qtbot.mouseClick(window.ask_pane.citations.viewport(), Qt.LeftButton,
                         pos=window.ask_pane.citations.visualItemRect(item).center())
    assert clicked.args[0] == doc["id"] and 1 <= clicked.args[1] <= 3


def test_stop_cancels_the_answer(qtbot, window, corpus, session):
    session.save_settings(Settings(engine="llamacpp", n_ctx=2048, max_tokens=400, temperature=0.0))
    ingest(qtbot, window, corpus)
    window.library.select_id(window.session.store.find_documents("treaty.pdf")[0]["id"])
    window.ask_pane.question.setText("Describe everything in the document in great detail.")
    window.ask_pane.ask_button.click()
    job = window.ask_job
    with qtbot.waitSignal(job.signals.sig_text, timeout=120_000):
        pass
    qtbot.mouseClick(window.ask_pane.stop_button, Qt.LeftButton)
    with qtbot.waitSignal(job.signals.sig_done, timeout=60_000) as done:
        pass
    answer = done.args[0]
    assert answer.cancelled is True
    assert answer.timings["decode_tokens"] < 400
    assert "(stopped)" in window.ask_pane.answer.toHtml()


def test_asking_without_a_selection_shows_a_message(qtbot, window):
    window.ask_pane.question.setText("anything")
    window.ask_pane.ask_button.click()
    assert window.ask_job is None
    assert "Select a document" in window.statusBar().currentMessage()


def test_screenshot_command_writes_a_png(corpus, data_dir, tmp_path):
    shot = tmp_path / "shot.png"
    env_cmd = [sys.executable, "-m", "app", "--data-dir", str(data_dir)]
    subprocess.run([*env_cmd, "ingest", str(corpus)], check=True, capture_output=True)
    out = subprocess.run([*env_cmd, "gui", "--screenshot", str(shot)], capture_output=True, text=True,
                         env={**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen"})
    assert out.returncode == 0, out.stderr
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000
    from PySide6.QtGui import QImage

    img = QImage(str(shot))
    assert (img.width(), img.height()) == (1200, 760)
