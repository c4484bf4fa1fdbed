"""The library pane: failure reasons, several folders, and the watcher that
re-ingests what changed."""
from __future__ import annotations

from PySide6.QtCore import Qt

from tests.docs.make_samples import make_pdf, make_text
from tests.ui.helpers import doc_id, ingest, row_of


def test_a_failing_document_shows_its_reason(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    r = row_of(window, "broken.pdf")
    status = window.library.table.item(r, 3)
    assert status.text().startswith("failed: file is truncated or not a valid PDF")
    assert status.toolTip() == f"broken.pdf\n{corpus / 'broken.pdf'}\n{status.text()}"   # title, path, reason
    assert status.foreground().color() == Qt.darkRed
    window.library.table.selectRow(r)
    details = window.library.details.text()
    assert details == f"{corpus / 'broken.pdf'}\n{status.text()}"
    assert window.library.details.property("failed") is True
    # the viewer says why there is nothing to read instead of showing an empty page
    assert window.viewer.stack.currentWidget() is window.viewer.placeholder
    assert window.viewer.placeholder.text().startswith("No text stored for this document (file is truncated")
    window.library.table.selectRow(row_of(window, "Meeting notes"))
    assert window.library.details.text() == str(corpus / "notes.txt")
    assert window.library.details.property("failed") is False


def test_several_folders_are_remembered_and_filtered(qtbot, window, session, tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir()
    second.mkdir()
    make_text(first / "alpha.txt", "Alpha\n\nThe first folder's only document.\n")
    make_pdf(second / "beta.pdf", ["Beta\n\nA PDF in the second folder."], title="Beta report")
    make_text(second / "gamma.md", "# Gamma\n\nAnother one.\n")
    ingest(qtbot, window, first)
    ingest(qtbot, window, second)
    assert session.store.folders() == [str(first), str(second)]
    combo = window.library.folder_filter
    assert [combo.itemText(i) for i in range(combo.count())] == ["All folders", str(first), str(second)]
    assert window.library.table.rowCount() == 3

    combo.setCurrentIndex(2)
    titles = sorted(window.library.table.item(r, 0).text() for r in range(window.library.table.rowCount()))
    assert titles == ["Beta report", "Gamma"]
    assert window.library.remove_button.isEnabled()

    # a new window (the next run) remembers both folders
    from app.ui.main_window import MainWindow

    later = MainWindow(session)
    qtbot.addWidget(later)
    assert later.library.folder_filter.count() == 3
    assert str(first) in later.watcher.watched() and str(second / "gamma.md") in later.watcher.watched()

    window.library.select_id(doc_id(window, "alpha.txt"))  # not in the shown folder: shows all and selects it
    assert window.library.chosen_folder() is None and window.library.selected_ids() == [doc_id(window, "alpha.txt")]
    combo.setCurrentIndex(1)
    qtbot.mouseClick(window.library.remove_button, Qt.LeftButton)
    assert session.store.folders() == [str(second)]
    assert window.library.folder_filter.count() == 2
    assert str(first) not in window.watcher.watched()
    assert window.library.table.rowCount() == 3, "the documents stay in the library"


def test_the_watcher_reingests_a_modified_file(qtbot, window, corpus, session, monkeypatch):
    ingest(qtbot, window, corpus)
    notes = corpus / "notes.txt"
    before = session.store.document_by_path(str(notes))
    assert str(notes) in window.watcher.watched() and str(corpus / "sub") in window.watcher.watched()

    with qtbot.waitSignal(window.watcher.watcher.fileChanged, timeout=10_000):
        with open(notes, "a", encoding="utf-8") as f:
            f.write("\nThe budget was raised to 15 million euros in March.\n")
    assert str(notes) in window.watcher.pending and window.watcher.timer.isActive()
    events = []
    real = window._ingested  # recorded from the job's start: a fast job's report is not missed
    monkeypatch.setattr(window, "_ingested", lambda report: (events.extend(report.events), real(report)))
    assert window.watcher.flush() == [str(corpus)]  # the debounced handler, called now
    job = window.ingest_job
    assert job is not None and not window.watcher.pending
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
    assert [(e.path, e.status) for e in events if e.status != "unchanged"] == [
        (str(corpus / "broken.pdf"), "failed"), (str(notes), "updated")]
    after = session.store.document_by_path(str(notes))
    assert after["id"] == before["id"] and after["content_hash"] != before["content_hash"]
    assert after["tokens"] > before["tokens"]
    assert session.store.search_chunks([after["id"]], "raised March")

    # a new file in a subfolder changes that folder: it is picked up the same way
    with qtbot.waitSignal(window.watcher.watcher.directoryChanged, timeout=10_000):
        make_text(corpus / "sub" / "new.txt", "A new file\n\nIt arrived after the folder was opened.\n")
    assert window.watcher.flush() == [str(corpus)]
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
    row_of(window, "A new file")
    assert str(corpus / "sub" / "new.txt") in window.watcher.watched()


def test_changes_during_an_ingestion_wait_for_it(qtbot, window, corpus):
    job = window.ingest([str(corpus)])
    window.folders_changed([str(corpus)])
    assert window.pending_rescan == [str(corpus)] and window.ingest_job is job
    qtbot.waitUntil(lambda: window.ingest_job is not job, timeout=120_000)
    assert window.pending_rescan == []
    # the queued rescan (if it started) runs after the first one
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=120_000)
