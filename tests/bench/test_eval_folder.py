"""`ellm eval --folder-trials`: documents cut from the set's manuals, a fact planted in one of
them, asked across all of them; the cutting and planting on hand-made pages, the facts against
the real manuals, and an end to end run with the test model (SmolLM2 through llama.cpp)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.bench.eval_folder import FACTS, FolderTrials, cut_documents, make_trials, plant
from app.bench.eval_score import answer_right, normalise
from app.bench.eval_set import load_question_set
from app.bench.eval_docs import sha256_of
from app.qa.pages import PageText
from tests.bench.test_eval import QUESTIONS, model, write_json  # noqa: F401 (model: the test model's fixture)
from tests.docs.make_samples import make_pdf


def manual(title: str, n: int, tokens: int = 100) -> list[PageText]:
    return [PageText(1, title, i + 1, f"{title} page {i + 1}. Some text here.", tokens) for i in range(n)]


def test_documents_are_whole_pages_taken_in_turn_from_each_manual_and_spread_over_it():
    docs = cut_documents([manual("R FAQ", 40), manual("FHS", 20)], 4, 300)
    names = [n for n, _ in docs]
    assert names == ["01-r-faq-part1.txt", "02-fhs-part1.txt", "03-r-faq-part2.txt", "04-fhs-part2.txt"]
    texts = [t.split("\n\n") for _, t in docs]
    assert [len(t) for t in texts] == [3, 3, 3, 3], "three 100-token pages fit 300 tokens, a fourth does not"
    assert texts[0][0] == "R FAQ page 1. Some text here." and texts[2][0] == "R FAQ page 21. Some text here."
    assert texts[1][0] == "FHS page 1. Some text here." and texts[3][0] == "FHS page 11. Some text here."
    # A page larger than the budget is still taken alone; the end of a manual ends a document.
    big = cut_documents([manual("A", 3, tokens=900)], 2, 300)
    assert [t.count("page") for _, t in big] == [1, 1]


def test_a_fact_is_planted_after_a_sentence_end_and_nothing_else_changes():
    text = "First sentence here. Second one follows. Third closes it."
    out = plant(text, "The print server is Heron.", 0.4)
    assert out == "First sentence here. Second one follows. The print server is Heron. Third closes it."
    assert plant(text, "X.", 0.99) == text + " X."
    assert out.replace("The print server is Heron. ", "") == text


def test_trials_are_fixed_by_the_seed_and_each_copy_holds_its_fact_once(tmp_path):
    docs = [(f"{i:02d}-doc.txt", "Words of a manual. " * 200) for i in range(8)]
    a = make_trials(FolderTrials(6), docs, tmp_path / "a")
    b = make_trials(FolderTrials(6), docs, tmp_path / "b")
    assert [(t.fact, t.slot, t.depth) for t in a] == [(t.fact, t.slot, t.depth) for t in b]
    assert len({t.fact for t in a}) == 6, "the facts are not repeated before all are used"
    assert len({t.slot for t in a}) > 1 and all(0.1 <= t.depth <= 0.9 for t in a)
    for t in a:
        text = t.path.read_text()
        assert t.path.name == docs[t.slot][0] and text.count(t.fact.sentence) == 1
        assert text.replace(t.fact.sentence + " ", "") == docs[t.slot][1]
    other = make_trials(FolderTrials(6, seed=1), docs, tmp_path / "c")
    assert [(t.slot, t.depth) for t in other] != [(t.slot, t.depth) for t in a]


def test_every_fact_answers_its_own_question_and_no_manual_holds_one():
    from app.bench.eval_docs import cache_dir, cached_document
    from app.docs import extract

    for f in FACTS:
        assert answer_right(f.sentence, f.answers) and f.question.endswith("?")
    qs = load_question_set(QUESTIONS)
    found = [cached_document(d, cache_dir()) for d in qs.documents]
    if not all(found):
        pytest.skip("the documents are not fetched (python -m app.bench.eval_docs)")
    for path in found:
        text = normalise(" ".join(p.text for p in extract(path).pages))
        assert not [a for f in FACTS for a in f.answers if normalise(a) in text], path.name


PROSE = ["The harbour board met on Monday to discuss the new quay and the dredging of the channel. "
         "Members agreed that the work should begin in spring, when the weather allows boats to move freely. ",
         "The library committee reviewed the loans of the past year and the state of the reading room. "
         "It asked for new shelves and for the windows on the north side to be repaired before winter. "]


def test_folder_trials_ask_every_document_and_write_every_row(cli, tmp_path, model):
    docs = tmp_path / "docs"
    docs.mkdir()
    pdfs = [make_pdf(docs / f"{name}.pdf", [PROSE[i % 2] * 3 for _ in range(6)], title=name.title())
            for i, name in enumerate(["harbour", "library"])]
    questions = write_json(tmp_path / "questions.json", {"documents": [
        {"file": p.name, "sha256": sha256_of(p), "questions": [{"question": "Q?", "answers": ["x"], "page": 1}]}
        for p in pdfs]})
    out = tmp_path / "folder.json"
    rc, stdout, stderr = cli("eval", str(questions), "--docs-dir", str(docs), "--model", str(model), "--modes", "rag8k",
                             "--folder-trials", "2", "--folder-docs", "4", "--folder-doc-tokens", "300",
                             "--max-tokens", "16", "--json", str(out))
    assert rc == 0, stderr
    report = json.loads(out.read_text())
    assert [d["name"] for d in report["documents"]] == ["01-harbour-part1.txt", "02-library-part1.txt",
                                                       "03-harbour-part2.txt", "04-library-part2.txt"]
    rows = report["rows"]
    assert [(r["mode"], r["trial"]) for r in rows] == [("rag8k", 1), ("rag8k", 2)]
    for r in rows:
        assert r["error"] == "" and r["engine"] == "llamacpp" and r["considered"] == 4
        assert r["whole"] is True and r["pages_used"] == r["total_pages"] >= 4, "four small documents fit 8192"
        assert r["page"] >= 1 and r["document"] in [d["name"] for d in report["documents"]]
        assert r["right"] == answer_right(r["answer"], r["accepted"])
        assert r["cited"] == any(abs(p - r["page"]) <= 1 for p in r["cited_pages"] + r["attended_pages"])
        assert r["total_s"] >= r["ttft_s"] > 0
    [s] = report["summary"]
    assert (s["mode"], s["trials"], s["whole"]) == ("rag8k", 2, 1.0)
    assert s["right"] == sum(r["right"] for r in rows) / 2
    header, line = stdout.splitlines()[:2]
    assert header.split()[:2] == ["mode", "trials"] and line.split()[:2] == ["rag8k", "2"]
    rc, _, err = cli("eval", str(questions), "--docs-dir", str(docs), "--folder-trials", "2", "--folder-docs", "1")
    assert rc == 1 and "--folder-docs at least 2" in err
