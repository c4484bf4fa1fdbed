"""The ask pane: what to ask about (the selected documents, a folder, everything), a
question, the streamed answer with its citations and timings, and the searchable
history of earlier answers about the document in the viewer."""
from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, QTimer, QUrl, Signal
from PySide6.QtWidgets import (
    QComboBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QProgressBar, QPushButton, QSplitter,
    QTextBrowser, QVBoxLayout, QWidget,
)

from app.qa.targets import AskTarget, KINDS, SELECTED, scope_note
from app.qa.history import PastAnswer
from app.ui.widgets import ElidedLabel, info_label

PASSAGE_PREVIEW = 220
SEARCH_DELAY_MS = 250
_PAGE_REF = re.compile(r"\[(?:p|pp|page)\.?\s*(\d+)\]", re.IGNORECASE)


def _heading(text: str) -> QLabel:
    label = QLabel(text)
    label.setObjectName("heading")
    return label


def _stats_line(timings: dict) -> str:
    if not timings:
        return ""
    # ttft_s counts from the question (qa/answer.py); the parts say where the wait went.
    parts = [f"{label} {timings[key]:.1f} s" for key, label in (("prefix_s", "reading"), ("compose_s", "laying out"))
             if timings.get(key, 0) >= 0.5]
    where = f" ({', '.join(parts)})" if parts else ""
    return (f"{timings.get('prompt_tokens', 0)} prompt tokens · first token after "
            f"{timings.get('ttft_s', 0):.2f} s{where} · {timings.get('decode_tok_s', 0):.1f} tokens/s")


class AskPane(QWidget):
    """A question, the streamed answer, its citations, timings and history."""

    sig_ask = Signal(str)
    """The person asked this question."""
    sig_stop = Signal()
    """The person wants the answer to stop."""
    sig_citation = Signal(int, int, str)
    """A citation was activated: (document id, page, passage to highlight)."""
    sig_history_search = Signal(str)
    """The history search text changed (debounced); "" lists every answer."""
    sig_target_changed = Signal(str)
    """The person chose what to ask about: a kind of app.qa.targets (selected, folder, everything)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.titles: dict[int, str] = {}
        self._text = ""
        self._question = ""
        self._shown_citations: list[dict] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        top = QHBoxLayout()
        self.target = QComboBox()
        self.target.setObjectName("target")
        self.target.setToolTip("What to ask about")
        for kind, label in KINDS.items():
            self.target.addItem(label, kind)
        self.target.currentIndexChanged.connect(lambda _: self.sig_target_changed.emit(self.target_kind()))
        self.heading = ElidedLabel("Select a document in the library", "heading")
        top.addWidget(self.target)
        top.addWidget(self.heading, 1)
        layout.addLayout(top)
        row = QHBoxLayout()
        self.question = QLineEdit()
        self.question.setObjectName("question")
        self.question.setPlaceholderText("Ask a question about the whole document…")
        self.question.returnPressed.connect(self._ask)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setObjectName("primary")
        self.ask_button.setToolTip("Ask (Ctrl+Return)")
        self.ask_button.clicked.connect(self._ask)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Stop the answer (Esc)")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.sig_stop.emit)
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
        row.addWidget(self.stop_button)
        layout.addLayout(row)

        splitter = QSplitter(Qt.Vertical)
        splitter.setChildrenCollapsible(False)
        top = QWidget()
        top_layout = QVBoxLayout(top)
        top_layout.setContentsMargins(0, 0, 0, 0)
        self.answer = QTextBrowser()
        self.answer.setObjectName("answer")
        self.answer.setOpenLinks(False)
        self.answer.anchorClicked.connect(self._anchor)
        top_layout.addWidget(self.answer, 1)
        self.note = info_label("", "note")
        self.note.setVisible(False)
        top_layout.addWidget(self.note)
        self.stats = info_label("", "stats", wrap=False)
        top_layout.addWidget(self.stats)
        # A document read into its cache for this question: tokens read of total (the line above
        # says which document and the time left). Hidden otherwise.
        self.reading = QProgressBar()
        self.reading.setObjectName("reading")
        self.reading.setTextVisible(True)
        self.reading.setVisible(False)
        top_layout.addWidget(self.reading)
        splitter.addWidget(top)

        sources = QWidget()
        sources_layout = QVBoxLayout(sources)
        sources_layout.setContentsMargins(0, 0, 0, 0)
        sources_layout.addWidget(_heading("Sources"))
        self.citations = QListWidget()
        self.citations.setObjectName("citations")
        self.citations.setWordWrap(True)
        self.citations.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.citations.itemActivated.connect(self._citation)
        self.citations.itemClicked.connect(self._citation)
        sources_layout.addWidget(self.citations, 2)
        self.attended_heading = _heading("Where the model looked")
        self.attended_heading.setToolTip("Passages that received the most attention while the answer was generated")
        self.attended = QListWidget()
        self.attended.setObjectName("citations")
        self.attended.setWordWrap(True)
        self.attended.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.attended.itemActivated.connect(self._citation)
        self.attended.itemClicked.connect(self._citation)
        sources_layout.addWidget(self.attended_heading)
        sources_layout.addWidget(self.attended, 1)
        self._show_attended(False)
        splitter.addWidget(sources)

        past = QWidget()
        past_layout = QVBoxLayout(past)
        past_layout.setContentsMargins(0, 0, 0, 0)
        past_row = QHBoxLayout()
        past_row.addWidget(_heading("History"))
        self.history_search = QLineEdit()
        self.history_search.setObjectName("historySearch")
        self.history_search.setPlaceholderText("Search earlier questions and answers…")
        self.history_search.setClearButtonEnabled(True)
        past_row.addWidget(self.history_search, 1)
        past_layout.addLayout(past_row)
        self.history = QListWidget()
        self.history.setObjectName("history")
        self.history.setWordWrap(True)
        self.history.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.history.itemActivated.connect(self._history_item)
        self.history.itemClicked.connect(self._history_item)
        past_layout.addWidget(self.history, 1)
        splitter.addWidget(past)
        splitter.setSizes([230, 210, 120])
        layout.addWidget(splitter, 1)

        self._search_timer = QTimer(self)
        self._search_timer.setSingleShot(True)
        self._search_timer.setInterval(SEARCH_DELAY_MS)
        self._search_timer.timeout.connect(lambda: self.sig_history_search.emit(self.history_search.text()))
        self.history_search.textChanged.connect(lambda _: self._search_timer.start())

    # ---- Public API --------------------------------------------------------

    def target_kind(self) -> str:
        """What the person chose to ask about (a kind of app.qa.targets)."""
        return self.target.currentData()

    def set_target_kind(self, kind: str) -> None:
        self.target.setCurrentIndex(max(self.target.findData(kind), 0))

    def show_target(self, target: AskTarget, titles: dict[int, str]) -> None:
        """Show what a question would be asked about."""
        self.titles = titles
        self.heading.setText(target.heading)
        self.heading.setToolTip(target.detail)
        many = len(target.doc_ids) > 1 or (target.kind != SELECTED and not target.doc_ids)
        self.question.setPlaceholderText("Ask about these documents…" if many
                                         else "Ask a question about the whole document…")

    def set_busy(self, busy: bool) -> None:
        self.ask_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def begin(self, question: str, n_docs: int = 1) -> None:
        self._text = ""
        self.answer.setHtml(f"<p><b>{html.escape(question)}</b></p>")
        self.citations.clear()
        self.attended.clear()
        self._show_attended(False)
        self.note.setVisible(False)
        self.reading.setVisible(False)
        self.stats.setText("Preparing the answer…" if n_docs == 1 else f"Preparing the answer from {n_docs} documents…")
        self._question = question

    def append(self, piece: str) -> None:
        """One more streamed piece of the answer."""
        self._text += piece
        body = html.escape(self._text).replace("\n", "<br>")
        self.answer.setHtml(f"<p><b>{html.escape(self._question)}</b></p><p>{body}▍</p>")
        bar = self.answer.verticalScrollBar()
        bar.setValue(bar.maximum())

    def set_live(self, text: str) -> None:
        self.stats.setText(text)
        self.reading.setVisible(False)

    def set_reading(self, done: int, total: int, text: str) -> None:
        """A document being read into its cache: ``done`` of ``total`` tokens (0 of 0: no count)."""
        self.stats.setText(text)
        if total <= 0:
            self.reading.setVisible(False)
            return
        self.reading.setRange(0, total)
        self.reading.setValue(min(done, total))
        self.reading.setFormat(f"%p % · {done:,} of {total:,} tokens")
        self.reading.setVisible(True)

    def show_answer(self, question: str, answer: str, citations: list[dict], timings: dict,
                    titles: dict[int, str], note: str = "", cancelled: bool = False,
                    attended: list[dict] | None = None) -> None:
        self.titles = titles
        self._shown_citations = list(citations)
        body = self._linked(answer, citations)
        stopped = " <i>(stopped)</i>" if cancelled else ""
        self.answer.setHtml(f"<p><b>{html.escape(question)}</b></p><p>{body}{stopped}</p>")
        self.note.setText(f"Note: {note}" if note else "")
        self.note.setVisible(bool(note))
        self._fill(self.citations, citations)
        self._fill(self.attended, attended or [])
        self._show_attended(bool(attended))
        self.reading.setVisible(False)
        self.stats.setText(_stats_line(timings))

    def show_past(self, past: PastAnswer) -> None:
        self.show_answer(past.question, past.answer, past.citations, past.timings, self.titles,
                         note=scope_note(past.doc_ids, self.titles), attended=past.attended)

    def set_history(self, entries: list[PastAnswer], select_id: int | None = None) -> None:
        self.history.clear()
        for e in entries:
            item = QListWidgetItem(e.label())
            item.setData(Qt.UserRole, e)
            item.setToolTip(e.answer[:400])
            self.history.addItem(item)
            if e.id == select_id:
                self.history.setCurrentItem(item)
        if not entries:
            item = QListWidgetItem("No matching answers" if self.history_search.text().strip()
                                   else "No questions asked about this document yet")
            item.setFlags(Qt.NoItemFlags)
            self.history.addItem(item)

    def history_entries(self) -> list[PastAnswer]:
        return [e for e in (self.history.item(i).data(Qt.UserRole) for i in range(self.history.count())) if e]

    # ---- Internals -------------------------------------------------------------

    def _ask(self) -> None:
        q = self.question.text().strip()
        if q and self.ask_button.isEnabled():
            self.sig_ask.emit(q)

    def _fill(self, widget: QListWidget, citations: list[dict]) -> None:
        widget.clear()
        for c in citations:
            title = self.titles.get(c["doc"], str(c["doc"]))
            text = c.get("text", "")
            preview = text if len(text) <= PASSAGE_PREVIEW else text[:PASSAGE_PREVIEW - 1] + "…"
            item = QListWidgetItem(f"p. {c['page']} — {title}\n“{preview}”")
            item.setData(Qt.UserRole, (c["doc"], c["page"], text))
            item.setToolTip(text)
            widget.addItem(item)

    def _linked(self, answer: str, citations: list[dict]) -> str:
        """The answer as HTML with its own page references ([p. N]) clickable."""
        doc = citations[0]["doc"] if citations else None
        out, pos = [], 0
        for m in _PAGE_REF.finditer(answer):
            out.append(html.escape(answer[pos:m.start()]))
            ref = html.escape(m.group())
            out.append(f'<a href="page:{m.group(1)}">{ref}</a>' if doc is not None else ref)
            pos = m.end()
        out.append(html.escape(answer[pos:]))
        return "".join(out).replace("\n", "<br>")

    def _anchor(self, url: QUrl) -> None:
        text = url.toString()
        if not text.startswith("page:") or not self._shown_citations:
            return
        page = int(text.split(":", 1)[1])
        match = next((c for c in self._shown_citations if c["page"] == page), None)
        doc = match["doc"] if match else self._shown_citations[0]["doc"]
        self.sig_citation.emit(doc, page, match.get("text", "") if match else "")

    def _citation(self, item: QListWidgetItem) -> None:
        doc_id, page, passage = item.data(Qt.UserRole)
        self.sig_citation.emit(doc_id, page, passage)

    def _history_item(self, item: QListWidgetItem) -> None:
        past = item.data(Qt.UserRole)
        if past is not None and self.ask_button.isEnabled():
            self.show_past(past)

    def _show_attended(self, visible: bool) -> None:
        self.attended_heading.setVisible(visible)
        self.attended.setVisible(visible)
