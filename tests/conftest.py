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
