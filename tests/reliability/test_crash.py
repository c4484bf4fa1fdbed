"""Crash safety: `ellm` killed with SIGKILL (no handler runs, nothing is flushed)
leaves a consistent store, and running the same command again completes without
duplicates.

Every change to the store is one SQLite transaction in WAL mode: a killed writer's
uncommitted pages are ignored by the next reader and rolled back by the next writer.

KV-cache files: their crash test belongs here when the cache arrives (a later
issue): kill `ellm ask` while a document's KV cache file is being written, then
check that only a `*.tmp` file is left (never a file under its final name), that
the next `ellm ask` rebuilds the cache and answers, and that `ellm doctor` removes
the leftover (tests/reliability/test_doctor.py covers the removal of stale temporary
files already).
"""
from __future__ import annotations

import json
import random

import pytest

from app.library.ingest import chunk_page
from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import make_pdf
from tests.reliability.helpers import (
    cli_env,
    kill_hard,
    query,
    read_until,
    run_cli,
    start_cli,
    store_problems,
)

N_FILES = 240
WORDS = ("river treaty lighthouse keeper lamp northern signed cities tolls barges lock railway ledger "
         "harbour customs merchant cargo winter flood bridge mill charter council").split()


@pytest.fixture
def library(tmp_path):
    """Enough files that ingesting them takes seconds, each with text of its own."""
    folder = tmp_path / "library"
    folder.mkdir()
    rng = random.Random(2)
    for i in range(N_FILES):
        paragraphs = [" ".join(rng.choice(WORDS) for _ in range(60)) + "." for _ in range(12)]
        (folder / f"file{i:03}.txt").write_text(f"Report {i}\n\n" + "\n\n".join(paragraphs) + "\n")
    return folder


def chunks_match_pages(db) -> list[str]:
    """Documents whose passages are not exactly those their pages cut into."""
    bad = []
    for doc_id, path in query(db, "SELECT id, path FROM documents WHERE status = 'ingested'"):
        pages = query(db, "SELECT number, start, text FROM pages WHERE doc_id = ? ORDER BY number", [doc_id])
        expected = sorted((n, start + s, start + e) for n, start, text in pages for s, e in chunk_page(text))
        stored = sorted(query(db, "SELECT page, start, end FROM chunks WHERE doc_id = ?", [doc_id]))
        if stored != expected:
            bad.append(path)
    return bad


def test_killed_during_ingestion_then_run_again(library, data_dir):
    proc = start_cli(data_dir, "ingest", str(library))
    seen = read_until(proc, lambda out: out.count(b"\n") >= 5, timeout=120)
    assert kill_hard(proc) == -9
    assert b" ingested, " not in seen  # it was killed mid-way, not after finishing

    db = data_dir / "ellm.db"
    assert store_problems(db) == []
    [(before,)] = query(db, "SELECT count(*) FROM documents")
    assert 5 <= before < N_FILES

    again = run_cli(data_dir, "ingest", str(library), timeout=300)
    assert again.rc == 0, again.err
    ingested, unchanged = (int(again.lines()[-1].split(", ")[k].split()[0]) for k in (0, 1))
    assert (ingested + unchanged, unchanged) == (N_FILES, before)
    assert store_problems(db) == []
    assert query(db, "SELECT count(*), count(DISTINCT path) FROM documents") == [(N_FILES, N_FILES)]
    assert chunks_match_pages(db) == []


def test_killed_inside_a_write_transaction(library, data_dir):
    """Killed after a document's pages and passages were written but before the commit:
    that document is simply not there, and the next run ingests it."""
    env = cli_env(ELLM_TEST_PAUSE_IN_SAVE="3")
    proc = start_cli(data_dir, "ingest", str(library), env=env)
    err = read_until(proc, lambda e: b"PAUSED IN TRANSACTION" in e, timeout=120, stream="stderr")
    paused = err.decode().split("PAUSED IN TRANSACTION ", 1)[1].splitlines()[0]
    assert kill_hard(proc) == -9

    db = data_dir / "ellm.db"
    assert store_problems(db) == []
    assert query(db, "SELECT count(*) FROM documents WHERE path = ?", [paused]) == [(0,)]
    assert query(db, "SELECT count(*) FROM documents") == [(2,)]
    assert query(db, "SELECT count(*) FROM chunks WHERE doc_id NOT IN (SELECT id FROM documents)") == [(0,)]

    again = run_cli(data_dir, "ingest", str(library), timeout=300)
    assert again.rc == 0, again.err
    assert again.lines()[-1] == f"{N_FILES - 2} ingested, 2 unchanged, 0 failed"
    assert store_problems(db) == []
    assert chunks_match_pages(db) == []


def test_killed_during_an_answer_leaves_no_half_written_answer(tmp_path, data_dir):
    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES, title="River Treaty History")
    assert run_cli(data_dir, "ingest", str(tmp_path / "treaty.pdf"), timeout=120).rc == 0
    ask = ("ask", "Describe the treaty, the cities and the lighthouse in detail.", "--doc", "treaty.pdf",
           "--engine", "llamacpp", "--ctx", "2048", "--max-tokens", "60", "--threads", "1")
    # One thread: on a loaded machine llama.cpp's spinning thread pool decoded 10x slower with two.

    # Slowed to a piece every 0.5 s so the kill lands mid-answer however short the model's answer.
    proc = start_cli(data_dir, *ask, env=cli_env(ELLM_TEST_STREAM_DELAY="0.5"))
    streamed = read_until(proc, lambda out: len(out.strip()) > 0, timeout=180)
    assert kill_hard(proc) == -9
    assert streamed.strip()  # the answer had begun

    db = data_dir / "ellm.db"
    assert query(db, "SELECT count(*) FROM answers") == [(0,)]
    assert query(db, "SELECT count(*) FROM answer_docs") == [(0,)]
    assert store_problems(db) == []

    again = run_cli(data_dir, *ask, "--json", timeout=300)
    assert again.rc == 0, again.err
    answer = json.loads(again.out)
    assert answer["answer"] and answer["answer_id"]
    assert query(db, "SELECT id, answer FROM answers") == [(answer["answer_id"], answer["answer"])]
    assert store_problems(db) == []
