"""Loaded backends, built from run plans (runtime/plan.py) and keyed by them.

Loading a model costs seconds and the window asks many questions, so whoever holds a
``Backends`` (a Session) keeps what it loaded: a plan with the same key gets the same backend,
its blocked cache grown to the plan's context. One model stays in memory at a time: the one
loaded is let go before another loads, and its memory counts as free for the check.
"""
from __future__ import annotations

import os
import threading

from app.runtime.model_files import validate_model
from app.runtime.plan import RunPlan


class Backends:
    """The backends one session has loaded (at most one model at a time)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._held: dict[tuple, object] = {}

    def get(self, plan: RunPlan):
        """The backend for ``plan``: the one held under its key, or loaded now (checked first:
        model_files.validate_model refuses a file that is not GGUF, is truncated or corrupt, or
        needs more memory than is free, with the numbers)."""
        key = plan.key()
        with self._lock:
            backend = self._held.get(key)
            if backend is not None:
                if plan.grows:
                    backend.reserve(plan.n_ctx)
                return backend
            reclaimable = sum(_file_size(k[1]) for k in self._held)
            validate_model(plan.model, plan.n_ctx, reclaimable=reclaimable)
            # let the loaded model go before the next one loads (its memory counted as free above):
            # if loading fails, the next question loads its model again
            self._held.clear()
            backend = self._held[key] = load(plan)
            return backend

    def clear(self) -> None:
        """Let every loaded backend go (the next question loads its model again)."""
        with self._lock:
            self._held.clear()


def load(plan: RunPlan):
    """A new backend built from ``plan``, with no checks and nothing kept."""
    if plan.engine == "llamacpp":
        from app.engine.cpu.plan import ThreadPlan, llamacpp_kwargs
        from app.engine.llamacpp_backend import LlamaCppBackend

        # llama.cpp runs its own threads: the plan maps onto n_threads and its numa option. Its
        # attention is always dense; the KV format maps onto its cache types.
        threads = (llamacpp_kwargs(plan.threads) if isinstance(plan.threads, ThreadPlan)
                   else {"n_threads": plan.thread_count or None})
        return LlamaCppBackend(plan.model, n_ctx=plan.n_ctx, kv=plan.kv, **threads)
    from app.engine.ellm_backend import EllmBackend

    return EllmBackend(plan.model, n_ctx=plan.n_ctx, n_threads=plan.threads, numa=plan.numa, kv=plan.kv,
                       attention=plan.attention, planes_dir=plan.planes_dir, documents=plan.documents)


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0
