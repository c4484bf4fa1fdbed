"""The whole flow through real widgets: open a folder -> ingest -> ask -> stop ->
click a citation (the viewer shows the page with the passage highlighted) -> a
summary exported as Markdown, PDF and DOCX."""
from __future__ import annotations

import docx
import pymupdf
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QKeySequence
from PySide6.QtWidgets import QApplication, QFileDialog

from app.settings import Settings
from tests.ui.conftest import FAST
from tests.ui.helpers import ANSWER_TIMEOUT_MS, ask_and_wait, doc_id, row_of


def is_highlight(color) -> bool:
    """The translucent yellow over white paper: red and green high, blue clearly lower."""
    return color.red() > 200 and color.green() > 180 and color.blue() < 200


def test_open_ingest_ask_stop_cite_and_export(qtbot, window, corpus, session, monkeypatch, tmp_path):
    # ---- Open folder (Ctrl+O) -> ingestion in the background with progress
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(corpus))
    assert window.open_action.shortcut() == QKeySequence(QKeySequence.Open)
    progress: list[tuple[int, int, str]] = []
    real_ingest_progress = window._ingest_progress  # recorded from the job's start (see below)
    monkeypatch.setattr(window, "_ingest_progress", lambda *a: (progress.append(a), real_ingest_progress(*a)))
    window.open_action.trigger()
    job = window.ingest_job
    assert job is not None and window.library.progress.isVisible() and window.library.cancel_button.isVisible()
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
    assert [p[:2] for p in progress][-1] == (5, 5)
    assert any("treaty.pdf: ingested (3 pages, 105 tokens)" in p[2] for p in progress)
    assert window.library.table.rowCount() == 5
    assert window.session.store.folders() == [str(corpus)]
    assert "4 ingested, 0 unchanged, 1 failed" in window.library.current.text()

    # ---- Ask: the answer streams, with sources and timings
    treaty = doc_id(window, "treaty.pdf")
    window.library.table.selectRow(row_of(window, "River Treaty History"))
    assert window.viewer.doc_id == treaty and window.viewer.is_pdf() and window.viewer.page == 1
    answer, pieces = ask_and_wait(qtbot, window, "Who kept the lighthouse lamp burning?")
    assert len(pieces) >= 2 and "".join(pieces).strip() == answer.answer
    assert not answer.cancelled and answer.citations
    assert window.ask_pane.citations.count() == len(answer.citations)
    stats = window.ask_pane.stats.text()
    assert "prompt tokens" in stats and "first token after" in stats and "tokens/s" in stats

    # ---- Ask again and stop it with Esc
    session.save_settings(FAST.with_(max_tokens=400))
    window.ask_pane.question.setText("Describe everything in the document in great detail.")
    qtbot.mouseClick(window.ask_pane.ask_button, Qt.LeftButton)
    job = window.ask_job
    assert window.ask_pane.stop_button.isEnabled() and not window.ask_pane.ask_button.isEnabled()
    with qtbot.waitSignal(job.signals.sig_text, timeout=ANSWER_TIMEOUT_MS):
        pass
    assert window.stop_action.shortcut() == QKeySequence(Qt.Key_Escape)
    window.stop_action.trigger()
    with qtbot.waitSignal(job.signals.sig_done, timeout=ANSWER_TIMEOUT_MS) as done:
        pass
    qtbot.waitUntil(lambda: window.ask_job is None)
    assert done.args[0].cancelled is True and done.args[0].timings["decode_tokens"] < 400
    assert "(stopped)" in window.ask_pane.answer.toHtml()
    assert window.ask_pane.ask_button.isEnabled() and not window.ask_pane.stop_button.isEnabled()

    # ---- One conversation of two turns; the first turn's sources come back on a click of its question
    threads = window.ask_pane.threads.entries()
    assert [(t.title, t.turns) for t in threads] == [("Who kept the lighthouse lamp burning?", 2)]
    shown = window.ask_pane.answer.toPlainText()
    assert shown.index("Who kept the lighthouse lamp burning?") < shown.index("Describe everything")
    window.ask_pane.answer.anchorClicked.emit(QUrl("turn:0"))
    assert window.ask_pane.citations.count() == len(answer.citations)

    # ---- Click a citation: the viewer shows that page with the passage highlighted
    window.viewer.show_page(3 if answer.citations[0]["page"] != 3 else 1)
    cited = answer.citations[0]
    item = window.ask_pane.citations.item(0)
    with qtbot.waitSignal(window.ask_pane.sig_citation) as clicked:
        qtbot.mouseClick(window.ask_pane.citations.viewport(), Qt.LeftButton,
                         pos=window.ask_pane.citations.visualItemRect(item).center())
    assert clicked.args == [treaty, cited["page"], cited["text"]]
    viewer = window.viewer
    assert viewer.doc_id == treaty and viewer.page == cited["page"]
    assert viewer.page_box.value() == cited["page"]
    assert viewer.highlight_rects, "the cited passage is highlighted on the page"
    z = viewer.effective_zoom()
    r = viewer.highlight_rects[0]
    assert is_highlight(viewer.rendered.pixelColor(int((r.x() + 1) * z), int((r.y() + r.height() / 2) * z)))
    assert not is_highlight(viewer.rendered.pixelColor(5, viewer.rendered.height() - 5))

    # ---- Summary: made in the background, exported in each format, copied
    session.save_settings(FAST)
    window.tabs.setCurrentWidget(window.summary_pane)
    pane = window.summary_pane
    assert pane.doc["id"] == treaty and pane.summarize_button.isEnabled()
    assert not pane.export_buttons["pdf"].isEnabled()  # nothing to export yet
    steps = []
    # Listen from the job's start: connecting after the click would miss what a fast job
    # reports before the connection exists.
    real_progress = pane._progress
    monkeypatch.setattr(pane, "_progress", lambda *a: (steps.append(a), real_progress(*a)))
    qtbot.mouseClick(pane.summarize_button, Qt.LeftButton)
    qtbot.waitUntil(lambda: pane.job is None, timeout=ANSWER_TIMEOUT_MS)
    assert steps[0] == (0, 1, "summarizing the whole document")
    text = pane.text.toPlainText()
    assert text and pane.summary["text"] == text and "single pass" in pane.method.text()
    assert window.session.store.summaries(treaty)[0]["summary"] == text

    md = pane.export_to(tmp_path / "out" / "treaty.md")
    body = md.read_text(encoding="utf-8")
    assert body.startswith("# Summary: River Treaty History\n") and text.strip() in body
    assert f"Source: {corpus / 'treaty.pdf'}" in body

    saved = tmp_path / "out" / "chosen.pdf"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(saved), "PDF (*.pdf)"))
    qtbot.mouseClick(pane.export_buttons["pdf"], Qt.LeftButton)
    with pymupdf.open(saved) as pdf:
        pdf_text = " ".join(page.get_text() for page in pdf)
    assert "Summary: River Treaty History" in pdf_text
    assert " ".join(text.split()[:5]) in " ".join(pdf_text.split())
    assert "exported to" in window.statusBar().currentMessage()

    word = pane.export_to(tmp_path / "out" / "treaty.docx")
    paragraphs = [p.text for p in docx.Document(str(word)).paragraphs]
    assert paragraphs[0] == "Summary: River Treaty History"
    assert " ".join(paragraphs[2:]).split() == text.split()

    qtbot.mouseClick(pane.copy_button, Qt.LeftButton)
    assert QApplication.clipboard().text() == text


def test_a_long_document_is_summarized_section_by_section_and_can_be_cancelled(qtbot, window, session,
                                                                                tmp_path, monkeypatch):
    from tests.docs.make_samples import make_text

    # A small context makes "long" cheap: sections of ~350 tokens (a prefill cannot be interrupted).
    session.save_settings(FAST.with_(n_ctx=512))
    folder = tmp_path / "long"
    folder.mkdir()
    paragraph = ("The committee met in the harbour office and discussed the tolls, the locks, the barges "
                 "and the lighthouse, and every member spoke at length about the river. ")
    make_text(folder / "minutes.txt", "\n\n".join(f"Section {i}\n\n" + paragraph * 3 for i in range(8)))
    job = window.ingest([str(folder)])
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
    window.library.select_id(doc_id(window, "minutes.txt"))
    window.tabs.setCurrentWidget(window.summary_pane)
    pane = window.summary_pane
    seen: list[str] = []  # progress recorded from the job's start: a fast first step is not missed
    real_progress = pane._progress
    monkeypatch.setattr(pane, "_progress", lambda step, steps, what: (seen.append(what),
                                                                      real_progress(step, steps, what)))
    job = pane.summarize()
    qtbot.waitUntil(lambda: any(w.startswith("section 1 of") for w in seen), timeout=ANSWER_TIMEOUT_MS)
    assert pane.progress.isVisible() and pane.step.text().startswith("Section 1 of")
    assert pane.cancel_button.isEnabled() and not pane.summarize_button.isEnabled()
    qtbot.mouseClick(pane.cancel_button, Qt.LeftButton)
    with qtbot.waitSignal(job.signals.sig_done, timeout=ANSWER_TIMEOUT_MS) as done:
        pass
    qtbot.waitUntil(lambda: pane.job is None)
    assert done.args[0].cancelled is True
    assert pane.step.text() == "Cancelled; nothing was saved."
    assert window.session.store.summaries(doc_id(window, "minutes.txt")) == []
    assert not pane.progress.isVisible() and pane.summarize_button.isEnabled()


def test_errors_are_messages_not_tracebacks(qtbot, window, session, corpus):
    from tests.ui.helpers import ingest

    ingest(qtbot, window, corpus)
    session.save_settings(Settings(model="/nonexistent/model.gguf", engine="llamacpp", n_ctx=2048))
    window.library.select_id(doc_id(window, "treaty.pdf"))
    window.ask_pane.question.setText("Anything?")
    window.ask_pane.ask_button.click()
    qtbot.waitUntil(lambda: window.ask_job is None, timeout=30_000)  # the job clears it when finished
    message = window.statusBar().currentMessage()
    assert message.startswith("/nonexistent/model.gguf: no such model file")
    assert "Traceback" not in message
    assert window._error_box.isVisible() and not window._error_box.isModal()
    assert window._error_box.text() == message
    assert window.summary_pane.export_to(window.session.paths.root / "x.md") is None
    assert window.statusBar().currentMessage() == "There is no summary to export yet: click Summarize first."
