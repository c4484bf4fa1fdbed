"""Hostile files beside good ones: every bad file is recorded as failed with a reason
a person can act on, every good file is ingested, memory stays bounded and the
store stays consistent. Everything is built here; nothing is downloaded."""
from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from app.docs.limits import MAX_TEXT_BYTES, PAGE_CHARS
from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import (
    make_damaged_image_pdf,
    make_encrypted_pdf,
    make_epub,
    make_pdf,
    make_text,
    make_truncated_pdf,
)
from tests.reliability.helpers import (
    MiB,
    cli_env,
    honouring_file_permissions,
    make_tree,
    query,
    remove_deep_tree,
    remove_tree,
    run_cli,
    store_problems,
    write_one_line,
    write_text_file,
    write_zip_bomb,
)

PEAK_RSS_LIMIT = 500 * MiB
"""README, "Reliability and privacy": `ellm ingest` stays under 500 MB whatever it is
given (measured: ~290 MB for a 31 MB text file, ~430 MB for a 31 MB HTML file, the
largest accepted; docs/benchmarks.md, "Ingestion: OCR, tables and memory"). Without the
limits, the 200 MB file alone took over 6 GB."""
NESTED_LEVELS = 60
LATIN1_TEXT = "Café crème brûlée: 5 € à Zürich — naïve façade"

GOOD = {  # relative path -> pages
    "good/treaty.pdf": 3,
    "good/owls.epub": 2,
    "good/notes.txt": 1,
}
FAILED = {  # relative path -> what the reason must say
    "truncated.pdf": "file is truncated or not a valid PDF",
    "encrypted.pdf": "PDF is encrypted; remove the password and ingest it again",
    "empty.txt": "file is empty",
    "random.pdf": "file is truncated or not a valid PDF",
    "random.epub": "file is truncated or not a valid EPUB",
    "random.docx": "file is truncated or not a valid DOCX",
    "bomb.epub": "archive would expand to 600 MB (limit 512 MB); refused as a suspected zip bomb",
    "huge.txt": f"file is 200 MB; text files over {MAX_TEXT_BYTES // MiB} MB are not read (split it",
    "one_long_line.txt": f"file is 50 MB; text files over {MAX_TEXT_BYTES // MiB} MB are not read (split it",
    "loop.txt": "is a symbolic link that loops back on itself; fix or remove the link",
    "dangling.pdf": "which does not exist; fix or remove the link",
    "secret.txt": "permission denied; make the file readable and ingest again",
    "vanishing.txt": "file disappeared while it was being read (moved or deleted?)",
    "pipe.txt": "not a regular file (a named pipe, socket or device)",
}
HANDLED = {  # read correctly although they look odd: relative path -> pages
    "latin1.txt": 1,
    "short_line.txt": None,  # a 2 MB line: many pages, each at most PAGE_CHARS
    "/".join(["nested"] * NESTED_LEVELS) + "/deep.md": 1,
    "damaged_scan.pdf": 2,  # page 2 a scan whose JPEG is garbage: stored empty with a note
}
OCRED = {"damaged_scan.pdf": 1}  # relative path -> pages that went through OCR


def build_corpus(root: Path) -> None:
    (root / "good").mkdir()
    make_pdf(root / "good/treaty.pdf", TREATY_PAGES, title="River Treaty History")
    make_epub(root / "good/owls.epub", [("Owls", "Owls hunt at night."), ("Barn owls", "They nest in barns.")],
              title="A Book of Owls")
    make_text(root / "good/notes.txt", "Meeting notes\n\nThe budget for 2025 is 12 million euros.\n")

    make_truncated_pdf(root / "truncated.pdf")
    make_encrypted_pdf(root / "encrypted.pdf", ["A secret page."])
    (root / "empty.txt").write_bytes(b"")
    rng = random.Random(8)
    for name in ("random.pdf", "random.epub", "random.docx"):
        (root / name).write_bytes(rng.randbytes(64 * 1024))
    write_zip_bomb(root / "bomb.epub")
    write_text_file(root / "huge.txt", 200 * MiB, b"All work and no play makes Jack a dull boy.\n")
    write_one_line(root / "one_long_line.txt", 50 * MiB)
    os.symlink("loop.txt", root / "loop.txt")  # points at itself: ELOOP
    os.symlink(root / "nowhere.pdf", root / "dangling.pdf")
    (root / "secret.txt").write_text("Private.\n")
    (root / "secret.txt").chmod(0)
    (root / "vanishing.txt").write_text("Here now, gone when read.\n")
    os.mkfifo(root / "pipe.txt")  # reading it would wait forever for a writer

    make_text(root / "latin1.txt", LATIN1_TEXT + "\n", encoding="cp1252")
    write_one_line(root / "short_line.txt", 2 * MiB)
    deepest = make_tree(root, NESTED_LEVELS, "nested")
    make_text(deepest / "deep.md", "# Deep note\n\nFound at the bottom of sixty folders.\n")
    make_damaged_image_pdf(root / "damaged_scan.pdf", "A typed cover page before the scan.")
    os.symlink("..", root / "good" / "up")  # a folder link back up: following it would loop


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    root = tmp_path_factory.mktemp("hostile")
    corpus, data = root / "corpus", root / "data"
    corpus.mkdir()
    data.mkdir()
    build_corpus(corpus)
    try:
        yield corpus, data
    finally:
        remove_tree(corpus)  # 250 MB: pytest would keep it for three runs


@pytest.fixture(scope="module")
def ingested(hostile):
    """`ellm ingest` over the corpus, with vanishing.txt deleted just before it is
    opened and file permissions in force even for root."""
    corpus, data = hostile
    env = cli_env(ELLM_TEST_VANISH=str(corpus / "vanishing.txt"))
    run = run_cli(data, "ingest", str(corpus), env=env, timeout=300, honour_permissions=True)
    return corpus, data, run


def report_lines(run, corpus: Path) -> dict[str, str]:
    """{relative path: what `ellm ingest` said about it}."""
    out = {}
    for line in run.lines():
        if line.startswith("[") and "] " in line:
            path, _, said = line.split("] ", 1)[1].partition(": ")
            out[os.path.relpath(path, corpus)] = said
    return out


def test_ingest_over_the_hostile_corpus_exits_0_and_says_why_each_bad_file_failed(ingested):
    corpus, _, run = ingested
    assert run.rc == 0, run.err
    said = report_lines(run, corpus)
    assert set(said) == set(GOOD) | set(FAILED) | set(HANDLED), said
    for path in FAILED:
        assert said[path].startswith("failed: "), (path, said[path])
        assert FAILED[path] in said[path], (path, said[path])
    for path in [*GOOD, *HANDLED]:
        assert said[path].startswith("ingested ("), (path, said[path])
    n_ok = len(GOOD) + len(HANDLED)
    assert run.lines()[-1] == f"{n_ok} ingested, 0 unchanged, {len(FAILED)} failed"
    assert "Traceback" not in run.err, run.err


def test_the_unreadable_file_is_unreadable_to_the_ingesting_process(hostile, ingested):
    # Root reads any file; the ingestion ran without that power (honouring_file_permissions).
    # Check the premise rather than trust it: the same kind of process cannot open the file.
    import subprocess
    import sys

    corpus, _ = hostile
    reading = [sys.executable, "-c", f"open({str(corpus / 'secret.txt')!r}).read()"]
    probe = subprocess.run(honouring_file_permissions(reading), check=False, capture_output=True, text=True,
                           timeout=60)
    assert probe.returncode == 1 and "PermissionError" in probe.stderr, probe.stderr
    assert "permission denied" in report_lines(ingested[2], corpus)["secret.txt"]


def test_docs_json_agrees_with_the_ingest_report(ingested):
    corpus, data, run = ingested
    said = report_lines(run, corpus)
    result = run_cli(data, "docs", "--json", timeout=60)
    assert result.rc == 0, result.err
    docs = {os.path.relpath(d["path"], corpus): d for d in json.loads(result.out)}
    assert set(docs) == set(said)
    for path, d in docs.items():
        if path in FAILED:
            assert (d["status"], d["pages"]) == ("failed", 0), d
            assert said[path] == f"failed: {d['error']}"
        else:
            assert d["status"] == "ingested" and d["error"] is None and d["tokens"] > 0, d
            pages = {**GOOD, **HANDLED}[path]
            assert pages is None or d["pages"] == pages, d
            ocr = f", {OCRED[path]} OCRed" if path in OCRED else ""
            assert said[path] == f"ingested ({d['pages']} pages{ocr}, {d['tokens']} tokens)"


def test_odd_but_valid_files_are_read_correctly(ingested):
    corpus, data, _ = ingested
    db = data / "ellm.db"
    [(latin1,)] = query(db, "SELECT text FROM pages JOIN documents d ON d.id = doc_id WHERE d.path = ?",
                        [str(corpus / "latin1.txt")])
    assert latin1 == LATIN1_TEXT
    lengths = query(db, "SELECT length(p.text) FROM pages p JOIN documents d ON d.id = p.doc_id "
                        "WHERE d.path = ?", [str(corpus / "short_line.txt")])
    assert len(lengths) >= 2 * MiB // PAGE_CHARS
    assert max(n for (n,) in lengths) <= PAGE_CHARS
    deep = str(corpus / "/".join(["nested"] * NESTED_LEVELS) / "deep.md")
    assert query(db, "SELECT title, status FROM documents WHERE path = ?", [deep]) == [("Deep note", "ingested")]
    notes = query(db, "SELECT p.number, p.source, p.note FROM pages p JOIN documents d ON d.id = p.doc_id "
                      "WHERE d.path = ? ORDER BY p.number", [str(corpus / "damaged_scan.pdf")])
    assert notes[0] == (1, "text", None) and notes[1][:2] == (2, "ocr")
    assert notes[1][2].startswith("the page image is damaged (mupdf: "), notes
    # The folder link back up ("good/up" -> "..") was not followed: no file was found twice.
    assert query(db, "SELECT count(*) FROM documents WHERE path LIKE ?", ["%/up/%"]) == [(0,)]


def test_memory_stays_bounded_and_the_store_is_consistent(ingested):
    _, data, run = ingested
    assert run.peak_rss < PEAK_RSS_LIMIT, f"peak RSS {run.peak_rss / MiB:.0f} MB"
    assert store_problems(data / "ellm.db") == []


def test_a_file_that_disappears_between_hashing_and_reading(cli, tmp_path, monkeypatch):
    """The other window: the file is gone after it was listed and hashed, before the reader opens it."""
    import app.library.ingest
    from app import docs

    folder = tmp_path / "lib"
    folder.mkdir()
    make_text(folder / "a.txt", "Stays.\n")
    make_text(folder / "b.txt", "Goes away.\n")
    real_read = docs.extract

    def read_after_deletion(path, *args):
        if Path(path).name == "b.txt":
            Path(path).unlink()
        return real_read(path, *args)

    monkeypatch.setattr(app.library.ingest.docs, "extract", read_after_deletion)
    rc, out, _ = cli("ingest", str(folder))
    assert rc == 0
    assert f"{folder / 'a.txt'}: ingested (" in out
    assert f"{folder / 'b.txt'}: failed: file disappeared while it was being read" in out


def test_a_folder_tree_deeper_than_the_recursion_limit(tmp_path):
    """os.walk raised RecursionError on ~1000 levels (Python 3.11), which ended the whole ingestion."""
    import tempfile

    from app.library.ingest import collect

    # On tmpfs when there is one: removing 1100 folders one by one took 4 s on disk.
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    base = Path(tempfile.mkdtemp(prefix="ellm-deep-", dir=shm or tmp_path))
    root = base / "deep"
    root.mkdir()
    try:
        bottom = make_tree(root, 1100)
        make_text(bottom / "bottom.txt", "Still found.\n")
        found, folders = collect([root])
        assert [c.path for c in found] == [str(bottom / "bottom.txt")]
        assert folders == [str(root)]
    finally:
        remove_deep_tree(root)
        base.rmdir()


@pytest.mark.parametrize(("kind", "reason"), [
    ("epub", "the book's chapters are 0 MB of XHTML; books over 0 MB of text are not read (split it"),
    ("docx", "the document's word/"),
    ("pdf", "the PDF holds more than 0 MB of text (2 of 3 pages read); split it into smaller files"),
])
def test_every_format_bounds_the_text_it_keeps(tmp_path, monkeypatch, kind, reason):
    """The memory bound holds for archives and PDFs too, not only for text files: each
    reader refuses once the text it would keep passes the limit (here lowered to 4 KB)."""
    from app import docs
    from tests.docs.make_samples import make_docx

    monkeypatch.setattr(f"app.docs.{'word' if kind == 'docx' else kind}.MAX_TEXT_BYTES", 4096)
    path = tmp_path / f"long.{kind}"
    pages = ["Long page of text. " * 120] * 3
    if kind == "epub":
        make_epub(path, [(f"Chapter {i}", text) for i, text in enumerate(pages)])
    elif kind == "docx":
        make_docx(path, pages)
    else:
        make_pdf(path, pages)
    with pytest.raises(docs.DocumentError) as refused:
        docs.extract(path)
    assert refused.value.reason.startswith(reason), refused.value.reason
    if kind == "docx":
        assert "MB of XML; documents over 0 MB are not read (split it" in refused.value.reason
