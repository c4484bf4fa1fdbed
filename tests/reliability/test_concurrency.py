"""Concurrent use: ingesting while answering (threads, one shared Store or one each),
many threads on one Store, and two processes on one data directory. SQLite (WAL,
busy timeout) keeps the store consistent; the ingest lock (app/library/locking.py) makes two
ingestions take turns."""
from __future__ import annotations

import random
import threading
import time

import pytest

from app.qa.answer import answer
from app.settings import Paths, Settings
from app.library.ingest import ingest
from app.session import Session
from app.store import Store
from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import make_pdf
from tests.reliability.helpers import (
    cli_env,
    query,
    read_until,
    run_cli,
    start_cli,
    store_problems,
)

FAST = Settings(engine="llamacpp", n_ctx=2048, max_tokens=24, temperature=0.0, threads=1)
WORDS = "river treaty lighthouse keeper lamp tolls barges lock railway harbour cargo flood bridge mill".split()
QUESTIONS = ["Who kept the lighthouse lamp burning?", "When was the treaty signed?", "When did the treaty end?"]


def write_library(folder, n: int, seed: int = 3):
    folder.mkdir()
    rng = random.Random(seed)
    for i in range(n):
        text = "\n\n".join(" ".join(rng.choice(WORDS) for _ in range(50)) + "." for _ in range(10))
        (folder / f"note{i:03}.txt").write_text(f"Note {i}\n\n{text}\n")
    return folder


@pytest.fixture
def session(data_dir, tmp_path):
    s = Session(Paths.resolve(data_dir))
    s.save_settings(FAST)
    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES, title="River Treaty History")
    ingest(s.store, [tmp_path / "treaty.pdf"], s.token_counter())
    return s


@pytest.mark.parametrize("stores", ["shared", "one each"])
def test_ingesting_while_answering(session, tmp_path, stores):
    library = write_library(tmp_path / "library", 80)
    doc_id = session.store.find_documents("treaty.pdf")[0]["id"]
    backend = session.backend()
    # The first answer warms the model up (seconds): outside the timed part, or the
    # ingestion could be over before any answer came.
    answer(session.store, backend, QUESTIONS[0], [doc_id], session.sampling(), save=False)
    ingest_store = session.store if stores == "shared" else Store(session.paths.db)
    errors: list[BaseException] = []
    ingest_span: list[float] = []
    answered_at: list[float] = []
    first_answer = threading.Event()

    def ingesting():
        def halfway(event):  # the second half waits for an answer: the two surely overlap
            if event.index == event.total // 2:
                first_answer.wait(120)

        try:
            ingest_span.append(time.monotonic())
            ingest(ingest_store, [library], session.token_counter(), progress=halfway)
            ingest_span.append(time.monotonic())
        except BaseException as e:  # reported below: a thread's exception would vanish
            errors.append(e)

    def answering():
        try:
            for q in QUESTIONS * 2:
                answer(session.store, backend, q, [doc_id], session.sampling())
                answered_at.append(time.monotonic())
                first_answer.set()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=ingesting), threading.Thread(target=answering)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    assert errors == []
    start, end = ingest_span
    assert any(start < t < end for t in answered_at), ("no answer came while the ingestion ran", start, end, answered_at)

    assert len(session.store.answers(doc_id=doc_id)) == 2 * len(QUESTIONS)
    assert len(session.store.documents()) == 81
    assert all(d["status"] == "ingested" for d in session.store.documents())
    assert store_problems(session.paths.db) == []
    if ingest_store is not session.store:
        ingest_store.close()


def test_many_threads_on_one_store(tmp_path):
    """The Store's one connection serves every thread: each use holds its lock, and
    a transaction holds it from BEGIN to COMMIT, so no thread's statements land in
    another's transaction."""
    store = Store(tmp_path / "ellm.db")
    errors: list[BaseException] = []
    per_thread = 40

    def work(t: int):
        try:
            for i in range(per_thread):
                text = f"thread {t} item {i} lighthouse"
                doc = store.save_document({"path": f"/t{t}/d{i}.txt", "status": "ingested", "pages": 1},
                                          [(1, 0, text)], [(1, 0, len(text), text)])
                assert store.search_chunks([doc], "lighthouse")[0]["doc_id"] == doc
                store.add_answer([doc], f"question {t} {i}", "an answer", [], "m", "e", {})
                assert store.document(doc)["path"] == f"/t{t}/d{i}.txt"
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(store.documents()) == 4 * per_thread
    assert len(store.answers(limit=1000)) == 4 * per_thread
    store.close()
    assert store_problems(tmp_path / "ellm.db") == []


def test_two_processes_ingesting_the_same_folder_take_turns(tmp_path, data_dir):
    library = write_library(tmp_path / "library", 150)
    hold = tmp_path / "hold"
    hold.touch()  # the first trickles on until the second is seen waiting for it
    first = start_cli(data_dir, "ingest", str(library), env=cli_env(ELLM_TEST_INGEST_HOLD=str(hold)))
    first.stdout.readline()  # it holds the ingest lock and is writing
    second = start_cli(data_dir, "ingest", str(library))
    waited = read_until(second, lambda err: b"another eLLM is working on this data directory" in err,
                        timeout=120, stream="stderr")
    assert b"waiting for the ingest lock" in waited and first.poll() is None
    hold.unlink()
    results = [p.communicate(timeout=300) for p in (first, second)]
    assert [p.returncode for p in (first, second)] == [0, 0], [r[1] for r in results]
    summaries = [out.decode().splitlines()[-1] for out, _ in results]
    assert summaries == ["150 ingested, 0 unchanged, 0 failed", "0 ingested, 150 unchanged, 0 failed"]
    db = data_dir / "ellm.db"
    assert query(db, "SELECT count(*), count(DISTINCT path) FROM documents") == [(150, 150)]
    assert store_problems(db) == []


def test_asking_in_one_process_while_another_ingests(tmp_path, data_dir):
    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES, title="River Treaty History")
    assert run_cli(data_dir, "ingest", str(tmp_path / "treaty.pdf"), timeout=120).rc == 0
    library = write_library(tmp_path / "library", 120)
    hold = tmp_path / "hold"
    hold.touch()  # the ingestion trickles on (a file per 0.2 s) until the answer is in
    ingesting = start_cli(data_dir, "ingest", str(library), env=cli_env(ELLM_TEST_INGEST_HOLD=str(hold)))
    ingesting.stdout.readline()  # it has started writing
    answer = run_cli(data_dir, "ask", QUESTIONS[0], "--doc", "treaty.pdf", "--engine", "llamacpp", "--ctx", "2048",
                     "--max-tokens", "24", "--threads", "1", "--greedy", timeout=300)
    still_ingesting = ingesting.poll() is None
    hold.unlink()
    out, err = ingesting.communicate(timeout=300)
    assert answer.rc == 0 and "Sources:" in answer.out, answer.err
    assert still_ingesting, "the ingestion ended before the answer: the test proved nothing"
    assert ingesting.returncode == 0, err
    assert out.decode().splitlines()[-1] == "120 ingested, 0 unchanged, 0 failed"
    db = data_dir / "ellm.db"
    assert query(db, "SELECT count(*) FROM answers") == [(1,)]
    assert store_problems(db) == []


# ---- The lock itself (app/library/locking.py) -------------------------------------------------


def test_a_lock_is_waited_for_and_says_who_holds_it(tmp_path):
    from app.library.locking import LockTimeout, file_lock

    order: list[str] = []
    told: list[str] = []
    with file_lock(tmp_path, "ingest"):
        with pytest.raises(LockTimeout, match=r"still held \(pid \d+, ingest, since "):
            with file_lock(tmp_path, "ingest", timeout=0.3, on_wait=told.append):
                pass
        assert len(told) == 1 and "waiting for the ingest lock" in told[0]

        def second():
            with file_lock(tmp_path, "ingest", on_wait=lambda m: order.append("waited")):
                order.append("second")

        t = threading.Thread(target=second)
        t.start()
        time.sleep(0.5)
        order.append("first done")
    t.join(30)
    assert order == ["waited", "first done", "second"]
    with file_lock(tmp_path, "other", timeout=0):  # locks of other purposes are independent
        pass


def test_a_lock_file_removed_by_doctor_is_never_shared(tmp_path, monkeypatch):
    """remove_if_unheld (doctor) removes only an unheld lock file, and a process that
    opened the old file just before the removal locks the new one instead."""
    from app.library.locking import file_lock, is_held, lock_path, remove_if_unheld

    path = lock_path(tmp_path, "ingest")
    with file_lock(tmp_path, "ingest"):
        assert is_held(path) and remove_if_unheld(path) is False and path.exists()
    assert not is_held(path) and remove_if_unheld(path) is True and not path.exists()

    import app.library.locking

    real_still_at = app.library.locking._still_at
    calls = []

    def removed_meanwhile(fd, p):  # the file is unlinked between our open and our flock
        if not calls:
            calls.append(1)
            p.unlink()
        return real_still_at(fd, p)

    monkeypatch.setattr(app.library.locking, "_still_at", removed_meanwhile)
    with file_lock(tmp_path, "ingest") as held:
        assert held.exists() and is_held(held)  # the file now at the path is the one we hold
    assert calls == [1]


def test_an_ingestion_waiting_for_the_lock_can_be_cancelled(tmp_path):
    """The window's Stop button works while its ingestion waits for another eLLM's."""
    from app.library.locking import file_lock

    store = Store(tmp_path / "ellm.db")
    library = write_library(tmp_path / "library", 2)
    with file_lock(tmp_path, "ingest"):
        started = time.monotonic()
        report = ingest(store, [library], len, cancel=lambda: time.monotonic() - started > 0.5)
    assert report.cancelled and report.events == []
    assert ingest(store, [library], len).summary() == "2 ingested, 0 unchanged, 0 failed"
    store.close()
