"""KVCache: keys and values of every processed token, in f16, like llama.cpp's default cache.

This is the simple dense layout; the blocked, quantized layout (kv/blocked.py)
replaces it later behind the same ``update`` / ``attend`` boundary (app/engine/attention/dense.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numba import njit

from ..cpu.pages import lazy_zeros
from ..header.model_config import ModelConfig
from ..ops.f16 import f32_to_f16


class KVCache:
    """K and V for positions [0, n_tokens) of one sequence.

    Keys are stored after RoPE (as llama.cpp does), rounded to f16 on the way in
    (ggml_set_rows f32 -> f16, round to nearest even).
    """

    def __init__(self, config: ModelConfig, n_ctx: int):
        self.n_ctx = n_ctx
        shape = (config.n_layers, config.n_kv_heads, n_ctx, config.head_dim)
        # Pages arrive as positions are written, so an unused tail of the context costs nothing.
        self.k = lazy_zeros(shape, np.float16)  # (L, KVH, C, HD) float16
        self.v = lazy_zeros(shape, np.float16)  # (L, KVH, C, HD) float16
        # The same memory as raw bits: numba has no float16 type, the kernels convert
        # with F16C instructions (attention.f16_to_f32).
        self.k_bits = self.k.view(np.uint16)  # (L, KVH, C, HD) uint16
        self.v_bits = self.v.view(np.uint16)  # (L, KVH, C, HD) uint16
        self.tokens: list[int] = []  # token id at each filled position, for prefix reuse

    # ---- Public API ----------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    def update(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v (T, KVH*HD) float32 of the tokens at positions pos .. pos+T-1 of ``layer``."""
        t = k.shape[0]
        if pos + t > self.n_ctx:
            raise ValueError(f"KV cache full: {pos + t} tokens > n_ctx {self.n_ctx}")
        _store_f16(self.k_bits[layer], pos, k)
        _store_f16(self.v_bits[layer], pos, v)

    def commit(self, tokens: Sequence[int]) -> None:
        """Record that ``tokens`` now occupy the next positions (all layers updated)."""
        self.tokens.extend(int(t) for t in tokens)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are already cached."""
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return n

    def truncate(self, n: int) -> None:
        """Forget positions >= n (their K/V are overwritten by the next update)."""
        del self.tokens[n:]

    def clear(self) -> None:
        self.tokens.clear()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@njit(cache=True, nogil=True)
def _store_f16(dst, pos, x):
    """dst[h, pos + t, d] = f16(x[t, h*HD + d])  (round to nearest even, as ggml_set_rows).

    dst  # (KVH, C, HD) uint16 f16 bits;  x  # (T, KVH*HD) float32
    """
    n_kv_heads, _, head_dim = dst.shape
    for t in range(x.shape[0]):
        for h in range(n_kv_heads):
            for d in range(head_dim):
                dst[h, pos + t, d] = f32_to_f16(x[t, h * head_dim + d])
