"""The folders a person opened: which documents belong to which, and what to watch.

Qt-free: the window's file watcher asks these functions what to watch and which
folders to ingest again when something under them changed. Re-ingesting a whole
folder is cheap because ingestion skips files whose content hash is unchanged.
"""
from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from app import docs


def folder_of(path: str, folders: Iterable[str]) -> str | None:
    """The innermost of ``folders`` that holds ``path`` (or is it)."""
    best = None
    for f in folders:
        root = f.rstrip(os.sep)
        if path == root or path.startswith(root + os.sep):
            if best is None or len(root) > len(best):
                best = f
    return best


def documents_in(docs_: list[dict], folder: str | None) -> list[dict]:
    """The documents found under ``folder`` (all of them for None)."""
    if folder is None:
        return list(docs_)
    return [d for d in docs_ if d.get("folder") == folder or folder_of(d["path"], [folder])]


def watch_targets(folders: Iterable[str]) -> tuple[list[str], list[str]]:
    """(directories, files) to watch: each folder and its visible subfolders (a file
    added, removed or renamed changes its directory), and every readable document
    in them (an edit in place changes only the file)."""
    dirs: list[str] = []
    files: list[str] = []
    for folder in folders:
        if not os.path.isdir(folder):
            continue
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            dirs.append(dirpath)
            files += [os.path.join(dirpath, n) for n in sorted(filenames)
                      if not n.startswith(".") and Path(n).suffix.lower() in docs.SUPPORTED_SUFFIXES]
    return dirs, files


def folders_to_rescan(changed: Iterable[str], folders: Iterable[str]) -> list[str]:
    """The opened folders that hold any of the ``changed`` paths, in opening order."""
    folders = list(folders)
    hit = {folder_of(p, folders) for p in changed}
    return [f for f in folders if f in hit]
