"""Choosing the engine that runs a model, and its tokenizer for counting, from the header.

The rule for ``--engine auto``, decided from the file's header alone (milliseconds, before
anything loads): our engine (``ellm``) when it implements the model's architecture and every
tensor type in it (app/engine/header/support.py), otherwise ``llamacpp``, with a one-line note
that says why. Asked for ``ellm`` on a file it cannot run, the refusal comes from the header too.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from app.engine.header.support import why_not
from app.engine.model.tokenizer import why_not_tokenizer
from app.runtime.model_files import ModelError, scan_gguf

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
    reason = why_not(layout) or why_not_tokenizer(layout.metadata.get("tokenizer.ggml.model"),
                                                  layout.metadata.get("tokenizer.ggml.pre"))
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


@lru_cache(maxsize=4)
def _vocab(model_path: str):
    from app.engine.llamacpp_backend import open_llama, quiet_llama_logs

    quiet_llama_logs()
    return open_llama(model_path, vocab_only=True, verbose=False)


def tokenizer_key(model_path: Path) -> str:
    """Which tokenizer counted a document's tokens (store.token_counts): the model file's name
    and size, known without opening it. Two files with one tokenizer count twice, which is
    cheap (tokenizing a manual is small next to reading it)."""
    return f"{Path(model_path).name}:{os.path.getsize(model_path)}"


def _engine_tokenizer(model_path: Path):
    stat = os.stat(model_path)      # a file replaced in place is read again
    return _tokenizer_of(os.path.realpath(model_path), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=2)
def _tokenizer_of(path: str, size: int, mtime_ns: int):
    from app.engine.header.gguf_file import GGUFFile
    from app.engine.model.tokenizer import Tokenizer

    return Tokenizer.from_gguf(GGUFFile(path))


def token_counter(model_path: Path, engine: str = "auto"):
    """count(text) -> number of tokens of ``text`` for the tokenizer of the engine that runs this
    model with the ``engine`` setting (choose_engine): eLLM's own where eLLM's engine runs it,
    llama.cpp's vocabulary otherwise. Its ``tokenizer`` attribute says which model's
    (tokenizer_key: both engines' tokenizers give a model's text the same tokens,
    tests/engine/model/test_tokenizer.py), ``engine`` which engine's."""
    try:
        scan_gguf(model_path)  # never hand a tokenizer a truncated or corrupt file
        choice = choose_engine(engine, Path(model_path))
        if choice.name == "ellm":
            tokenizer = _engine_tokenizer(model_path)

            def count(text: str) -> int:
                return len(tokenizer.encode(text, add_bos=False, special=False))
        else:
            vocab = _vocab(str(model_path))

            def count(text: str) -> int:
                return len(vocab.tokenize(text.encode("utf-8", errors="replace"), add_bos=False, special=False))
    except ModelError:
        raise
    except Exception as e:
        raise ModelError(f"{model_path}: cannot load the tokenizer ({e})") from e
    count.tokenizer = tokenizer_key(model_path)
    count.engine = choice.name
    return count
