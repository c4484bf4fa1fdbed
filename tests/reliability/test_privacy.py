"""No network: ingest, ask, summarize and the window open no internet socket.

Two ways, because each sees what the other cannot:
- in this process, the socket module refuses (and records) every internet socket,
  connection and name lookup while ingest, ask, summarize and the main window run:
  code that caught the error and went on quietly is caught by the record;
- in a subprocess, with networking taken away by the kernel (a network namespace of
  its own with no interface up, `unshare -n`) when we may, and the same Python-level
  guard in any case: `ellm ingest`, `ellm ask` and the window must still work. This
  covers llama.cpp and Qt, whose C code the Python guard does not see.

`ellm serve` listens, so it runs under the guard's listen-only mode (it may listen on loopback,
never connect out or look up a name): tests/api/test_serve_end_to_end.py.
"""
from __future__ import annotations

import shutil
import socket
import subprocess
import sys

import pytest

from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import make_image_only_pdf, make_pdf
from tests.reliability.helpers import cli_env, run_cli
from tests.reliability.hooks.ellm_netguard import NetworkAttempt, make_guard

LLAMA = ("--engine", "llamacpp", "--ctx", "2048", "--threads", "1")


@pytest.fixture
def no_network(monkeypatch):
    """Internet sockets and name lookups raise for the test's duration; returns the
    list of attempts (empty at the end, or the test fails)."""
    attempts: list[str] = []
    for name, replacement in make_guard(attempts).items():
        monkeypatch.setattr(socket, name, replacement)
    # The guard works (so an empty record means something), and local sockets still do.
    with pytest.raises(NetworkAttempt):
        socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    with pytest.raises(NetworkAttempt):
        socket.create_connection(("example.org", 443))
    with pytest.raises(NetworkAttempt):
        socket.getaddrinfo("example.org", 443)
    a, b = socket.socketpair()  # AF_UNIX, as Qt and asyncio use inside a process
    a.close(), b.close()
    attempts.clear()
    yield attempts
    assert attempts == [], f"network access was attempted: {attempts}"


def test_ingest_ask_and_summarize_open_no_socket(no_network, cli, corpus, tmp_path):
    rc, out, err = cli("ingest", str(corpus))
    assert rc == 0 and "4 ingested" in out, err
    rc, answer, err = cli("ask", "Who kept the lighthouse lamp burning?", "--doc", "treaty.pdf", *LLAMA,
                          "--max-tokens", "12", "--json", json_out=True)
    assert rc == 0 and answer["answer"], err
    out_file = tmp_path / "summary.md"
    rc, summary, err = cli("summarize", "treaty.pdf", "--out", str(out_file), *LLAMA, "--max-tokens", "16",
                           "--json", json_out=True)
    assert rc == 0 and summary["summary"] and out_file.is_file(), err
    assert no_network == []


def test_the_window_opens_no_socket(no_network, qtbot, data_dir, corpus):
    from app.settings import Paths, Settings
    from app.session import Session
    from app.ui.main_window import MainWindow

    session = Session(Paths.resolve(data_dir))
    session.save_settings(Settings(engine="llamacpp", n_ctx=2048, max_tokens=12, temperature=0.0, threads=1))
    window = MainWindow(session)
    qtbot.addWidget(window)
    window.show()
    job = window.ingest([str(corpus)])
    with qtbot.waitSignal(job.signals.sig_finished, timeout=120_000):
        pass
    qtbot.waitUntil(lambda: window.ingest_job is None, timeout=10_000)
    assert len(session.store.documents()) == 5
    assert no_network == []


def _can_unshare_network() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        return subprocess.run(check=False, args=["unshare", "-n", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def test_ellm_answers_with_networking_disabled_for_the_process(data_dir, tmp_path):
    log = tmp_path / "network-attempts.log"
    env = cli_env(ELLM_TEST_NO_NETWORK="1", ELLM_TEST_NETWORK_LOG=str(log))
    prefix = ["unshare", "-n"] if _can_unshare_network() else []
    if prefix:  # the premise: in that namespace nothing is reachable, not even this machine's loopback
        server = socket.create_server(("127.0.0.1", 0))
        port = server.getsockname()[1]
        reach = f"import socket; socket.create_connection(('127.0.0.1', {port}), 5)"
        probe = subprocess.run(check=False, args=[*prefix, sys.executable, "-c", reach], capture_output=True, text=True, timeout=30)
        server.close()
        assert probe.returncode != 0 and "Error" in probe.stderr, probe.stderr

    # The premise of the Python-level guard: in such a process an internet socket fails and is logged.
    probe_log = tmp_path / "probe.log"
    probe = subprocess.run(check=False, args=[sys.executable, "-c", "import socket; socket.socket()"], capture_output=True, text=True,
                           env=cli_env(ELLM_TEST_NO_NETWORK="1", ELLM_TEST_NETWORK_LOG=str(probe_log)), timeout=60)
    assert probe.returncode == 1 and "NetworkAttempt" in probe.stderr and probe_log.read_text(), probe.stderr

    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES, title="River Treaty History")
    ingest = run_cli(data_dir, "ingest", str(tmp_path / "treaty.pdf"), env=env, prefix=prefix, timeout=120)
    assert ingest.rc == 0, ingest.err
    ask = run_cli(data_dir, "ask", "Who kept the lighthouse lamp burning?", "--doc", "treaty.pdf", *LLAMA,
                  "--max-tokens", "24", "--greedy", env=env, prefix=prefix, timeout=300)
    assert ask.rc == 0, ask.err
    assert "Sources:" in ask.out and "River Treaty History, p. " in ask.out
    shot = tmp_path / "window.png"
    gui = run_cli(data_dir, "gui", "--screenshot", str(shot), env=env, prefix=prefix, timeout=120)
    assert gui.rc == 0 and shot.stat().st_size > 10_000, gui.err
    assert not log.exists(), log.read_text()


def test_ocr_of_a_scan_needs_no_network(data_dir, tmp_path):
    """The OCR models ship in the wheel: reading a scan in a process without networking (and
    with the socket guard) must not try to fetch anything."""
    log = tmp_path / "network-attempts.log"
    env = cli_env(ELLM_TEST_NO_NETWORK="1", ELLM_TEST_NETWORK_LOG=str(log))
    prefix = ["unshare", "-n"] if _can_unshare_network() else []
    scan = make_image_only_pdf(tmp_path / "scan.pdf", ["A scanned letter about the mill race."], height=120)
    ingest = run_cli(data_dir, "ingest", str(scan), env=env, prefix=prefix, timeout=180)
    assert ingest.rc == 0 and "(1 pages, 1 OCRed, " in ingest.out, ingest.err
    assert not log.exists(), log.read_text()
