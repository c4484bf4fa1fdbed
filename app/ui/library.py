"""The library: the opened folders, their documents with status, ingestion progress,
and the watcher that notices when files in those folders change."""
from __future__ import annotations

from PySide6.QtCore import QFileSystemWatcher, QItemSelectionModel, QObject, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractItemView, QComboBox, QHBoxLayout, QHeaderView, QLabel, QProgressBar, QPushButton, QTableWidget,
    QTableWidgetItem, QToolButton, QVBoxLayout, QWidget,
)

from app.library.folders import documents_in, folders_to_rescan, watch_targets
from app.ui.widgets import info_label

COLUMNS = ("Title", "Pages", "Tokens", "Status", "Read")
READ_COLUMN = COLUMNS.index("Read")
ALL_FOLDERS = "All folders"
# The title is what a person picks a document by: it takes the room the other columns leave,
# and they keep to what their usual values need (a long state or failure elides; its whole
# text is in the tooltip and the details line).
PAGES_WIDTH = 48
TOKENS_WIDTH = 58   # "61.2K", "1.23M"
STATUS_WIDTH = 68
READ_WIDTH = 76     # "no, #3" whole; "read, 931 MiB" may elide (the title keeps the most room; the tooltip has it all)
WATCH_DELAY_MS = 1500  # editors write a file in several steps; wait for the last one
MAX_WATCHED_FILES = 4000  # inotify watches are a per-user budget; past this, folders only (Rescan finds edits)


class LibraryPane(QWidget):
    """The documents with their status; failed ones show why."""

    sig_selection_changed = Signal(list)
    """The ids of the selected documents."""
    sig_open_folder = Signal()
    """The person wants to open (add) a folder."""
    sig_remove_folder = Signal(str)
    """The person no longer wants this folder in the library (its documents stay stored)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.docs: list[dict] = []
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        top = QHBoxLayout()
        heading = QLabel("Library")
        heading.setObjectName("heading")
        top.addWidget(heading)
        top.addStretch(1)
        self.add_button = QToolButton()
        self.add_button.setText("+ Folder")
        self.add_button.setToolTip("Open a folder of documents (Ctrl+O)")
        self.add_button.clicked.connect(self.sig_open_folder.emit)
        top.addWidget(self.add_button)
        layout.addLayout(top)

        row = QHBoxLayout()
        self.folder_filter = QComboBox()
        self.folder_filter.setObjectName("folderFilter")
        self.folder_filter.setToolTip("Show the documents of one folder")
        self.folder_filter.setSizeAdjustPolicy(QComboBox.AdjustToMinimumContentsLengthWithIcon)
        self.folder_filter.setMinimumContentsLength(12)
        self.folder_filter.currentIndexChanged.connect(self._filter_changed)
        row.addWidget(self.folder_filter, 1)
        self.remove_button = QToolButton()
        self.remove_button.setText("Remove")
        self.remove_button.setToolTip("Stop watching this folder (its documents and answers stay stored)")
        self.remove_button.setEnabled(False)
        self.remove_button.clicked.connect(self._remove_folder)
        row.addWidget(self.remove_button)
        layout.addLayout(row)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("library")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.ExtendedSelection)  # Ctrl/Shift-click: ask about several
        self.table.setEditTriggers(QAbstractItemView.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.setWordWrap(False)
        self.table.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.table.setTextElideMode(Qt.ElideRight)
        header = self.table.horizontalHeader()
        header.setMinimumSectionSize(36)
        header.setSectionResizeMode(0, QHeaderView.Stretch)
        # The others keep their widths (a person can drag them wider); a failure reason or
        # "reading 42 %, 3 min left" elides, whole in the tooltip and the details line.
        for col, width in ((1, PAGES_WIDTH), (2, TOKENS_WIDTH), (3, STATUS_WIDTH), (READ_COLUMN, READ_WIDTH)):
            header.setSectionResizeMode(col, QHeaderView.Interactive)
            header.resizeSection(col, width)
        self.table.itemSelectionChanged.connect(self._selection_changed)
        layout.addWidget(self.table, 1)

        self.details = info_label("", "details")
        self.details.setTextInteractionFlags(Qt.TextSelectableByMouse)
        layout.addWidget(self.details)
        self.cache_total = info_label("", "cacheTotal")
        self.cache_total.setToolTip("The documents' KV caches on disk against their budget (Settings; "
                                    "`ellm cache`): past it, the least recently used are deleted first")
        layout.addWidget(self.cache_total)

        self.progress = QProgressBar()
        self.progress.setVisible(False)
        self.current = info_label("", "status")
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop ingesting after the current file (or the current page of a scan being OCRed)")
        self.cancel_button.setVisible(False)
        row = QHBoxLayout()
        row.addWidget(self.progress, 1)
        row.addWidget(self.cancel_button)
        layout.addLayout(row)
        layout.addWidget(self.current)
        self.set_folders([])

    # ---- Public API --------------------------------------------------------

    def set_folders(self, folders: list[str]) -> None:
        """The opened folders, for the filter; keeps the chosen one if it is still there."""
        chosen = self.chosen_folder()
        self.folder_filter.blockSignals(True)
        self.folder_filter.clear()
        self.folder_filter.addItem(ALL_FOLDERS, None)
        for f in folders:
            self.folder_filter.addItem(f, f)
            self.folder_filter.setItemData(self.folder_filter.count() - 1, f, Qt.ToolTipRole)
        index = self.folder_filter.findData(chosen) if chosen else 0
        self.folder_filter.setCurrentIndex(max(index, 0))
        self.folder_filter.blockSignals(False)
        self.remove_button.setEnabled(self.chosen_folder() is not None)

    def chosen_folder(self) -> str | None:
        return self.folder_filter.currentData()

    def choose_folder(self, folder: str | None) -> None:
        self.folder_filter.setCurrentIndex(max(self.folder_filter.findData(folder), 0) if folder else 0)

    def set_documents(self, docs: list[dict]) -> None:
        """Every stored document; the table shows those of the chosen folder."""
        self.docs = docs
        selected, current = self.selected_ids(), self.current_id()
        shown = documents_in(docs, self.chosen_folder())
        self.table.blockSignals(True)
        self.table.clearSelection()
        self.table.setRowCount(len(shown))
        for r, d in enumerate(shown):
            status = d["status"] if not d["error"] else f"{d['status']}: {d['error']}"
            title = d["title"] or d["path"]
            tokens = int(d["tokens"] or 0)
            values = (title, str(d["pages"]), short_count(tokens), status, d.get("read", ""))
            details = (status if d["error"] else "", f"{d['pages']} pages", f"{tokens:,} tokens", status,
                       read_tip(d))
            for c, v in enumerate(values):
                item = QTableWidgetItem(v)
                item.setData(Qt.UserRole, d["id"])
                item.setToolTip(row_tip(d, details[c]))
                if c in (1, 2):
                    item.setTextAlignment(Qt.AlignRight | Qt.AlignVCenter)
                if d["status"] == "failed":
                    item.setForeground(Qt.darkRed)
                elif d["status"] == "missing":
                    item.setForeground(Qt.gray)
                self.table.setItem(r, c, item)
        self._restore_selection(shown, selected, current)
        self.table.blockSignals(False)
        if self.selected_ids() != selected:
            self._selection_changed()
        else:
            self._show_details()

    def set_read_state(self, doc_id: int, state: str) -> None:
        """A document's reading state ("no, #3", "reading 42 %, 3 min left", "read, 931 MiB",
        "in memory only")."""
        doc = next((d for d in self.docs if d["id"] == doc_id), None)
        if doc is not None:
            doc["read"] = state
        for r in range(self.table.rowCount()):
            item = self.table.item(r, READ_COLUMN)
            if item is not None and item.data(Qt.UserRole) == doc_id:
                item.setText(state)
                item.setToolTip(row_tip(doc, read_tip(doc)) if doc is not None else state)

    def set_cache_total(self, text: str) -> None:
        """The caches on disk against their budget ("Caches: 2.1 GiB of 32 GiB")."""
        self.cache_total.setText(text)

    def selected_ids(self) -> list[int]:
        rows = sorted({i.row() for i in self.table.selectedItems()})
        return [self.table.item(r, 0).data(Qt.UserRole) for r in rows]

    def current_id(self) -> int | None:
        """The document the viewer shows: the selected row last clicked, else the first selected."""
        row = self.table.currentRow()
        if row >= 0 and self.table.item(row, 0) is not None and self.table.item(row, 0).isSelected():
            return self.table.item(row, 0).data(Qt.UserRole)
        ids = self.selected_ids()
        return ids[0] if ids else None

    def select_id(self, doc_id: int) -> None:
        for attempt in range(2):
            for r in range(self.table.rowCount()):
                if self.table.item(r, 0).data(Qt.UserRole) == doc_id:
                    self.table.selectRow(r)
                    return
            self.choose_folder(None)  # not in the chosen folder: show all, then look again

    def begin_progress(self, what: str) -> None:
        self.progress.setVisible(True)
        self.progress.setRange(0, 0)
        self.cancel_button.setVisible(True)
        self.cancel_button.setEnabled(True)
        self.current.setText(what)

    def set_progress(self, done: int, total: int, what: str) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.progress.setFormat(f"{done} of {total} files")
        self.current.setText(what)

    def end_progress(self, summary: str = "") -> None:
        self.progress.setVisible(False)
        self.cancel_button.setVisible(False)
        self.current.setText(summary)

    # ---- Internals -------------------------------------------------------------

    def _filter_changed(self) -> None:
        self.remove_button.setEnabled(self.chosen_folder() is not None)
        self.set_documents(self.docs)

    def _remove_folder(self) -> None:
        folder = self.chosen_folder()
        if folder:
            self.sig_remove_folder.emit(folder)

    def _restore_selection(self, shown: list[dict], selected: list[int], current: int | None) -> None:
        """Select the rows of ``selected`` again (all of them: selectRow would keep only the
        last) and make ``current`` the current row, as they were before the table was refilled."""
        model, selection = self.table.model(), self.table.selectionModel()
        for r, d in enumerate(shown):
            if d["id"] == current:
                selection.setCurrentIndex(model.index(r, 0), QItemSelectionModel.NoUpdate)
            if d["id"] in selected:
                selection.select(model.index(r, 0), QItemSelectionModel.Select | QItemSelectionModel.Rows)

    def _show_details(self) -> None:
        current = self.current_id()
        doc = next((d for d in self.docs if d["id"] == current), None)
        if doc is None:
            self.details.setText("")
            return
        line = f"{doc['path']}"
        if doc.get("author"):
            line += f" · {doc['author']}"
        if doc["error"]:
            line += f"\n{doc['status']}: {doc['error']}"
        self.details.setText(line)
        self.details.setProperty("failed", doc["status"] == "failed")
        self.details.style().unpolish(self.details)
        self.details.style().polish(self.details)

    def _selection_changed(self) -> None:
        self._show_details()
        self.sig_selection_changed.emit(self.selected_ids())


def read_tip(doc: dict) -> str:
    """The Read column's whole story: the state, what the cache takes, why it stays in memory."""
    state = doc.get("read", "")
    if state.startswith("read, "):
        return f"read; its KV cache takes {state[6:]} on disk"
    if state.startswith("no, #"):
        return f"not read yet: {state[4:]} in reading ahead's order"
    if doc.get("cache_note") and state.startswith("in memory"):
        return doc["cache_note"]
    return state


def row_tip(doc: dict, detail: str = "") -> str:
    """A row's tooltip: the whole title and the path (a narrow column elides the title), then
    what the cell says in full."""
    return "\n".join(x for x in (doc["title"] or doc["path"], doc["path"] if doc["title"] else "", detail) if x)


def short_count(n: int) -> str:
    """A token count in a narrow column: 950, 61.2K, 1.23M (the exact count is in the tooltip)."""
    if n < 10_000:
        return str(n)
    if n < 1_000_000:
        return f"{n / 1000:.1f}K" if n < 100_000 else f"{n // 1000}K"
    return f"{n / 1_000_000:.2f}M"


class FolderWatcher(QObject):
    """Watches the opened folders and reports, once things settle, which of them changed."""

    sig_changed = Signal(list)
    """The opened folders in which files were added, removed or modified (debounced)."""

    def __init__(self, delay_ms: int = WATCH_DELAY_MS, parent=None):
        super().__init__(parent)
        self.folders: list[str] = []
        self.pending: set[str] = set()
        self.watcher = QFileSystemWatcher(self)
        self.watcher.fileChanged.connect(self._touched)
        self.watcher.directoryChanged.connect(self._touched)
        self.timer = QTimer(self)
        self.timer.setSingleShot(True)
        self.timer.setInterval(delay_ms)
        self.timer.timeout.connect(self.flush)

    def watch(self, folders: list[str]) -> None:
        """Watch ``folders``, their subfolders and documents (call again after ingesting:
        an editor that saves by renaming replaces the file that was watched)."""
        self.folders = list(folders)
        dirs, files = watch_targets(self.folders)
        wanted = set(dirs) | (set(files) if len(files) <= MAX_WATCHED_FILES else set())
        current = set(self.watcher.directories()) | set(self.watcher.files())
        if current - wanted:
            self.watcher.removePaths(sorted(current - wanted))
        # Re-adding a file that was replaced re-arms it; Qt ignores paths it already watches.
        missing = sorted(wanted - set(self.watcher.directories()) - set(self.watcher.files()))
        if missing:
            self.watcher.addPaths(missing)

    def watched(self) -> list[str]:
        return sorted(self.watcher.directories() + self.watcher.files())

    def flush(self) -> list[str]:
        """The debounced handler: emit the folders holding what changed since the last flush."""
        self.timer.stop()
        folders = folders_to_rescan(self.pending, self.folders)
        self.pending.clear()
        if folders:
            self.sig_changed.emit(folders)
        return folders

    def _touched(self, path: str) -> None:
        self.pending.add(path)
        self.timer.start()
