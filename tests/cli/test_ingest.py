"""`ellm ingest` and `ellm docs`: every format, incremental re-ingest, failures."""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

from tests.docs.make_samples import make_text


def by_name(docs):
    return {Path(d["path"]).name: d for d in docs}


def test_folder_with_four_good_files_and_a_truncated_pdf(cli, corpus):
    rc, out, _ = cli("ingest", str(corpus))
    assert rc == 0
    lines = [ln for ln in out.splitlines() if ln.startswith("[")]
    assert len(lines) == 5
    assert sum("ingested (" in ln for ln in lines) == 4
    # The count of files done, with the time the rest will take (the last file has none left).
    assert [ln.split("] ")[0] for ln in lines][-1] == "[5/5"
    assert all(re.fullmatch(r"\[\d/5, \d+ s left", ln.split("] ")[0]) for ln in lines[:-1]), lines
    [failed] = [ln for ln in lines if "failed" in ln]
    assert "broken.pdf: failed: file is truncated or not a valid PDF" in failed
    assert out.strip().endswith("4 ingested, 0 unchanged, 1 failed")

    rc, docs, _ = cli("docs", "--json", json_out=True)
    assert rc == 0
    assert all(set(d) == {"id", "title", "path", "pages", "tokens", "status", "error"} for d in docs)
    got = {name: (d["title"], d["pages"], d["status"]) for name, d in by_name(docs).items()}
    assert got == {
        "treaty.pdf": ("River Treaty History", 3, "ingested"),
        "owls.epub": ("A Book of Owls", 2, "ingested"),
        "notes.txt": ("Meeting notes", 1, "ingested"),
        "page.html": ("About Bees", 1, "ingested"),
        "broken.pdf": ("broken.pdf", 0, "failed"),
    }
    broken = by_name(docs)["broken.pdf"]
    assert "truncated" in broken["error"] and broken["tokens"] == 0
    good = [d for d in docs if d["status"] == "ingested"]
    assert all(d["tokens"] > 5 and d["error"] is None for d in good)


def test_token_counts_come_from_the_model_tokenizer(cli, corpus):
    from app.runtime.engines import token_counter
    from app.runtime.model_files import default_model_path

    cli("ingest", str(corpus / "notes.txt"))
    _, docs, _ = cli("docs", "--json", json_out=True)
    count = token_counter(default_model_path())
    text = "Meeting notes\n\nThe budget for 2025 is 12 million euros."
    assert docs[0]["tokens"] == count(text)


def test_reingest_skips_unchanged_replaces_changed_and_marks_deleted(cli, corpus):
    cli("ingest", str(corpus))
    rc, out, _ = cli("ingest", str(corpus))
    assert rc == 0 and "0 ingested, 4 unchanged, 1 failed" in out

    notes = corpus / "notes.txt"
    make_text(notes, "Meeting notes\n\nThe budget for 2026 is 15 million euros.\n")
    os.utime(notes, (time.time() + 5, time.time() + 5))
    (corpus / "page.html").unlink()
    rc, out, _ = cli("ingest", str(corpus))
    assert "notes.txt: ingested (changed since last time)" in out
    assert "page.html: missing" in out
    _, docs, _ = cli("docs", "--json", json_out=True)
    docs = by_name(docs)
    assert docs["page.html"]["status"] == "missing"
    assert docs["notes.txt"]["status"] == "ingested"
    make_text(corpus / "page.html", "<html><title>Bees again</title><p>Back.</p></html>")
    rc, out, _ = cli("ingest", str(corpus))
    assert "page.html: ingested (" in out


def test_changed_text_is_what_the_store_holds(cli, corpus, data_dir):
    from app.settings import Paths
    from app.store import Store

    cli("ingest", str(corpus))
    make_text(corpus / "notes.txt", "Meeting notes\n\nThe budget for 2026 is 15 million euros.\n")
    cli("ingest", str(corpus))
    store = Store(Paths.resolve(data_dir).db)
    doc = store.find_documents("notes.txt")[0]
    assert "15 million" in store.pages(doc["id"])[0]["text"]
    assert [h["page"] for h in store.search_chunks([doc["id"]], "2026 budget")] == [1]
    assert store.search_chunks([doc["id"]], "12") == []
    assert store.integrity_check() == "ok"


def test_a_failed_file_keeps_its_earlier_good_content(cli, corpus, data_dir):
    from app.settings import Paths
    from app.store import Store

    cli("ingest", str(corpus))
    (corpus / "treaty.pdf").write_bytes(b"%PDF-1.7 garbage that is not a pdf")
    rc, out, _ = cli("ingest", str(corpus))
    assert rc == 0 and "treaty.pdf: failed:" in out
    store = Store(Paths.resolve(data_dir).db)
    doc = store.find_documents("treaty.pdf")[0]
    assert doc["status"] == "failed" and doc["pages"] == 3
    assert len(store.pages(doc["id"])) == 3


def test_exit_status_is_1_only_when_nothing_could_be_read(cli, tmp_path):
    bad = tmp_path / "bad.pdf"
    bad.write_bytes(b"not a pdf")
    rc, out, _ = cli("ingest", str(bad), str(tmp_path / "absent.txt"))
    assert rc == 1
    assert "absent.txt: failed: no such file or folder" in out
    assert "bad.pdf: failed:" in out


def test_unsupported_file_named_directly_is_reported(cli, tmp_path):
    f = tmp_path / "photo.jpg"
    f.write_bytes(b"\xff\xd8")
    good = make_text(tmp_path / "ok.md", "# Title\n\nSome text.")
    rc, out, _ = cli("ingest", str(f), str(good))
    assert rc == 0
    assert "photo.jpg: failed: unsupported file type '.jpg'" in out


def test_ingest_json_output(cli, corpus):
    rc, obj, _ = cli("ingest", str(corpus), "--json", json_out=True)
    assert rc == 0
    assert obj["summary"] == "4 ingested, 0 unchanged, 1 failed"
    assert sorted(f["status"] for f in obj["files"]) == ["failed"] + ["ingested"] * 4


def test_docs_text_output_shows_failure_reasons(cli, corpus):
    cli("ingest", str(corpus))
    rc, out, _ = cli("docs")
    assert rc == 0
    assert "River Treaty History" in out
    assert "-> file is truncated or not a valid PDF" in out
