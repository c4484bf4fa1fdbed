"""Reading in the window: the library's Read column, reading ahead in the background with its
progress, pausing it, and the ask pane's progress bar while a document is read for a question."""
from __future__ import annotations

from app.qa.reading import READ
from app.settings import Settings
from app.qa.cache_budget import format_size
from app.ui.library import READ_COLUMN
from tests.docs.make_samples import make_text
from tests.ui.helpers import doc_id, ingest, row_of

# eLLM's engine with the automatic KV and attention: the blocked cache, whose files persist.
READING = Settings(engine="ellm", max_tokens=8, temperature=0.0)


def test_the_ask_pane_shows_tokens_read_of_total_while_a_document_is_read(qtbot, window):
    pane = window.ask_pane
    pane.begin("What is it?")
    assert pane.stats.text() == "Preparing the answer…" and not pane.reading.isVisible()
    window._ask_progress(1200, 4800, "reading Manual: 1,200 of 4,800 tokens, 2 min left")
    assert pane.reading.isVisible() and (pane.reading.value(), pane.reading.maximum()) == (1200, 4800)
    assert pane.stats.text() == "Reading Manual: 1,200 of 4,800 tokens, 2 min left"
    assert pane.reading.text() == "25 % · 1,200 of 4,800 tokens"
    pane.set_live("Generating… ≈3.0 tokens/s")
    assert not pane.reading.isVisible()


def test_documents_are_read_ahead_and_the_library_shows_their_state(qtbot, window, session, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "a.txt", "Alpha\n\n" + "The alpha report describes the northern harbour. " * 20)
    make_text(folder / "b.txt", "Beta\n\n" + "The beta memo lists the council's budget lines. " * 20)
    session.save_settings(READING)
    ingest(qtbot, window, folder)
    # Not read, numbered in reading ahead's order: added the same day, the smaller first.
    assert {window.library.table.item(row_of(window, t), READ_COLUMN).text() for t in ("Alpha", "Beta")} == {
        "no, #1", "no, #2"}
    smaller = min(session.store.documents(), key=lambda d: d["tokens"])["title"]
    item = window.library.table.item(row_of(window, smaller), READ_COLUMN)
    assert item.text() == "no, #1" and "not read yet: #1 in reading ahead's order" in item.toolTip()
    states = []
    window.reader.sig_state.connect(lambda doc, state: states.append((doc, state)))
    window.read_ahead = True
    job = window.reader.start()
    assert job is not None
    qtbot.waitUntil(lambda: window.reader.job is None, timeout=300_000)
    a, b = doc_id(window, "a.txt"), doc_id(window, "b.txt")
    assert (a, READ) in states and (b, READ) in states
    assert {r["doc_id"] for r in session.store.kv_caches()} == {a, b}
    # Read, with each document's cache size on disk, as reading ahead reported it and after a refresh;
    # the total against the budget below the table.
    sizes = {r["doc_id"]: format_size(r["bytes"]) for r in session.store.kv_caches()}
    def shown():
        return [window.library.table.item(row_of(window, t), READ_COLUMN).text() for t in ("Alpha", "Beta")]

    assert shown() == [f"{READ}, {sizes[a]}", f"{READ}, {sizes[b]}"]
    window.refresh()
    assert shown() == [f"{READ}, {sizes[a]}", f"{READ}, {sizes[b]}"]
    total = format_size(session.store.kv_cache_bytes())
    assert window.library.cache_total.text().startswith(f"Caches: {total} of ")
    # Nothing left to read: starting again does nothing.
    assert window.reader.start() is None


def test_pausing_stops_reading_until_resumed(qtbot, window, session, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "c.txt", "Gamma\n\n" + "The gamma letter thanks the lighthouse keeper. " * 20)
    session.save_settings(READING)
    ingest(qtbot, window, folder)
    window.read_ahead = True
    window.toggle_reading()                                   # pause
    assert window.reader.paused and window.pause_reading_action.text() == "Resume reading"
    assert window.reader.start() is None                      # paused: nothing starts
    window.toggle_reading()                                   # resume
    assert not window.reader.paused and window.pause_reading_action.text() == "Pause reading"
    qtbot.waitUntil(lambda: window.reader.job is None, timeout=300_000)
    window.refresh()
    assert window.library.table.item(row_of(window, "Gamma"), READ_COLUMN).text().startswith(f"{READ}, ")


def test_a_question_before_reading_is_answered_from_passages_and_its_document_is_read_next(qtbot, window, session,
                                                                                             tmp_path):
    """The first question about a long document not read yet answers at once from its best
    passages and says so; reading then carries on in the background with that document first,
    and the next question reads the whole of it."""
    from tests.ui.helpers import ask_and_wait

    folder = tmp_path / "docs"
    folder.mkdir()
    filler = "The harbour log notes the tides, the nets and the gulls of an ordinary day. " * 30
    make_text(folder / "a.txt", "Alpha\n\n" + "The alpha memo lists the council's budget lines. " * 20)
    make_text(folder / "log.txt", "Harbour Log\n\n" + filler * 3 + "The secret password of the harbour master was "
              "BLUEHERON.\n\n" + filler * 3)      # about 3,000 tokens: more than a first question reads at once
    session.save_settings(READING)
    ingest(qtbot, window, folder)
    log = doc_id(window, "log.txt")
    window.library.select_id(log)
    read = []
    window.reader.sig_state.connect(lambda doc, state: read.append(doc) if state == READ else None)
    first, _ = ask_and_wait(qtbot, window, "What was the secret password of the harbour master?")
    assert first.answered_from == "passages" and "not read yet" in window.ask_pane.note.text()
    qtbot.waitUntil(lambda: window.reader.job is None and len(read) == 2, timeout=300_000)
    assert read[0] == log                      # the document asked about is read before the others
    second, _ = ask_and_wait(qtbot, window, "What was the secret password of the harbour master?")
    assert second.answered_from == "document" and second.timings["kv_cache"] == "hit"
