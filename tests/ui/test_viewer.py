"""The document viewer: PDF pages rendered with zoom and navigation, text pages
with their structure, citations highlighted, a moved PDF shown from the store."""
from __future__ import annotations

import pymupdf
from PySide6.QtCore import QPointF, Qt
from PySide6.QtGui import QFont

from tests.docs.make_samples import make_image_only_pdf, make_pdf, make_text
from tests.ui.helpers import doc_id, ingest


def test_pdf_pages_render_with_zoom_and_navigation(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    window.library.select_id(doc_id(window, "treaty.pdf"))
    v = window.viewer
    assert v.is_pdf() and v.page == 1 and v.page_count == 3
    assert v.page_total.text() == "of 3" and v.title.text() == "River Treaty History"
    assert v.stack.currentWidget() is v.scroll
    assert not v.prev_button.isEnabled() and v.next_button.isEnabled()
    # an A4 page, fitted to the viewer's width (again after the window settles its size)
    qtbot.waitUntil(lambda: abs(v.image.pixmap().width() - 595 * v.effective_zoom()) <= 2)
    qtbot.waitUntil(lambda: not v._refit.isActive())
    fit = v.effective_zoom()
    width = v.image.pixmap().width()
    assert v.scroll.viewport().width() - 2 * 12 - 30 <= width <= v.scroll.viewport().width() - 2 * 12

    qtbot.mouseClick(v.next_button, Qt.LeftButton)
    assert v.page == 2 and v.page_box.value() == 2
    qtbot.mouseClick(v.zoom_in_button, Qt.LeftButton)
    assert abs(v.zoom - fit * 1.25) < 1e-9
    assert abs(v.image.pixmap().width() - width * 1.25) <= 2
    assert v.zoom_label.text() == f"{fit * 125:.0f}%" and v.fit_button.isEnabled()
    qtbot.mouseClick(v.zoom_out_button, Qt.LeftButton)
    qtbot.mouseClick(v.zoom_out_button, Qt.LeftButton)
    assert abs(v.image.pixmap().width() - width / 1.25) <= 2
    qtbot.mouseClick(v.fit_button, Qt.LeftButton)
    assert v.zoom is None and abs(v.image.pixmap().width() - width) <= 2

    v.page_box.setValue(3)
    assert v.page == 3 and not v.next_button.isEnabled()
    window.next_page_action.trigger()  # Page Down at the last page stays there
    assert v.page == 3
    window.prev_page_action.trigger()
    assert v.page == 2
    v.show_page(99)
    assert v.page == 3


def test_text_pages_keep_their_structure_and_highlight_a_citation(qtbot, window, tmp_path):
    folder = tmp_path / "notes"
    folder.mkdir()
    make_text(folder / "plan.md", "# Harbour plan\n\nThe harbour opens in May.\nBoats pay a small fee.\n\n"
                                  "## Costs\n\nThe new crane costs 40 thousand euros and arrives in June.\n")
    ingest(qtbot, window, folder)
    plan = doc_id(window, "plan.md")
    window.library.select_id(plan)
    v = window.viewer
    assert not v.is_pdf() and v.stack.currentWidget() is v.text and v.page_count == 1
    blocks = []
    block = v.text.document().begin()
    while block.isValid():
        blocks.append((block.text(), block.charFormat().fontWeight() >= QFont.DemiBold))
        block = block.next()
    assert blocks == [("Harbour plan", True), ("The harbour opens in May. Boats pay a small fee.", False),
                      ("Costs", True), ("The new crane costs 40 thousand euros and arrives in June.", False)]

    assert window.show_citation(plan, 1, "The new crane costs 40 thousand euros and arrives in June.")
    assert v.highlighted_text() == "The new crane costs 40 thousand euros and arrives in June."
    # a passage cut short by the citation ("…") across a line break is still found
    assert v.show_citation(plan, 1, "opens in May. Boats pay a…")
    assert v.highlighted_text() == "opens in May. Boats pay a"
    assert not v.show_citation(plan, 1, "nothing like this is on the page at all")
    assert v.highlighted_text() == ""
    assert window.show_citation(plan, 1, "zebra quantum marmalade") is False
    assert "could not be located" in window.statusBar().currentMessage()


def test_a_long_text_page_opens_at_its_top_and_brings_a_cited_passage_to_the_top(qtbot, window, tmp_path):
    folder = tmp_path / "log"
    folder.mkdir()
    entries = [f"Day {i}: the barge number {i} entered the east lock with timber." for i in range(1, 80)]
    make_text(folder / "log.txt", "Lock log\n\n" + "\n\n".join(entries) + "\n")
    ingest(qtbot, window, folder)
    log = doc_id(window, "log.txt")
    window.library.select_id(log)
    v = window.viewer
    bar = v.text.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0)          # longer than the viewer: it scrolls
    assert bar.value() == 0 and v.text.textCursor().position() == 0
    cited = "Day 20: the barge number 20 entered the east lock with timber."
    assert v.show_citation(log, 1, cited) and v.highlighted_text() == cited
    top = v.text.cursorForPosition(v.text.viewport().rect().topLeft()).block().text()
    assert top.startswith(("Day 19", "Day 20")), top      # the passage near the top, not at the bottom edge


def test_a_citation_opens_another_document_and_page(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    window.library.select_id(doc_id(window, "notes.txt"))
    treaty = doc_id(window, "treaty.pdf")
    passage = "The treaty ended in 1901, when the railway made the river tolls useless."
    assert window.viewer.show_citation(treaty, 3, passage)
    v = window.viewer
    assert v.doc_id == treaty and v.page == 3 and v.is_pdf()
    words = [w[4] for w in window.viewer._pdf[2].get_text("words")
             if any(r.contains(QPointF((w[0] + w[2]) / 2, (w[1] + w[3]) / 2)) for r in v.highlight_rects)]
    assert " ".join(words) == "The treaty ended in 1901, when the railway made the river tolls useless."
    assert len(v.highlight_rects) == 1, "one line, one marker stroke"
    v.show_page(2)
    assert not v.has_highlight(), "a highlight belongs to its page"


def test_a_moved_pdf_is_shown_from_the_stored_text(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    (corpus / "treaty.pdf").rename(corpus.parent / "elsewhere.pdf")
    window.library.select_id(doc_id(window, "treaty.pdf"))
    v = window.viewer
    assert not v.is_pdf() and v.stack.currentWidget() is v.text and v.page_count == 3
    assert v.note.text().startswith("Cannot render the PDF") and "stored text" in v.note.text()
    assert v.show_citation(v.doc_id, 2, "Marta Quill, who kept the lamp")
    assert v.highlighted_text() == "Marta Quill, who kept the lamp"


LETTER = "Dear council,\nthe bridge tolls must fall by half this spring."


def test_a_citation_on_a_scanned_page_highlights_the_recognised_words(qtbot, window, tmp_path):
    folder = tmp_path / "scans"
    folder.mkdir()
    make_image_only_pdf(folder / "letter.pdf", [LETTER], height=120)
    ingest(qtbot, window, folder)
    letter = doc_id(window, "letter.pdf")
    v = window.viewer
    assert v.show_citation(letter, 1, "the bridge tolls must fall by half this spring.")
    assert v.is_pdf() and v._pdf[0].get_text("words") == []  # the page has no words of its own
    assert v.note.text() == "This page is a scan: its text was recognised by OCR."
    # one marker stroke, over the second line where the original text PDF has it (within 3 pt)
    with pymupdf.open(make_pdf(tmp_path / "original.pdf", [LETTER])) as original:
        drawn = [w for w in original[0].get_text("words") if w[6] == 1]
    expected = (min(w[0] for w in drawn), min(w[1] for w in drawn), max(w[2] for w in drawn),
                max(w[3] for w in drawn))
    [line] = v.highlight_rects
    got = (line.left(), line.top(), line.right(), line.bottom())
    assert max(abs(a - b) for a, b in zip(got, expected)) < 3, (got, expected)
