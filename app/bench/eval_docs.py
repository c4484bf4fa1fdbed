"""Fetching the question set's documents from Debian's documentation packages.

    python -m app.bench.eval_docs tests/data/eval/questions.json [--dir DIR]

Each document is a PDF inside a .deb: ``apt-get download PACKAGE=VERSION`` fetches the
package (the only network access of the evaluation, through the system's package manager, and
only when this is run), ``dpkg-deb -x`` unpacks it, the PDF is gunzipped when the package
ships it compressed, its sha256 is checked against the question file, and it is kept in DIR
(default ``~/.cache/ellm-eval``) under its file name. A document already there with the right
checksum is not fetched again. ``ellm eval`` only reads the cache; it never fetches.
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

from app.bench.eval_set import EvalDocument, QuestionSet, QuestionSetError, load_question_set

DEFAULT_DIR = Path("~/.cache/ellm-eval")
HASH_BLOCK = 1 << 20

Download = Callable[[str, str, Path], Path]
"""download(package, version, folder) -> the .deb file it put in folder."""


class EvalDocError(Exception):
    """A document that cannot be had; the message names the package or file and the problem."""


def cache_dir(folder: str | os.PathLike | None = None) -> Path:
    return Path(folder or DEFAULT_DIR).expanduser()


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_BLOCK):
            h.update(block)
    return h.hexdigest()


def apt_download(package: str, version: str, folder: Path) -> Path:
    """``apt-get download PACKAGE=VERSION`` into ``folder``; the .deb it wrote."""
    if shutil.which("apt-get") is None:
        raise EvalDocError(f"{package}: apt-get is not available here; fetch the documents on a Debian machine "
                           f"and copy the folder (--dir)")
    run = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=folder, capture_output=True,
                         text=True)
    debs = sorted(folder.glob(f"{package}_*.deb"))
    if run.returncode != 0 or not debs:
        reason = (run.stderr or run.stdout).strip().splitlines()
        raise EvalDocError(f"{package}={version}: apt-get download failed: {reason[-1] if reason else 'no .deb'}"
                           f" (is the version still in the archive? `apt-cache policy {package}`; "
                           f"run `apt-get update` first)")
    return debs[0]


def extract_member(deb: Path, member: str, out: Path) -> None:
    """Write ``member`` of the package ``deb`` to ``out`` (gunzipped when it ends in .gz)."""
    with tempfile.TemporaryDirectory(prefix="ellm-deb-") as tmp:
        run = subprocess.run(["dpkg-deb", "-x", str(deb), tmp], capture_output=True, text=True)
        if run.returncode != 0:
            raise EvalDocError(f"{deb}: dpkg-deb -x failed: {run.stderr.strip()}")
        src = Path(tmp) / member.lstrip("/")
        if not src.is_file():
            raise EvalDocError(f"{deb.name}: has no file {member} (check 'path' in the question file: "
                               f"`dpkg-deb -c {deb.name}` lists what it holds)")
        partial = out.with_name(out.name + ".part")
        with (gzip.open(src, "rb") if member.endswith(".gz") else open(src, "rb")) as f, open(partial, "wb") as g:
            shutil.copyfileobj(f, g)
        partial.replace(out)


def cached_document(doc: EvalDocument, folder: Path) -> Path | None:
    """The document's file in ``folder`` when it is there with the right checksum."""
    path = folder / doc.name
    return path if path.is_file() and sha256_of(path) == doc.sha256 else None


def fetch_document(doc: EvalDocument, folder: Path, download: Download = apt_download) -> Path:
    """The document in ``folder``, fetched and checked when it is not already there."""
    found = cached_document(doc, folder)
    if found is not None:
        return found
    if doc.local:
        raise EvalDocError(f"{folder / doc.name}: missing or not the file the question set names "
                           f"(sha256 {doc.sha256})")
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / doc.name
    with tempfile.TemporaryDirectory(prefix="ellm-apt-") as tmp:
        deb = download(doc.package, doc.version, Path(tmp))
        extract_member(deb, doc.path, out)
    got = sha256_of(out)
    if got != doc.sha256:
        out.unlink()
        raise EvalDocError(f"{doc.package}={doc.version}: {doc.path} has sha256 {got}, the question set says "
                           f"{doc.sha256}; the package changed: update the question file (and its questions)")
    return out


def fetch_all(questions: QuestionSet, folder: Path, download: Download = apt_download,
              progress: Callable[[str], None] | None = None) -> list[Path]:
    paths = []
    for doc in questions.documents:
        had = cached_document(doc, folder) is not None
        path = fetch_document(doc, folder, download)
        if progress:
            progress(f"{path}: {'already there' if had else 'fetched from ' + doc.package + '=' + doc.version}")
        paths.append(path)
    return paths


def document_files(questions: QuestionSet, folder: Path) -> list[Path]:
    """The cached documents of a question set, checked; what is missing is named, with the
    command that fetches it."""
    paths, missing = [], []
    for doc in questions.documents:
        path = cached_document(doc, folder)
        if path is None:
            missing.append(str(folder / doc.name))
        paths.append(path)
    if missing:
        raise EvalDocError(f"missing or changed: {', '.join(missing)}; fetch them with "
                           f"`python -m app.bench.eval_docs {questions.source} --dir {folder}`")
    return paths


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m app.bench.eval_docs",
                                     description="Fetch the question set's PDFs from Debian packages.")
    parser.add_argument("questions", metavar="QUESTIONS.json")
    parser.add_argument("--dir", default=None, help=f"where to keep them (default {DEFAULT_DIR})")
    a = parser.parse_args(argv)
    try:
        qs = load_question_set(a.questions)
        fetch_all(qs, cache_dir(a.dir), progress=print)
    except (QuestionSetError, EvalDocError) as e:
        print(f"eval_docs: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
