"""KV cache sizes: bytes per token, the largest context that fits, the context to recommend.

Bytes per token (DESIGN.md, "KV cache"):
    layers x kv_heads x (key_length x bytes_k + value_length x bytes_v)
which is ``2 x layers x kv_heads x head_dim x bytes_per_element`` for llama.cpp's f16 cache.
The quantized settings add their scales and bounds as app/engine/kv/formats.py lays them out.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import numpy as np

from .formats import KV_NAMES, KVSpec, dense_f16_bytes_per_token

KV_SETTINGS = KV_NAMES          # the setting names, smallest error first

MIN_CONTEXT = 1024
CONTEXT_MULTIPLE = 256
HEADROOM = 1.20                 # recommended = 95th percentile of document tokens + 20%
SAFETY_MARGIN_BYTES = 1 << 30   # left free for the OS, the app and activations
SAFETY_MARGIN_FRACTION = 0.10   # ... or a tenth of free memory, whichever is larger


@dataclass(frozen=True)
class KVShape:
    """What the KV cache size depends on, from GGUF metadata."""

    n_layers: int
    n_kv_heads: int
    key_length: int        # head_dim of K
    value_length: int      # head_dim of V
    context_length: int    # trained context (n_ctx_train)

    @classmethod
    def from_gguf(cls, path: str | os.PathLike) -> "KVShape":
        st = os.stat(path)
        return _shape_from_gguf(os.path.realpath(path), st.st_size, st.st_mtime_ns)


# GGUF value types (gguf-py constants.GGUFValueType) -> struct format of a scalar.
_GGUF_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
                 10: "<Q", 11: "<q", 12: "<d"}
_GGUF_STRING, _GGUF_ARRAY = 8, 9


def read_gguf_scalars(path: str | os.PathLike) -> dict:
    """The scalar and string metadata of a GGUF file (arrays are skipped, not read).

    gguf.GGUFReader builds numpy views of every metadata array, the whole vocabulary
    included, which takes seconds on a small machine; the KV calculator needs five integers.
    Layout: GGUF spec (ggml docs/gguf.md), little-endian, version 2 and 3.
    """
    import struct

    def unpack(f, fmt):
        size = struct.calcsize(fmt)
        data = f.read(size)
        if len(data) != size:
            raise ValueError(f"{path}: the GGUF metadata ends early")
        return struct.unpack(fmt, data)[0]

    def string(f):
        return f.read(unpack(f, "<Q")).decode("utf-8", errors="replace")

    out: dict = {}
    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF model file (the first bytes are not 'GGUF')")
        version = unpack(f, "<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version} is not supported (2 and 3 are)")
        unpack(f, "<Q")                      # tensor count
        for _ in range(unpack(f, "<Q")):     # metadata key/value count
            key = string(f)
            vtype = unpack(f, "<I")
            if vtype in _GGUF_SCALARS:
                out[key] = unpack(f, _GGUF_SCALARS[vtype])
            elif vtype == _GGUF_STRING:
                out[key] = string(f)
            elif vtype == _GGUF_ARRAY:
                etype, count = unpack(f, "<I"), unpack(f, "<Q")
                if etype in _GGUF_SCALARS:
                    f.seek(count * struct.calcsize(_GGUF_SCALARS[etype]), 1)
                elif etype == _GGUF_STRING:
                    for _ in range(count):
                        f.seek(unpack(f, "<Q"), 1)
                else:
                    raise ValueError(f"{path}: nested GGUF arrays in {key} are not supported")
            else:
                raise ValueError(f"{path}: unknown GGUF value type {vtype} for {key}")
    return out


@functools.lru_cache(maxsize=16)
def _shape_from_gguf(path: str, size: int, mtime_ns: int) -> KVShape:
    """Cached on (path, size, mtime): the panel asks again on every thread change."""
    meta = read_gguf_scalars(path)
    arch = meta.get("general.architecture")
    if arch is None:
        raise ValueError(f"{path}: no general.architecture in the GGUF metadata")
    n_heads = meta.get(f"{arch}.attention.head_count")
    # head_count_kv may be a per-layer array in some hybrids (skipped above): then it is absent
    # here, and the largest count is what matters; read it the slow way.
    n_kv = meta.get(f"{arch}.attention.head_count_kv")
    if n_kv is None or n_heads is None:
        from gguf import GGUFReader

        fields = GGUFReader(path).fields

        def largest(key):
            f = fields.get(key)
            value = None if f is None else f.contents()
            return max(value) if isinstance(value, list) else value

        n_heads = n_heads if n_heads is not None else largest(f"{arch}.attention.head_count")
        n_kv = n_kv if n_kv is not None else largest(f"{arch}.attention.head_count_kv")
        n_kv = n_heads if n_kv is None else n_kv
    key_length = meta.get(f"{arch}.attention.key_length")
    if key_length is None:
        key_length = meta[f"{arch}.embedding_length"] // n_heads
    value_length = meta.get(f"{arch}.attention.value_length", key_length)
    return KVShape(
        n_layers=int(meta[f"{arch}.block_count"]),
        n_kv_heads=int(n_kv),
        key_length=int(key_length),
        value_length=int(value_length),
        context_length=int(meta.get(f"{arch}.context_length", 0)),
    )


def kv_spec(kv: str) -> KVSpec:
    """The format of a KV setting; an unknown name fails with the choices."""
    return KVSpec.parse(kv)


def kv_bytes_per_token(shape: KVShape, kv: str = "f16") -> int:
    """Bytes the KV cache holds per token, all layers, K and V, scales included."""
    spec = kv_spec(kv)
    dims = (shape.n_layers, shape.n_kv_heads, shape.key_length, shape.value_length)
    if spec.name == "f16":
        return dense_f16_bytes_per_token(*dims)
    return math.ceil(spec.bytes_per_token(*dims))


def safety_margin(free_bytes: int) -> int:
    return max(SAFETY_MARGIN_BYTES, int(free_bytes * SAFETY_MARGIN_FRACTION))


def max_context(bytes_per_token: int, free_bytes: int, model_bytes: int) -> int:
    """The largest context (a multiple of 256) whose KV cache fits in free RAM next to the model."""
    room = free_bytes - model_bytes - safety_margin(free_bytes)
    if room <= 0 or bytes_per_token <= 0:
        return 0
    return room // bytes_per_token // CONTEXT_MULTIPLE * CONTEXT_MULTIPLE


def wanted_context(doc_tokens) -> int | None:
    """95th percentile of the documents' token counts (linear interpolation) + 20%, rounded
    up to a multiple of 256; None without documents."""
    counts = np.asarray(list(doc_tokens), dtype=np.float64)     # (n_docs,)
    if counts.size == 0:
        return None
    want = math.ceil(float(np.percentile(counts, 95)) * HEADROOM)
    return -(-want // CONTEXT_MULTIPLE) * CONTEXT_MULTIPLE


def recommended_context(doc_tokens, max_ctx: int, default: int | None = None) -> int:
    """``wanted_context`` clamped to [1024, max_ctx]; without documents, ``default`` (the
    model's trained context) clamped the same way."""
    want = wanted_context(doc_tokens)
    if want is None:
        want = default or MIN_CONTEXT
    return max(0, min(max(want, MIN_CONTEXT), max_ctx))


def kv_bytes(bytes_per_token: int, context: int) -> int:
    return bytes_per_token * context
