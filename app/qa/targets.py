"""What a question is asked about: the selected documents, one folder, or everything.

The one resolver of both front ends: the window's ask pane offers the three choices and
shows the heading made here; ``ellm ask --doc / --folder / --all`` resolves the same kinds
and prints ``problem`` when nothing can be asked.
A folder or everything means its ingested documents (as on the command line); the
selection is taken as it is, so asking about a failed document says why it cannot
be answered.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

from app.library.folders import documents_in

SELECTED, FOLDER, EVERYTHING = "selected", "folder", "everything"
KINDS = {SELECTED: "Selected documents", FOLDER: "This folder", EVERYTHING: "Everything"}
"""The choices in the order the ask pane lists them, with their labels."""
TITLES_SHOWN = 6  # titles named in a heading or note; the rest are counted


@dataclass(frozen=True)
class AskTarget:
    """The documents one question would be asked about, and how to say so."""

    kind: str
    doc_ids: tuple[int, ...]
    heading: str             # one line: what will be asked about, or why nothing can be
    detail: str = ""         # the titles, for a tooltip
    folder: str | None = None
    problem: str = ""        # why nothing can be asked, with what to do (the command line's words)


def resolve(kind: str, docs: list[dict], selected: list[int], current: int | None = None,
            chosen_folder: str | None = None) -> AskTarget:
    """The target of ``kind`` among the stored ``docs``. ``selected`` are the library's
    selected documents, ``current`` the one the viewer shows, ``chosen_folder`` the
    folder the library is filtered to (None: all folders)."""
    titles = {d["id"]: title_of(d) for d in docs}
    if kind == SELECTED:
        ids = tuple(i for i in selected if i in titles)
        if not ids:
            return AskTarget(kind, (), "Select a document in the library",
                             problem="no document given: name one with --doc (`ellm docs` lists them)")
        return AskTarget(kind, ids, heading(kind, ids, titles), titles[ids[0]] if len(ids) == 1 else detail(ids, titles))
    if kind == FOLDER:
        folder = chosen_folder or folder_of_document(next((d for d in docs if d["id"] == current), None))
        if folder is None:
            return AskTarget(kind, (), "Select a document or choose a folder in the library",
                             problem="no folder given: name one with --folder")
        ids = tuple(d["id"] for d in documents_in(docs, folder) if d["status"] == "ingested")
        if not ids:
            return AskTarget(kind, (), f"No ingested documents in {short_path(folder)}", folder=folder,
                             problem=f"{folder}: no ingested documents under this folder; "
                                     f"`ellm ingest {folder}` first")
        return AskTarget(kind, ids, heading(kind, ids, titles, folder), folder + "\n\n" + detail(ids, titles), folder)
    if kind == EVERYTHING:
        ids = tuple(d["id"] for d in docs if d["status"] == "ingested")
        if not ids:
            return AskTarget(kind, (), "No ingested documents yet: open a folder",
                             problem="no ingested documents; `ellm ingest FOLDER` first")
        return AskTarget(kind, ids, heading(kind, ids, titles), detail(ids, titles))
    raise ValueError(f"unknown ask target {kind!r}; one of {', '.join(KINDS)}")


def heading(kind: str, ids, titles: dict[int, str], folder: str | None = None) -> str:
    """One line saying what the documents ``ids`` (at least one) of a target of ``kind`` are."""
    if kind == FOLDER and folder:
        # The count first: a long path is what gets cut off when the line is too narrow.
        return f"{count(len(ids))} in {short_path(folder)}"
    if kind == EVERYTHING:
        return f"All {len(ids)} documents" if len(ids) > 1 else f"The only document: {titles[ids[0]]}"
    return titles[ids[0]] if len(ids) == 1 else f"{len(ids)} documents: " + name_list(ids, titles)


def scope_note(doc_ids: list[int], titles: dict[int, str]) -> str:
    """A note for an answer asked across several documents ("" for one)."""
    if len(doc_ids) < 2:
        return ""
    return f"Asked across {len(doc_ids)} documents: {name_list(doc_ids, titles)}."


# ---- Helpers -----------------------------------------------------------------


def title_of(doc: dict) -> str:
    return doc.get("title") or os.path.basename(doc["path"])


def folder_of_document(doc: dict | None) -> str | None:
    """The opened folder ``doc`` was found under, or its directory when it was opened on its own."""
    if doc is None:
        return None
    return doc.get("folder") or os.path.dirname(doc["path"])


def short_path(path: str) -> str:
    home = os.path.expanduser("~")
    if home not in ("", "/") and (path == home or path.startswith(home + os.sep)):
        return "~" + path[len(home):]
    return path


def count(n: int) -> str:
    return f"{n} document" + ("" if n == 1 else "s")


def name_list(ids, titles: dict[int, str]) -> str:
    names = [titles.get(i, str(i)) for i in ids]
    more = len(names) - TITLES_SHOWN
    return "; ".join(names[:TITLES_SHOWN]) + (f" and {more} more" if more > 0 else "")


def detail(ids, titles: dict[int, str]) -> str:
    return "\n".join(titles.get(i, str(i)) for i in ids)
