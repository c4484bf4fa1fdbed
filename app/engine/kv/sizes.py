"""KV cache sizes, the one place they are computed: bytes stored per token (ours and
llama.cpp's cache types), bytes one decode step reads, the largest context that fits in free
memory and the context to recommend.

Bytes per token:
    layers x kv_heads x (key_length x bytes_k + value_length x bytes_v)
which is ``2 x layers x kv_heads x head_dim x bytes_per_element`` for llama.cpp's f16 cache.
The quantized settings add their scales and bounds as app/engine/kv/formats.py lays them out.
The weights a decode step streams come from the file's tensor table
(header/gguf_file.py ``GGUFLayout.weight_bytes_per_token``).
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass

import numpy as np

from ..header.gguf_file import GGUFError, GGUFLayout, scan_gguf
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
        """From a model file's header (header/gguf_file.py, cached): milliseconds, no load."""
        return cls.from_layout(scan_gguf(path))

    @classmethod
    def from_layout(cls, layout: GGUFLayout) -> "KVShape":
        meta, arch = layout.metadata, layout.architecture
        if "general.architecture" not in meta:
            raise GGUFError("no general.architecture in the GGUF metadata")

        def largest(key, default=None):
            # per-layer values (hybrid models) come as tuples: the largest is what memory needs
            value = meta.get(f"{arch}.{key}", default)
            return max(value) if isinstance(value, tuple) else value

        n_heads = largest("attention.head_count")
        n_kv = largest("attention.head_count_kv", n_heads)
        key_length = largest("attention.key_length")
        if key_length is None:
            key_length = meta[f"{arch}.embedding_length"] // n_heads
        return cls(n_layers=int(meta[f"{arch}.block_count"]), n_kv_heads=int(n_kv), key_length=int(key_length),
                   value_length=int(largest("attention.value_length", key_length)),
                   context_length=layout.context_length)

    @classmethod
    def from_config(cls, config) -> "KVShape":
        """From a loaded model's ModelConfig."""
        return cls(config.n_layers, config.n_kv_heads, config.head_dim, config.head_dim, config.context_length)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        return self.n_layers, self.n_kv_heads, self.key_length, self.value_length


def kv_spec(kv: str) -> KVSpec:
    """The format of a KV setting; an unknown name fails with the choices."""
    return KVSpec.parse(kv)


def kv_bytes_per_token(shape: KVShape, kv: str = "f16") -> int:
    """Bytes the KV cache holds per token, all layers, K and V, scales included."""
    spec = kv_spec(kv)
    if spec.name == "f16":
        return dense_f16_bytes_per_token(*shape.dims)
    return math.ceil(spec.bytes_per_token(*shape.dims))


# llama.cpp's cache types for our KV settings (ggml_type ids: f16 1, q8_0 8, q4_0 2); it stores
# q8_0 / q4_0 as ggml blocks of 32 elements (34 / 18 bytes).
LLAMACPP_KV_TYPES = {"f16": (1, 1), "k8v8": (8, 8), "k8v4": (8, 2), "k4v4": (2, 2)}
_GGML_BLOCKS = {1: (1, 2), 8: (32, 34), 2: (32, 18)}   # type id -> (elements, bytes) per block


def llamacpp_kv_bytes_per_token(shape: KVShape, kv: str = "f16") -> int:
    """KV bytes llama.cpp's cache stores per token for a KV setting (its q8_0/q4_0 types)."""
    if kv not in LLAMACPP_KV_TYPES:
        raise ValueError(f"unknown KV setting {kv!r}: use one of {', '.join(LLAMACPP_KV_TYPES)}")
    type_k, type_v = LLAMACPP_KV_TYPES[kv]

    def row(n: int, type_id: int) -> float:
        block, size = _GGML_BLOCKS[type_id]
        return n / block * size

    return math.ceil(shape.n_layers * shape.n_kv_heads * (row(shape.key_length, type_k) + row(shape.value_length, type_v)))


def kv_read_bytes_per_token(shape: KVShape, kv: str, n_tokens: int, attention=None) -> int:
    """KV bytes one decode step reads with ``n_tokens`` cached: all of them when dense; when
    sparse (``attention`` a SparseConfig in a sparse mode), the blocks it attends, plus every
    block's key bounds when it ranks by them at each step (observe = 0; ranked by the
    question's votes, decoding reads no bounds: the question read every block once)."""
    stored = kv_bytes_per_token(shape, kv)
    if attention is None or not attention.sparse:
        return stored * n_tokens
    spec = kv_spec(kv)
    block = spec.block
    attended = min(n_tokens, attention.budget_tokens(block))
    per_block_bounds = shape.n_layers * shape.n_kv_heads * 2 * 2 * shape.key_length
    bounds = 0 if attention.observe else -(-n_tokens // block) * per_block_bounds
    return int(round(attended * spec.bytes_per_token(*shape.dims))) + bounds


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
