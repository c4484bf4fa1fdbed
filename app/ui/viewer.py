"""The document viewer: PDF pages rendered by pymupdf, other documents page by page
from the store with their headings and paragraphs; a citation opens its page with
the passage highlighted."""
from __future__ import annotations

import os

from PySide6.QtCore import QRectF, Qt, QTimer, Signal
from PySide6.QtGui import (
    QColor, QFont, QImage, QPainter, QPixmap, QTextBlockFormat, QTextCharFormat, QTextCursor,
)
from PySide6.QtWidgets import (
    QHBoxLayout, QLabel, QScrollArea, QSpinBox, QStackedWidget, QStyle, QTextBrowser, QTextEdit,
    QToolButton, QVBoxLayout, QWidget,
)

from app.library.passages import locate_in_pdf_words, locate_passage, page_blocks
from app.ui.widgets import info_label

ZOOM_STEP = 1.25
ZOOM_MIN, ZOOM_MAX = 0.25, 6.0
HIGHLIGHT = QColor(255, 213, 0, 110)  # translucent yellow over the rendered page
HIGHLIGHT_TEXT = QColor("#ffe680")
PAGE_MARGIN = 12


def _line_rects(words: list[tuple]) -> list[QRectF]:
    """One rectangle per text line for pymupdf word tuples (x0, y0, x1, y1, word, block,
    line, word_no), so a highlight reads as a marker stroke rather than word boxes."""
    lines: dict[tuple[int, int], QRectF] = {}
    for x0, y0, x1, y1, _, block, line, _ in words:
        r = QRectF(x0, y0, x1 - x0, y1 - y0)
        key = (block, line)
        lines[key] = lines[key].united(r) if key in lines else r
    return list(lines.values())


class DocumentViewer(QWidget):
    """One document, one page at a time."""

    sig_page_changed = Signal(int)
    """The page now shown (1-based)."""

    def __init__(self, store, parent=None):
        super().__init__(parent)
        self.store = store
        self.doc: dict | None = None
        self.page = 0
        self.page_count = 0
        self.zoom: float | None = None  # None = fit the page to the width
        self.highlight_rects: list[QRectF] = []  # PDF points of the highlighted passage on this page
        self.highlight_span: tuple[int, int] | None = None  # offsets into a text page's text
        self._pdf = None  # the open pymupdf.Document of a PDF being shown
        self.rendered: QImage | None = None  # the page image last shown, highlight included
        self._pages: list[dict] = []  # text pages from the store: [{number, start, text}]
        self._sources: dict[int, dict] = {}  # PDF page number -> {number, source, note} from the store
        self._positions: list[tuple[int, int, int]] = []  # (page offset, length, document position) per block

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.title = info_label("No document", "heading", wrap=False)
        layout.addWidget(self.title)

        bar = QHBoxLayout()
        self.prev_button = self._tool("◀", "Previous page (Page Up)", self.previous_page)
        self.page_box = QSpinBox()
        self.page_box.setObjectName("pageBox")
        self.page_box.setKeyboardTracking(False)
        self.page_box.setButtonSymbols(QSpinBox.NoButtons)  # the arrows beside it turn pages
        self.page_box.setMinimumWidth(44)
        self.page_box.valueChanged.connect(self.show_page)
        self.page_total = QLabel("of 0")
        self.next_button = self._tool("▶", "Next page (Page Down)", self.next_page)
        for w in (self.prev_button, self.page_box, self.page_total, self.next_button):
            bar.addWidget(w)
        bar.addStretch(1)
        self.zoom_out_button = self._tool("−", "Zoom out (Ctrl+-)", self.zoom_out)
        self.zoom_label = QLabel("")
        self.zoom_label.setMinimumWidth(44)
        self.zoom_label.setAlignment(Qt.AlignCenter)
        self.zoom_in_button = self._tool("+", "Zoom in (Ctrl++)", self.zoom_in)
        self.fit_button = self._tool("Fit", "Fit the page to the width", self.fit_width)
        for w in (self.zoom_out_button, self.zoom_label, self.zoom_in_button, self.fit_button):
            bar.addWidget(w)
        layout.addLayout(bar)

        self.stack = QStackedWidget()
        self.placeholder = QLabel("Select a document in the library to read it here.")
        self.placeholder.setObjectName("placeholder")
        self.placeholder.setAlignment(Qt.AlignCenter)
        self.placeholder.setWordWrap(True)
        self.image = QLabel()
        self.image.setObjectName("pageImage")
        self.image.setAlignment(Qt.AlignHCenter | Qt.AlignTop)
        self.scroll = QScrollArea()
        self.scroll.setObjectName("pageScroll")
        self.scroll.setWidget(self.image)
        self.scroll.setWidgetResizable(True)
        self.text = QTextBrowser()
        self.text.setObjectName("pageText")
        self.text.setOpenLinks(False)
        for w in (self.placeholder, self.scroll, self.text):
            self.stack.addWidget(w)
        layout.addWidget(self.stack, 1)
        self.note = info_label("", "status")
        layout.addWidget(self.note)
        self._refit = QTimer(self)
        self._refit.setSingleShot(True)
        self._refit.setInterval(60)
        self._refit.timeout.connect(self._render)
        self._update_controls()

    # ---- Public API --------------------------------------------------------

    @property
    def doc_id(self) -> int | None:
        return self.doc["id"] if self.doc else None

    def is_pdf(self) -> bool:
        return self._pdf is not None

    def show_document(self, doc: dict | None, page: int = 1) -> None:
        """Open ``doc`` (a row of store.documents()) at ``page``; None shows nothing."""
        self._close_pdf()
        self.doc, self._pages, self._sources = doc, [], {}
        self._clear_highlight()
        if doc is None:
            self.title.setText("No document")
            self.page_count = 0
            self.stack.setCurrentWidget(self.placeholder)
            self._update_controls()
            return
        self.title.setText(doc["title"] or os.path.basename(doc["path"]))
        self.title.setToolTip(doc["path"])
        if (doc.get("format") == "pdf" or doc["path"].lower().endswith(".pdf")) and doc["status"] != "failed":
            self._open_pdf(doc["path"])
            self._sources = {row["number"]: row for row in self.store.page_sources(doc["id"])}
        if self._pdf is None:
            self._pages = self.store.pages(doc["id"])
            if not self._pages:
                reason = f" ({doc['error']})" if doc.get("error") else ""
                self.placeholder.setText(f"No text stored for this document{reason}.")
                self.page_count = 0
                self.stack.setCurrentWidget(self.placeholder)
                self._update_controls()
                return
        self.page_count = self._pdf.page_count if self._pdf is not None else len(self._pages)
        self.page = 0
        self.show_page(page)

    def show_page(self, number: int) -> None:
        if not self.page_count:
            return
        number = min(max(1, int(number)), self.page_count)
        if number != self.page:
            self._clear_highlight()
        self.page = number
        self._render()
        self.sig_page_changed.emit(number)

    def previous_page(self) -> None:
        self.show_page(self.page - 1)

    def next_page(self) -> None:
        self.show_page(self.page + 1)

    def show_citation(self, doc_id: int, page: int, passage: str = "") -> bool:
        """Open ``page`` of ``doc_id`` and highlight ``passage``; True when it was found."""
        if self.doc_id != doc_id:
            doc = self.store.document(doc_id)
            if doc is None:
                return False
            self.show_document(doc, page)
        self.show_page(page)
        self._clear_highlight()
        if self._pdf is not None:
            pdf_page = self._pdf[self.page - 1]
            # A scanned page has no words of its own: use those OCR recognised at ingestion.
            words = pdf_page.get_text("words") or self.store.page_words(doc_id, self.page)
            hits = locate_in_pdf_words(words, passage) if passage else []
            rects = _line_rects([words[i] for i in hits])
            if not rects and passage:  # fall back to pymupdf's own phrase search on the opening words
                snippet = " ".join(passage.rstrip("…").split()[:6])
                rects = [QRectF(r.x0, r.y0, r.width, r.height) for r in pdf_page.search_for(snippet)]
            self.highlight_rects = rects
        else:
            text = self._page_text()
            self.highlight_span = locate_passage(text, passage) if passage else None
        self._render()
        return self.has_highlight()

    def has_highlight(self) -> bool:
        return bool(self.highlight_rects) or self.highlight_span is not None

    def zoom_in(self) -> None:
        self._set_zoom(self._effective_zoom() * ZOOM_STEP)

    def zoom_out(self) -> None:
        self._set_zoom(self._effective_zoom() / ZOOM_STEP)

    def fit_width(self) -> None:
        self._set_zoom(None)

    def effective_zoom(self) -> float:
        return self._effective_zoom()

    # ---- Rendering -------------------------------------------------------------

    def _render(self) -> None:
        if self.doc is None or not self.page_count:
            return
        if self._pdf is not None:
            self._render_pdf()
            self.stack.setCurrentWidget(self.scroll)
        else:
            self._render_text()
            self.stack.setCurrentWidget(self.text)
        self._update_controls()

    def _render_pdf(self) -> None:
        import pymupdf

        page = self._pdf[self.page - 1]
        z = self._effective_zoom()
        pix = page.get_pixmap(matrix=pymupdf.Matrix(z, z), alpha=False)
        image = QImage(pix.samples, pix.width, pix.height, pix.stride, QImage.Format_RGB888).copy()
        if self.highlight_rects:
            painter = QPainter(image)
            painter.setPen(Qt.NoPen)
            painter.setBrush(HIGHLIGHT)
            for r in self.highlight_rects:
                painter.drawRect(QRectF(r.x() * z - 1, r.y() * z - 1, r.width() * z + 2, r.height() * z + 2))
            painter.end()
        self.image.setPixmap(QPixmap.fromImage(image))
        self.rendered = image
        self.note.setText(self._page_note(self._sources.get(self.page)))
        if self.highlight_rects:
            top = min(r.y() for r in self.highlight_rects) * z
            QTimer.singleShot(0, lambda: self.scroll.verticalScrollBar().setValue(max(0, int(top) - 60)))
        else:
            self.scroll.verticalScrollBar().setValue(0)

    @staticmethod
    def _page_note(source: dict | None) -> str:
        """What a person should know about how this PDF page was read."""
        if not source:
            return ""
        note = source["note"] or ""
        if source["source"] == "ocr":
            return f"This page is a scan: its text was recognised by OCR{'; ' + note if note else ''}."
        return note

    def _render_text(self) -> None:
        """The page as headings and paragraphs; ``_positions`` maps page offsets to
        document positions so a passage can be highlighted exactly."""
        text = self._page_text()
        doc = self.text.document()
        doc.clear()
        self._positions = []
        cursor = QTextCursor(doc)
        base = QFont(self.text.font())
        size = base.pointSizeF() if base.pointSizeF() > 0 else 10.0
        z = self._effective_zoom()
        for i, block in enumerate(page_blocks(text)):
            fmt = QTextBlockFormat()
            fmt.setBottomMargin(8)
            char = QTextCharFormat()
            char.setFontPointSize(size * z * (1.3 if block.kind == "heading" else 1.0))
            char.setFontWeight(QFont.DemiBold if block.kind == "heading" else QFont.Normal)
            if block.kind == "heading":
                fmt.setTopMargin(6)
            if i == 0:
                cursor.setBlockFormat(fmt)
                cursor.setBlockCharFormat(char)
            else:
                cursor.insertBlock(fmt, char)
            # Line breaks inside a paragraph become spaces: same length, so offsets still map.
            piece = text[block.start:block.end].replace("\n", " ")
            self._positions.append((block.start, len(piece), cursor.position()))
            cursor.insertText(piece, char)
        selections = []
        if self.highlight_span is not None:
            start, end = (self._position_of(o) for o in self.highlight_span)
            sel = QTextEdit.ExtraSelection()
            sel.cursor = QTextCursor(doc)
            sel.cursor.setPosition(start)
            sel.cursor.setPosition(end, QTextCursor.KeepAnchor)
            sel.format.setBackground(HIGHLIGHT_TEXT)
            selections.append(sel)
            visible = QTextCursor(doc)
            visible.setPosition(start)
            self.text.setTextCursor(visible)
            self.text.ensureCursorVisible()
            # the passage near the top of the view, not at its bottom edge
            bar = self.text.verticalScrollBar()
            bar.setValue(bar.value() + self.text.cursorRect().top() - self.text.fontMetrics().height())
        else:
            self.text.moveCursor(QTextCursor.Start)     # a page opens at its top
            self.text.verticalScrollBar().setValue(0)
        self.text.setExtraSelections(selections)

    def highlighted_text(self) -> str:
        """The text under the highlight (text pages), for people and tests."""
        sels = self.text.extraSelections()
        return sels[0].cursor.selectedText() if sels and self._pdf is None else ""

    # ---- Internals -------------------------------------------------------------

    def _tool(self, text: str, tip: str, slot) -> QToolButton:
        b = QToolButton()
        b.setText(text)
        b.setToolTip(tip)
        b.clicked.connect(slot)
        return b

    def _position_of(self, offset: int) -> int:
        """The document position of a page-text offset (clamped into the nearest block)."""
        pos = 0
        for start, length, where in self._positions:
            if offset < start:  # in the blank space before this block
                return where
            if offset <= start + length:
                return where + offset - start
            pos = where + length
        return pos

    def _page_text(self) -> str:
        if 1 <= self.page <= len(self._pages):
            return self._pages[self.page - 1]["text"]
        return ""

    def _effective_zoom(self) -> float:
        if self.zoom is not None:
            return self.zoom
        if self._pdf is None:
            return 1.0
        width = self._pdf[max(self.page, 1) - 1].rect.width or 595
        # The stack's width, not the viewport's: a page not shown yet has no laid-out
        # viewport, and the room for the vertical scroll bar is kept whether it shows or not.
        bar = self.scroll.style().pixelMetric(QStyle.PM_ScrollBarExtent)
        avail = self.stack.width() - 2 * self.scroll.frameWidth() - bar - 2 * PAGE_MARGIN
        return min(max(avail / width, ZOOM_MIN), ZOOM_MAX) if avail > 50 else 1.0

    def _set_zoom(self, zoom: float | None) -> None:
        self.zoom = None if zoom is None else min(max(zoom, ZOOM_MIN), ZOOM_MAX)
        self._render()

    def _open_pdf(self, path: str) -> None:
        import pymupdf

        try:
            self._pdf = pymupdf.open(path)
        except Exception as e:  # moved, deleted or damaged since ingestion: show the stored text
            self._pdf = None
            self.note.setText(f"Cannot render the PDF ({e}); showing its stored text.")
            return
        if self._pdf.needs_pass or self._pdf.page_count == 0:
            self._close_pdf()
            self.note.setText("Cannot render this PDF; showing its stored text.")

    def _close_pdf(self) -> None:
        if self._pdf is not None:
            self._pdf.close()
        self._pdf = None
        self.note.setText("")

    def _clear_highlight(self) -> None:
        self.highlight_rects = []
        self.highlight_span = None

    def _update_controls(self) -> None:
        has = bool(self.page_count)
        self.page_box.blockSignals(True)
        self.page_box.setRange(1 if has else 0, max(self.page_count, 1) if has else 0)
        self.page_box.setValue(self.page if has else 0)
        self.page_box.blockSignals(False)
        self.page_total.setText(f"of {self.page_count}")
        for w in (self.page_box, self.zoom_in_button, self.zoom_out_button, self.fit_button):
            w.setEnabled(has)
        self.prev_button.setEnabled(has and self.page > 1)
        self.next_button.setEnabled(has and self.page < self.page_count)
        self.zoom_label.setText(f"{self._effective_zoom() * 100:.0f}%" if has else "")
        self.fit_button.setEnabled(has and self.zoom is not None)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.zoom is None and self._pdf is not None:
            self._refit.start()
