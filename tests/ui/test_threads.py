"""Conversations in the window (pytest-qt): the thread list, follow-ups that see the earlier
turns and continue the backend's cache, New conversation, rename and delete from the context
menu, threads after a restart; the Local API server switch; the library's Title column.
Answers come from the real answer service on tests/qa/fake_backend.py, which records its prompts."""
from __future__ import annotations

import socket

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtWidgets import QInputDialog, QMessageBox

from app.api.server import ApiServerError
from app.qa.conversation import next_turn
from app.qa.history import ThreadSummary, thread_target, when
from app.qa.targets import FOLDER
from app.session import Session
from app.settings import Paths
from app.store.threads import create_thread, get_thread, list_threads, thread_turns
from app.ui.main_window import MainWindow
from tests.qa.fake_backend import FakeBackend
from tests.ui.conftest import FAST
from tests.ui.helpers import ask_and_wait, doc_id, ingest, row_of
from tests.ui.test_settings_dialog import open_dialog, typed

LAMP = "Marta Quill kept the lamp [p. 2]."
SIGNED = "The Treaty of Foo was signed in 1848"
CITIES = "the three river cities of Arlen, Brisk and Cole"


def fake_model(monkeypatch, session, backend: FakeBackend | None = None) -> FakeBackend:
    """The session's backend replaced by one FakeBackend (the same object each question, as the
    window's one engine is): answers in milliseconds, every prompt recorded."""
    backend = backend or FakeBackend(session.model_path, n_ctx=4096, answer=LAMP, composes=True)
    monkeypatch.setattr(session, "backend", lambda doc_tokens=None: backend)
    return backend


@pytest.fixture
def model(monkeypatch, session):
    return fake_model(monkeypatch, session)


def stored_thread(store, doc_ids, turns) -> int:
    """A thread of ``turns`` (question, answer, citations, timings) as an earlier session left it."""
    thread = create_thread(store, doc_ids, title=turns[0][0])
    for question, text, citations, timings in turns:
        store.add_answer(doc_ids, question, text, citations, "m", "fake", timings, thread_id=thread)
    return thread


@pytest.fixture
def threads(qtbot, window, corpus, session):
    """The corpus ingested and three stored threads: two turns about the treaty, one about the
    notes, one about both."""
    ingest(qtbot, window, corpus)
    treaty, notes = doc_id(window, "treaty.pdf"), doc_id(window, "notes.txt")
    store = session.store
    signed = stored_thread(store, [treaty], [
        ("When was the treaty signed?", "In 1848 [p. 1].", [{"doc": treaty, "page": 1, "text": SIGNED}],
         {"prompt_tokens": 200, "ttft_s": 0.5, "decode_tok_s": 20.0}),
        ("Who signed it?", "Arlen, Brisk and Cole [p. 1].", [{"doc": treaty, "page": 1, "text": CITIES}],
         {"prompt_tokens": 230, "ttft_s": 0.1, "decode_tok_s": 21.0})])
    budget = stored_thread(store, [notes], [("What is the budget?", "12 million euros.", [], {})])
    both = stored_thread(store, [treaty, notes], [("What is in them?", "A treaty and meeting notes.", [], {})])
    return {"treaty": treaty, "notes": notes, "signed": signed, "budget": budget, "both": both}


def click(qtbot, widget, item) -> None:
    qtbot.mouseClick(widget.viewport(), Qt.LeftButton, pos=widget.visualItemRect(item).center())


def search(qtbot, pane, text: str) -> None:
    pane.search.clear()
    with qtbot.waitSignal(pane.sig_search, timeout=5_000):
        qtbot.keyClicks(pane.search, text)


# ---- The thread list ------------------------------------------------------------------------


def test_the_list_shows_the_threads_about_the_document_in_view_and_a_click_shows_their_turns(
        qtbot, window, threads, session):
    pane, ask = window.ask_pane.threads, window.ask_pane
    window.library.select_id(threads["treaty"])
    # the threads about the treaty, the most recently continued first; the notes' thread is not listed
    assert [t.id for t in pane.entries()] == [threads["both"], threads["signed"]]
    signed = get_thread(session.store, threads["signed"])
    assert pane.item_of(threads["signed"]).text() == (f"When was the treaty signed?\n"
                                                     f"2 turns · {when(signed['updated_at'])}")
    assert pane.item_of(threads["both"]).text().endswith(" · 2 documents")
    # the newest thread about exactly the document in view is shown: a follow-up continues it
    assert window.thread_id == threads["signed"] and pane.list.currentItem() is pane.item_of(threads["signed"])
    text = ask.answer.toPlainText()
    assert text.index("When was the treaty signed?") < text.index("In 1848") < text.index("Who signed it?") \
        < text.index("Arlen, Brisk and Cole")
    assert [ask.citations.item(i).data(Qt.UserRole) for i in range(ask.citations.count())] == [
        (threads["treaty"], 1, CITIES)]                                  # the last turn's sources
    assert ask.stats.text().startswith("230 prompt tokens")
    assert ask.question.placeholderText().startswith("Ask a follow-up question")

    # a question of the conversation shows its own turn's sources; a page reference opens its page
    ask.answer.anchorClicked.emit(QUrl("turn:0"))
    assert ask.citations.item(0).data(Qt.UserRole) == (threads["treaty"], 1, SIGNED)
    assert ask.stats.text().startswith("200 prompt tokens")
    with qtbot.waitSignal(ask.sig_citation) as cited:
        ask.answer.anchorClicked.emit(QUrl("page:1:1"))
    assert cited.args == [threads["treaty"], 1, CITIES] and ask.turn == 1
    assert 'href="page:0:1"' in ask.answer.toHtml()

    # a click on another thread shows it, and the heading says what a follow-up is about
    click(qtbot, pane.list, pane.item_of(threads["both"]))
    assert window.thread_id == threads["both"] and "A treaty and meeting notes." in ask.answer.toPlainText()
    assert ask.heading.text().startswith("2 documents: ")

    # search covers titles and every turn; All documents lists the other documents' threads too
    search(qtbot, pane, "Arlen")                          # in an answer of the second turn only
    assert [t.id for t in pane.entries()] == [threads["signed"]]
    search(qtbot, pane, "budget")
    assert pane.entries() == [] and pane.list.item(0).text() == "No matching conversations"
    pane.everywhere.setChecked(True)
    assert [t.id for t in pane.entries()] == [threads["budget"]]
    pane.search.clear()
    window.list_threads()
    assert {t.id for t in pane.entries()} == {threads["signed"], threads["budget"], threads["both"]}


def test_threads_and_their_targets_without_a_window():
    t = ThreadSummary(7, "Lamps", FOLDER, (1, 2), "/data/box", 3, "2025-01-02T10:00:00+00:00",
                      "2025-01-03T11:30:00+00:00")
    assert t.label() == f"Lamps\n3 turns · {when(t.updated_at)} · /data/box"
    target = thread_target(t, {1: "Alpha", 2: "Beta", 3: "Gamma"})
    assert (target.kind, target.doc_ids, target.heading, target.folder) == (FOLDER, (1, 2), "2 documents in /data/box",
                                                                             "/data/box")
    gone = thread_target(t, {3: "Gamma"})
    assert gone.doc_ids == () and gone.heading == "The documents of this conversation are no longer in the library"


# ---- Asking in a thread ----------------------------------------------------------------------


def test_asking_twice_makes_one_thread_of_two_turns_and_the_follow_up_sees_the_first(
        qtbot, window, corpus, session, model):
    ingest(qtbot, window, corpus)
    treaty = doc_id(window, "treaty.pdf")
    window.library.select_id(treaty)
    assert window.thread_id is None and window.ask_pane.threads.entries() == []
    first, _ = ask_and_wait(qtbot, window, "Who kept the lighthouse lamp?")
    model.answer = "For forty years [p. 2]."
    second, _ = ask_and_wait(qtbot, window, "For how long?")

    stored = list_threads(session.store)
    assert [(t["title"], t["turns"], t["doc_ids"], t["kind"]) for t in stored] == [
        ("Who kept the lighthouse lamp?", 2, [treaty], "selected")]
    thread = stored[0]["id"]
    assert first.thread_id == second.thread_id == window.thread_id == thread
    assert [t["question"] for t in thread_turns(session.store, thread)] == ["Who kept the lighthouse lamp?",
                                                                            "For how long?"]
    # the follow-up's prompt holds the first turn and continues what the backend holds of it
    p1, p2 = model.prompts
    text = model.detokenize(p2)
    assert text.index("Who kept the lighthouse lamp?") < text.index(LAMP) < text.index("For how long?")
    assert "For how long?" not in model.detokenize(p1)
    assert p2 == p1 + model.tokenize(LAMP) + next_turn(model, "For how long?")
    assert second.timings["reused_prompt_tokens"] == len(p1) + len(model.tokenize(LAMP))
    assert len(window.conversations[thread].turns) == 2          # one Conversation per thread, kept

    # the view shows both turns, the list one thread of two turns, selected
    shown = window.ask_pane.answer.toPlainText()
    assert shown.index("Who kept the lighthouse lamp?") < shown.index("For how long?") < shown.index("forty years")
    entries = window.ask_pane.threads.entries()
    assert [(t.id, t.turns) for t in entries] == [(thread, 2)]
    assert window.ask_pane.threads.list.currentItem().data(Qt.UserRole).id == thread


def test_new_conversation_starts_a_second_thread_that_knows_nothing_of_the_first(
        qtbot, window, corpus, session, model):
    ingest(qtbot, window, corpus)
    treaty = doc_id(window, "treaty.pdf")
    window.library.select_id(treaty)
    first, _ = ask_and_wait(qtbot, window, "Who kept the lighthouse lamp?")
    pane = window.ask_pane
    qtbot.mouseClick(pane.threads.new_button, Qt.LeftButton)
    assert window.thread_id is None and pane.citations.count() == 0
    assert pane.answer.toPlainText() == "A new conversation about River Treaty History."
    assert pane.threads.list.currentItem() is None
    model.answer = "In 1901 [p. 3]."
    second, _ = ask_and_wait(qtbot, window, "When did the treaty end?")
    assert second.thread_id not in (None, first.thread_id)
    assert "Who kept the lighthouse lamp?" not in model.detokenize(model.prompts[-1])
    assert [(t.title, t.turns) for t in pane.threads.entries()] == [("When did the treaty end?", 1),
                                                                   ("Who kept the lighthouse lamp?", 1)]
    assert "Who kept" not in pane.answer.toPlainText()

    # a new conversation about a folder is stored as one, with the folder's documents
    pane.set_target_kind(FOLDER)
    assert window.thread_id is None
    folder_ids = [d["id"] for d in window.docs if d["status"] == "ingested" and d["path"].startswith(str(corpus))]
    third, _ = ask_and_wait(qtbot, window, "What is in this folder?")
    t = get_thread(session.store, third.thread_id)
    assert (t["kind"], t["folder"], sorted(t["doc_ids"]), t["turns"]) == (FOLDER, str(corpus), sorted(folder_ids), 1)


def test_rename_and_delete_from_the_context_menu(qtbot, window, threads, session, monkeypatch):
    pane, ask = window.ask_pane.threads, window.ask_pane
    window.library.select_id(threads["treaty"])
    assert window.thread_id == threads["signed"]
    menu = pane.menu_for(pane.item_of(threads["signed"]))
    assert [a.text() for a in menu.actions()] == ["Rename…", "Delete"]
    assert pane.menu_for(None) is None

    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("Treaty dates", True))
    menu.actions()[0].trigger()
    assert get_thread(session.store, threads["signed"])["title"] == "Treaty dates"
    assert pane.item_of(threads["signed"]).text().startswith("Treaty dates\n")
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("   ", True))
    pane.menu_for(pane.item_of(threads["signed"])).actions()[0].trigger()
    assert get_thread(session.store, threads["signed"])["title"] == "Treaty dates"
    assert window.statusBar().currentMessage().startswith("The conversation keeps its title")

    # Delete asks first: No keeps it
    asked = []
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: (asked.append(a[2]), QMessageBox.No)[1])
    pane.menu_for(pane.item_of(threads["signed"])).actions()[1].trigger()
    assert asked == ["Delete “Treaty dates” and its 2 turns? This cannot be undone."]
    assert get_thread(session.store, threads["signed"]) is not None
    # Yes deletes the thread and its turns; the view showed it, so it is cleared
    monkeypatch.setattr(QMessageBox, "question", lambda *a, **k: QMessageBox.Yes)
    pane.menu_for(pane.item_of(threads["signed"])).actions()[1].trigger()
    assert get_thread(session.store, threads["signed"]) is None and thread_turns(session.store, threads["signed"]) == []
    assert window.thread_id is None and threads["signed"] not in window.conversations
    assert "In 1848" not in ask.answer.toPlainText() and ask.citations.count() == 0
    assert [t.id for t in pane.entries()] == [threads["both"]]
    # deleting a thread not in view leaves the view alone
    click(qtbot, pane.list, pane.item_of(threads["both"]))
    assert window.delete_thread(threads["budget"]) is True
    assert window.thread_id == threads["both"] and "meeting notes" in ask.answer.toPlainText()


def test_threads_survive_a_restart_and_continuing_one_appends_a_turn(qtbot, window, corpus, session, data_dir,
                                                                     model, monkeypatch):
    ingest(qtbot, window, corpus)
    treaty = doc_id(window, "treaty.pdf")
    window.library.select_id(treaty)
    first, _ = ask_and_wait(qtbot, window, "Who kept the lighthouse lamp?")
    window.close()

    again = Session(Paths.resolve(data_dir))
    fake_model(monkeypatch, again, model)
    restarted = MainWindow(again)
    qtbot.addWidget(restarted)
    restarted.show()
    summary = restarted.show_latest_thread()           # what the app shows first
    assert summary.id == first.thread_id and restarted.library.current_id() == treaty
    assert restarted.thread_id == first.thread_id and restarted.conversations == {}
    assert [t.id for t in restarted.ask_pane.threads.entries()] == [first.thread_id]
    assert "Marta Quill kept the lamp" in restarted.ask_pane.answer.toPlainText()

    model.answer = "For forty years [p. 2]."
    second, _ = ask_and_wait(qtbot, restarted, "For how long?")
    assert second.thread_id == first.thread_id
    assert [t["question"] for t in thread_turns(again.store, first.thread_id)] == [
        "Who kept the lighthouse lamp?", "For how long?"]
    text = model.detokenize(model.prompts[-1])          # the turns read again from the store
    assert text.index("Who kept the lighthouse lamp?") < text.index(LAMP) < text.index("For how long?")
    assert len(restarted.conversations[first.thread_id].turns) == 2


# ---- The local API server -----------------------------------------------------------------


class FakeServer:
    """app.api.server.ApiServer's interface; port TAKEN cannot be bound."""

    TAKEN = 8999
    made: list[FakeServer] = []

    def __init__(self, session, host="127.0.0.1", port=8080, api_key=None, cors=None):
        self.session, self.host, self.port, self.running = session, host, port, False
        FakeServer.made.append(self)

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> None:
        if self.port == self.TAKEN:
            raise ApiServerError(f"{self.host}:{self.port} is in use by another program")
        self.running = True

    def stop(self) -> None:
        self.running = False


def test_the_api_server_setting_starts_and_stops_the_server_and_the_status_bar_shows_it(
        qtbot, window, session, monkeypatch):
    FakeServer.made = []
    monkeypatch.setattr("app.api.server.ApiServer", FakeServer)
    label = window.api.label
    assert FakeServer.made == [] and label.isHidden()               # off by default

    dialog = open_dialog(qtbot, window)
    assert not dialog.api_server.isChecked() and dialog.api_port.value() == 8080
    assert "http://127.0.0.1:8080/v1" in dialog.api_info.text()
    dialog.api_server.setChecked(True)
    typed(qtbot, dialog.api_port, "8765")
    with qtbot.waitSignal(dialog.accepted):
        qtbot.mouseClick(dialog.save_button, Qt.LeftButton)
    assert (session.settings.api_server, session.settings.api_port) == (True, 8765)
    server = FakeServer.made[-1]
    assert (server.session, server.host, server.port, server.running) == (session, "127.0.0.1", 8765, True)
    assert label.isVisible() and label.text() == "API: http://127.0.0.1:8765"
    assert window.statusBar().currentMessage() == "The local API server is on: http://127.0.0.1:8765/v1"
    again = open_dialog(qtbot, window)
    assert again.api_info.text() == "Serving at http://127.0.0.1:8765/v1 (this computer only)"
    again.api_server.setChecked(False)
    with qtbot.waitSignal(again.accepted):
        qtbot.mouseClick(again.save_button, Qt.LeftButton)
    assert not server.running and label.isHidden() and len(FakeServer.made) == 1
    assert window.statusBar().currentMessage() == "The local API server is off"

    # a port that cannot be bound is a message, never a crash
    session.save_settings(FAST.with_(api_server=True, api_port=FakeServer.TAKEN))
    window.apply_api_setting()
    assert not window.api.running and label.isHidden()
    message = window.statusBar().currentMessage()
    assert message == (f"The local API server could not start: 127.0.0.1:{FakeServer.TAKEN} is in use by another "
                       f"program. Choose another port than {FakeServer.TAKEN} in Settings → Local API server, or "
                       f"turn it off.")
    assert window._error_box.text() == message

    # on at startup when the setting is on; stopped when the window closes
    session.save_settings(FAST.with_(api_server=True, api_port=8766))
    started = MainWindow(session)
    qtbot.addWidget(started)
    started.show()
    server = FakeServer.made[-1]
    assert (server.port, server.running) == (8766, True) and started.api.label.text() == "API: http://127.0.0.1:8766"
    started.close()
    assert not server.running


def test_the_real_server_reports_a_taken_port(qtbot, window, session):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        session.save_settings(FAST.with_(api_server=True, api_port=port))
        window.apply_api_setting()
        assert not window.api.running and window.api.label.isHidden()
        message = window.statusBar().currentMessage()
        assert message.startswith("The local API server could not start: ") and f"127.0.0.1:{port}" in message


# ---- The library's Title column ---------------------------------------------------------------


def test_the_title_column_has_the_room_and_the_whole_title_in_its_tooltip(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    assert (window.width(), window.height()) == (1200, 760)              # the default size
    table = window.library.table
    widths = [table.columnWidth(c) for c in range(table.columnCount())]
    assert widths[0] > max(widths[1:]) and widths[0] >= table.viewport().width() * 0.35, widths
    cell = table.item(row_of(window, "River Treaty History"), 0)
    assert table.fontMetrics().horizontalAdvance(cell.text()) + 12 <= widths[0]   # shown whole, not "…"
    for c in range(table.columnCount()):
        tip = table.item(cell.row(), c).toolTip()
        assert tip.startswith(f"River Treaty History\n{corpus / 'treaty.pdf'}"), tip
    tokens = table.item(cell.row(), 2)
    assert tokens.toolTip().endswith(" tokens")
