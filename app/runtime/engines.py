"""Choosing and opening an inference backend, shared by the CLI and the GUI.

The rule for ``--engine auto``, decided from the file's header alone (milliseconds, before
anything loads): our engine (``ellm``) when it implements the model's architecture and every
tensor type in it (app/engine/model/support.py), otherwise ``llamacpp``, with a one-line note
that says why. Asked for ``ellm`` on a file it cannot run, the refusal comes from the header too.
"""
from __future__ import annotations

import os
import threading
from functools import lru_cache
from pathlib import Path

from dataclasses import dataclass, field

from app.engine.attention.config import SparseConfig
from app.engine.kv.formats import KV_NAMES
from app.engine.model.support import blocked_cache, why_not
from app.runtime.model_files import ModelError, check_gguf_header, scan_gguf, validate_model

ENGINES = ("auto", "ellm", "llamacpp")   # the engine setting: auto, or a backend's name


@dataclass(frozen=True)
class EngineChoice:
    name: str        # "ellm" | "llamacpp"
    note: str = ""   # why auto chose llama.cpp ("" when nothing needs saying)
    architecture: str = ""   # general.architecture, when the header was read ("" for llamacpp asked by name)
    context_length: int = field(default=0, compare=False)   # the trained context, when the header was read


def choose_engine(engine: str, model_path: Path) -> EngineChoice:
    """The backend for ``engine`` (a setting) and ``model_path``, from the header alone."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose auto, ellm or llamacpp")
    if engine == "llamacpp":
        return EngineChoice("llamacpp")
    layout = scan_gguf(model_path)
    reason = why_not(layout)
    if not reason:
        return EngineChoice("ellm", architecture=layout.architecture, context_length=layout.context_length or 0)
    if engine == "ellm":
        raise ModelError(f"{model_path}: eLLM's engine cannot run this model: {reason}; "
                         f"choose the llama.cpp engine (--engine llamacpp) or the automatic choice")
    return EngineChoice("llamacpp", f"{Path(model_path).name} runs on llama.cpp, because eLLM's engine: {reason}",
                        layout.architecture)


def thread_plan(threads: int = 0, numa: str = "distribute"):
    """The thread plan of app/engine/cpu/plan.py for this machine: one thread per
    physical core by default, never two on SMT siblings."""
    from app.engine.cpu.plan import plan_threads
    from app.engine.cpu.topology import read_topology

    return plan_threads(read_topology(), threads=threads, numa_policy=numa)


def default_threads() -> int:
    return thread_plan().count


_open_lock = threading.Lock()
_cache: dict[tuple, object] = {}


def open_backend(engine: str, model_path: Path, n_ctx: int, threads: int = 0, numa: str = "distribute",
                 kv: str = "f16", attention: str = "dense", planes_dir: Path | None = None,
                 documents: bool = False):
    """A loaded backend; one instance per (engine, model, context, threads) in a
    process, because loading costs seconds and the GUI asks many questions. ``planes_dir``:
    where eLLM's engine keeps the model's repacked weights between starts; ``documents``: the
    backend answers about documents (eLLM's engine then keeps its cache in blocks, persisted:
    model/support.py ``blocked_cache``).

    Before anything loads the file it is checked (model_files.validate_model): a
    file that is not GGUF, is truncated or corrupt, or needs more memory than is
    free is refused with a ModelError that says so, with the numbers."""
    check_gguf_header(model_path)
    choice = choose_engine(engine, model_path)
    chosen = choice.name
    plan = thread_plan(threads, numa)
    threads = plan.count
    if kv not in KV_NAMES:
        raise ValueError(f"unknown KV setting {kv!r}: use one of {', '.join(KV_NAMES)}")
    # eLLM's blocked cache grows in place (EllmBackend.reserve), so one loaded model serves
    # every context of its settings; llama.cpp's and the dense f16 cache are sized at load.
    grows = chosen == "ellm" and blocked_cache(choice.architecture, kv, attention, documents)
    # ... as long as attention reads them alike: "sparse-decode" reads documents one way inside the
    # trained context and another beyond it (SparseConfig.for_context), so it is keyed by that reading.
    key = (chosen, str(model_path), None if grows else n_ctx, threads, numa) + (
        (kv, _reading(attention, n_ctx, choice.context_length), grows) if chosen == "ellm" else (kv,))
    with _open_lock:
        if key in _cache:
            backend = _cache[key]
            if grows:
                backend.reserve(n_ctx)
            return backend
        # The model loaded now is unloaded before the new one loads: its memory counts as free.
        reclaimable = sum(_file_size(k[1]) for k in _cache)
        validate_model(model_path, n_ctx, reclaimable=reclaimable)
        if chosen == "llamacpp":
            from app.engine.llamacpp_backend import LlamaCppBackend
            from app.engine.cpu.plan import llamacpp_kwargs

            # llama.cpp runs its own threads: the plan maps onto n_threads and its numa option.
            # Its attention is always dense; the KV setting maps onto its cache types.
            backend = LlamaCppBackend(str(model_path), n_ctx=n_ctx, kv=kv, **llamacpp_kwargs(plan))
        else:
            from app.engine.ellm_backend import EllmBackend

            backend = EllmBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, numa=numa, kv=kv,
                                  attention=attention, planes_dir=planes_dir, documents=documents)
        _cache.clear()  # keep one model in memory at a time
        _cache[key] = backend
        return backend


def _reading(attention: str, n_ctx: int, trained: int):
    """The SparseConfig eLLM's engine reads a context of ``n_ctx`` tokens with in ``attention``
    (hashable: a loaded backend's key)."""
    return SparseConfig(mode=attention).for_context(n_ctx, trained or n_ctx)


def engine_note(engine: str, model_path: Path) -> str:
    """The one-line note of the automatic choice for this model ("" when there is none)."""
    try:
        return choose_engine(engine, model_path).note
    except (ModelError, ValueError):
        return ""


def _file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


@lru_cache(maxsize=4)
def _vocab(model_path: str):
    from app.engine.llamacpp_backend import open_llama, quiet_llama_logs

    quiet_llama_logs()
    return open_llama(model_path, vocab_only=True, verbose=False)


def tokenizer_key(model_path: Path) -> str:
    """Which tokenizer counted a document's tokens (store.token_counts): the model file's name
    and size, known without opening it. Two files with one tokenizer count twice, cheaply
    (0.1 s for a 31K-token manual)."""
    return f"{Path(model_path).name}:{os.path.getsize(model_path)}"


def token_counter(model_path: Path):
    """count(text) -> number of tokens of ``text`` for this model's tokenizer; its
    ``tokenizer`` attribute says which (tokenizer_key)."""
    try:
        scan_gguf(model_path)  # never hand llama.cpp a truncated or corrupt file
        vocab = _vocab(str(model_path))
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{model_path}: cannot load the tokenizer ({e})") from e

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=False))

    count.tokenizer = tokenizer_key(model_path)
    return count
