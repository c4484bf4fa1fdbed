"""The main window: the library on the left, the document viewer in the middle, and
the ask / summary / batch / hardware tabs on the right. It wires the panes to the services
(ingest, ask) and to each other; the panes hold the widgets."""
from __future__ import annotations

import os
import time

from PySide6.QtCore import Qt, QThreadPool
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QMessageBox, QSplitter, QTabWidget, QToolBar

from app.qa import history
from app.qa.conversation import Conversation
from app.qa.cache_budget import format_size
from app.qa.doc_cache import budget_of
from app.qa.history import PastAnswer
from app.qa.reading import MEMORY_ONLY, NOT_READ, READ
from app.qa.stream import Listeners
from app.qa.targets import SELECTED, AskTarget, resolve, scope_note
from app.session import Session, SessionError
from app.settings import AUTO_BUDGET
from app.store.threads import create_thread
from app.ui.api_switch import ApiSwitch
from app.ui.ask_pane import AskPane
from app.ui.batch_tab import BatchTab
from app.ui.conversations import ConversationsMixin
from app.ui.hardware_tab import HardwareTab
from app.ui.library import FolderWatcher, LibraryPane
from app.ui.read_ahead import ReadAhead
from app.ui.settings_dialog import SettingsDialog
from app.ui.summary_pane import SummaryPane
from app.ui.viewer import DocumentViewer
from app.ui.workers import Job, JobControl, start

__all__ = ["AskPane", "LibraryPane", "MainWindow"]

LIBRARY_REFRESH_S = 0.5  # while ingesting, show new documents at most this often
CLOSE_WAIT_MS = 15_000  # how long closing waits for cancelled work to reach a stopping point


class MainWindow(ConversationsMixin, QMainWindow):
    def __init__(self, session: Session, read_ahead: bool = False):
        """``read_ahead``: read the library's documents into their KV caches in the background
        (the app does; tests that do not test it leave it off)."""
        super().__init__()
        self.session = session
        self.pool = QThreadPool.globalInstance()
        self.docs: list[dict] = []
        self.ingest_job: Job | None = None
        self.ask_job: Job | None = None
        self.pending_rescan: list[str] = []  # folders that changed while an ingestion ran
        self.thread_id: int | None = None    # the conversation in view; None: the next question starts one
        # The conversations continued in this window: each keeps the tokens the backend holds of
        # its last turn, so a follow-up prefills only its own (qa/conversation.py).
        self.conversations: dict[int, Conversation] = {}
        self._new_thread: int | None = None  # the thread the question being answered started
        self._ingest_summary = ""
        self._last_refresh = 0.0
        self.setWindowTitle("eLLM — ask your documents")
        self.resize(1200, 760)

        self.library = LibraryPane()
        self.viewer = DocumentViewer(session.store)
        self.ask_pane = AskPane()
        self.summary_pane = SummaryPane(session, self.pool)
        self.hardware_tab = HardwareTab(session, self.pool)
        self.batch_tab = BatchTab(session, self.target_of, self.pool, engine_busy=self.engine_busy)
        self.summary_pane.engine_busy = lambda: self.batch_tab.uses_window_engine()
        self.tabs = QTabWidget()
        self.tabs.setObjectName("sideTabs")
        self.tabs.addTab(self.ask_pane, "Ask")
        self.tabs.addTab(self.summary_pane, "Summary")
        self.tabs.addTab(self.batch_tab, "Batch")
        self.tabs.addTab(self.hardware_tab, "Hardware")
        self.tabs.currentChanged.connect(self._tab_changed)
        splitter = QSplitter()
        splitter.setObjectName("main")
        for w in (self.library, self.viewer, self.tabs):
            splitter.addWidget(w)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([410, 350, 440])
        self.setCentralWidget(splitter)
        self.watcher = FolderWatcher(parent=self)
        self.reader = ReadAhead(session, self.pool, parent=self)
        self.read_ahead = read_ahead
        self.summary_pane.reader = self.reader
        self._build_actions()
        self.reader.sig_state.connect(self.read_state)

        self.library.sig_selection_changed.connect(self.selection_changed)
        self.library.folder_filter.currentIndexChanged.connect(self.view_changed)
        self.library.sig_open_folder.connect(self.choose_folder)
        self.library.sig_remove_folder.connect(self.remove_folder)
        self.library.cancel_button.clicked.connect(self.cancel_ingest)
        self.ask_pane.sig_ask.connect(self.ask)
        self.ask_pane.sig_stop.connect(self.stop)
        self.ask_pane.sig_citation.connect(self.show_citation)
        self.ask_pane.sig_target_changed.connect(self.view_changed)
        threads = self.ask_pane.threads
        threads.sig_search.connect(lambda _: self.list_threads())
        threads.sig_chosen.connect(self.open_thread)
        threads.sig_new.connect(self.new_conversation)
        threads.sig_rename.connect(self.ask_rename_thread)
        threads.sig_delete.connect(self.ask_delete_thread)
        self.watcher.sig_changed.connect(self.folders_changed)
        self.batch_tab.sig_citation.connect(self.show_citation)
        for pane in (self.summary_pane, self.hardware_tab, self.batch_tab):
            pane.sig_error.connect(self.show_error)
            pane.sig_message.connect(self.statusBar().showMessage)
        self.api = ApiSwitch(session, self)
        self.api.sig_error.connect(self.show_error)
        self.api.sig_message.connect(self.statusBar().showMessage)
        self.statusBar().addPermanentWidget(self.api.label)
        self.statusBar().showMessage(f"Data: {session.paths.root}")
        self.refresh()
        self.view_changed()
        if read_ahead:
            self.reader.start()
        self.apply_api_setting()

    def _build_actions(self) -> None:
        toolbar = QToolBar("Main")
        toolbar.setObjectName("mainToolbar")
        toolbar.setMovable(False)
        self.addToolBar(toolbar)

        def action(text: str, shortcut, slot, tip: str = "", in_toolbar: bool = True) -> QAction:
            a = QAction(text, self)
            a.setShortcut(QKeySequence(shortcut))
            a.setToolTip(f"{tip or text} ({a.shortcut().toString(QKeySequence.NativeText)})")
            a.triggered.connect(slot)
            (toolbar.addAction if in_toolbar else self.addAction)(a)
            return a

        self.open_action = action("Open folder…", QKeySequence.Open, self.choose_folder,
                                  "Add a folder of documents to the library")
        self.rescan_action = action("Rescan", QKeySequence.Refresh, self.rescan, "Look for new and changed files")
        self.settings_action = action("Settings…", "Ctrl+,", self.open_settings, "Model, engine, context, threads")
        self.pause_reading_action = action("Pause reading", "Ctrl+Shift+P", self.toggle_reading,
                                           "Pause or resume reading documents into their caches in the background")
        self.ask_action = action("Ask", "Ctrl+Return", self.ask_pane.submit, in_toolbar=False)
        self.stop_action = action("Stop", Qt.Key_Escape, self.stop, in_toolbar=False)
        self.zoom_in_action = action("Zoom in", QKeySequence.ZoomIn, self.viewer.zoom_in, in_toolbar=False)
        self.zoom_out_action = action("Zoom out", QKeySequence.ZoomOut, self.viewer.zoom_out, in_toolbar=False)
        self.next_page_action = action("Next page", Qt.Key_PageDown, self.viewer.next_page, in_toolbar=False)
        self.prev_page_action = action("Previous page", Qt.Key_PageUp, self.viewer.previous_page, in_toolbar=False)

    # ---- Public API --------------------------------------------------------

    def refresh(self, watch: bool = True) -> None:
        """Read the documents and folders again and show them; watch the folders."""
        folders = self.session.store.folders()
        self.docs = self.session.store.documents()
        states = self.reader.states()
        queue = {doc_id: n for n, doc_id in enumerate(self.reader.queue(), 1)}
        sizes = {}
        for row in self.session.store.kv_caches():
            sizes[row["doc_id"]] = sizes.get(row["doc_id"], 0) + row["bytes"]
        for d in self.docs:
            d["read"] = states.get(d["id"], "")
            d["read"] = self.read_label(d["read"], sizes.get(d["id"], 0), queue.get(d["id"]))
        self.library.set_folders(folders)
        self.library.set_documents(self.docs)
        self.library.set_cache_total(self.cache_total())
        self.update_target()
        if watch:
            self.watcher.watch(folders)

    @staticmethod
    def read_label(state: str, cache_bytes: int, place: int | None) -> str:
        """What the library's Read column says: a read document with its cache's size on disk,
        one not read yet with its place in reading ahead's order."""
        if state == READ and cache_bytes:
            return f"{READ}, {format_size(cache_bytes)}"
        if state == NOT_READ and place is not None:
            return f"no, #{place}"       # not read, its place in line (the tooltip says it whole)
        return state

    def read_state(self, doc_id: int, state: str) -> None:
        """Reading ahead's news of a document: its state, and once read its cache's size."""
        size = sum(r["bytes"] for r in self.session.store.kv_caches(doc_id)) if state == READ else 0
        self.library.set_read_state(doc_id, self.read_label(state, size, None))
        if state in (READ, MEMORY_ONLY):
            self.library.set_cache_total(self.cache_total())

    def cache_total(self) -> str:
        """The document caches on disk against their budget, for the library's footer."""
        budget = budget_of(self.session.store, self.session.paths.cache_dir)
        total = budget.total()
        return f"Caches: {format_size(total)} of {format_size(budget.budget)}" + (
            " (automatic)" if budget.settings.cache_budget == AUTO_BUDGET else "")

    def titles(self) -> dict[int, str]:
        return {d["id"]: d["title"] or os.path.basename(d["path"]) for d in self.docs}

    def document(self, doc_id: int) -> dict | None:
        return next((d for d in self.docs if d["id"] == doc_id), None)

    def choose_folder(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Open a folder of documents")
        if folder:
            self.ingest([folder])

    def rescan(self) -> None:
        folders = self.session.store.folders()
        if folders:
            self.ingest(folders)

    def remove_folder(self, folder: str) -> None:
        self.session.store.remove_folder(folder)
        self.statusBar().showMessage(f"{folder} is no longer watched; its documents stay in the library")
        self.library.choose_folder(None)
        self.refresh()

    def folders_changed(self, folders: list[str]) -> None:
        """Files changed under ``folders`` (the watcher, debounced): ingest them again."""
        if self.ingest_job is not None:
            self.pending_rescan += [f for f in folders if f not in self.pending_rescan]
            return
        self.statusBar().showMessage("Files changed: " + ", ".join(folders))
        self.ingest(folders)

    def ingest(self, paths: list[str]) -> Job:
        from app.library.ingest import ingest

        if self.ingest_job is not None:
            return self.ingest_job
        session = self.session

        def work(ctl: JobControl):
            count = session.token_counter()
            return ingest(session.store, paths, count,
                          progress=lambda e: ctl.progress(e.index, e.total,
                                                          e.line() + (f" · {e.left}" if e.left else "")),
                          cancel=ctl.cancelled)

        job = Job(work)
        job.signals.sig_progress.connect(self._ingest_progress)
        job.signals.sig_done.connect(self._ingested)
        job.signals.sig_error.connect(self.show_error)
        job.signals.sig_finished.connect(self._ingest_finished)
        self.library.begin_progress("Looking for documents…")
        self.ingest_job = start(job, self.pool)
        return job

    def cancel_ingest(self) -> None:
        if self.ingest_job:
            self.ingest_job.cancel()
            self.library.current.setText("Stopping after the current file or OCR page…")

    def ask_target(self) -> AskTarget:
        """What a question asked now would be about: the choice in the ask pane, applied to
        the library's selection, its current document and its chosen folder."""
        return self.target_of(self.ask_pane.target_kind())

    def target_of(self, kind: str) -> AskTarget:
        """The documents of a target ``kind`` (qa/targets.py) as the library stands now."""
        return resolve(kind, self.docs, self.library.selected_ids(), self.library.current_id(),
                       self.library.chosen_folder())

    def engine_busy(self) -> bool:
        """Whether an answer or a summary is using the window's engine now (one generation at a time)."""
        return self.ask_job is not None or self.summary_pane.job is not None

    def update_target(self) -> AskTarget:
        """Show what the next question is asked about: the conversation in view's documents, or
        the ask target; returns the ask target."""
        target = self.ask_target()
        summary = self.thread_in_view()
        titles = self.titles()
        shown = history.thread_target(summary, titles) if summary is not None else target
        self.ask_pane.show_target(shown, titles, follow_up=summary is not None)
        return target

    def selection_changed(self, ids: list[int]) -> None:
        self.update_target()
        current = self.library.current_id()
        first = self.document(current) if current is not None else None
        if first is None or self.viewer.doc_id != first["id"]:
            if first is not None:
                self.session.store.mark_opened([first["id"]])   # read ahead first (qa/reading.py)
            self.viewer.show_document(first)
        if self.summary_pane.doc is None or first is None or self.summary_pane.doc["id"] != first["id"]:
            self.summary_pane.set_document(first)
        self.view_changed()

    def ask(self, question: str) -> Job | None:
        """Ask ``question`` about the ask pane's target: one document, several, a folder or
        everything, in one generation, by the answer service `ellm ask` uses (app/qa/answer.py)."""
        if self.ask_job is not None:
            return self.ask_job
        if self.batch_tab.uses_window_engine():
            self.show_error("A batch is using the model in this window: stop it (Batch tab) or wait for it.")
            return None
        summary = self.thread_in_view()
        target = self.update_target()
        if summary is not None:
            target = history.thread_target(summary, self.titles())
        ids = list(target.doc_ids)
        if not ids:
            self.show_error(f"{target.heading}.")
            return None
        session = self.session
        if summary is None:     # a new conversation: its first question names it
            thread_id = create_thread(session.store, ids, title=question, kind=target.kind, folder=target.folder)
            self._new_thread = self.thread_id = thread_id
            conv = self.conversations[thread_id] = Conversation(thread_id)
        else:
            conv = self.conversation(summary)

        if target.kind == SELECTED:      # a document not read yet is answered from passages: read it next
            self.reader.prefer(ids)      # (across a folder: those the answer cites, qa/reading.py)
        self.reader.suspend()      # the engine answers first; reading carries on afterwards

        def work(ctl: JobControl):
            with session.engine_lock:
                listen = Listeners(on_text=ctl.text, progress=ctl.progress, cancel=ctl.cancelled,
                                   on_stats=lambda stats: ctl.stats(stats.decode_tok_s, stats.read_gb_s))
                return session.ask(question, ids, listen=listen, conversation=conv)

        job = Job(work)
        job.signals.sig_text.connect(self._streamed)
        job.signals.sig_stats.connect(self._live_rate)
        job.signals.sig_progress.connect(self._ask_progress)
        job.signals.sig_done.connect(self._answered)
        job.signals.sig_error.connect(self.show_error)
        job.signals.sig_finished.connect(self._ask_finished)
        self.ask_pane.begin(question, len(ids), follow_up=summary is not None)
        self.ask_pane.set_busy(True)
        self.tabs.setCurrentWidget(self.ask_pane)
        self.ask_job = start(job, self.pool)
        self.list_threads()
        self.ask_pane.threads.select(self.thread_id)
        return job

    def stop(self) -> None:
        if self.ask_job:
            self.ask_job.cancel()
        elif self.summary_pane.job:
            self.summary_pane.cancel()

    def show_citation(self, doc_id: int, page: int, passage: str = "") -> bool:
        """Open the cited page in the viewer with the passage highlighted."""
        found = self.viewer.show_citation(doc_id, page, passage)
        title = self.titles().get(doc_id, str(doc_id))
        self.statusBar().showMessage(f"{title}, page {page}" + ("" if found or not passage else
                                                                 " (the passage could not be located on the page)"))
        return found

    def open_settings(self) -> SettingsDialog:
        dialog = SettingsDialog(self.session, self)
        dialog.accepted.connect(self._settings_saved)
        dialog.open()
        return dialog

    def apply_api_setting(self) -> None:
        """Start or stop the local API server as the settings say (loopback only)."""
        try:
            settings = self.session.settings
        except SessionError:
            return      # the stored settings are unusable: the settings dialog says why
        self.api.apply(settings)

    def show_error(self, message: str) -> None:
        """A readable message in the status bar and a non-modal box (never a traceback)."""
        self.statusBar().showMessage(message)
        box = QMessageBox(QMessageBox.Warning, "eLLM", message, QMessageBox.Ok, self)
        box.setModal(False)
        box.show()
        self._error_box = box

    def toggle_reading(self) -> None:
        """Pause reading ahead, or resume it."""
        if self.reader.paused or not self.read_ahead:
            self.read_ahead = True
            self.reader.resume()
            self.pause_reading_action.setText("Pause reading")
        else:
            self.reader.pause()
            self.pause_reading_action.setText("Resume reading")

    def closeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        """Closing stops the work in progress: an answer at its next token, ingestion
        after the current file, a summary at its next token, reading after its chunk."""
        self.reader.stop()
        self.api.stop()
        for job in (self.ask_job, self.ingest_job, self.summary_pane.job, self.batch_tab.job):
            if job is not None:
                job.cancel()
        self.watcher.timer.stop()
        self.pool.waitForDone(CLOSE_WAIT_MS)
        super().closeEvent(event)

    # ---- Slots ------------------------------------------------------------------

    def _ingest_progress(self, done: int, total: int, what: str) -> None:
        self.library.set_progress(done, total, what)
        now = time.monotonic()
        if now - self._last_refresh >= LIBRARY_REFRESH_S or done >= total:  # a big folder: not per file
            self._last_refresh = now
            self.refresh(watch=False)

    def _ingested(self, report) -> None:
        self.statusBar().showMessage(report.summary())
        self._ingest_summary = report.summary()

    def _ingest_finished(self) -> None:
        self.ingest_job = None
        self.library.end_progress(self._ingest_summary)
        self._ingest_summary = ""
        self.refresh()
        if self.read_ahead:
            self.reader.start()
        if self.pending_rescan:
            folders, self.pending_rescan = self.pending_rescan, []
            self.ingest(folders)

    def _streamed(self, piece: str) -> None:
        self.ask_pane.append(piece)

    def _live_rate(self, tok_s: float, gb_s: float) -> None:
        """The engine's own figures while it decodes (GenerationStats): tokens/s and the bytes
        it reads per token, which sparse attention keeps far below the whole cache."""
        if tok_s <= 0:
            return
        self.ask_pane.set_live(f"Generating… ≈{tok_s:.1f} tokens/s" + (f", ≈{gb_s:.2f} GB/s read" if gb_s > 0 else ""))
        self.hardware_tab.set_live(tok_s, gb_s if gb_s > 0 else None)

    def _answered(self, answer) -> None:
        engine_note = self.session.engine_note()
        if engine_note:
            self.statusBar().showMessage(engine_note)
        titles = self.titles()
        # Why some documents or pages were left out (or earlier turns); else, for several, which were asked.
        note = answer.notes or scope_note(answer.doc_ids, titles)
        this = PastAnswer(answer.answer_id or -1, answer.question, answer.answer, answer.citations, answer.timings,
                          list(answer.doc_ids), "", thread_id=answer.thread_id)
        shown = [this]
        if answer.thread_id is not None and history.thread(self.session.store, answer.thread_id) is not None:
            self.thread_id = answer.thread_id
            shown = history.turns(self.session.store, answer.thread_id)
            if answer.answer_id is None:   # stopped before its first word: not stored
                shown.append(this)
        self.ask_pane.show_thread(shown, titles, note, answer.cancelled, answer.attended)

    def _ask_progress(self, done: int, total: int, what: str) -> None:
        """Before the answer: a document being read into its cache, tokens read of total."""
        self.ask_pane.set_reading(done, total, what[:1].upper() + what[1:])

    def _ask_finished(self) -> None:
        self.ask_job = None
        self.forget_empty_thread()
        self.reader.carry_on()
        self.refresh(watch=False)   # the document asked about is read now
        self.ask_pane.set_busy(False)
        self.list_threads()
        self.hardware_tab.set_live(None, None)

    def _settings_saved(self) -> None:
        self.statusBar().showMessage("Settings saved; used from the next answer")
        self.apply_api_setting()

    def _tab_changed(self, index: int) -> None:
        if self.tabs.widget(index) is self.hardware_tab:
            self.hardware_tab.ensure_loaded()
