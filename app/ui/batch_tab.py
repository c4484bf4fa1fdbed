"""The Batch tab: every question asked of every document of a target (the selection, a folder
or everything), in the background, resumable, with progress; the results in a table whose
rows open the cited page in the viewer. The work is app/batch's, as `ellm batch` runs it:
one worker in this process, or several on a local Ray runtime."""
from __future__ import annotations

from typing import Callable

from PySide6.QtCore import Qt, QThreadPool, Signal
from PySide6.QtWidgets import (
    QCheckBox, QComboBox, QFileDialog, QHBoxLayout, QHeaderView, QLabel, QPlainTextEdit, QProgressBar, QPushButton,
    QSpinBox, QTableWidget, QTableWidgetItem, QVBoxLayout, QWidget,
)

from app.qa.targets import EVERYTHING, FOLDER, KINDS, SELECTED, AskTarget
from app.ui.widgets import info_label
from app.ui.workers import Job, JobControl, start

COLUMNS = ("Document", "Question", "Answer", "Page")
TARGET_KINDS = (EVERYTHING, FOLDER, SELECTED)


class BatchTab(QWidget):
    """Questions for many documents; the results as they come."""

    sig_citation = Signal(int, int, str)
    """(doc_id, page, passage): a result row was chosen; the viewer opens that page."""
    sig_error = Signal(str)
    """Something failed; the message says what and what to do."""
    sig_message = Signal(str)
    """Something a person may want to know (for the status bar)."""

    def __init__(self, session, resolve_target: Callable[[str], AskTarget], pool: QThreadPool | None = None,
                 parent=None, engine_busy: Callable[[], bool] = lambda: False):
        super().__init__(parent)
        self.session = session
        self.resolve_target = resolve_target
        self.engine_busy = engine_busy   # an answer or a summary holds the window's engine
        self.in_window = False           # the running batch uses the window's engine (one worker)
        self.pool = pool or QThreadPool.globalInstance()
        self.job: Job | None = None
        self.batch_id: str | None = None
        self.report = None

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        row = QHBoxLayout()
        row.addWidget(QLabel("Documents:"))
        self.target_combo = QComboBox()
        for kind in TARGET_KINDS:
            self.target_combo.addItem(KINDS[kind], kind)
        row.addWidget(self.target_combo, 1)
        row.addWidget(QLabel("Workers:"))
        self.workers = QSpinBox()
        self.workers.setRange(1, 64)
        self.workers.setToolTip("1: in this window; more: a local Ray runtime, each worker with its own engine "
                                "(workers x threads never exceeds the physical cores)")
        row.addWidget(self.workers)
        layout.addLayout(row)
        self.questions = QPlainTextEdit()
        self.questions.setPlaceholderText("One question a line, asked of every document")
        self.questions.setMaximumHeight(110)
        layout.addWidget(self.questions)
        self.summarize_box = QCheckBox("Summarize each document too")
        # A line of its own: the tab stays narrow, and the library's titles get the room.
        layout.addWidget(self.summarize_box)
        row = QHBoxLayout()
        row.addStretch(1)
        self.run_button = QPushButton("Run batch")
        self.run_button.setObjectName("primary")
        self.run_button.setToolTip("Answer what this batch is missing (a batch stopped earlier resumes)")
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.cancel)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Write the results as CSV, JSON Lines or Markdown")
        self.export_button.clicked.connect(self.choose_export)
        for b in (self.run_button, self.stop_button, self.export_button):
            row.addWidget(b)
        layout.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.status = info_label("", "status")
        layout.addWidget(self.status)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QTableWidget.NoEditTriggers)
        self.table.setSelectionBehavior(QTableWidget.SelectRows)
        self.table.horizontalHeader().setSectionResizeMode(2, QHeaderView.Stretch)
        self.table.cellClicked.connect(self.open_row)
        layout.addWidget(self.table, 1)
        self._update_buttons()

    # ---- Public API --------------------------------------------------------

    def tasks(self):
        from app.batch.spec import tasks_from

        return tasks_from(self.questions.toPlainText().splitlines(), self.summarize_box.isChecked())

    def run(self) -> Job | None:
        """Start (or resume) the batch the tab describes."""
        from app.batch.driver import run_batch, session_spec
        from app.batch.pools import LocalPool, size_workers
        from app.batch.worker import DocumentWorker
        from app.runtime.engines import thread_plan

        if self.job is not None:
            return self.job
        tasks = self.tasks()
        target = self.resolve_target(self.target_combo.currentData())
        if not tasks:
            self.sig_error.emit("Write at least one question (one a line), or tick Summarize.")
            return None
        session, workers = self.session, self.workers.value()
        if workers == 1 and self.engine_busy():
            self.sig_error.emit("An answer or a summary is using the model: wait for it, or run the batch "
                                "with 2 or more workers (a local Ray runtime with engines of its own).")
            return None
        if not target.doc_ids:
            self.sig_error.emit(f"{target.heading}.")
            return None
        name = {SELECTED: "docs:" + ",".join(str(i) for i in sorted(target.doc_ids)),
                FOLDER: f"folder:{target.folder}", EVERYTHING: "all"}[target.kind]
        try:
            s = session.settings
            workers, threads = size_workers(workers, s.threads, thread_plan(0, s.numa).count)
            spec = session_spec(session, name, target.doc_ids, tasks, session.sampling(), threads)
        except Exception as e:  # a setting or model a person can fix
            self.sig_error.emit(str(e))
            return None
        self.batch_id = spec.batch_id

        def work(ctl: JobControl):
            if workers == 1:  # the window's own engine: no second copy of the model in memory
                pool = LocalPool(DocumentWorker(spec.engine, backend=session.batch_backend(target.doc_ids)))
            else:
                from app.batch.ray_pool import RayPool

                pool = RayPool(spec.engine, workers, threads)
            try:
                return run_batch(session.store, spec, pool, cancel=ctl.cancelled,
                                 on_progress=lambda p: ctl.progress(p.done, p.total, p.line()))
            finally:
                pool.close()

        job = Job(work)
        job.signals.sig_progress.connect(self._progress)
        job.signals.sig_done.connect(self._done)
        job.signals.sig_error.connect(self.sig_error.emit)
        job.signals.sig_finished.connect(self._finished)
        self.progress.setVisible(True)
        self.progress.setRange(0, len(target.doc_ids))
        self.progress.setValue(0)
        self.status.setText(f"Starting: {len(target.doc_ids)} documents x {len(tasks)} tasks…")
        self.show_results()
        self.in_window = workers == 1
        self.job = start(job, self.pool)
        self._update_buttons()
        return job

    def uses_window_engine(self) -> bool:
        """Whether a batch runs now on the window's own engine (so nothing else may use it)."""
        return self.job is not None and self.in_window

    def cancel(self) -> None:
        if self.job:
            self.job.cancel()
            self.status.setText("Stopping after the current document…")

    def show_results(self) -> int:
        """Fill the table with the current batch's results from the store; returns the rows."""
        from app.store import batches

        rows = batches.results(self.session.store, self.batch_id) if self.batch_id else []
        self.table.setRowCount(len(rows))
        for i, r in enumerate(rows):
            cite = r["citations"][0] if r["citations"] else None
            cells = (r.get("title") or r.get("path") or str(r["doc_id"]),
                     r["question"] if r["kind"] == "ask" else "(summary)", " ".join(r["answer"].split()),
                     str(cite["page"]) if cite else "")
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(r["answer"] if j == 2 else text)
                self.table.setItem(i, j, item)
            self.table.item(i, 0).setData(Qt.UserRole, (r["doc_id"], cite["page"] if cite else 0,
                                                cite.get("text", "") if cite else ""))
        return len(rows)

    def open_row(self, row: int, _column: int = 0) -> None:
        """The row's first citation, opened in the viewer (sig_citation)."""
        item = self.table.item(row, 0)
        if item is None:
            return
        doc_id, page, passage = item.data(Qt.UserRole)
        if page:
            self.sig_citation.emit(doc_id, page, passage)

    def choose_export(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export the batch's results", "batch.csv",
                                              "CSV (*.csv);;JSON Lines (*.jsonl);;Markdown (*.md)")
        if path:
            self.export_to(path)

    def export_to(self, path: str):
        from app.batch.results_file import BatchExportError, export_rows, write_results
        from app.store import batches

        if not self.batch_id:
            self.sig_error.emit("Run a batch first: there are no results to export.")
            return None
        try:
            out = write_results(path, export_rows(batches.results(self.session.store, self.batch_id)))
        except (BatchExportError, OSError) as e:
            self.sig_error.emit(str(e))
            return None
        self.sig_message.emit(f"Batch results written to {out}")
        return out

    # ---- Slots -----------------------------------------------------------------

    def _progress(self, done: int, total: int, line: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.status.setText(line)
        self.show_results()

    def _done(self, report) -> None:
        self.report = report
        self.show_results()
        failed = "; ".join(f"{f['title'] or f['doc']}: {f['reason']}" for f in report.failures)
        head = "Stopped" if report.cancelled else ("Done" if report.complete else "Finished with failures")
        self.status.setText(f"{head}: {report.done} of {report.total} documents, {report.answers} answers "
                            f"written by this run" + (f". Failed: {failed}" if failed else ""))

    def _finished(self) -> None:
        self.job = None
        self.progress.setVisible(False)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.job is not None
        self.run_button.setEnabled(not busy)
        self.stop_button.setEnabled(busy)
        self.export_button.setEnabled(not busy and self.batch_id is not None)
