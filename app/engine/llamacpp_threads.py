"""llama.cpp's threads pinned one per CPU, as the engine pins its own (cpu/pinning.py).

Without this, llama.cpp computes every graph on a pool of threads it creates for that graph
and lets the OS place them, while our engine runs pinned: a comparison of the two would mix
the engines with their placement. llama.cpp's own way to pin is a ggml threadpool with a
strict CPU mask (``llama-cli --cpu-mask M --cpu-strict 1``), attached to the context with
``llama_attach_threadpool``. llama-cpp-python 0.3.36 binds neither the threadpool functions nor
``llama_attach_threadpool``, so they are declared here with ctypes from the headers that ship
with it (``include/ggml.h``, ``ggml-cpu.h``, ``llama.h``).

With a strict mask ggml pins worker ``j`` to the ``j``-th CPU of the mask and the thread that
calls ``llama_decode`` (worker 0) to the first; that thread keeps its pin after the pool is
freed, so ``PinnedPool.close`` gives the threads that computed the CPUs the process started with back.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import Sequence

from .cpu.topology import STARTUP_CPUS

GGML_MAX_N_THREADS = 512   # ggml.h


class ThreadpoolParams(ctypes.Structure):
    """ggml.h ``struct ggml_threadpool_params``."""

    _fields_ = [("cpumask", ctypes.c_bool * GGML_MAX_N_THREADS),
                ("n_threads", ctypes.c_int),
                ("prio", ctypes.c_int),          # enum ggml_sched_priority
                ("poll", ctypes.c_uint32),       # 0: sleep between graphs, 100: spin
                ("strict_cpu", ctypes.c_bool),
                ("paused", ctypes.c_bool)]


_libs: tuple | None = None


def _bind():
    """(libggml-base, libggml-cpu, libllama) with the functions used here declared; the libraries
    are the ones llama_cpp already loaded (dlopen of the same path returns the same handle)."""
    global _libs
    if _libs is None:
        import llama_cpp

        folder = Path(llama_cpp.__file__).parent / "lib"
        base = ctypes.CDLL(str(folder / "libggml-base.so"))
        cpu = ctypes.CDLL(str(folder / "libggml-cpu.so"))
        llama = llama_cpp.llama_cpp._lib
        base.ggml_threadpool_params_default.argtypes = [ctypes.c_int]
        base.ggml_threadpool_params_default.restype = ThreadpoolParams
        cpu.ggml_threadpool_new.argtypes = [ctypes.POINTER(ThreadpoolParams)]
        cpu.ggml_threadpool_new.restype = ctypes.c_void_p
        cpu.ggml_threadpool_free.argtypes = [ctypes.c_void_p]
        cpu.ggml_threadpool_free.restype = None
        llama.llama_attach_threadpool.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        llama.llama_attach_threadpool.restype = None
        llama.llama_detach_threadpool.argtypes = [ctypes.c_void_p]
        llama.llama_detach_threadpool.restype = None
        _libs = (base, cpu, llama)
    return _libs


class PinnedPool:
    """A ggml threadpool of one thread per CPU in ``cpus`` (in that order), attached to a
    llama.cpp context for both its single-token and its batch graphs."""

    def __init__(self, ctx, cpus: Sequence[int]):
        cpus = [int(c) for c in cpus]
        if not cpus or min(cpus) < 0 or max(cpus) >= GGML_MAX_N_THREADS:
            raise ValueError(f"llama.cpp can pin to CPUs 0-{GGML_MAX_N_THREADS - 1}, not {cpus}")
        base, cpu, llama = _bind()
        params = base.ggml_threadpool_params_default(len(cpus))
        for c in cpus:
            params.cpumask[c] = True
        params.strict_cpu = True
        pool = cpu.ggml_threadpool_new(ctypes.byref(params))
        if not pool:
            raise RuntimeError(f"llama.cpp could not start a threadpool on CPUs {cpus}")
        llama.llama_attach_threadpool(ctx, pool, pool)
        self._ctx, self._pool, self.cpus = ctx, pool, tuple(cpus)
        self._callers: set[int] = set()     # native ids of threads that ran graphs (ggml pinned them)

    def note_caller(self) -> None:
        """Remember the calling thread: a graph it computes pins it to ``cpus[0]``."""
        self._callers.add(threading.get_native_id())

    def close(self) -> None:
        """Detach and free the pool (before the context is freed); the callers get the
        process's startup CPUs back."""
        if self._pool is None:
            return
        _, cpu, llama = _bind()
        llama.llama_detach_threadpool(self._ctx)
        cpu.ggml_threadpool_free(self._pool)
        self._pool = None
        for tid in self._callers:
            try:
                os.sched_setaffinity(tid, STARTUP_CPUS)
            except (ProcessLookupError, PermissionError, OSError):
                pass     # the thread ended meanwhile
