"""The one GGUF header reader: metadata and tensor table, checked against the file's size.

gguf.GGUFReader is slow to open a model (it builds a numpy view of every field, the
vocabulary included) and slower still to fail on a truncated file, and llama.cpp may not fail
cleanly at all; this scan reads only the header and the tensor table, in milliseconds, and says
whether a file is not GGUF, truncated or corrupt. Everything that needs a fact from a model
file's header before loading it reads it here: the engine choice (architecture, tensor types),
the memory check, the KV calculator, ``ellm models``, the bytes a decode step streams.
Format: ggml docs/gguf.md (version 2 and 3, little-endian).
"""
from __future__ import annotations

import functools
import hashlib
import math
import mmap
import os
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

GGUF_MAGIC = b"GGUF"

# llama.cpp's llama_ftype (include/llama.h), the value of general.file_type: what a person
# calls the quantization of the whole file ("Q4_K_M"), not its commonest tensor type.
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M",
    18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S",
    25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M",
    32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4",
}

_SCALAR_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                   10: "<Q", 11: "<q", 12: "<d"}  # GGUFValueType -> struct format
_STRING, _ARRAY = 8, 9
_U64 = struct.Struct("<Q")
_MAX_COUNT = 1 << 24  # more tensors or metadata fields than any model has: the header is garbage
_DEFAULT_ALIGNMENT = 32
_SMALL_ARRAY = 4096  # arrays of numbers up to this long are kept (per-layer values)
_AGAIN = "download or copy it again"


class GGUFError(ValueError):
    """A file that is not a usable GGUF file; the message names the file and the problem."""


class _Truncated(Exception):
    pass


class _Corrupt(Exception):
    pass


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str          # GGMLQuantizationType name: "Q4_K", "F32", ...
    dims: tuple[int, ...]   # GGUF order, fastest-varying first: (n_in, n_out) for a matrix
    nbytes: int
    offset: int = 0         # first byte of its data, from the start of the data section


@dataclass(frozen=True)
class GGUFLayout:
    """What a GGUF file's header promises: its metadata (scalars and strings; arrays are
    skipped), its tensors, and where its tensor data ends."""

    version: int
    metadata: dict = field(repr=False)
    tensors: tuple[TensorInfo, ...] = field(repr=False)
    data_offset: int  # first byte of the tensor data section
    data_end: int     # one past the last byte of the last tensor: a complete file is this long
    file_size: int
    arrays: dict = field(default_factory=dict, repr=False)  # key of a skipped array -> where it starts

    @property
    def n_tensors(self) -> int:
        return len(self.tensors)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, key: str, default=0):
        """``{architecture}.{key}`` when it is a number (per-layer arrays are skipped)."""
        value = self.metadata.get(f"{self.architecture}.{key}", default)
        return value if isinstance(value, (int, float)) else default

    @property
    def name(self) -> str:
        return str(self.metadata.get("general.name") or "")

    @property
    def context_length(self) -> int:
        return int(self.arch_value("context_length", 0))

    @property
    def parameters(self) -> int:
        return sum(math.prod(t.dims) for t in self.tensors)

    @property
    def tensor_types(self) -> frozenset[str]:
        return frozenset(t.type_name for t in self.tensors)

    @property
    def quantization(self) -> str:
        """The file type a person knows it by (general.file_type: "Q4_K_M"); the commonest
        matrix type where the file does not say."""
        ftype = self.metadata.get("general.file_type")
        if isinstance(ftype, int) and ftype in FILE_TYPES:
            return FILE_TYPES[ftype]
        counts = Counter(t.type_name for t in self.tensors if len(t.dims) >= 2)
        return counts.most_common(1)[0][0] if counts else "unknown"

    def weight_bytes_per_token(self) -> int:
        """Weight bytes one decode step reads: every tensor once (matrices, norms, biases), but of
        the token embedding one row — unless the output reuses it (tied embeddings): then all of it."""
        names = {t.name for t in self.tensors}
        total = 0
        for t in self.tensors:
            if t.name == "token_embd.weight":
                total += t.nbytes // int(t.dims[-1])
                if "output.weight" not in names:
                    total += t.nbytes
            else:
                total += t.nbytes
        return total


def check_gguf_header(path: str | os.PathLike) -> None:
    """Refuse what is not a GGUF file before handing it to a parser."""
    try:
        with open(path, "rb") as f:
            head = f.read(8)
    except OSError as e:
        raise GGUFError(f"{path}: cannot read the file ({e.strerror})") from e
    if len(head) < 8 or head[:4] != GGUF_MAGIC:
        raise GGUFError(f"{path}: not a GGUF model file (the first bytes are not 'GGUF')")


def scan_gguf(path: str | os.PathLike) -> GGUFLayout:
    """The header and tensor table of a GGUF file, checked against the file's size (cached by
    path, size and modification time). Raises GGUFError saying whether the file is not GGUF,
    truncated or corrupt."""
    st = os.stat(path)
    return _scan(os.path.realpath(path), st.st_size, st.st_mtime_ns, str(path))


@functools.lru_cache(maxsize=16)
def _scan(real: str, size: int, mtime_ns: int, shown: str) -> GGUFLayout:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(shown)
    check_gguf_header(real)
    try:
        with open(real, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(buf)
            c.take("<I")  # magic, checked above
            version = c.take("<I")
            if version < 2:
                raise _Corrupt(f"GGUF version {version}, too old: convert it again with a current llama.cpp")
            n_tensors, n_kv = c.take("<Q"), c.take("<Q")
            if n_tensors > _MAX_COUNT or n_kv > _MAX_COUNT:
                raise _Corrupt(f"the header claims {n_tensors} tensors and {n_kv} metadata fields")
            metadata, arrays = {}, {}
            for _ in range(n_kv):
                key = c.string()
                kind = c.take("<I")
                start = c.pos
                metadata[key] = c.value(kind)
                if kind == _ARRAY and metadata[key] is None:
                    arrays[key] = start
            tensors, extents = [], []
            for _ in range(n_tensors):
                name = c.string()
                n_dims = c.take("<I")
                if n_dims > 8:
                    raise _Corrupt(f"tensor {name} has {n_dims} dimensions")
                dims = tuple(c.take("<Q") for _ in range(n_dims))
                kind, offset = c.take("<I"), c.take("<Q")
                try:
                    qtype = GGMLQuantizationType(kind)
                    block, block_bytes = GGML_QUANT_SIZES[qtype]
                except (ValueError, KeyError):
                    raise _Corrupt(f"tensor {name} has unknown type {kind}") from None
                elements = math.prod(dims)
                if elements % block:
                    raise _Corrupt(f"tensor {name} has {elements} values, not a whole number of blocks")
                nbytes = elements // block * block_bytes
                tensors.append(TensorInfo(name, qtype.name, dims, nbytes, offset))
                extents.append(offset + nbytes)
            alignment = metadata.get("general.alignment", _DEFAULT_ALIGNMENT)
            if not isinstance(alignment, int) or alignment <= 0:
                raise _Corrupt(f"general.alignment is {alignment!r}")
            data_offset = -(-c.pos // alignment) * alignment
    except _Truncated:
        raise GGUFError(f"{path}: the GGUF file is truncated or corrupt: its header runs past the end of the "
                        f"file ({size} bytes); {_AGAIN}") from None
    except _Corrupt as e:
        raise GGUFError(f"{path}: the GGUF file is truncated or corrupt ({e}); {_AGAIN}") from None
    except RecursionError:  # arrays of arrays of arrays...: no model nests metadata like that
        raise GGUFError(f"{path}: the GGUF file is truncated or corrupt (its metadata nests too deep); "
                        f"{_AGAIN}") from None
    except (OSError, ValueError) as e:
        raise GGUFError(f"{path}: cannot read the file ({e})") from e
    data_end = data_offset + max(extents, default=0)
    if size < data_end:
        raise GGUFError(f"{path}: the GGUF file is truncated or corrupt: its tensors need {data_end} bytes but "
                        f"the file has {size} ({100 * size / data_end:.0f}%); {_AGAIN}")
    return GGUFLayout(version, metadata, tuple(tensors), data_offset, data_end, size, arrays)


# ---- Opening a model file: metadata, long arrays on demand, tensors as views -----------------

class GGUFFile:
    """A GGUF file opened for loading: the scan's metadata, the long arrays (vocabulary, merges)
    read only when asked for, and every tensor as a numpy view of the memory-mapped file
    (``.tensors``: name, tensor_type, shape, data as gguf.GGUFReader gives them). It replaces
    gguf.GGUFReader on the load path, which parses every field up front, a numpy view per
    token of a vocabulary (151,646 for Qwen2.5-1.5B), where this reads them only when asked."""

    def __init__(self, path: str | os.PathLike):
        self.path = str(path)
        self.layout = scan_gguf(path)
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.tensors = [self._view(t) for t in self.layout.tensors]

    def _view(self, t: TensorInfo) -> "TensorView":
        from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

        qtype = GGMLQuantizationType[t.type_name]
        start = self.layout.data_offset + t.offset
        raw = self._map[start:start + t.nbytes]
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        rows = math.prod(t.dims[1:])
        if block == 1:           # F32, F16, BF16, ...: elements of their own dtype
            dtype = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}.get(t.type_name, np.uint8)
            data = raw.view(dtype).reshape(tuple(reversed(t.dims))) if dtype is not np.uint8 else raw
        else:                    # blocks: one byte row per output row, as GGUFReader
            data = raw.reshape(rows, t.dims[0] // block * block_bytes)
        return TensorView(t.name, qtype, np.array(t.dims, dtype=np.uint64), data)

    def value(self, key: str, default=None):
        """A metadata value (numbers, strings, lists) or ``default`` when the key is absent."""
        if key in self.layout.arrays:
            return self.array(key)
        if key not in self.layout.metadata:
            return default
        value = self.layout.metadata[key]
        return list(value) if isinstance(value, tuple) else value

    def array(self, key: str) -> list | None:
        """A metadata array, read from the file now: strings decoded as UTF-8 (bytes that are not
        are kept as surrogate escapes, as a vocabulary's byte tokens need)."""
        if key not in self.layout.arrays:
            value = self.value(key)
            return value if isinstance(value, list) else None
        with open(self.path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            c = _Cursor(buf)
            c.pos = self.layout.arrays[key]
            item, count = c.take("<I"), c.take("<Q")
            if item in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item]
                return list(struct.unpack_from(f"<{count}{fmt[1]}", buf, c.pos))
            if item != _STRING:
                raise GGUFError(f"{self.path}: metadata {key} is an array of arrays, which no model has")
            out, pos, unpack = [], c.pos, _U64.unpack_from
            for _ in range(count):
                n = unpack(buf, pos)[0]
                out.append(buf[pos + 8:pos + 8 + n].decode("utf-8", "surrogateescape"))
                pos += 8 + n
            return out


@dataclass(frozen=True)
class TensorView:
    name: str
    tensor_type: object      # gguf.GGMLQuantizationType
    shape: np.ndarray        # (n_dims,) uint64, GGUF order (fastest first)
    data: np.ndarray         # a view of the file: (rows, bytes per row) uint8 for block types


def field_value(reader, key: str, default=None):
    """``key``'s value from a GGUFFile or a gguf.GGUFReader (tests open files with the latter)."""
    if isinstance(reader, GGUFFile):
        return reader.value(key, default)
    f = reader.get_field(key)
    return default if f is None else f.contents()


def field_array(reader, key: str) -> list | None:
    """An array field from a GGUFFile or a gguf.GGUFReader, strings decoded with surrogate
    escapes; None when absent."""
    if isinstance(reader, GGUFFile):
        return reader.array(key)
    import gguf

    f = reader.fields.get(key)
    if f is None:
        return None
    if f.types[-1] == gguf.GGUFValueType.STRING:
        return [bytes(f.parts[i]).decode("utf-8", "surrogateescape") for i in f.data]
    return [f.parts[i][0].item() for i in f.data]


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
        """A metadata value; arrays of strings and long arrays are skipped (None): the vocabulary
        alone is 50k strings. Short arrays of numbers (per-layer values) come back as tuples."""
        if kind in _SCALAR_FORMATS:
            return self.take(_SCALAR_FORMATS[kind])
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item, count = self.take("<I"), self.take("<Q")
            if item in _SCALAR_FORMATS:
                fmt = _SCALAR_FORMATS[item]
                size = struct.calcsize(fmt)
                self.need(count * size)
                start, self.pos = self.pos, self.pos + count * size
                if count <= _SMALL_ARRAY:   # per-layer values (head counts, window pattern)
                    return struct.unpack_from(f"<{count}{fmt[1]}", self.buf, start)
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


# ---- a model file's identity

_FINGERPRINT_BYTES = 4 << 20


@functools.lru_cache(maxsize=8)
def _fingerprint(path: str, size: int, mtime_ns: int) -> str:
    h = hashlib.sha256(f"{size}".encode())
    with open(path, "rb") as f:
        h.update(f.read(_FINGERPRINT_BYTES))          # header, metadata, first tensors
        f.seek(max(0, size - _FINGERPRINT_BYTES))
        h.update(f.read(_FINGERPRINT_BYTES))          # last tensors
    return h.hexdigest()[:32]


def model_fingerprint(path: str | os.PathLike) -> str:
    """A hash of the model file's size and its first and last 4 MiB (cached by mtime):
    enough to tell models apart without reading gigabytes at every question or start. Keys
    what is kept per model: KV caches (app/qa/doc_cache.py), repacked weights
    (quant/planes_file.py)."""
    st = os.stat(path)
    return _fingerprint(os.path.realpath(path), st.st_size, st.st_mtime_ns)
