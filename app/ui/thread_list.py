"""The conversations pane under the answer: the threads about the documents in view (or all
of them), searchable across titles and every turn, a *New conversation* button, and a
context menu to rename or delete a thread. The window decides what the choices do."""
from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QCheckBox, QHBoxLayout, QLabel, QLineEdit, QListWidget, QListWidgetItem, QMenu, QPushButton, QVBoxLayout,
    QWidget,
)

from app.qa.history import ThreadSummary

SEARCH_DELAY_MS = 250
RENAME, DELETE = "Rename…", "Delete"


class ThreadList(QWidget):
    """The list of conversations with its search and *New conversation*."""

    sig_search = Signal(str)
    """The search text or the scope changed (debounced); "" lists every thread."""
    sig_chosen = Signal(int)
    """The person chose this thread: show its turns; the next question continues it."""
    sig_new = Signal()
    """The person wants a new conversation."""
    sig_rename = Signal(int)
    """The person wants to rename this thread (context menu)."""
    sig_delete = Signal(int)
    """The person wants to delete this thread (context menu)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        row = QHBoxLayout()
        heading = QLabel("Conversations")
        heading.setObjectName("heading")
        row.addWidget(heading)
        self.search = QLineEdit()
        self.search.setObjectName("threadSearch")
        self.search.setPlaceholderText("Search titles, questions and answers…")
        self.search.setClearButtonEnabled(True)
        row.addWidget(self.search, 1)
        layout.addLayout(row)
        row = QHBoxLayout()
        self.everywhere = QCheckBox("All documents")
        self.everywhere.setObjectName("threadsEverywhere")
        self.everywhere.setToolTip("List the conversations about every document, not only the one in view")
        self.everywhere.toggled.connect(lambda _: self.sig_search.emit(self.search.text()))
        row.addWidget(self.everywhere)
        row.addStretch(1)
        self.new_button = QPushButton("New conversation")
        self.new_button.setObjectName("newConversation")
        self.new_button.setToolTip("Start a conversation afresh: the next question does not see the earlier ones")
        self.new_button.clicked.connect(self.sig_new.emit)
        row.addWidget(self.new_button)
        layout.addLayout(row)
        self.list = QListWidget()
        self.list.setObjectName("threads")
        self.list.setWordWrap(True)
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarAlwaysOff)
        self.list.setContextMenuPolicy(Qt.CustomContextMenu)
        self.list.customContextMenuRequested.connect(self._context_menu)
        self.list.itemActivated.connect(self._chosen)
        self.list.itemClicked.connect(self._chosen)
        layout.addWidget(self.list, 1)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.setInterval(SEARCH_DELAY_MS)
        self._timer.timeout.connect(lambda: self.sig_search.emit(self.search.text()))
        self.search.textChanged.connect(lambda _: self._timer.start())
        self.enabled = True  # False while an answer streams: the view stays on it

    # ---- Public API --------------------------------------------------------

    def set_threads(self, entries: list[ThreadSummary], current: int | None = None, empty: str = "") -> None:
        """Show ``entries``; ``current`` is the thread in view (selected), ``empty`` what to say when none."""
        self.list.clear()
        for t in entries:
            item = QListWidgetItem(t.label())
            item.setData(Qt.UserRole, t)
            item.setToolTip(t.title)
            self.list.addItem(item)
            if t.id == current:
                self.list.setCurrentItem(item)
        if not entries:
            item = QListWidgetItem("No matching conversations" if self.search.text().strip() else
                                   empty or "No conversations yet: ask a question")
            item.setFlags(Qt.NoItemFlags)
            self.list.addItem(item)

    def entries(self) -> list[ThreadSummary]:
        return [t for t in (self.list.item(i).data(Qt.UserRole) for i in range(self.list.count())) if t]

    def select(self, thread_id: int | None) -> None:
        """Mark the thread in view (None: no thread, a new conversation)."""
        self.list.setCurrentItem(None)
        self.list.clearSelection()
        for i in range(self.list.count()):
            t = self.list.item(i).data(Qt.UserRole)
            if t is not None and t.id == thread_id:
                self.list.setCurrentItem(self.list.item(i))

    def item_of(self, thread_id: int) -> QListWidgetItem | None:
        return next((self.list.item(i) for i in range(self.list.count())
                     if self.list.item(i).data(Qt.UserRole) is not None
                     and self.list.item(i).data(Qt.UserRole).id == thread_id), None)

    def menu_for(self, item: QListWidgetItem | None) -> QMenu | None:
        """The context menu of a thread's row: Rename…, Delete (None on no thread)."""
        t = item.data(Qt.UserRole) if item is not None else None
        if t is None:
            return None
        menu = QMenu(self)
        menu.addAction(RENAME).triggered.connect(lambda: self.sig_rename.emit(t.id))
        menu.addAction(DELETE).triggered.connect(lambda: self.sig_delete.emit(t.id))
        return menu

    # ---- Internals -------------------------------------------------------------

    def _chosen(self, item: QListWidgetItem) -> None:
        t = item.data(Qt.UserRole)
        if t is not None and self.enabled:
            self.sig_chosen.emit(t.id)

    def _context_menu(self, pos: QPoint) -> None:
        menu = self.menu_for(self.list.itemAt(pos))
        if menu is not None:
            menu.exec(self.list.viewport().mapToGlobal(pos))
