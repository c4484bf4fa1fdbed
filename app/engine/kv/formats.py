"""KV cache formats: the names a person chooses (``f16``, ``k8v8``, ``k8v4``, ``k4v4``) and
what each stores. Light on purpose (no numba): the KV calculator and the settings use it.

The blocked cache of app/engine/kv/blocked.py holds, per layer and KV head, blocks of B tokens:

  keys    per-channel quantization inside each block (KIVI, Liu et al. 2024, section 3: key
          outliers sit in fixed channels, so a scale per channel keeps them from flattening
          the rest). Asymmetric: per (block, channel) an f16 minimum and an f16 step, codes
          0 .. 2^bits - 1. The minimum and minimum + step x (2^bits - 1) are the channel's exact
          bounds over the block, which is what sparse attention ranks blocks by (Quest, Tang et
          al. 2024): the block representative costs nothing extra.
          Per token and head: HD x bits/8 bytes + 2 x 2 x HD / B bytes of bounds.
  values  per-token quantization (KIVI: value errors stay per token), symmetric, one f16
          scale per token and head, codes -(2^(bits-1) - 1) .. 2^(bits-1) - 1.
          Per token and head: HD x bits/8 + 2 bytes.
  f16     the element as IEEE half (K keeps its f16 bounds for ranking).

Measured on SmolLM2-135M (docs/benchmarks.md): k8v4 holds 0.40x the bytes of f16.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ..header.support import DENSE_ONLY

BLOCK = 64          # tokens per block (B); see docs/benchmarks.md for the measurement
SCALE_BYTES = 2     # f16 scales and bounds

KV_NAMES = ("f16", "k8v8", "k8v4", "k4v4")
_BITS = {"f16": (16, 16), "k8v8": (8, 8), "k8v4": (8, 4), "k4v4": (4, 4)}


class CacheFileError(ValueError):
    """A persisted KV cache that cannot be used (the message names the file and the problem;
    ``path`` is the file, where known)."""

    def __init__(self, message: str, path: Path | None = None):
        super().__init__(message)
        self.path = path


@dataclass(frozen=True)
class KVSpec:
    """A KV cache format: bits of K and of V (16 = f16, 8 or 4 = integer codes)."""

    k_bits: int = 16
    v_bits: int = 16
    block: int = BLOCK

    def __post_init__(self):
        if self.k_bits not in (4, 8, 16) or self.v_bits not in (4, 8, 16):
            raise ValueError(f"KV bits must be 4, 8 or 16, not k{self.k_bits}v{self.v_bits}")
        if self.block < 8 or self.block % 8:
            raise ValueError(f"the KV block must be a multiple of 8 tokens, not {self.block}")

    @classmethod
    def parse(cls, name: str, block: int = BLOCK) -> "KVSpec":
        """``f16``, ``k8v8``, ``k8v4`` or ``k4v4`` (also ``k16v8``-style spellings)."""
        key = name.strip().lower()
        if key in _BITS:
            return cls(*_BITS[key], block=block)
        import re

        m = re.fullmatch(r"k(16|8|4)v(16|8|4)", key)
        if not m:
            raise ValueError(f"unknown KV setting {name!r}: use one of {', '.join(KV_NAMES)}")
        return cls(int(m.group(1)), int(m.group(2)), block=block)

    @property
    def name(self) -> str:
        if self.k_bits == self.v_bits == 16:
            return "f16"
        return f"k{self.k_bits}v{self.v_bits}"

    def key_bytes(self, head_dim: int) -> float:
        """Bytes of one token's key in one head, bounds included."""
        return head_dim * self.k_bits / 8 + 2 * SCALE_BYTES * head_dim / self.block

    def value_bytes(self, head_dim: int) -> float:
        """Bytes of one token's value in one head, scale included."""
        if self.v_bits == 16:
            return head_dim * 2.0
        return head_dim * self.v_bits / 8 + SCALE_BYTES

    def bytes_per_token(self, n_layers: int, n_kv_heads: int, key_length: int, value_length: int) -> float:
        return n_layers * n_kv_heads * (self.key_bytes(key_length) + self.value_bytes(value_length))


def dense_f16_bytes_per_token(n_layers: int, n_kv_heads: int, key_length: int, value_length: int) -> int:
    """llama.cpp's f16 cache: 2 bytes per element, nothing else."""
    return n_layers * n_kv_heads * (key_length + value_length) * 2


def blocked_cache(architecture: str, kv: str, attention: str, documents: bool = False) -> bool:
    """Whether eLLM's engine keeps the KV cache in blocks (app/engine/kv/blocked.py): for every
    question about documents (the blocked cache is persisted, laid side by side across documents,
    and its attention mass gives the citations; f16 there stores the same halves as the dense
    cache), except on the DENSE_ONLY architectures, and whenever the format or sparse attention
    needs it (refused there by Model.new_cache). Only a completion without documents in f16 with
    dense attention keeps the contiguous cache: llama.cpp's numerics, token for token."""
    wants_files = documents and architecture not in DENSE_ONLY
    return wants_files or KVSpec.parse(kv).name != "f16" or attention != "dense"
