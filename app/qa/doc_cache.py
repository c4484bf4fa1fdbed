"""Persisted document KV caches: compute a document's prefix once, reuse it for every question.

A prefix (system prompt + the document's pages, as ask.py lays them out) is question-
independent. The engine computes its KV cache once; this service stores it as a file
(app/engine/kv/files.py) under the data directory, registers it in the store (``kv_caches``)
and hands it back on the next question, memory-mapped. The file's key hashes the model,
the cache settings and the exact prefix tokens, so a changed document, model or KV setting
simply finds no file and computes a new one (the older file of that document is deleted).
A file that fails its checks is deleted and rebuilt, never used.
"""
from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from app.store import Store

log = logging.getLogger(__name__)

KV_SUBDIR = "kv"
_FINGERPRINT_BYTES = 4 << 20


@functools.lru_cache(maxsize=8)
def _fingerprint(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(f"{size}".encode())
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))          # header, metadata, first tensors
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        h.update(f.read(_FINGERPRINT_BYTES))          # last tensors
    return h.hexdigest()[:32]


def model_fingerprint(path: str | os.PathLike) -> str:
    """A hash of the model file's size and its first and last 4 MiB (cached by mtime):
    enough to tell models apart without reading gigabytes at every question."""
    st = os.stat(path)
    return _fingerprint(os.path.realpath(path), st.st_size, st.st_mtime_ns)


def cache_key(model_fp: str, signature: dict, tokens: Sequence[int]) -> str:
    h = hashlib.sha256(json.dumps({"model": model_fp, "settings": signature}, sort_keys=True).encode())
    h.update(np.asarray(tokens, dtype=np.int32).tobytes())
    return h.hexdigest()[:32]


def store_cache_dir(store: Store) -> Path:
    """The data directory's cache folder (config.Paths.cache_dir) next to the store's file."""
    return Path(store.path).parent / "cache"


class DocCaches:
    """The KV cache files of one data directory."""

    def __init__(self, store: Store, cache_dir: Path):
        self.store = store
        self.dir = Path(cache_dir) / KV_SUBDIR

    def prepare(self, backend, doc_id: int | None, tokens: Sequence[int],
                cancel: Callable[[], bool] | None = None) -> str | None:
        """Make ``backend`` hold the prefix ``tokens``; "hit" if it was in memory or on disk,
        "miss" if computed now (and then saved, for a single document), None if cancelled.
        Backends without prefix support (llama.cpp) return "miss": they prefill it all."""
        if not hasattr(backend, "ensure_prefix"):
            return "miss"
        if doc_id is None or not backend.blocked:
            return backend.ensure_prefix(tokens, cancel=cancel)
        from app.engine.kv.files import KVFileError, load, save

        path, meta, key, model_fp, signature = self.locate(backend, doc_id, tokens)
        row = self.store.kv_cache(doc_id, key)

        def load_file(cache) -> bool:
            if row is None or not path.exists():
                return False
            try:
                load(cache, path, meta)
            except KVFileError as e:
                log.warning("rebuilding the KV cache of document %s: %s", doc_id, e)
                self._forget(doc_id, key, path)
                return False
            if cache.tokens != list(tokens):
                log.warning("rebuilding the KV cache of document %s: %s holds other tokens", doc_id, path)
                cache.clear()
                self._forget(doc_id, key, path)
                return False
            self.store.touch_kv_cache(doc_id, key)
            return True

        def save_file(cache) -> None:
            try:
                nbytes = save(cache, path, meta)
            except OSError as e:   # a full disk must not fail the question
                log.warning("could not save the KV cache of document %s to %s: %s", doc_id, path, e)
                return
            for old in self.store.add_kv_cache(doc_id, key, str(path), model_fp, signature["kv"],
                                               len(tokens), nbytes):
                if old != str(path):
                    Path(old).unlink(missing_ok=True)

        return backend.ensure_prefix(tokens, load_file, save_file, cancel)

    def locate(self, backend, doc_id: int, tokens: Sequence[int]) -> tuple[Path, dict, str, str, dict]:
        """(file path, header meta, key, model fingerprint, settings) of a prefix's cache."""
        model_fp = model_fingerprint(backend.model_path)
        signature = backend.cache_signature()
        key = cache_key(model_fp, signature, tokens)
        meta = {"key": key, "model": model_fp, **signature}
        return self.dir / f"doc{doc_id}-{key[:16]}.kv", meta, key, model_fp, signature

    def registered(self, backend, doc_id: int, tokens: Sequence[int]) -> tuple[Path, dict] | None:
        """The file and meta of a registered, existing cache of this prefix, or None."""
        path, meta, key, _, _ = self.locate(backend, doc_id, tokens)
        if self.store.kv_cache(doc_id, key) is None or not path.exists():
            return None
        return path, meta

    def forget(self, backend, doc_id: int, tokens: Sequence[int]) -> None:
        path, _, key, _, _ = self.locate(backend, doc_id, tokens)
        self._forget(doc_id, key, path)

    def _forget(self, doc_id: int, key: str, path: Path) -> None:
        self.store.remove_kv_cache(doc_id, key)
        path.unlink(missing_ok=True)
