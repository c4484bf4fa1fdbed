"""The Batch tab with the SmolLM2 test model (llama.cpp, one worker in the window's process):
every question of every document of the library, results in the table, a row opening its cited
page in the viewer, a second run skipping what is done, and the export."""
from __future__ import annotations

import json
from types import SimpleNamespace

from PySide6.QtCore import Qt

from app.qa.targets import EVERYTHING
from app.settings import Settings
from app.store import batches
from tests.ui.helpers import ANSWER_TIMEOUT_MS, ingest

QUESTIONS = ["When was the treaty signed?"]


def run_and_wait(qtbot, tab):
    qtbot.mouseClick(tab.run_button, Qt.LeftButton)
    assert tab.job is not None, tab.status.text()
    assert not tab.run_button.isEnabled() and tab.stop_button.isEnabled()
    qtbot.waitUntil(lambda: tab.job is None, timeout=ANSWER_TIMEOUT_MS)
    return tab.report


def test_a_batch_fills_the_table_and_a_row_opens_the_cited_page(qtbot, window, corpus, tmp_path):
    # Short answers: the table is what is tested (the window's fixture settings otherwise).
    window.session.save_settings(Settings(engine="llamacpp", n_ctx=2048, max_tokens=16, temperature=0.0))
    ingest(qtbot, window, corpus)
    tab = window.batch_tab
    window.tabs.setCurrentWidget(tab)
    tab.target_combo.setCurrentIndex(tab.target_combo.findData(EVERYTHING))
    for q in QUESTIONS:
        qtbot.keyClicks(tab.questions, q)
        qtbot.keyClick(tab.questions, Qt.Key_Return)
    report = run_and_wait(qtbot, tab)
    ingested = [d for d in window.session.store.documents() if d["status"] == "ingested"]
    assert report is not None and report.complete and report.total == len(ingested) == 4
    assert report.answers == 4 and tab.table.rowCount() == 4
    assert "Done: 4 of 4 documents" in tab.status.text()
    stored = batches.results(window.session.store, tab.batch_id)
    assert sorted((r["doc_id"], r["question"]) for r in stored) == sorted(
        (d["id"], q) for d in ingested for q in QUESTIONS)
    # The row of the treaty's question opens a page the answer cites.
    row = next(i for i in range(tab.table.rowCount()) if tab.table.item(i, 0).text() == "River Treaty History"
               and tab.table.item(i, 1).text() == QUESTIONS[0])
    doc_id, page, _ = tab.table.item(row, 0).data(Qt.UserRole)
    assert page >= 1 and tab.table.item(row, 3).text() == str(page)
    tab.open_row(row)
    assert window.viewer.doc_id == doc_id and window.viewer.page == page
    assert "River Treaty History, page" in window.statusBar().currentMessage()
    # Run again: the same batch, nothing left to answer.
    again = run_and_wait(qtbot, tab)
    assert (again.skipped, again.answers) == (4, 0) and tab.table.rowCount() == 4
    out = tab.export_to(str(tmp_path / "batch.jsonl"))
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(lines) == 4 and {x["question"] for x in lines} == set(QUESTIONS)


def test_running_without_questions_says_what_to_do(qtbot, window):
    errors = []
    window.batch_tab.sig_error.connect(errors.append)
    assert window.batch_tab.run() is None
    assert errors == ["Write at least one question (one a line), or tick Summarize."]


def test_a_batch_in_the_window_and_an_answer_never_share_the_engine(qtbot, window):
    errors = []
    tab = window.batch_tab
    tab.sig_error.connect(errors.append)
    running = SimpleNamespace(cancel=lambda: None)
    window.ask_job = running             # an answer being written
    tab.questions.setPlainText("Q?")
    try:
        assert tab.run() is None and "An answer or a summary is using the model" in errors[-1]
        window.ask_job = None
        tab.job, tab.in_window = running, True   # a batch running in the window
        assert window.ask("Q?") is None and "A batch is using the model" in window.statusBar().currentMessage()
        window.summary_pane.doc = {"id": 1}
        assert window.summary_pane.summarize() is None
    finally:
        window.ask_job = tab.job = window.summary_pane.doc = None
