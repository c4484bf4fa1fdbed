"""The ask pane asks about the selected documents, a folder or everything, through the one
answer service the command line uses (app/qa/answer.py ``answer``); the fake here records
which documents each question was given."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from PySide6.QtCore import Qt

from app.qa.answer import Answer
from app.qa.targets import EVERYTHING, FOLDER, SELECTED, resolve, short_path
from app.qa.pages import ContextPlan
from app.qa.stream import Listeners
from tests.docs.make_samples import make_text
from tests.ui.helpers import ask_and_wait, doc_id, ingest, row_of

NOTE = "The 2 documents need 90 MB of KV cache, more than the memory budget of 50 MB: ..."


@pytest.fixture
def services(monkeypatch, session):
    """The answer service replaced by a fake (same signature) that records its documents in
    ``.calls``. For one document it answers plainly; for several it reports progress, streams,
    cites ``.cite`` (doc, page, passage) and stores its answer as the conversation's next turn
    under the documents it cites, as the real one stores those it considered."""
    fakes = SimpleNamespace(calls=[], cite=[])
    calls = fakes.calls

    def fake_answer(store, backend, question, doc_ids, params, listen=Listeners(), *, options=None, conversation=None,
                    save=True, caches=None):
        calls.append(("answer", list(doc_ids)))
        on_text, progress, model_name = listen.on_text, listen.progress, "fake.gguf"
        thread = conversation.thread_id if conversation is not None else None
        if len(doc_ids) == 1:
            on_text("One document.")
            return Answer(question, "One document.", [], {}, ContextPlan(), "fake", model_name, list(doc_ids),
                          thread_id=thread)
        progress(25, 50, f"reading document {doc_ids[0]} (1 of {len(doc_ids)}): 25 of 50 tokens")
        text = "The budget is 12 million euros [p. 1]; Marta Quill kept the lamp [p. 2]."
        for word in text.split(" "):
            on_text(word + " ")
        citations = [{"doc": d, "page": p, "text": t} for d, p, t in fakes.cite]
        considered = sorted({c["doc"] for c in citations}) or list(doc_ids)
        answer = Answer(question, text, citations, {"prompt_tokens": 90}, ContextPlan(), "fake", model_name,
                        considered, considered=[{"doc": d} for d in considered], note=NOTE, thread_id=thread)
        answer.answer_id = store.add_answer(considered, question, text, citations, model_name, "fake", {},
                                            thread_id=thread)
        return answer

    monkeypatch.setattr("app.qa.answer.answer", fake_answer)
    monkeypatch.setattr(session, "backend", lambda doc_tokens=None: None)  # no model is loaded
    return fakes


@pytest.fixture
def two_folders(qtbot, window, corpus, tmp_path):
    """The corpus (4 readable documents, 1 broken) and a second folder with one document."""
    other = tmp_path / "other"
    other.mkdir()
    make_text(other / "diary.txt", "Diary\n\nIt rained all week.\n")
    ingest(qtbot, window, corpus)
    ingest(qtbot, window, other)
    return corpus, other


def ctrl_click(qtbot, window, title: str) -> None:
    table = window.library.table
    rect = table.visualItemRect(table.item(row_of(window, title), 0))
    qtbot.mouseClick(table.viewport(), Qt.LeftButton, Qt.ControlModifier, rect.center())


def choose(window, kind: str) -> None:
    combo = window.ask_pane.target
    combo.setCurrentIndex(combo.findData(kind))


def test_each_target_sends_its_documents_to_the_service(qtbot, window, services, two_folders):
    corpus, other = two_folders
    pane, library = window.ask_pane, window.library
    treaty, notes, diary = doc_id(window, "treaty.pdf"), doc_id(window, "notes.txt"), doc_id(window, "diary.txt")
    readable = [d["id"] for d in window.docs if d["status"] == "ingested"]
    assert len(readable) == 5 and doc_id(window, "broken.pdf") not in readable
    assert [pane.target.itemText(i) for i in range(pane.target.count())] == [
        "Selected documents", "This folder", "Everything"]

    # ---- Selected documents: Ctrl-click two; the viewer shows the one clicked last
    library.select_id(treaty)
    ctrl_click(qtbot, window, "Meeting notes")
    assert library.selected_ids() == sorted([treaty, notes])  # the library's order
    assert window.viewer.doc_id == notes and library.current_id() == notes
    window.refresh()  # as while ingesting: the table is filled again, the selection kept whole
    assert library.selected_ids() == sorted([treaty, notes]) and library.current_id() == notes
    titles = window.titles()
    assert pane.heading.text() == "2 documents: " + "; ".join(titles[i] for i in sorted([treaty, notes]))
    ask_and_wait(qtbot, window, "What is in them?")
    assert services.calls[-1] == ("answer", sorted([treaty, notes]))

    # ---- This folder: the current document's folder, its ingested documents only
    choose(window, FOLDER)
    assert pane.heading.text() == f"4 documents in {short_path(str(corpus))}"
    ask_and_wait(qtbot, window, "What is in the folder?")
    assert services.calls[-1] == ("answer", [i for i in readable if i != diary])

    # ---- Everything
    choose(window, EVERYTHING)
    assert pane.heading.text() == "All 5 documents"
    ask_and_wait(qtbot, window, "What is in the library?")
    assert services.calls[-1] == ("answer", readable)

    # ---- One selected document: today's single-document path
    choose(window, SELECTED)
    library.select_id(treaty)
    assert pane.heading.text() == "River Treaty History"
    ask_and_wait(qtbot, window, "Who kept the lamp?")
    assert services.calls[-1] == ("answer", [treaty])

    # ---- This folder follows the library's folder filter; a folder of one is one document
    choose(window, FOLDER)
    library.choose_folder(str(other))
    assert pane.heading.text() == f"1 document in {short_path(str(other))}"
    ask_and_wait(qtbot, window, "Did it rain?")
    assert services.calls[-1] == ("answer", [diary])
    assert len(services.calls) == 5


def test_an_answer_across_documents_shows_progress_note_and_opens_each_cited_document(
        qtbot, window, services, two_folders, monkeypatch):
    pane, library = window.ask_pane, window.library
    treaty, notes = doc_id(window, "treaty.pdf"), doc_id(window, "notes.txt")
    library.select_id(notes)
    ctrl_click(qtbot, window, "River Treaty History")
    assert library.current_id() == treaty and window.viewer.doc_id == treaty
    services.cite = [(notes, 1, "The budget for 2025 is 12 million euros."),
                     (treaty, 2, "Marta Quill, who kept the lamp of the northern lighthouse burning")]
    reading: list[tuple] = []
    real_set_reading = pane.set_reading
    monkeypatch.setattr(pane, "set_reading", lambda *r: (reading.append(r), real_set_reading(*r)))

    answer, pieces = ask_and_wait(qtbot, window, "What is the budget and who kept the lamp?")
    first, last = sorted([treaty, notes])
    assert services.calls == [("answer", [first, last])]
    assert reading[0] == (25, 50, f"Reading document {first} (1 of 2): 25 of 50 tokens")
    assert "".join(pieces).strip() == answer.answer
    assert pane.note.isVisibleTo(pane) and pane.note.text() == f"Note: {NOTE}"
    titles = window.titles()
    assert [pane.citations.item(i).text().split("\n")[0] for i in range(pane.citations.count())] == [
        "p. 1 — Meeting notes", "p. 2 — River Treaty History"]

    # each citation opens its own document at its page, the passage highlighted; the selection stays
    for row, (doc, page) in ((0, (notes, 1)), (1, (treaty, 2))):
        item = pane.citations.item(row)
        qtbot.mouseClick(pane.citations.viewport(), Qt.LeftButton, pos=pane.citations.visualItemRect(item).center())
        assert (window.viewer.doc_id, window.viewer.page) == (doc, page) and window.viewer.has_highlight()
    assert library.selected_ids() == [first, last]

    # conversations: the thread is listed under each of its documents, and shown again on a click
    threads = pane.threads
    assert [(t.id, t.doc_ids) for t in threads.entries()] == [(answer.thread_id, (first, last))]
    assert threads.list.currentItem().text().startswith("What is the budget and who kept the lamp?\n1 turn · ")
    assert threads.list.currentItem().text().endswith(" · 2 documents")
    library.select_id(first)           # one document in view: the thread about two is listed, not continued
    assert [t.id for t in threads.entries()] == [answer.thread_id] and window.thread_id is None
    qtbot.mouseClick(threads.list.viewport(), Qt.LeftButton,
                     pos=threads.list.visualItemRect(threads.list.item(0)).center())
    assert window.thread_id == answer.thread_id and pane.heading.text().startswith("2 documents: ")
    assert pane.note.text() == f"Note: Asked across 2 documents: {titles[first]}; {titles[last]}."
    assert pane.citations.count() == 2


def test_a_target_with_nothing_to_ask_says_so(qtbot, window, services):
    pane = window.ask_pane
    assert pane.target_kind() == SELECTED and pane.heading.text() == "Select a document in the library"
    choose(window, FOLDER)
    assert pane.heading.text() == "Select a document or choose a folder in the library"
    choose(window, EVERYTHING)
    assert pane.heading.text() == "No ingested documents yet: open a folder"
    pane.question.setText("anything")
    pane.ask_button.click()
    assert window.ask_job is None and services.calls == []
    assert window.statusBar().currentMessage() == "No ingested documents yet: open a folder."


def test_everything_is_answered_by_the_model_across_documents(qtbot, window, corpus, session):
    ingest(qtbot, window, corpus)
    choose(window, EVERYTHING)
    readable = [d["id"] for d in window.docs if d["status"] == "ingested"]
    answer, pieces = ask_and_wait(qtbot, window, "What is the budget for 2025?")
    assert answer.doc_ids == readable and answer.answer and "".join(pieces).strip() == answer.answer
    assert answer.citations and {c["doc"] for c in answer.citations} <= set(readable)
    assert window.ask_pane.citations.count() == len(answer.citations)
    for doc in readable:  # stored once, listed under every document it was asked about
        assert [a["id"] for a in session.store.answers(doc_id=doc)] == [answer.answer_id]


def test_targets_resolve_without_a_window():
    home = os.path.expanduser("~")
    docs = [{"id": i, "title": f"T{i}", "path": f"{home}/box/f{i}.txt", "folder": f"{home}/box",
             "status": "ingested"} for i in range(1, 9)]
    docs.append({"id": 9, "title": "", "path": "/elsewhere/alone.txt", "folder": None, "status": "ingested"})
    docs.append({"id": 10, "title": "Bad", "path": f"{home}/box/bad.pdf", "folder": f"{home}/box", "status": "failed"})
    many = resolve(SELECTED, docs, list(range(1, 9)))
    assert many.heading == "8 documents: T1; T2; T3; T4; T5; T6 and 2 more" and many.detail.count("\n") == 7
    box = resolve(FOLDER, docs, [], current=3)
    assert (box.heading, box.doc_ids) == ("8 documents in ~/box", tuple(range(1, 9)))
    alone = resolve(FOLDER, docs, [9], current=9)
    assert (alone.heading, alone.doc_ids) == ("1 document in /elsewhere", (9,))
    assert resolve(EVERYTHING, docs, []).doc_ids == tuple(range(1, 10))
    assert resolve(SELECTED, docs, [10]).doc_ids == (10,)  # a failed one says why when asked
    with pytest.raises(ValueError, match="unknown ask target"):
        resolve("nearby", docs, [])
