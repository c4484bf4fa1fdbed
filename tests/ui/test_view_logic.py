"""The Qt-free logic behind the window (app/library/passages.py, app/library/folders.py,
the engine's GenerationStats, app/qa/history.py), tested without a window."""
from __future__ import annotations

import pymupdf

from app.library.folders import documents_in, folder_of, folders_to_rescan, watch_targets
from app.qa.history import history, latest
from app.engine.backend import GenerationStats
from app.library.passages import Block, align, locate_in_pdf_words, locate_passage, page_blocks
from app.store import Store
from tests.docs.make_samples import make_pdf


def test_page_blocks_find_headings_and_paragraphs():
    text = "# Title\n\nFirst paragraph,\nstill first.\n\n  Chapter 2  \n\nIt ends here.\n"
    blocks = page_blocks(text)
    assert blocks == [Block("heading", 2, 7), Block("paragraph", 9, 38), Block("heading", 42, 51),
                      Block("paragraph", 55, 68)]
    assert [text[b.start:b.end] for b in blocks] == ["Title", "First paragraph,\nstill first.", "Chapter 2",
                                                     "It ends here."]
    assert page_blocks("") == [] and page_blocks("\n\n  \n") == []
    assert [b.kind for b in page_blocks("a short line in lower case\n\nThe End")] == ["paragraph", "heading"]


def test_locate_passage_ignores_whitespace_case_and_the_ellipsis():
    page = "The lighthouse\n\nChapter two describes the lighthouse keeper, Marta Quill, who kept\nthe lamp burning."
    start, end = locate_passage(page, "the lighthouse keeper, Marta Quill, who kept the lamp…")
    assert page[start:end] == "the lighthouse keeper, Marta Quill, who kept\nthe lamp"
    start, end = locate_passage(page, "who kept the lamp burning.")
    assert page[start:end] == "who kept\nthe lamp burning."
    assert locate_passage(page, "an entirely different sentence") is None
    assert locate_passage(page, "") is None
    # two words in common are a coincidence, not a match
    assert align(["the", "lamp", "of", "x"], "the lamp was bright tonight") is None
    # a word that differs at the edge is still covered: the passage keeps its length
    assert align(["a", "b", "c", "d", "e", "f"], "zz c d e f") == (1, 6)


def test_pdf_words_of_a_passage(tmp_path):
    path = make_pdf(tmp_path / "t.pdf", ["Heading\n\nThe treaty ended in 1901, when the railway made the river "
                                         "tolls useless and the barges stopped."])
    with pymupdf.open(path) as pdf:
        words = pdf[0].get_text("words")
    hits = locate_in_pdf_words(words, "The treaty ended in 1901, when the railway…")
    assert [words[i][4] for i in hits] == ["The", "treaty", "ended", "in", "1901,", "when", "the", "railway"]
    assert locate_in_pdf_words(words, "nothing of the kind") == []


def test_folders_watch_targets_and_rescans(tmp_path):
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    for name in ("a.pdf", "b.txt", "c.jpg", ".d.txt", "sub/e.md", ".hidden/f.txt"):
        (root / name).write_text("x")
    dirs, files = watch_targets([str(root), str(tmp_path / "gone")])
    assert dirs == [str(root), str(root / "sub")]
    assert files == [str(root / "a.pdf"), str(root / "b.txt"), str(root / "sub" / "e.md")]
    folders = [str(root), str(root / "sub"), str(tmp_path / "other")]
    assert folder_of(str(root / "sub" / "e.md"), folders) == str(root / "sub")
    assert folder_of(str(root / "a.pdf"), folders) == str(root)
    assert folder_of(str(tmp_path / "docs2" / "x.txt"), folders) is None  # a prefix is not a parent
    assert folders_to_rescan([str(root / "sub" / "e.md"), str(root / "a.pdf"), "/elsewhere/x"], folders) == \
        [str(root), str(root / "sub")]
    docs = [{"path": str(root / "a.pdf"), "folder": str(root)}, {"path": "/x/y.txt", "folder": None}]
    assert documents_in(docs, None) == docs and documents_in(docs, str(root)) == docs[:1]


def test_live_rate_is_the_engines_own_decode_figures():
    stats = GenerationStats()
    assert stats.decode_tok_s == 0 and stats.read_gb_s == 0          # nothing decoded yet
    stats = GenerationStats(decode_tokens=1, decode_s=0.5)
    assert stats.decode_tok_s == 0                                  # the first token comes from prefill
    stats = GenerationStats(decode_tokens=4, decode_s=2.0, weight_bytes_per_token=1_500_000_000,
                            kv_read_bytes_per_token=500_000_000)
    assert stats.decode_tok_s == 3 / 2.0
    assert stats.bytes_per_decode_token == 2_000_000_000 and stats.read_gb_s == 3.0


def test_history_per_document_and_search(tmp_path):
    store = Store(tmp_path / "s.db")
    assert latest(store) is None
    a = store.add_answer([1], "When was the treaty signed?", "In 1848.", [{"doc": 1, "page": 1, "text": "t"}],
                         "m", "e", {"prompt_tokens": 3})
    b = store.add_answer([1, 2], "Who kept the lamp?", "Marta Quill.", [], "m", "e", {})
    store.add_answer([2], "Budget?", "12 million.", [], "m", "e", {})
    assert [p.id for p in history(store, 1)] == [b, a]
    assert [p.id for p in history(store, 1, "  quill ")] == [b]
    assert history(store, 1, "budget") == []
    past = history(store, 1, "1848")[0]
    assert (past.citations, past.timings, past.doc_ids, past.attended) == (
        [{"doc": 1, "page": 1, "text": "t"}], {"prompt_tokens": 3}, [1], [])
    assert past.label().endswith("  When was the treaty signed?") and "T" not in past.label()[:16]
    assert latest(store).question == "Budget?"
