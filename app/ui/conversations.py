"""The main window's conversations: which thread is in view as the documents in view change,
the thread list, opening, starting, renaming and deleting threads, and the one Conversation a
window keeps per thread so that its follow-ups reuse the backend's cache (qa/conversation.py).
A part of MainWindow (main_window.py), kept in its own module."""
from __future__ import annotations

from PySide6.QtWidgets import QInputDialog, QMessageBox

from app.qa import history
from app.qa.conversation import Conversation
from app.qa.history import ThreadSummary
from app.store.threads import delete_thread, rename_thread, thread_turns


class ConversationsMixin:
    """MainWindow's methods about conversations; ``thread_id`` is the thread in view (None:
    the next question starts one), ``conversations`` the threads continued in this window."""

    # ---- Public API --------------------------------------------------------

    def view_changed(self) -> None:
        """The documents in view changed (selection, ask target, folder): the conversation in
        view stays if it is about these documents, else the newest one about exactly them is
        shown (a follow-up continues it), else the next question starts a new one."""
        target = self.ask_target()
        if self.ask_job is None:
            summary = self.thread_in_view()
            if summary is None or not history.same_documents(summary, target.doc_ids):
                about = (history.threads(self.session.store, target.doc_ids[0]) if target.doc_ids else [])
                match = next((t for t in about if t.turns and history.same_documents(t, target.doc_ids)), None)
                if match is not None:
                    self.open_thread(match.id)
                else:
                    self.new_conversation()
        self.update_target()
        self.list_threads()

    def thread_in_view(self) -> ThreadSummary | None:
        return history.thread(self.session.store, self.thread_id) if self.thread_id is not None else None

    def list_threads(self) -> list[ThreadSummary]:
        """The conversations about the document in view (every one with *All documents*, or
        when none is in view), matching the search, the most recently continued first."""
        pane = self.ask_pane.threads
        current = self.library.current_id()
        everywhere = pane.everywhere.isChecked() or current is None
        entries = history.threads(self.session.store, None if everywhere else current, pane.search.text())
        pane.set_threads(entries, self.thread_id, "No conversations yet" if everywhere else
                         "No conversations about this document yet")
        return entries

    def open_thread(self, thread_id: int) -> ThreadSummary | None:
        """Show the thread's turns; the next question continues it (about its documents)."""
        summary = history.thread(self.session.store, thread_id)
        if summary is None or self.ask_job is not None:
            self.list_threads()
            return None
        self.thread_id = summary.id
        self.ask_pane.set_target_kind(summary.kind, quiet=True)
        self.ask_pane.show_thread(history.turns(self.session.store, summary.id), self.titles())
        self.ask_pane.threads.select(summary.id)
        self.update_target()
        return summary

    def new_conversation(self) -> None:
        """No conversation in view: the next question starts one about the ask target."""
        if self.ask_job is not None:
            return
        self.thread_id = None
        self.ask_pane.threads.select(None)
        target = self.update_target()
        self.ask_pane.clear_view(f"A new conversation about {target.heading.rstrip('.')}." if target.doc_ids else "")

    def ask_rename_thread(self, thread_id: int) -> None:
        """The context menu's Rename…: asks for the new title."""
        summary = history.thread(self.session.store, thread_id)
        if summary is None:
            return
        title, ok = QInputDialog.getText(self, "Rename conversation", "Title:", text=summary.title)
        if ok:
            self.rename_thread(thread_id, title)

    def rename_thread(self, thread_id: int, title: str) -> bool:
        try:
            rename_thread(self.session.store, thread_id, title)
        except ValueError as e:
            self.show_error(f"The conversation keeps its title: {e}.")
            return False
        self.list_threads()
        return True

    def ask_delete_thread(self, thread_id: int) -> None:
        """The context menu's Delete: asks for confirmation first."""
        summary = history.thread(self.session.store, thread_id)
        if summary is None:
            return
        turns = f"{summary.turns} turn" + ("" if summary.turns == 1 else "s")
        if QMessageBox.question(self, "Delete conversation", f"Delete “{summary.title}” and its {turns}? "
                                "This cannot be undone.") == QMessageBox.Yes:
            self.delete_thread(thread_id)

    def delete_thread(self, thread_id: int) -> bool:
        """Delete the thread and its turns; the view is cleared when it showed the thread."""
        if self.ask_job is not None and thread_id == self.thread_id:
            self.show_error("The conversation is being answered: stop the answer first, then delete it.")
            return False
        deleted = delete_thread(self.session.store, thread_id)
        self.conversations.pop(thread_id, None)
        if thread_id == self.thread_id:
            self.new_conversation()
        self.list_threads()
        if deleted:
            self.statusBar().showMessage("Conversation deleted")
        return deleted

    def conversation(self, summary: ThreadSummary) -> Conversation:
        """The thread's Conversation: the one this window continued (its backend tokens), or
        rebuilt from the store (after a restart, or when another front end added turns)."""
        conv = self.conversations.get(summary.id)
        if conv is None or len(conv.turns) != summary.turns:
            conv = Conversation.from_rows(summary.id, thread_turns(self.session.store, summary.id))
            self.conversations[summary.id] = conv
        return conv

    def show_latest_thread(self) -> ThreadSummary | None:
        """Select the document of the most recently continued conversation, show its turns and
        open the viewer on the last answer's first citation (what `ellm gui --screenshot` shows)."""
        summary = history.latest_thread(self.session.store)
        if summary is None or not summary.doc_ids:
            if self.docs:
                self.library.select_id(next((d["id"] for d in self.docs if d["status"] == "ingested"),
                                            self.docs[0]["id"]))
            return None
        self.library.select_id(summary.doc_ids[0])
        self.open_thread(summary.id)
        self.list_threads()
        last = self.ask_pane.turns[-1] if self.ask_pane.turns else None
        if last is not None and last.citations:
            c = last.citations[0]
            self.show_citation(c["doc"], c["page"], c.get("text", ""))
        return summary

    # ---- Internals -------------------------------------------------------------

    def forget_empty_thread(self) -> None:
        """The thread the question just answered started, deleted when it kept no turn (the
        question failed, or was stopped before its first word)."""
        started, self._new_thread = self._new_thread, None
        summary = history.thread(self.session.store, started) if started is not None else None
        if summary is not None and not summary.turns:
            delete_thread(self.session.store, started)
            self.conversations.pop(started, None)
            if self.thread_id == started:
                self.thread_id = None
