"""Persisted document KV caches: compute a document's prefix once, reuse it for every question.

A prefix (system prompt + the document's pages, as qa/prompt.py lays them out) is question-
independent. The engine computes its KV cache once; this service decides where its file lives
under the data directory, registers it in the store (``kv_caches``), and hands it to the
backend on the next question, which maps it back (the prefix-cache part of the backend
protocol, app/engine/backend.py). The file's key hashes the model,
the cache settings and the exact prefix tokens, so a changed document, model or KV setting
simply finds no file and computes a new one (the older file of that document is deleted).
A file that fails its checks is deleted and rebuilt, never used. The files keep within the disk
budget (qa/cache_budget.py): room is made before one is written, and a cache larger than the
whole budget stays in memory only.
"""
from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from app.engine.backend import Backend, CacheFile
from app.engine.header.gguf_file import model_fingerprint
from app.qa.cache_budget import FILE_OVERHEAD, CacheBudget, Room, holding
from app.settings import Settings
from app.store import Store

log = logging.getLogger(__name__)

KV_SUBDIR = "kv"


def cache_key(model_fp: str, signature: dict, tokens: Sequence[int]) -> str:
    h = hashlib.sha256(json.dumps({"model": model_fp, "settings": signature}, sort_keys=True).encode())
    h.update(np.asarray(tokens, dtype=np.int32).tobytes())
    return h.hexdigest()[:32]


def store_cache_dir(store: Store) -> Path:
    """The data directory's cache folder (config.Paths.cache_dir) next to the store's file."""
    return Path(store.path).parent / "cache"


def budget_of(store: Store, cache_dir: Path, settings: Settings | None = None) -> CacheBudget:
    """The budget of the document caches a data directory keeps under ``cache_dir``."""
    return CacheBudget(store, Path(cache_dir) / KV_SUBDIR, settings)


class DocCaches:
    """The KV cache files of one data directory, registered in the store (``kv_caches``)."""

    def __init__(self, store: Store, cache_dir: Path, settings: Settings | None = None):
        self.store = store
        self.budget = budget_of(store, cache_dir, settings)
        self.dir = self.budget.dir
        self.kept: set[int] = set()     # documents a question is about now: room is never made from them

    @contextmanager
    def holding(self, backend: Backend, doc_ids: Iterable[int]) -> Iterator[None]:
        """The documents' cache files for ``backend``'s model held in use until the block ends:
        the budget deletes none of them, nor (in this process) a cache made for them meanwhile."""
        doc_ids = set(doc_ids)
        fp = model_fingerprint(backend.model_path)
        before, self.kept = self.kept, self.kept | doc_ids
        try:
            with holding(r["path"] for r in self.budget.caches() if r["doc_id"] in doc_ids and r["model"] == fp):
                yield
        finally:
            self.kept = before

    def room(self, backend: Backend, doc_id: int, tokens: Sequence[int], ahead: bool = False,
             opened: bool = True) -> Room:
        """Whether ``doc_id``'s prefix cache may be written, least recently used caches deleted to
        make room (``ahead``: reading ahead, CacheBudget.make_room)."""
        need = len(tokens) * backend.kv_bytes_per_token() + FILE_OVERHEAD
        return self.budget.make_room(need, keep={doc_id} | self.kept, ahead=ahead, opened=opened)

    def touch(self, doc_id: int, file: CacheFile) -> None:
        """A registered cache was used: the last the budget deletes."""
        self.store.touch_kv_cache(doc_id, file.meta["key"])

    def prepare(self, backend: Backend, doc_id: int | None, tokens: Sequence[int],
                cancel: Callable[[], bool] | None = None,
                progress: Callable[[int, int], None] | None = None, ahead: bool = False,
                opened: bool = True) -> str | None:
        """Make ``backend`` hold the prefix ``tokens``; "hit" if it was in memory or on disk,
        "miss" if computed now (and then saved, for a single document on a backend that keeps
        prefix files, when the cache budget has room: else it stays in memory only and the
        document says so), None if cancelled. Backends that keep no prefix (llama.cpp) answer
        "miss": they prefill it with the question. ``progress(done, total)``: tokens computed so far."""
        if doc_id is None or not backend.capabilities.prefix_files:
            result = backend.ensure_prefix(tokens, None, cancel, progress)
            return None if result is None else result.status
        file, key, model_fp, signature = self.locate(backend, doc_id, tokens)
        if not file.exists and backend.cached_tokens(0, len(tokens)) != list(tokens):
            room = self.room(backend, doc_id, tokens, ahead, opened)
            if not room.ok:
                log.info("document %s: %s", doc_id, room.note)
                if room.too_large:      # for as long as the budget stays: the document says so
                    self.store.set_cache_note(doc_id, room.note)
                result = backend.ensure_prefix(tokens, None, cancel, progress)
                return None if result is None else result.status
        result = backend.ensure_prefix(tokens, file, cancel, progress)
        if result is None:
            return None
        if result.rejected:
            log.warning("rebuilding the KV cache of document %s: %s", doc_id, result.rejected)
        if result.save_error:   # a full disk must not fail the question
            log.warning("could not save the KV cache of document %s: %s", doc_id, result.save_error)
        if result.source in ("file", "memory") and file.exists:
            self.touch(doc_id, file)
        elif result.saved_bytes:
            for registered in self.store.add_kv_cache(doc_id, key, str(file.path), model_fp, signature["kv"],
                                                      len(tokens), result.saved_bytes):
                old = self.budget.local(registered)
                if old != file.path:
                    old.unlink(missing_ok=True)
        elif result.rejected:
            self._forget(doc_id, key, file.path)
        return result.status

    def locate(self, backend: Backend, doc_id: int, tokens: Sequence[int]) -> tuple[CacheFile, str, str, dict]:
        """(the prefix's cache file, its key, the model fingerprint, the cache settings). The
        file ``exists`` when it is registered and on disk."""
        model_fp = model_fingerprint(backend.model_path)
        signature = backend.cache_signature()
        key = cache_key(model_fp, signature, tokens)
        path = self.dir / f"doc{doc_id}-{key[:16]}.kv"
        exists = self.store.kv_cache(doc_id, key) is not None and path.exists()
        return CacheFile(path, {"key": key, "model": model_fp, **signature}, exists), key, model_fp, signature

    def registered(self, backend: Backend, doc_id: int, tokens: Sequence[int]) -> CacheFile | None:
        """The registered, existing cache file of this prefix, or None."""
        file = self.locate(backend, doc_id, tokens)[0]
        return file if file.exists else None

    def is_read(self, backend: Backend, doc_id: int, tokens: Sequence[int]) -> bool:
        """Whether the prefix ``tokens`` is ready without reading: held by the backend, or in its file."""
        held = backend.cached_tokens(0, len(tokens)) == list(tokens)
        return held or self.registered(backend, doc_id, tokens) is not None

    def forget(self, backend: Backend, doc_id: int, tokens: Sequence[int]) -> None:
        file, key, _, _ = self.locate(backend, doc_id, tokens)
        self._forget(doc_id, key, file.path)

    def _forget(self, doc_id: int, key: str, path: Path) -> None:
        self.store.remove_kv_cache(doc_id, key)
        path.unlink(missing_ok=True)
