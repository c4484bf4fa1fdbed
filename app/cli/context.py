"""What one ``ellm`` invocation shares: its arguments, the session they open, and errors a
person can act on."""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from app.settings import Paths


class CliError(Exception):
    """An error a person can act on; printed without a traceback, exit status 1."""



@dataclass
class Context:
    args: argparse.Namespace
    _noted: bool = field(default=False, repr=False)     # the engine choice's note is on stderr

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @cached_property
    def session(self):
        from app.session import Session

        a = self.args
        overrides = {"engine": getattr(a, "engine", None), "model": getattr(a, "model", None),
                     "n_ctx": getattr(a, "ctx", None), "max_tokens": getattr(a, "max_tokens", None),
                     "threads": getattr(a, "threads", None), "kv": getattr(a, "kv", None),
                     "attention": getattr(a, "attention", None)}
        return Session(Paths.resolve(getattr(a, "data_dir", None)), overrides)

    @property
    def paths(self) -> Paths:
        return self.session.paths

    @property
    def store(self):
        return self.session.store

    @property
    def model_path(self) -> Path:
        return self.session.model_path

    def noted(self, backend):
        """``backend``, once the automatic engine choice's note (if any) is on stderr."""
        if not self._noted:
            note = self.session.engine_note()
            if note:
                err(f"ellm: {note}")
            self._noted = True
        return backend

    def print_json(self, obj) -> None:
        print(json.dumps(obj, indent=2, ensure_ascii=False))

    def sampling(self, greedy: bool = False, max_tokens: int | None = None):
        return self.session.sampling(greedy, max_tokens)

    def resolve_doc(self, ref: str) -> dict:
        matches = self.store.find_documents(ref)
        if not matches:
            raise CliError(f"no document matches '{ref}'; `ellm docs` lists them (use an id, title or file name)")
        if len(matches) > 1:
            listing = "; ".join(f"{d['id']}: {d['title']} ({d['path']})" for d in matches[:8])
            raise CliError(f"'{ref}' matches {len(matches)} documents, use an id: {listing}")
        doc = matches[0]
        if doc["status"] == "failed" and not doc["pages"]:
            raise CliError(f"{doc['path']}: this document failed to ingest: {doc['error']}")
        return doc



def err(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


class ProgressLine:
    """Progress of long work on stderr, ``(done, total, line)`` as the services report it: on a
    terminal one line rewritten in place, elsewhere a line at most every ``every`` seconds (and
    the last one), so a log stays readable."""

    def __init__(self, prefix: str, every: float = 5.0, clock=time.monotonic):
        self.prefix, self.every, self.clock = prefix, every, clock
        self.tty = sys.stderr.isatty()
        self.last = 0.0
        self.said = ""
        self.open = False

    def __call__(self, done: int, total: int, line: str) -> None:
        now = self.clock()
        final = total > 0 and done >= total
        if self.tty:
            bar = f" [{'#' * (20 * done // total):<20}]" if total else ""
            sys.stderr.write(f"\r\x1b[K{self.prefix}: {line}{bar}" + ("\n" if final else ""))
            sys.stderr.flush()
            self.open = not final
        elif line != self.said and (final or now - self.last >= self.every or done == 0):
            err(f"{self.prefix}: {line}")
            self.said, self.last = line, now

    def close(self) -> None:
        if self.open:
            sys.stderr.write("\n")
            self.open = False


def ask_target(ctx: Context):
    """What --doc, --folder or --all ask about, by the resolver the window uses (qa/targets.py)."""
    from app.qa.targets import EVERYTHING, FOLDER, SELECTED, resolve

    a = ctx.args
    if not (a.doc or a.folder or a.all):
        raise CliError("say what to ask about: --doc DOC (repeat for several), --folder PATH or --all"
                       + (", or --thread ID to continue a conversation" if hasattr(a, "thread") else ""))
    docs = ctx.store.documents()
    if a.doc:
        target = resolve(SELECTED, docs, [ctx.resolve_doc(ref)["id"] for ref in a.doc])
    elif a.folder:
        target = resolve(FOLDER, docs, [], chosen_folder=str(Path(a.folder).expanduser().resolve()))
    else:
        target = resolve(EVERYTHING, docs, [])
    if not target.doc_ids:
        raise CliError(target.problem)
    return target
