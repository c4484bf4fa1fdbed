"""The ask pane: what to ask about (the selected documents, a folder, everything), a
question, the conversation in view (its turns, the last one streaming) with the citations and
timings of a turn, and the searchable list of conversations (thread_list.py)."""
from __future__ import annotations

import html
import re

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtWidgets import (
    QComboBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QProgressBar, QPushButton, QSplitter,
    QTextBrowser, QVBoxLayout, QWidget,
)

from app.qa.targets import AskTarget, KINDS, SELECTED, scope_note
from app.qa.history import PastAnswer
from app.ui.thread_list import ThreadList
from app.ui.widgets import ElidedLabel, info_label

PASSAGE_PREVIEW = 220
# The questions are links (a click shows that turn's sources), drawn as bold text.
TURN_STYLE = "a.turn { color: #1f2933; text-decoration: none; }"
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
    """A question, the conversation in view with a turn's citations and timings, and the
    list of conversations."""

    sig_ask = Signal(str)
    """The person asked this question."""
    sig_stop = Signal()
    """The person wants the answer to stop."""
    sig_citation = Signal(int, int, str)
    """A citation was activated: (document id, page, passage to highlight)."""
    sig_target_changed = Signal(str)
    """The person chose what to ask about: a kind of app.qa.targets (selected, folder, everything)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.titles: dict[int, str] = {}
        self._text = ""
        self._question = ""
        self._shown_citations: list[dict] = []
        self.turns: list[PastAnswer] = []     # the conversation in view, in the order asked
        self.turn = -1                        # the turn whose sources and timings are shown
        self._last_note = ""                  # what the answer service said of the last turn
        self._last_attended: list[dict] | None = None
        self._cancelled = False               # the last turn was stopped
        self._earlier = ""                    # the earlier turns as HTML, while one streams
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
        self.question.returnPressed.connect(self.submit)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setObjectName("primary")
        self.ask_button.setToolTip("Ask (Ctrl+Return)")
        self.ask_button.clicked.connect(self.submit)
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
        self.answer.document().setDefaultStyleSheet(TURN_STYLE)
        self.answer.anchorClicked.connect(self._anchor)
        top_layout.addWidget(self.answer, 1)
        self.note = info_label("", "note")
        self.note.setVisible(False)
        top_layout.addWidget(self.note)
        self.stats = info_label("", "stats")     # wraps: the pane may be narrower than the line
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

        self.threads = ThreadList()
        splitter.addWidget(self.threads)
        splitter.setSizes([230, 180, 150])
        layout.addWidget(splitter, 1)

    # ---- Public API --------------------------------------------------------

    def target_kind(self) -> str:
        """What the person chose to ask about (a kind of app.qa.targets)."""
        return self.target.currentData()

    def set_target_kind(self, kind: str, quiet: bool = False) -> None:
        """Choose ``kind``; ``quiet``: without telling (the window shows a conversation of that kind)."""
        self.target.blockSignals(quiet)
        self.target.setCurrentIndex(max(self.target.findData(kind), 0))
        self.target.blockSignals(False)

    def show_target(self, target: AskTarget, titles: dict[int, str], follow_up: bool = False) -> None:
        """Show what a question would be asked about (``follow_up``: in the conversation in view)."""
        self.titles = titles
        self.heading.setText(target.heading)
        self.heading.setToolTip(target.detail)
        many = len(target.doc_ids) > 1 or (target.kind != SELECTED and not target.doc_ids)
        if follow_up:
            self.question.setPlaceholderText("Ask a follow-up question…")
        else:
            self.question.setPlaceholderText("Ask about these documents…" if many
                                             else "Ask a question about the whole document…")

    def set_busy(self, busy: bool) -> None:
        self.ask_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.threads.enabled = not busy                # the view stays on the answer coming in
        self.threads.new_button.setEnabled(not busy)

    def begin(self, question: str, n_docs: int = 1, follow_up: bool = False) -> None:
        """A question is being answered: after the turns in view when it ``follow_up``s them."""
        self._text = ""
        if not follow_up:
            self.turns, self.turn, self._cancelled = [], -1, False
        self._earlier = self._html(self.turns)
        self._question = question
        self.answer.setHtml(self._earlier + self._question_html(question, len(self.turns)))
        self.citations.clear()
        self.attended.clear()
        self._show_attended(False)
        self.note.setVisible(False)
        self.reading.setVisible(False)
        self.stats.setText("Preparing the answer…" if n_docs == 1 else f"Preparing the answer from {n_docs} documents…")

    def append(self, piece: str) -> None:
        """One more streamed piece of the answer."""
        self._text += piece
        body = html.escape(self._text).replace("\n", "<br>")
        self.answer.setHtml(f"{self._earlier}{self._question_html(self._question, len(self.turns))}<p>{body}▍</p>")
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
        """One answer on its own (not a turn of a conversation)."""
        self.show_thread([PastAnswer(-1, question, answer, citations, timings, [], "")], titles, note, cancelled,
                         attended)

    def show_thread(self, turns: list[PastAnswer], titles: dict[int, str] | None = None, note: str = "",
                    cancelled: bool = False, attended: list[dict] | None = None) -> None:
        """A conversation's turns, with the sources and timings of the last one; ``note``,
        ``cancelled`` and ``attended`` are what the answer service said of the last turn."""
        if titles is not None:
            self.titles = titles
        self.turns = list(turns)
        self._last_note, self._cancelled, self._last_attended = note, cancelled, attended
        self.answer.setHtml(self._html(self.turns))
        bar = self.answer.verticalScrollBar()
        bar.setValue(bar.maximum())
        self.show_turn(len(self.turns) - 1)

    def show_turn(self, index: int) -> None:
        """The sources, note and timings of turn ``index`` of the conversation in view."""
        self.turn = index
        self.reading.setVisible(False)
        if not 0 <= index < len(self.turns):
            self._shown_citations = []
            self._fill(self.citations, [])
            self._fill(self.attended, [])
            self._show_attended(False)
            self.note.setVisible(False)
            self.stats.setText("")
            return
        t = self.turns[index]
        last = index == len(self.turns) - 1
        note = self._last_note if last and self._last_note else scope_note(t.doc_ids, self.titles)
        attended = (self._last_attended if last and self._last_attended is not None else t.attended) or []
        self._shown_citations = list(t.citations)
        self.note.setText(f"Note: {note}" if note else "")
        self.note.setVisible(bool(note))
        self._fill(self.citations, t.citations)
        self._fill(self.attended, attended)
        self._show_attended(bool(attended))
        self.stats.setText(_stats_line(t.timings))

    def show_past(self, past: PastAnswer) -> None:
        """One stored answer on its own."""
        self.show_thread([past])

    def clear_view(self, text: str = "") -> None:
        """No conversation in view (a new one starts with the next question); ``text`` says so."""
        self.show_thread([])
        self.answer.setHtml(f'<p style="color:#6b7280">{html.escape(text)}</p>' if text else "")

    def submit(self) -> None:
        """Ask the question in the box (the Ask button, Return, and the window's Ctrl+Return)."""
        q = self.question.text().strip()
        if q and self.ask_button.isEnabled():
            self.sig_ask.emit(q)

    # ---- Internals -------------------------------------------------------------

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

    def _html(self, turns: list[PastAnswer]) -> str:
        """The turns as HTML: each question (a link to its sources), then its answer."""
        parts = []
        for i, t in enumerate(turns):
            stopped = " <i>(stopped)</i>" if self._cancelled and i == len(turns) - 1 else ""
            answer = self._linked(t.answer, t.citations, i)
            parts.append(f"{self._question_html(t.question, i)}<p>{answer}{stopped}</p>")
        return "".join(parts)

    @staticmethod
    def _question_html(question: str, index: int) -> str:
        rule = "<hr>" if index else ""
        return f'{rule}<p><a class="turn" href="turn:{index}"><b>{html.escape(question)}</b></a></p>'

    def _linked(self, answer: str, citations: list[dict], turn: int) -> str:
        """The answer of turn ``turn`` as HTML with its own page references ([p. N]) clickable."""
        doc = citations[0]["doc"] if citations else None
        out, pos = [], 0
        for m in _PAGE_REF.finditer(answer):
            out.append(html.escape(answer[pos:m.start()]))
            ref = html.escape(m.group())
            out.append(f'<a href="page:{turn}:{m.group(1)}">{ref}</a>' if doc is not None else ref)
            pos = m.end()
        out.append(html.escape(answer[pos:]))
        return "".join(out).replace("\n", "<br>")

    def _anchor(self, url: QUrl) -> None:
        """A question (``turn:T``) shows its turn's sources; a page reference (``page:T:N``, or
        ``page:N`` of the turn shown) opens the page it cites."""
        kind, _, rest = url.toString().partition(":")
        turn, _, page = rest.rpartition(":")
        streaming = self.stop_button.isEnabled()   # the view is the answer coming in: it stays
        if kind == "turn" and page.isdigit() and not streaming:
            self.show_turn(int(page))
            return
        if kind != "page" or not page.isdigit():
            return
        if turn.isdigit() and int(turn) != self.turn and not streaming:
            self.show_turn(int(turn))
        if not self._shown_citations:
            return
        page = int(page)
        match = next((c for c in self._shown_citations if c["page"] == page), None)
        doc = match["doc"] if match else self._shown_citations[0]["doc"]
        self.sig_citation.emit(doc, page, match.get("text", "") if match else "")

    def _citation(self, item: QListWidgetItem) -> None:
        doc_id, page, passage = item.data(Qt.UserRole)
        self.sig_citation.emit(doc_id, page, passage)

    def _show_attended(self, visible: bool) -> None:
        self.attended_heading.setVisible(visible)
        self.attended.setVisible(visible)
