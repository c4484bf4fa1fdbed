"""Choosing and opening an inference backend, shared by the CLI and the GUI.

The rule for ``--engine auto``: our engine (``ellm``) when it is installed and
implements the model's architecture (llama, qwen2); otherwise ``llamacpp``.
"""
from __future__ import annotations

import importlib.util
import os
import threading
from functools import lru_cache
from pathlib import Path

from app.models import ModelError, check_gguf_header, scan_gguf, validate_model

ELLM_ARCHITECTURES = ("llama", "qwen2")


class EngineUnavailable(RuntimeError):
    pass


def ellm_available() -> bool:
    return importlib.util.find_spec("app.engine.ellm_backend") is not None


def choose_engine(engine: str, model_path: Path) -> str:
    if engine in ("ellm", "llamacpp"):
        return engine
    if engine != "auto":
        raise ValueError(f"unknown engine {engine!r}; choose auto, ellm or llamacpp")
    if ellm_available() and scan_gguf(model_path).architecture in ELLM_ARCHITECTURES:
        return "ellm"
    return "llamacpp"


def default_threads() -> int:
    """One thread per physical core (SMT siblings would share its load/store units)."""
    try:
        cores = set()
        base = "/sys/devices/system/cpu"
        for cpu in os.sched_getaffinity(0):
            with open(f"{base}/cpu{cpu}/topology/core_id") as f:
                core = f.read().strip()
            with open(f"{base}/cpu{cpu}/topology/physical_package_id") as f:
                pkg = f.read().strip()
            cores.add((pkg, core))
        return max(1, len(cores))
    except OSError:
        return max(1, len(os.sched_getaffinity(0)))


_open_lock = threading.Lock()
_cache: dict[tuple, object] = {}


def open_backend(engine: str, model_path: Path, n_ctx: int, threads: int = 0):
    """A loaded backend; one instance per (engine, model, context, threads) in a
    process, because loading costs seconds and the GUI asks many questions.

    Before anything loads the file it is checked (app.models.validate_model): a
    file that is not GGUF, is truncated or corrupt, or needs more memory than is
    free is refused with a ModelError that says so, with the numbers."""
    check_gguf_header(model_path)
    chosen = choose_engine(engine, model_path)
    threads = threads or default_threads()
    key = (chosen, str(model_path), n_ctx, threads)
    with _open_lock:
        if key in _cache:
            return _cache[key]
        # The model loaded now is unloaded before the new one loads: its memory counts as free.
        reclaimable = sum(_file_size(k[1]) for k in _cache)
        validate_model(model_path, n_ctx, reclaimable=reclaimable)
        if chosen == "llamacpp":
            from app.engine.llamacpp_backend import LlamaCppBackend

            backend = LlamaCppBackend(str(model_path), n_ctx=n_ctx, n_threads=threads)
        else:
            if not ellm_available():
                raise EngineUnavailable(
                    "the eLLM engine is not available in this build yet; use --engine llamacpp")
            from app.engine.ellm_backend import EllmBackend

            backend = EllmBackend(str(model_path), n_ctx=n_ctx, n_threads=threads)
        _cache.clear()  # keep one model in memory at a time
        _cache[key] = backend
        return backend


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@lru_cache(maxsize=4)
def _vocab(model_path: str):
    import llama_cpp

    from app.engine.llamacpp_backend import quiet_llama_logs

    quiet_llama_logs()
    return llama_cpp.Llama(model_path=model_path, vocab_only=True, verbose=False)


def token_counter(model_path: Path):
    """count(text) -> number of tokens of ``text`` for this model's tokenizer."""
    try:
        scan_gguf(model_path)  # never hand llama.cpp a truncated or corrupt file
        vocab = _vocab(str(model_path))
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{model_path}: cannot load the tokenizer ({e})") from e

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=False))

    return count
