"""The main window: the library on the left, the ask pane on the right."""
from __future__ import annotations

import html

from PySide6.QtCore import Qt, QThreadPool, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QLineEdit, QListWidget,
    QListWidgetItem, QMainWindow, QMessageBox, QProgressBar, QPushButton, QSplitter, QTableWidget,
    QTableWidgetItem, QTextBrowser, QToolBar, QVBoxLayout, QWidget,
)

from app.session import Session
from app.ui.workers import Job, JobControl, start

COLUMNS = ("Title", "Pages", "Tokens", "Status")


class LibraryPane(QWidget):
    """The documents with their status; failed ones show why."""

    sig_selection_changed = Signal(list)
    """The ids of the selected documents."""

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        heading = QLabel("Library")
        heading.setObjectName("heading")
        layout.addWidget(heading)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        for col in range(1, len(COLUMNS)):
            header.setSectionResizeMode(col, QHeaderView.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        layout.addWidget(self.table)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.current = QLabel("")
        self.current.setObjectName("status")
        self.current.setWordWrap(True)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        layout.addLayout(row)
        layout.addWidget(self.current)

    def set_documents(self, docs: list[dict]) -> None:
        selected = set(self.selected_ids())
        self.table.setRowCount(len(docs))
        for r, d in enumerate(docs):
            values = (d["title"] or d["path"], str(d["pages"]), str(d["tokens"]), d["status"])
            for c, v in enumerate(values):
                item = QTableWidgetItem(v)
                item.setData(Qt.UserRole, d["id"])
                tip = d["path"] + (f"\n{d['status']}: {d['error']}" if d["error"] else "")
                item.setToolTip(tip)
                if c in (1, 2):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if d["status"] == "failed":
                    item.setForeground(Qt.darkRed)
                    if c == 3:
                        item.setText(f"failed: {d['error']}")
                self.table.setItem(r, c, item)
            if d["id"] in selected:
                self.table.selectRow(r)

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectedItems()})
        return [self.table.item(r, 0).data(Qt.UserRole) for r in rows]

    def select_id(self, doc_id: int) -> None:
        for r in range(self.table.rowCount()):
            if self.table.item(r, 0).data(Qt.UserRole) == doc_id:
                self.table.selectRow(r)
                return

    def _selection_changed(self) -> None:
        self.sig_selection_changed.emit(self.selected_ids())


class AskPane(QWidget):
    """A question, the streamed answer, its citations and timings."""

    sig_ask = Signal(str)
    """The person asked this question."""
    sig_stop = Signal()
    """The person wants the answer to stop."""
    sig_citation = Signal(int, int)
    """A citation was activated: (document id, page)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.target = QLabel("Select a document in the library")
        self.target.setObjectName("heading")
        layout.addWidget(self.target)
        row = QHBoxLayout()
        self.question = QLineEdit()
        self.question.setObjectName("question")
        self.question.setPlaceholderText("Ask a question about the whole document…")
        self.question.returnPressed.connect(self._ask)
        self.ask_button = QPushButton("Ask")
        self.ask_button.setObjectName("primary")
        self.ask_button.clicked.connect(self._ask)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.sig_stop.emit)
        row.addWidget(self.question, 1)
        row.addWidget(self.ask_button)
        row.addWidget(self.stop_button)
        layout.addLayout(row)
        self.answer = QTextBrowser()
        self.answer.setObjectName("answer")
        self.answer.setOpenLinks(False)
        layout.addWidget(self.answer, 3)
        self.note = QLabel("")
        self.note.setObjectName("status")
        self.note.setWordWrap(True)
        layout.addWidget(self.note)
        heading = QLabel("Citations")
        heading.setObjectName("heading")
        layout.addWidget(heading)
        self.citations = QListWidget()
        self.citations.setObjectName("citations")
        self.citations.setWordWrap(True)
        self.citations.itemActivated.connect(self._citation)
        self.citations.itemClicked.connect(self._citation)
        layout.addWidget(self.citations, 1)
        self.stats = QLabel("")
        self.stats.setObjectName("stats")
        layout.addWidget(self.stats)

    def _ask(self) -> None:
        q = self.question.text().strip()
        if q and self.ask_button.isEnabled():
            self.sig_ask.emit(q)

    def _citation(self, item: QListWidgetItem) -> None:
        doc_id, page = item.data(Qt.UserRole)
        self.sig_citation.emit(doc_id, page)

    def set_busy(self, busy: bool) -> None:
        self.ask_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)

    def begin(self, question: str) -> None:
        self._text = ""
        self.answer.setHtml(f"<p><b>{html.escape(question)}</b></p>")
        self.citations.clear()
        self.note.setText("")
        self.stats.setText("Reading the document…")

    def append(self, piece: str) -> None:
        self._text = getattr(self, "_text", "") + piece
        self.answer.setPlainText(self._text)
        self.answer.moveCursor(self.answer.textCursor().MoveOperation.End)

    def show_answer(self, question: str, answer: str, citations: list[dict], timings: dict,
                    titles: dict[int, str], note: str = "", cancelled: bool = False) -> None:
        body = html.escape(answer).replace("\n", "<br>")
        stopped = " <i>(stopped)</i>" if cancelled else ""
        self.answer.setHtml(f"<p><b>{html.escape(question)}</b></p><p>{body}{stopped}</p>")
        self.note.setText(note)
        self.citations.clear()
        for c in citations:
            item = QListWidgetItem(f"{titles.get(c['doc'], c['doc'])}, p. {c['page']} — “{c['text'][:220]}”")
            item.setData(Qt.UserRole, (c["doc"], c["page"]))
            self.citations.addItem(item)
        if timings:
            self.stats.setText(
                f"{timings.get('prompt_tokens', 0)} prompt tokens · first token after "
                f"{timings.get('ttft_s', 0):.2f} s · {timings.get('decode_tok_s', 0):.1f} tokens/s")


class MainWindow(QMainWindow):
    def __init__(self, session: Session):
        super().__init__()
        self.session = session
        self.pool = QThreadPool.globalInstance()
        self.ingest_job: Job | None = None
        self.ask_job: Job | None = None
        self.setWindowTitle("eLLM — ask your documents")
        self.resize(1200, 760)

        self.library = LibraryPane()
        self.ask_pane = AskPane()
        splitter = QSplitter()
        splitter.addWidget(self.library)
        splitter.addWidget(self.ask_pane)
        splitter.setSizes([460, 740])
        self.setCentralWidget(splitter)

        toolbar = QToolBar("Main")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)
        self.open_action = QAction("Open folder…", self)
        self.open_action.setShortcut(QKeySequence.Open)
        self.open_action.triggered.connect(self.choose_folder)
        toolbar.addAction(self.open_action)
        self.rescan_action = QAction("Rescan", self)
        self.rescan_action.setShortcut(QKeySequence.Refresh)
        self.rescan_action.triggered.connect(self.rescan)
        toolbar.addAction(self.rescan_action)
        self.ask_action = QAction("Ask", self)
        self.ask_action.setShortcut(QKeySequence("Ctrl+Return"))
        self.ask_action.triggered.connect(self.ask_pane._ask)
        self.addAction(self.ask_action)
        self.stop_action = QAction("Stop", self)
        self.stop_action.setShortcut(QKeySequence(Qt.Key_Escape))
        self.stop_action.triggered.connect(self.stop)
        self.addAction(self.stop_action)

        self.library.sig_selection_changed.connect(self.selection_changed)
        self.library.cancel_button.clicked.connect(self.cancel_ingest)
        self.ask_pane.sig_ask.connect(self.ask)
        self.ask_pane.sig_stop.connect(self.stop)
        self.statusBar().showMessage(f"Data: {session.paths.root}")
        self.refresh()

    # ---- Public API --------------------------------------------------------

    def refresh(self) -> None:
        self.docs = self.session.store.documents()
        self.library.set_documents(self.docs)

    def titles(self) -> dict[int, str]:
        return {d["id"]: d["title"] or d["path"] for d in self.docs}

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a folder of documents")
        if folder:
            self.ingest([folder])

    def rescan(self) -> None:
        folders = self.session.store.folders()
        if folders:
            self.ingest(folders)

    def ingest(self, paths: list[str]) -> Job:
        from app.ingest import ingest

        if self.ingest_job is not None:
            return self.ingest_job
        session = self.session

        def work(ctl: JobControl):
            count = session.token_counter()
            return ingest(session.store, paths, count,
                          progress=lambda e: ctl.progress(e.index, e.total, e.line()), cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_progress.connect(self._ingest_progress)
        job.signals.sig_done.connect(lambda report: self.statusBar().showMessage(report.summary()))
        job.signals.sig_error.connect(self.show_error)
        job.signals.sig_finished.connect(self._ingest_finished)
        self.library.progress.setVisible(True)
        self.library.progress.setRange(0, 0)
        self.library.cancel_button.setVisible(True)
        self.library.current.setText("Looking for documents…")
        self.ingest_job = start(job, self.pool)
        return job

    def cancel_ingest(self) -> None:
        if self.ingest_job:
            self.ingest_job.cancel()

    def selection_changed(self, ids: list[int]) -> None:
        titles = self.titles()
        if not ids:
            self.ask_pane.target.setText("Select a document in the library")
            return
        self.ask_pane.target.setText("Ask about: " + "; ".join(titles.get(i, str(i)) for i in ids))
        history = self.session.store.answers(doc_id=ids[0], limit=1)
        if history and self.ask_job is None:
            h = history[0]
            self.ask_pane.show_answer(h["question"], h["answer"], h["citations"] or [], h["timings"] or {}, titles)

    def ask(self, question: str) -> Job | None:
        from app.ask import ask

        ids = self.library.selected_ids()
        if not ids:
            self.show_error("Select a document in the library first.")
            return None
        if self.ask_job is not None:
            return self.ask_job
        session = self.session

        def work(ctl: JobControl):
            backend = session.backend()
            return ask(session.store, backend, question, ids, session.sampling(),
                       model_name=session.model_path.name, on_text=ctl.text, cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_text.connect(self.ask_pane.append)
        job.signals.sig_done.connect(self._answered)
        job.signals.sig_error.connect(self.show_error)
        job.signals.sig_finished.connect(self._ask_finished)
        self.ask_pane.begin(question)
        self.ask_pane.set_busy(True)
        self.ask_job = start(job, self.pool)
        return job

    def stop(self) -> None:
        if self.ask_job:
            self.ask_job.cancel()

    def show_error(self, message: str) -> None:
        self.statusBar().showMessage(message)
        box = QMessageBox(QMessageBox.Warning, "eLLM", message, QMessageBox.Ok, self)
        box.setModal(False)
        box.show()
        self._error_box = box

    # ---- Slots ------------------------------------------------------------------

    def _ingest_progress(self, done: int, total: int, what: str) -> None:
        self.library.progress.setRange(0, max(total, 1))
        self.library.progress.setValue(done)
        self.library.current.setText(what)
        self.refresh()

    def _ingest_finished(self) -> None:
        self.ingest_job = None
        self.library.progress.setVisible(False)
        self.library.cancel_button.setVisible(False)
        self.library.current.setText("")
        self.refresh()

    def _answered(self, answer) -> None:
        self.ask_pane.show_answer(answer.question, answer.answer, answer.citations, answer.timings,
                                  self.titles(), answer.plan.note, answer.cancelled)

    def _ask_finished(self) -> None:
        self.ask_job = None
        self.ask_pane.set_busy(False)
