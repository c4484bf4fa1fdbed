"""Fixtures shared by the CLI, store and UI tests."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from tests.docs.make_samples import (  # noqa: E402
    make_epub,
    make_html,
    make_pdf,
    make_text,
    make_truncated_pdf,
)

TREATY_PAGES = [
    "The River Treaty\n\nThe Treaty of Foo was signed in 1848 by the three river cities of Arlen, Brisk and Cole.\n"
    "It set the tolls that barges paid at each lock.",
    "The lighthouse\n\nChapter two describes the lighthouse keeper, Marta Quill, who kept the lamp of the "
    "northern lighthouse burning for forty years.",
    "The end of the treaty\n\nThe treaty ended in 1901, when the railway made the river tolls useless.",
]


# ---- The quick inner loop: `pytest -m "not slow"` -------------------------------------------
# End-to-end checks run the default model (or llama.cpp) and take most of the suite's time:
# they are marked slow. CI runs everything.
SLOW_MODULES = {
    "tests/cli/test_ask.py", "tests/bench/test_bench.py", "tests/bench/test_bench_kv.py", "tests/cli/test_doc_cache.py",
    "tests/cli/test_folder_ask.py", "tests/runtime/test_kv_probe.py", "tests/bench/test_passkey.py",
    "tests/reliability/test_concurrency.py", "tests/reliability/test_crash.py", "tests/reliability/test_privacy.py",
    "tests/reliability/test_hostile_corpus.py", "tests/ui/test_flow.py",
    "tests/ui/test_batch_tab.py", "tests/api/test_serve_end_to_end.py",
    "tests/cli/test_conversations.py", "tests/batch/test_ray_batch.py", "tests/ui/test_settings_kv.py",
}
SLOW_FIXTURES = {"smollm2", "smollm2_vocab", "llama_cpp", "ggml_mul_mat", "reference", "pairs"}
ROOT = Path(__file__).resolve().parents[1]


def pytest_collection_modifyitems(config, items):
    for item in items:
        module = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if module in SLOW_MODULES or SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


@pytest.fixture(autouse=True)
def _unpinned_after_each_test():
    """An engine run in this process pins its calling thread (app/engine/cpu/pinning.py); a
    later test's subprocess would inherit that one CPU (a batch of two workers then sees one
    core). Each test starts as the process did."""
    yield
    import sys
    if "app.engine.cpu.pinning" in sys.modules:
        sys.modules["app.engine.cpu.pinning"].unpin()


@pytest.fixture
def data_dir(tmp_path) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    return d


@pytest.fixture
def corpus(tmp_path) -> Path:
    """A folder with a PDF, an EPUB, a TXT, an HTML file and a truncated PDF."""
    folder = tmp_path / "library"
    (folder / "sub").mkdir(parents=True)
    make_pdf(folder / "treaty.pdf", TREATY_PAGES, title="River Treaty History", author="A. Writer")
    make_epub(folder / "sub" / "owls.epub", [("Owls", "Owls hunt at night.\n\nThey eat mice."),
                                              ("Barn owls", "Barn owls nest in old barns.")],
              title="A Book of Owls", author="B. Birder")
    make_text(folder / "notes.txt", "Meeting notes\n\nThe budget for 2025 is 12 million euros.\n")
    make_html(folder / "page.html", ["Bees make honey.", "Bees dance to show where flowers are."],
              title="About Bees")
    make_truncated_pdf(folder / "broken.pdf")
    return folder


@pytest.fixture
def cli(data_dir, capsys):
    """Run ``ellm --data-dir DATA ARGS...`` in this process; returns (rc, stdout, stderr)."""
    from app.cli import main

    def run(*args: str, json_out: bool = False):
        rc = main(["--data-dir", str(data_dir), *args])
        out, err = capsys.readouterr()
        if json_out:
            return rc, json.loads(out), err
        return rc, out, err

    return run


@pytest.fixture
def no_bandwidth_probe(monkeypatch):
    """ellm bench without its two machine probes (read bandwidth, weight streaming): fixed figures,
    for tests about something else."""
    import app.bench.speed

    monkeypatch.setattr(app.bench.speed, "read_bandwidth_gb_s", lambda: 10.0)
    monkeypatch.setattr(app.bench.speed, "stream_gb_s", lambda threads: 8.0)
