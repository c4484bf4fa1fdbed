"""End to end with the default model (SmolLM2 through llama.cpp): ask, summarize, complete."""
from __future__ import annotations

import pymupdf
import pytest

from tests.docs.make_samples import make_text

LLAMACPP = ("--engine", "llamacpp", "--ctx", "2048")


@pytest.fixture
def ingested(cli, corpus):
    rc, _, _ = cli("ingest", str(corpus))
    assert rc == 0
    return corpus


def test_ask_about_a_pdf_answers_with_page_citations(cli, ingested):
    rc, obj, _ = cli("ask", "Who kept the lamp of the northern lighthouse burning?", "--doc", "treaty.pdf",
                     *LLAMACPP, "--greedy", "--max-tokens", "48", "--json", json_out=True)
    assert rc == 0
    assert isinstance(obj["answer"], str) and obj["answer"].strip()
    assert obj["citations"], "an answer about a PDF cites at least one page"
    for c in obj["citations"]:
        assert set(c) == {"doc", "page", "text"}
        assert isinstance(c["page"], int) and 1 <= c["page"] <= 3 and c["text"]
    t = obj["timings"]
    assert t["prompt_tokens"] > 50 and t["ttft_s"] > 0 and isinstance(t["decode_tok_s"], float)
    assert obj["context"]["truncated"] is False and obj["engine"] == "llamacpp"


def test_citations_point_at_the_page_that_holds_the_answer(cli, ingested, data_dir):
    from app.qa.citations import cite
    from app.settings import Paths
    from app.qa.pages import load_pages, plan_context
    from app.store import Store

    store = Store(Paths.resolve(data_dir).db)
    doc = store.find_documents("treaty.pdf")[0]
    pages = load_pages(store, [doc["id"]], lambda t: len(t.split()))
    plan = plan_context(store, pages, 10_000, "lighthouse")
    cites = cite(store, "Marta Quill kept the lighthouse lamp burning for forty years.", "Who kept the lamp?", plan)
    assert cites[0]["page"] == 2 and "Marta Quill" in cites[0]["text"]
    cites = cite(store, "It was signed in 1848 [p. 1].", "When was it signed?", plan)
    assert cites[0]["page"] == 1


def test_plain_output_streams_the_answer_and_names_pages(cli, ingested):
    rc, out, _ = cli("ask", "When was the treaty signed?", "--doc", "River Treaty History", *LLAMACPP,
                     "--greedy", "--max-tokens", "32")
    assert rc == 0
    assert "Sources:" in out and ", p. " in out
    assert "prompt tokens" in out and "engine llamacpp" in out


def test_a_document_longer_than_the_context_is_answered_honestly(cli, tmp_path):
    filler = "The committee reviewed routine matters of the harbour and the roads. " * 60
    pages = [filler] * 12
    pages[7] = "The secret password of the harbour master is AMBERGRIS. " + filler
    make_text(tmp_path / "long.txt", "\f".join(pages))
    cli("ingest", str(tmp_path / "long.txt"))
    rc, obj, _ = cli("ask", "What is the secret password of the harbour master?", "--doc", "long.txt",
                     "--engine", "llamacpp", "--ctx", "1024", "--greedy", "--max-tokens", "24", "--json",
                     json_out=True)
    assert rc == 0
    ctx = obj["context"]
    assert ctx["truncated"] is True and ctx["total_pages"] == 12
    assert ctx["doc_tokens"] > ctx["budget"] >= ctx["used_tokens"]
    assert {"doc": 1, "page": 8} in ctx["pages_used"], "the relevant page is chosen"
    assert "chosen by relevance" in ctx["note"] and "12 pages" in ctx["note"]
    rc, out, _ = cli("ask", "What is the secret password?", "--doc", "long.txt", "--engine", "llamacpp",
                     "--ctx", "1024", "--greedy", "--max-tokens", "8")
    assert "Note: The document has" in out


def test_unknown_document_is_a_clear_error(cli, ingested):
    rc, _, err = cli("ask", "anything", "--doc", "no-such-doc.pdf", *LLAMACPP)
    assert rc == 1
    assert "no document matches 'no-such-doc.pdf'" in err


def test_failed_document_cannot_be_asked_and_says_why(cli, ingested):
    rc, _, err = cli("ask", "anything", "--doc", "broken.pdf", *LLAMACPP)
    assert rc == 1 and "failed to ingest" in err and "truncated" in err


def test_summarize_writes_markdown_pdf_and_docx(cli, ingested, tmp_path):
    import docx

    for fmt in ("md", "pdf", "docx"):
        out = tmp_path / f"s.{fmt}"
        rc, obj, _ = cli("summarize", "treaty.pdf", "--out", str(out), *LLAMACPP, "--max-tokens", "40",
                         "--json", json_out=True)
        assert rc == 0 and obj["format"] == fmt and obj["method"] == "single pass"
        assert obj["summary"].strip()
        if fmt == "md":
            text = out.read_text()
            assert text.startswith("# Summary: River Treaty History") and obj["summary"].strip()[:20] in text
        elif fmt == "pdf":
            with pymupdf.open(out) as d:
                assert "Summary: River Treaty History" in d[0].get_text()
        else:
            assert docx.Document(str(out)).paragraphs[0].text == "Summary: River Treaty History"


def test_summarize_a_long_document_goes_section_by_section(cli, tmp_path):
    sections = [f"Section {i}. " + ("The harbour board discussed the state of pier %d at length. " % i) * 40
                for i in range(1, 6)]
    make_text(tmp_path / "report.txt", "\f".join(sections))
    cli("ingest", str(tmp_path / "report.txt"))
    rc, obj, err = cli("summarize", "report.txt", "--engine", "llamacpp", "--ctx", "768", "--max-tokens", "24",
                       "--json", json_out=True)
    assert rc == 0
    assert obj["method"].endswith("sections") and obj["sections"] >= 2
    assert obj["summary"].strip()


def test_summary_format_is_checked_before_any_work(cli, ingested, tmp_path):
    rc, _, err = cli("summarize", "treaty.pdf", "--out", str(tmp_path / "s.odt"), *LLAMACPP)
    assert rc == 1 and "cannot export as 'odt'" in err


def test_complete_greedy_is_deterministic(cli):
    args = ("complete", "The capital of France is", "--engine", "llamacpp", "--greedy", "-n", "12", "--json")
    rc, a, _ = cli(*args, json_out=True)
    rc2, b, _ = cli(*args, json_out=True)
    assert rc == rc2 == 0
    assert a["tokens"] == b["tokens"] and len(a["tokens"]) <= 12 and a["text"]
    assert set(a) >= {"text", "tokens", "timings"}


def test_cited_passage_is_the_matching_sentence_not_the_page_opening():
    from app.qa.citations import best_window

    page = ("Riverside Harbour Authority annual report. This report describes the work of the year. "
            + "Traffic grew on the river and the quays were busy all summer long. " * 4
            + "The new steel lock gates cost 2.4 million euros. They were made in Rotterdam. "
            + "Tolls brought in 5.1 million euros. " * 3)
    window = best_window(page, "The new gates cost 2.4 million euros.", 160)
    assert "lock gates cost 2.4 million euros" in window and len(window) <= 160
    assert not window.startswith("Riverside")
    assert best_window("Short page.", "anything", 160) == "Short page."


def test_a_document_not_read_yet_is_answered_from_passages_unless_whole(cli, tmp_path):
    """eLLM's engine keeps what it reads: the first question about a long document not read yet
    answers at once from its best passages and says so; --whole reads it first, and then the
    next question uses the whole document."""
    folder = tmp_path / "docs"
    folder.mkdir()
    filler = "The harbour log notes the tides, the nets and the gulls of an ordinary day. " * 30
    make_text(folder / "log.txt", "Harbour Log\n\n" + filler * 3 + "The keeper's dog was called Biscuit.\n\n"
              + filler * 3)
    assert cli("ingest", str(folder))[0] == 0
    ellm = ("--engine", "ellm", "--greedy", "--max-tokens", "8")
    rc, first, _ = cli("--json", "ask", "What was the keeper's dog called?", "--doc", "log.txt", *ellm, json_out=True)
    assert rc == 0 and first["answered_from"] == "passages" and first["timings"]["kv_cache"] == "none"
    assert "Harbour Log is not read yet" in first["note"] and first["context"]["truncated"]
    assert first["timings"]["prompt_tokens"] < 1000
    rc, out, _ = cli("ask", "What was the keeper's dog called?", "--doc", "log.txt", *ellm)
    assert rc == 0 and "Note: Answered from" in out and "`ellm ask --whole` waits for the reading" in out
    rc, whole, err = cli("--json", "ask", "What was the keeper's dog called?", "--doc", "log.txt", *ellm, "--whole",
                         json_out=True)
    assert rc == 0 and whole["answered_from"] == "document" and "reading Harbour Log" in err
    rc, later, _ = cli("--json", "ask", "Who kept the log?", "--doc", "log.txt", *ellm, json_out=True)
    assert rc == 0 and later["answered_from"] == "document" and later["timings"]["kv_cache"] == "hit"
