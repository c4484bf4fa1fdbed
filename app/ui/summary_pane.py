"""The summary pane: a whole-document summary made in the background (one pass, or
section by section then combined), shown, exported and copied."""
from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QThreadPool, Signal
from PySide6.QtWidgets import (
    QApplication, QFileDialog, QHBoxLayout, QProgressBar, QPushButton, QTextBrowser, QVBoxLayout, QWidget,
)

from app.ui.widgets import info_label
from app.ui.workers import Job, JobControl, start

EXPORT_FILTERS = {
    "md": "Markdown (*.md)",
    "pdf": "PDF (*.pdf)",
    "docx": "Word document (*.docx)",
}


class SummaryPane(QWidget):
    """Summarize the selected document; export or copy the result."""

    sig_error = Signal(str)
    """Something failed; the message says what and what to do."""
    sig_message = Signal(str)
    """Something a person may want to know (for the status bar)."""

    def __init__(self, session, pool: QThreadPool | None = None, parent=None):
        super().__init__(parent)
        self.session = session
        self.pool = pool or QThreadPool.globalInstance()
        self.doc: dict | None = None
        self.job: Job | None = None
        self.reader = None   # the window's ReadAhead, paused while a summary runs
        self.summary: dict | None = None  # {"title", "text", "method", "source"} of the summary shown
        self.engine_busy = lambda: False   # the window says when another job holds the engine

        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.target = info_label("Select a document in the library", "heading", wrap=False)
        layout.addWidget(self.target)
        row = QHBoxLayout()
        self.summarize_button = QPushButton("Summarize")
        self.summarize_button.setObjectName("primary")
        self.summarize_button.setToolTip("A summary of the whole document, section by section when it is long")
        self.summarize_button.clicked.connect(self.summarize)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setEnabled(False)
        self.cancel_button.clicked.connect(self.cancel)
        row.addWidget(self.summarize_button)
        row.addWidget(self.cancel_button)
        row.addStretch(1)
        layout.addLayout(row)
        self.progress = QProgressBar()
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.step = info_label("", "status")
        layout.addWidget(self.step)
        self.text = QTextBrowser()
        self.text.setObjectName("answer")
        layout.addWidget(self.text, 1)
        self.method = info_label("", "stats")
        layout.addWidget(self.method)
        row = QHBoxLayout()
        self.export_buttons = {}
        for fmt, label in (("md", "Markdown…"), ("pdf", "PDF…"), ("docx", "DOCX…")):
            b = QPushButton(label)
            b.setToolTip(f"Export the summary as {EXPORT_FILTERS[fmt].split(' (')[0]}")
            b.clicked.connect(lambda _=False, f=fmt: self.choose_export(f))
            self.export_buttons[fmt] = b
            row.addWidget(b)
        self.copy_button = QPushButton("Copy")
        self.copy_button.setToolTip("Copy the summary to the clipboard")
        self.copy_button.clicked.connect(self.copy)
        row.addWidget(self.copy_button)
        row.addStretch(1)
        layout.addLayout(row)
        self._update_buttons()

    # ---- Public API --------------------------------------------------------

    def set_document(self, doc: dict | None) -> None:
        """Show ``doc`` and its latest stored summary (if any)."""
        self.doc = doc
        self.summary = None
        self.text.clear()
        self.method.setText("")
        if doc is None:
            self.target.setText("Select a document in the library")
        else:
            self.target.setText(f"Summary of: {doc['title'] or doc['path']}")
            stored = self.session.store.summaries(doc["id"])
            if stored:
                s = stored[0]
                self._show(doc["title"] or doc["path"], s["summary"], s["method"] or "",
                           f"saved {s['created_at'][:16].replace('T', ' ')}")
        self._update_buttons()

    def summarize(self) -> Job | None:
        if self.doc is None:
            self.sig_error.emit("Select a document in the library first.")
            return None
        if self.job is not None:
            return self.job
        if self.engine_busy():
            self.sig_error.emit("A batch is using the model in this window: stop it (Batch tab) or wait for it.")
            return None
        session, doc_id = self.session, self.doc["id"]

        if self.reader is not None:
            self.reader.suspend()     # the summary needs the engine; reading carries on afterwards

        def work(ctl: JobControl):
            with session.engine_lock:
                return session.summarize(doc_id, progress=ctl.progress, cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_progress.connect(self._progress)
        job.signals.sig_done.connect(self._done)
        job.signals.sig_error.connect(self.sig_error.emit)
        job.signals.sig_finished.connect(self._finished)
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.step.setText("Preparing the summary…")
        self.job = start(job, self.pool)
        self._update_buttons()
        return job

    def cancel(self) -> None:
        if self.job:
            self.job.cancel()
            self.step.setText("Stopping after the current step…")

    def choose_export(self, fmt: str) -> None:
        if not self.summary:
            return
        stem = "".join(c if c.isalnum() or c in " -_" else "_" for c in self.summary["title"]).strip() or "summary"
        suggested = str(Path.home() / f"{stem} summary.{fmt}")
        path, _ = QFileDialog.getSaveFileName(self, "Export the summary", suggested, EXPORT_FILTERS[fmt])
        if path:
            self.export_to(path, fmt)

    def export_to(self, path: str | os.PathLike, fmt: str | None = None) -> Path | None:
        """Write the summary shown to ``path`` (format from ``fmt`` or the suffix)."""
        from app.qa.export import ExportError, export

        if not self.summary:
            self.sig_error.emit("There is no summary to export yet: click Summarize first.")
            return None
        s = self.summary
        try:
            out = export(path, s["title"], s["text"], fmt, source=s["source"], method=s["method"])
        except ExportError as e:
            self.sig_error.emit(str(e))
            return None
        except Exception as e:  # a writer library failing: say so, keep the window alive
            self.sig_error.emit(f"{path}: export failed ({type(e).__name__}: {e})")
            return None
        self.sig_message.emit(f"Summary exported to {out}")
        return out

    def copy(self) -> None:
        if self.summary:
            QApplication.clipboard().setText(self.summary["text"])
            self.sig_message.emit("Summary copied to the clipboard")

    # ---- Internals -------------------------------------------------------------

    def _show(self, title: str, text: str, method: str, when: str = "") -> None:
        self.summary = {"title": title, "text": text, "method": method,
                        "source": self.doc["path"] if self.doc else ""}
        self.text.setPlainText(text)
        self.method.setText(" · ".join(p for p in (method, when) if p))

    def _progress(self, step: int, steps: int, what: str) -> None:
        self.progress.setRange(0, max(steps, 1))
        self.progress.setValue(step)
        self.step.setText(what[:1].upper() + what[1:] if what else "")

    def _done(self, result) -> None:
        if self.doc is None or result.doc_id != self.doc["id"]:
            return  # the person moved on to another document; the summary is stored
        if result.cancelled:
            self.step.setText("Cancelled; nothing was saved.")
            return
        self._show(result.title, result.text, result.method, f"{result.seconds:.1f} s")
        self.step.setText("")

    def _finished(self) -> None:
        self.job = None
        if self.reader is not None:
            self.reader.carry_on()
        self.progress.setVisible(False)
        self._update_buttons()

    def _update_buttons(self) -> None:
        busy = self.job is not None
        self.summarize_button.setEnabled(self.doc is not None and not busy)
        self.cancel_button.setEnabled(busy)
        for b in (*self.export_buttons.values(), self.copy_button):
            b.setEnabled(bool(self.summary) and not busy)
