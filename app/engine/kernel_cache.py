"""Where numba keeps the engine's compiled kernels: a folder per version of the engine's sources.

Why: numba checks a cached kernel against the file that defines it, not against the functions it
inlined from other files. The engine's kernels inline their lanes, exp and reductions from ops/
and attention/ggml_lanes.py, so after an upgrade that changed only those, a kernel from the old
cache would keep the old numerics without a word (SwiGLU, for one, would keep the old exp after
ops/expf.py changed, until its cache was deleted). Keying the folder on a hash of every source file
of the engine makes any change start a fresh cache.

The folder is ``$NUMBA_CACHE_DIR/<key>`` where a person set NUMBA_CACHE_DIR, else
``$XDG_CACHE_HOME/ellm/kernels/<key>`` (``~/.cache/ellm/kernels/<key>``). Set once, when the
engine package is imported, before any kernel module is.
"""
from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

ENGINE_ROOT = Path(__file__).resolve().parent
BASE_VARIABLE = "ELLM_KERNEL_CACHE_BASE"   # the base, handed to child processes (which inherit NUMBA_CACHE_DIR set to the keyed folder)


def source_key(root: Path = ENGINE_ROOT) -> str:
    """16 hex digits of a hash over every .py file under ``root`` (path and bytes): a few ms."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode())
        h.update(b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def cache_base() -> Path:
    """The folder the keyed folders go in: the one this process's parent chose, else the person's
    NUMBA_CACHE_DIR, else the user's cache folder."""
    chosen = os.environ.get(BASE_VARIABLE) or os.environ.get("NUMBA_CACHE_DIR")
    if chosen:
        return Path(chosen)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ellm" / "kernels"


def cache_dir(key: str | None = None) -> Path:
    return cache_base() / (key or source_key())


def use_keyed_cache() -> Path:
    """Point numba's cache at ``cache_dir()`` (through the environment for a numba not yet
    imported, and its config where it already is); the folder chosen."""
    base = cache_base()
    folder = base / source_key()
    os.environ[BASE_VARIABLE] = str(base)
    os.environ["NUMBA_CACHE_DIR"] = str(folder)
    config = sys.modules.get("numba.core.config")
    if config is not None:
        config.CACHE_DIR = str(folder)
    return folder
