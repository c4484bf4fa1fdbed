"""Prefilled contexts kept for ``ellm bench``: each engine's KV cache after a context's
prompt, in the bench's data directory, so that a repeated run measures decode at 16K-32K
tokens without reading the prompt again (tens of minutes on two cores for each setting).

A state is keyed by the model file's fingerprint, the engine's code (a hash of eLLM's engine
sources, or llama-cpp-python's version), its cache settings (KV format, attention, flash
attention), the context and the prompt's tokens (the salt makes the prompt): a state made by
other code is never loaded. The prefill speed is measured when a state is first made and
recorded beside it; a run that loads the state reports that record as a record (``"state"``),
which the bench shows but never divides by a figure of its own run. eLLM's blocked caches are
written by its own prefix files (``ensure_prefix``, checksummed); llama.cpp's through its state
file (``llama_state_save_file``). eLLM's contiguous f16 cache has no file: it is prefilled every time.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from app.engine.backend import CacheFile

STATES_VERSION = 1   # bump when what a state holds changes: older ones are then made again


@dataclass(frozen=True)
class Prefilled:
    """How a context's prompt got into the cache: ``source`` "made" (prefilled now and kept),
    "loaded" (from a kept state), or "prefilled" (now, nothing kept); ``prefill_tok_s`` as
    measured when it was prefilled (now, or when the loaded state was made)."""

    source: str
    prefill_tok_s: float
    seconds: float


class BenchStates:
    """The prefilled states of one data directory (``<data dir>/bench-states``)."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def _key(self, backend, context: int, tokens: Sequence[int]) -> str:
        from app.qa.doc_cache import cache_key, model_fingerprint

        signature = {**backend.cache_signature(), "engine": backend.name, "code": engine_code(backend.name),
                     "context": context, "bench_states": STATES_VERSION}
        return cache_key(model_fingerprint(backend.model_path), signature, tokens)

    def prefill(self, backend, tokens: Sequence[int], context: int, progress=None) -> Prefilled:
        """Put ``tokens`` in the backend's cache: from the kept state when there is one, else
        prefilled (timed) and kept."""
        tokens = [int(t) for t in tokens]
        key = self._key(backend, context, tokens)
        resumed_at: list[int] = []     # where the prefill started: a reading checkpoint may have part of it

        def track(done: int, total: int) -> None:
            if not resumed_at:
                resumed_at.append(done)
            if progress is not None:
                progress(done, total)

        record_path = self.root / f"{key}.json"
        record = _read_record(record_path)
        file = None
        if backend.name == "llamacpp":
            path = self.root / f"{key}.llama"
            if record and path.exists() and backend.load_state(path, tokens):
                return Prefilled("loaded", record["prefill_tok_s"], 0.0)
        else:   # eLLM's blocked cache writes (and finds) its prefix file itself; f16 dense has none
            path = self.root / f"{key}.kv"
            file = CacheFile(path, {"key": key, "bench_states": STATES_VERSION}, exists=bool(record) and path.exists())
        self.root.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        result = backend.ensure_prefix(tokens, file, progress=track)
        seconds = time.perf_counter() - t0
        if result is None:
            raise RuntimeError("the prefill was cancelled")
        if result.status == "hit":    # from its file (or still in memory)
            return Prefilled("loaded", record["prefill_tok_s"] if record else 0.0, seconds)
        rate = (len(tokens) - resumed_at[0]) / seconds   # a computed prefix reports its start first
        if backend.name == "llamacpp":
            backend.save_state(path)
        elif not backend.blocked:
            return Prefilled("prefilled", rate, seconds)
        elif result.save_error:
            raise OSError(result.save_error)
        _write_record(record_path, {"prefill_tok_s": rate, "seconds": seconds, "tokens": len(tokens) - resumed_at[0],
                                    "made": time.strftime("%Y-%m-%d %H:%M:%S"), "engine": backend.name,
                                    "code": engine_code(backend.name),
                                    "settings": backend.cache_signature()})
        return Prefilled("made", rate, seconds)


def engine_code(engine: str) -> str:
    """Which code made a state: eLLM's engine source hash (the key its compiled kernels are
    kept under), or the llama-cpp-python version (the llama.cpp it bundles)."""
    if engine == "llamacpp":
        import llama_cpp

        return f"llama-cpp-python {llama_cpp.__version__}"
    from app.engine.kernel_cache import source_key

    return f"ellm {source_key()}"


def _read_record(path: Path) -> dict | None:
    try:
        record = json.loads(path.read_text())
        return record if float(record.get("prefill_tok_s", 0)) > 0 else None
    except (OSError, ValueError, TypeError, AttributeError):
        return None


def _write_record(path: Path, record: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(path)
