"""The conversations per document with their FTS5 search, attention-grounded passages
when an answer has them, and the hardware tab with live speed."""
from __future__ import annotations


from PySide6.QtCore import Qt, QUrl

from app.engine.backend import GenerationStats
from app.qa.answer import Answer
from app.qa.pages import ContextPlan
from tests.ui.helpers import ask_and_wait, doc_id, ingest


def test_thread_search_finds_an_earlier_conversation(qtbot, window, corpus, session):
    ingest(qtbot, window, corpus)
    treaty, notes = doc_id(window, "treaty.pdf"), doc_id(window, "notes.txt")
    store = session.store
    signed = store.add_answer([treaty], "When was the treaty signed?", "It was signed in 1848 [p. 1].",
                              [{"doc": treaty, "page": 1, "text": "The Treaty of Foo was signed in 1848"}], "m",
                              "llamacpp", {"prompt_tokens": 200, "ttft_s": 0.5, "decode_tok_s": 20.0})
    store.add_answer([notes], "What is the budget?", "12 million euros.", [], "m", "llamacpp", {})
    window.library.select_id(treaty)
    # an answer stored on its own is a thread of one turn (same id); the document's newest is shown
    assert window.thread_id == signed and "It was signed in 1848" in window.ask_pane.answer.toPlainText()
    qtbot.mouseClick(window.ask_pane.threads.new_button, Qt.LeftButton)
    answer, _ = ask_and_wait(qtbot, window, "Who kept the lighthouse lamp burning?")
    pane = window.ask_pane
    threads = pane.threads
    assert [t.title for t in threads.entries()] == ["Who kept the lighthouse lamp burning?",
                                                    "When was the treaty signed?"]
    assert threads.list.currentItem().data(Qt.UserRole).id == answer.thread_id

    search(qtbot, threads, "1848")
    assert [t.title for t in threads.entries()] == ["When was the treaty signed?"]
    item = threads.list.item(0)
    qtbot.mouseClick(threads.list.viewport(), Qt.LeftButton, pos=threads.list.visualItemRect(item).center())
    assert "It was signed in 1848" in pane.answer.toPlainText()
    assert pane.citations.count() == 1 and pane.stats.text().startswith("200 prompt tokens")

    search(qtbot, threads, "lighthouse keeper lamp")
    assert [t.title for t in threads.entries()] == ["Who kept the lighthouse lamp burning?"]
    search(qtbot, threads, "budget")  # asked about another document
    assert threads.entries() == []
    assert threads.list.item(0).text() == "No matching conversations"

    # the answer's own page references are links to the page
    threads.search.clear()
    window.open_thread(signed)
    with qtbot.waitSignal(pane.sig_citation) as cited:
        pane.answer.anchorClicked.emit(QUrl("page:1"))
    assert cited.args == [treaty, 1, "The Treaty of Foo was signed in 1848"]
    assert 'href="page:0:1"' in pane.answer.toHtml()


def search(qtbot, threads, text: str) -> None:
    threads.search.clear()
    with qtbot.waitSignal(threads.sig_search, timeout=5_000):
        qtbot.keyClicks(threads.search, text)


def test_attention_grounded_passages_are_shown_when_present(qtbot, window, corpus):
    ingest(qtbot, window, corpus)
    treaty = doc_id(window, "treaty.pdf")
    window.library.select_id(treaty)
    pane = window.ask_pane
    plain = Answer("Q?", "A.", [{"doc": treaty, "page": 1, "text": "x"}], {}, ContextPlan([], 0, 0, 0, 3),
                   "ellm", "m", [treaty])
    window._answered(plain)
    assert pane.attended.isHidden() and pane.attended_heading.isHidden()

    attended = [{"doc": treaty, "page": 3, "text": "The treaty ended in 1901"}]
    grounded = Answer("Q?", "A.", [], {}, ContextPlan([], 0, 0, 0, 3), "ellm", "m", [treaty],
                      attended=attended)
    window._answered(grounded)
    assert not pane.attended.isHidden() and pane.attended.count() == 1
    assert pane.attended.item(0).text() == "p. 3 — River Treaty History\n“The treaty ended in 1901”"
    item = pane.attended.item(0)
    with qtbot.waitSignal(pane.sig_citation) as cited:
        qtbot.mouseClick(pane.attended.viewport(), Qt.LeftButton, pos=pane.attended.visualItemRect(item).center())
    assert cited.args == [treaty, 3, "The treaty ended in 1901"]
    assert window.viewer.page == 3 and window.viewer.has_highlight()


def test_hardware_tab_embeds_the_panel_and_shows_live_speed(qtbot, window, session, monkeypatch):
    tab = window.hardware_tab
    assert tab.placeholder.text() == "Looking at this machine…" and tab.panel is None
    assert tab.ensure_loaded(probe_bandwidth=False) is not None  # the report is on its way
    qtbot.waitUntil(lambda: tab.job is None, timeout=120_000)
    assert tab.panel is not None and tab.panel.isVisibleTo(tab) and tab.placeholder.isHidden()
    kv = tab.report["kv"]
    assert kv["model_bytes"] > 50_000_000 and kv["bytes_per_token"] > 0

    # while an answer streams the panel shows the engine's own figures (GenerationStats):
    # tokens/s and the bytes each decode step reads
    window.ask_pane.begin("Q?")
    stats = GenerationStats(decode_tokens=11, decode_s=1.0, weight_bytes_per_token=kv["model_bytes"],
                            kv_read_bytes_per_token=1000 * kv["bytes_per_token"])
    window._live_rate(stats.decode_tok_s, stats.read_gb_s)
    expected_gb_s = 10.0 * (kv["model_bytes"] + 1000 * kv["bytes_per_token"]) / 1e9
    assert tab.panel.live.text().startswith(f"Live: 10.0 tok/s, {expected_gb_s:.2f} GB/s")
    assert window.ask_pane.stats.text() == f"Generating… ≈10.0 tokens/s, ≈{expected_gb_s:.2f} GB/s read"
    window._ask_finished()
    assert tab.panel.live.text() == "Live: idle"

    # a new thread plan is saved and the report made again
    with qtbot.waitSignal(window.statusBar().messageChanged, timeout=5_000):
        tab.panel.sig_threads_changed.emit(1, "isolate")
    assert (session.settings.threads, session.settings.numa) == (1, "isolate")
    qtbot.waitUntil(lambda: tab.job is None, timeout=120_000)  # the tab clears it when finished
    assert tab.report["threads"]["requested"] == 1 and tab.report["threads"]["count"] == 1
