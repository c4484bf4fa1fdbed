"""BlockKVCache: keys and values in blocks of B tokens, quantized, token-contiguous.

Layout (docs/ARCHITECTURE.md, "The KV cache is token-contiguous and quantized"): ``[layer][kv_head][block][token][head_dim]``, so reading a
block is one sequential sweep. Formats are in app/engine/kv/formats.py: keys quantized per
channel inside a block with f16 (lo, hi) bounds that double as the block's representative
for sparse attention; values per token with one f16 scale.

Keys are stored *before* their absolute RoPE rotation, rotated only by their offset j inside
their block (R(j) k). A block placed at position P then has keys R(P) R(j) k = R(P + j) k,
so attention can place any block anywhere (true positions inside the trained context,
compressed ones beyond it, InfLLM-style) by rotating the query once per block instead of
rotating every key: q_rot(p) . R(P + j) k = (R(p - P) q) . (R(j) k).

The most recent tokens wait in f16 (``tail``) until their block fills, then the block is
quantized. Blocks of a cache loaded from a file (app/engine/kv/files.py) stay memory-mapped in
``base`` and are never copied; later blocks go to ``own``, whose pages arrive as blocks are
written (cpu/pages.py).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import njit

from ..cpu.pages import lazy_zeros
from ..header.model_config import ModelConfig
from ..ops.f16 import f16_to_f32, f32_to_f16
from .formats import KVSpec

V_OFFSET = {8: 128, 4: 8}   # value codes are stored as c + offset in a uint8


def code_shapes(spec: KVSpec, n_blocks: int, n_layers: int, n_kv_heads: int, head_dim: int) -> dict:
    """name -> (shape, dtype) of every stored array for ``n_blocks`` blocks."""
    b = spec.block
    lead = (n_layers, n_kv_heads, n_blocks, b)
    k_width = head_dim // 2 if spec.k_bits == 4 else head_dim
    v_width = head_dim // 2 if spec.v_bits == 4 else head_dim
    return {
        "kc": (lead + (k_width,), np.uint16 if spec.k_bits == 16 else np.uint8),
        "kb": ((n_layers, n_kv_heads, n_blocks, 2, head_dim), np.uint16),   # f16 (lo, hi) per channel
        "vc": (lead + (v_width,), np.uint16 if spec.v_bits == 16 else np.uint8),
        "vs": (lead, np.uint16),                                            # f16 scale per token
    }


class LayerKV(NamedTuple):
    """One layer's blocked cache as the kernels read it, passed to them as one value. Blocks
    [0, nb_base) are the memory-mapped file's (``b*``), later whole blocks the cache's own
    (``o*``), the block being filled the f16 tail."""

    bkc: np.ndarray      # (KVH, NB_base, B, HD or HD/2) key codes: uint16 f16 bits (16) or uint8 (8, 4)
    bkb: np.ndarray      # (KVH, NB_base, 2, HD) uint16: f16 (lo, hi) of each key channel
    bvc: np.ndarray      # (KVH, NB_base, B, HD or HD/2) value codes, like bkc
    bvs: np.ndarray      # (KVH, NB_base, B) uint16: f16 scale of each token's values
    okc: np.ndarray      # (KVH, NB, B, HD or HD/2) the own blocks' key codes
    okb: np.ndarray      # (KVH, NB, 2, HD) uint16
    ovc: np.ndarray      # (KVH, NB, B, HD or HD/2)
    ovs: np.ndarray      # (KVH, NB, B) uint16
    tail_k: np.ndarray   # (KVH, B, HD) uint16 f16 bits: keys of the block being filled
    tail_v: np.ndarray   # (KVH, B, HD) uint16 f16 bits: its values
    nb_base: int         # blocks read from the b* arrays
    k_bits: int          # 16, 8 or 4 (kv/formats.py)
    v_bits: int


@dataclass
class _Checkpoint:
    n_tokens: int
    tail_k: np.ndarray   # (L, KVH, B, HD) uint16
    tail_v: np.ndarray   # (L, KVH, B, HD) uint16


class BlockKVCache:
    """K and V of positions [0, n_tokens) of one sequence, in quantized blocks."""

    def __init__(self, config: ModelConfig, n_ctx: int, spec: KVSpec):
        if config.head_dim % 16:
            raise ValueError(f"the blocked KV cache needs head_dim divisible by 16, not {config.head_dim}")
        self.config = config
        self.spec = spec
        self.block = spec.block
        self.n_ctx = n_ctx
        L, KVH, HD = config.n_layers, config.n_kv_heads, config.head_dim
        self.n_blocks_cap = -(-n_ctx // self.block)
        shapes = code_shapes(spec, self.n_blocks_cap, L, KVH, HD)
        # The capacity costs nothing until tokens arrive, and a new block only its own pages.
        self.own = {name: lazy_zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}
        self.base = {name: np.zeros((L, KVH, 0) + shape[3:], dtype)
                     for name, (shape, dtype) in shapes.items()}
        self.nb_base = 0      # blocks [0, nb_base) are read from ``base`` (memory-mapped file)
        self.tail_k = np.zeros((L, KVH, self.block, HD), np.uint16)  # (L, KVH, B, HD) f16 bits
        self.tail_v = np.zeros((L, KVH, self.block, HD), np.uint16)  # (L, KVH, B, HD) f16 bits
        self.tokens: list[int] = []
        self.checkpoint: _Checkpoint | None = None
        # Bumped whenever tokens are forgotten or the contents replaced, so that what attention
        # chose for the old contents (attention/state.py) is not used for the new.
        self.generation = 0

    # ---- State ----------------------------------------------------------------------

    @property
    def n_tokens(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """Bytes the cache's tokens occupy (full blocks in their format, the tail in f16)."""
        c = self.config
        n_full = self.n_tokens // self.block
        per_block = sum(int(np.prod(s[3:])) * np.dtype(d).itemsize
                        for s, d in code_shapes(self.spec, 1, 1, 1, c.head_dim).values())
        tail = (self.n_tokens % self.block) * c.head_dim * 4
        return (n_full * per_block + tail) * c.n_layers * c.n_kv_heads

    def commit(self, tokens: Sequence[int]) -> None:
        self.tokens.extend(int(t) for t in tokens)

    def common_prefix(self, tokens: Sequence[int]) -> int:
        """How many leading ``tokens`` are cached *and* can be kept: a block boundary, the
        checkpoint, or a point in the last, partly filled block (a partly filled block exists in
        f16 only at the checkpoint and at the end)."""
        n = 0
        for a, b in zip(self.tokens, tokens):
            if a != b:
                break
            n += 1
        return self._keepable(n)

    def _keepable(self, n: int) -> int:
        if n >= self.n_tokens:
            return self.n_tokens        # all of it: nothing to cut, whatever the last block holds
        if n // self.block == self.n_tokens // self.block:
            return n                    # inside the last, partly filled block: its f16 tail still holds [.., n)
        cp = self.checkpoint
        if cp is not None and cp.n_tokens <= n:
            if n - n % self.block <= cp.n_tokens:
                return cp.n_tokens
        return n - n % self.block

    def truncate(self, n: int) -> int:
        """Forget positions >= n (rounded down to where the cache can resume); returns the
        number of tokens kept."""
        n = self._keepable(min(n, self.n_tokens))
        if n == self.n_tokens:
            return n
        cp = self.checkpoint
        if n % self.block and n // self.block != self.n_tokens // self.block:
            # A block quantized since: only the checkpoint has it partly filled, its f16 tail comes back.
            self.tail_k[...] = cp.tail_k
            self.tail_v[...] = cp.tail_v
        self.nb_base = min(self.nb_base, n // self.block)
        del self.tokens[n:]
        self.generation += 1
        if cp is not None and cp.n_tokens > n:
            self.checkpoint = None
        return n

    def clear(self) -> None:
        self.truncate(0)
        self.drop_base()
        self.generation += 1

    def drop_base(self) -> None:
        if self.nb_base == 0 and all(a.shape[2] == 0 for a in self.base.values()):
            return
        self.tokens.clear()
        self.nb_base = 0
        L, KVH = self.config.n_layers, self.config.n_kv_heads
        self.base = {k: np.zeros((L, KVH, 0) + a.shape[3:], a.dtype) for k, a in self.own.items()}
        self.checkpoint = None

    def reserve(self, n_ctx: int) -> None:
        """Grow the capacity to ``n_ctx`` tokens (the filled blocks are kept)."""
        if n_ctx <= self.n_ctx:
            return
        c = self.config
        cap = -(-n_ctx // self.block)
        n_full = self.n_tokens // self.block
        shapes = code_shapes(self.spec, cap, c.n_layers, c.n_kv_heads, c.head_dim)
        own = {name: lazy_zeros(shape, dtype) for name, (shape, dtype) in shapes.items()}
        for name, a in self.own.items():
            own[name][:, :, self.nb_base:n_full] = a[:, :, self.nb_base:n_full]
        self.own = own
        self.n_blocks_cap = cap
        self.n_ctx = n_ctx

    def copy_blocks(self, blocks: Sequence[int]) -> None:
        """Append copies of the whole ``blocks`` after the last block (the cache must end on a
        block boundary). Keys are stored in their block's own frame, so a copy is those tokens
        at the copy's positions: attention places a block by rotating the query, whichever block
        it is."""
        b = self.block
        n_full = self.n_tokens // b
        if self.n_tokens % b:
            raise ValueError(f"copies of blocks go after a whole block, not after {self.n_tokens} tokens")
        if any(not 0 <= i < n_full for i in blocks):
            raise ValueError(f"only the cache's {n_full} whole blocks can be copied")
        if (n_full + len(blocks)) * b > self.n_ctx:
            raise ValueError(f"KV cache full: {(n_full + len(blocks)) * b} tokens > n_ctx {self.n_ctx}")
        tokens = list(self.tokens)
        for k, i in enumerate(blocks):
            source = self.base if i < self.nb_base else self.own
            for name, a in self.own.items():
                a[:, :, n_full + k] = source[name][:, :, i]
            self.tokens.extend(tokens[i * b:(i + 1) * b])

    def set_checkpoint(self) -> None:
        """Remember this point (e.g. the end of a document prefix) so that a later prompt that
        shares it resumes here exactly, even in the middle of a block."""
        self.checkpoint = _Checkpoint(self.n_tokens, self.tail_k.copy(), self.tail_v.copy())

    # ---- Writing ----------------------------------------------------------------------

    def update(self, layer: int, pos: int, k: np.ndarray, v: np.ndarray) -> None:
        """Store k, v (T, KVH*HD) float32 of positions pos .. pos+T-1 of ``layer``.
        k must already be rotated by each token's offset inside its block (R(pos % B))."""
        t = k.shape[0]
        if pos + t > self.n_ctx:
            raise ValueError(f"KV cache full: {pos + t} tokens > n_ctx {self.n_ctx}")
        o = self.own
        _append(self.tail_k[layer], self.tail_v[layer], pos, k, v, self.spec.k_bits, self.spec.v_bits,
                o["kc"][layer], o["kb"][layer], o["vc"][layer], o["vs"][layer])

    # ---- Reading (what the attention kernels take) ----------------------------------------

    def layer(self, layer: int) -> LayerKV:
        """``layer``'s blocks, as the kernels take them."""
        b, o = self.base, self.own
        return LayerKV(b["kc"][layer], b["kb"][layer], b["vc"][layer], b["vs"][layer],
                       o["kc"][layer], o["kb"][layer], o["vc"][layer], o["vs"][layer],
                       self.tail_k[layer], self.tail_v[layer], self.nb_base, self.spec.k_bits, self.spec.v_bits)

    def dequantize(self, layer: int, n: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Keys (still in their block frame) and values of ``layer`` as float32
        (KVH, n, HD) — the reference for tests and the quality probe."""
        n = self.n_tokens if n is None else n
        c = self.config
        k = np.zeros((c.n_kv_heads, n, c.head_dim), np.float32)
        v = np.zeros((c.n_kv_heads, n, c.head_dim), np.float32)
        _dequant_range(self.layer(layer), n, k, v)
        return k, v


# ---- Kernels ------------------------------------------------------------------------------


@njit(cache=True, nogil=True)
def _append(tail_k, tail_v, pos, k, v, k_bits, v_bits, kc, kb, vc, vs):
    """Write tokens into the f16 tail; quantize each block as it fills.

    tail_k, tail_v  # (KVH, B, HD) uint16       k, v  # (T, KVH*HD) float32
    kc  # (KVH, NB, B, HD or HD/2)  kb  # (KVH, NB, 2, HD) uint16  vc  # like kc  vs  # (KVH, NB, B) uint16
    """
    n_kv_heads, block, head_dim = tail_k.shape
    for t in range(k.shape[0]):
        p = pos + t
        j = p % block
        for h in range(n_kv_heads):
            for d in range(head_dim):
                tail_k[h, j, d] = f32_to_f16(k[t, h * head_dim + d])
                tail_v[h, j, d] = f32_to_f16(v[t, h * head_dim + d])
        if j == block - 1:
            b = p // block
            for h in range(n_kv_heads):
                _quantize_keys(tail_k[h], k_bits, kc[h, b], kb[h, b])
                _quantize_values(tail_v[h], v_bits, vc[h, b], vs[h, b])


@njit(cache=True, nogil=True)
def _quantize_keys(tk, bits, kc, kb):
    """Per-channel asymmetric quantization of one block of keys (KIVI).

    tk  # (B, HD) uint16 f16 bits;  kc  # (B, HD) uint16 (bits 16) / (B, HD) uint8 (8) /
    (B, HD/2) uint8 (4: low nibble = channel d, high nibble = channel d + HD/2);
    kb  # (2, HD) uint16: f16 lo and hi of each channel, exactly the range of the decoded keys.
    """
    block, head_dim = tk.shape
    qmax = np.float32((1 << bits) - 1) if bits < 16 else np.float32(1.0)
    half = head_dim // 2
    for d in range(head_dim):
        lo = np.float32(np.inf)
        hi = np.float32(-np.inf)
        for j in range(block):
            x = f16_to_f32(tk[j, d])
            lo = min(lo, x)
            hi = max(hi, x)
        kb[0, d] = f32_to_f16(lo)
        kb[1, d] = f32_to_f16(hi)
        if bits == 16:
            for j in range(block):
                kc[j, d] = tk[j, d]
            continue
        lo = f16_to_f32(kb[0, d])
        step = (f16_to_f32(kb[1, d]) - lo) / qmax
        inv = np.float32(1.0) / step if step > 0 else np.float32(0.0)
        for j in range(block):
            c = np.int64(np.rint((f16_to_f32(tk[j, d]) - lo) * inv))
            c = min(max(c, 0), np.int64(qmax))
            if bits == 8:
                kc[j, d] = c
            elif d < half:
                kc[j, d] = (kc[j, d] & 0xF0) | c
            else:
                kc[j, d - half] = (kc[j, d - half] & 0x0F) | (c << 4)


@njit(cache=True, nogil=True)
def _quantize_values(tv, bits, vc, vs):
    """Per-token symmetric quantization of one block of values: scale = max|v| / cmax,
    codes in [-cmax, cmax] stored as c + V_OFFSET.

    tv  # (B, HD) uint16;  vc  # (B, HD) uint16 (16) / (B, HD) uint8 (8) / (B, HD/2) uint8 (4)
    vs  # (B,) uint16 f16 scale
    """
    block, head_dim = tv.shape
    half = head_dim // 2
    for j in range(block):
        if bits == 16:
            for d in range(head_dim):
                vc[j, d] = tv[j, d]
            vs[j] = 0
            continue
        cmax = (1 << (bits - 1)) - 1
        off = 128 if bits == 8 else 8
        amax = np.float32(0.0)
        for d in range(head_dim):
            amax = max(amax, abs(f16_to_f32(tv[j, d])))
        vs[j] = f32_to_f16(amax / np.float32(cmax))
        scale = f16_to_f32(vs[j])
        inv = np.float32(1.0) / scale if scale > 0 else np.float32(0.0)
        for d in range(head_dim):
            c = np.int64(np.rint(f16_to_f32(tv[j, d]) * inv))
            c = min(max(c, -cmax), cmax) + off
            if bits == 8:
                vc[j, d] = c
            elif d < half:
                vc[j, d] = (vc[j, d] & 0xF0) | c
            else:
                vc[j, d - half] = (vc[j, d - half] & 0x0F) | (c << 4)


@njit(inline="always")
def decode_key(kc, kb, bits, j, d, half):
    """Key element (token j, channel d) of one block as float32 (block frame)."""
    if bits == 16:
        return f16_to_f32(np.uint16(kc[j, d]))
    lo = f16_to_f32(kb[0, d])
    step = (f16_to_f32(kb[1, d]) - lo) / np.float32((1 << bits) - 1)
    if bits == 8:
        c = np.float32(kc[j, d])
    elif d < half:
        c = np.float32(kc[j, d] & 0x0F)
    else:
        c = np.float32(kc[j, d - half] >> 4)
    return lo + c * step


@njit(inline="always")
def decode_keys(kc, kb, k_bits, n_valid, k_out):
    """Rows 0..n_valid-1 of one block's keys as float32 (block frame): k_out (>= n_valid, HD)."""
    head_dim = k_out.shape[1]
    half = head_dim // 2
    if k_bits == 16:
        for j in range(n_valid):
            for d in range(head_dim):
                k_out[j, d] = f16_to_f32(np.uint16(kc[j, d]))
        return
    lo = np.empty(head_dim, np.float32)
    step = np.empty(head_dim, np.float32)
    for d in range(head_dim):
        lo[d] = f16_to_f32(kb[0, d])
        step[d] = (f16_to_f32(kb[1, d]) - lo[d]) / np.float32((1 << k_bits) - 1)
    if k_bits == 8:
        for j in range(n_valid):
            for d in range(head_dim):
                k_out[j, d] = lo[d] + np.float32(kc[j, d]) * step[d]
    else:
        for j in range(n_valid):
            for d in range(half):
                c = kc[j, d]
                k_out[j, d] = lo[d] + np.float32(c & 0x0F) * step[d]
                k_out[j, d + half] = lo[d + half] + np.float32(c >> 4) * step[d + half]


@njit(inline="always")
def decode_value(vc, vs, bits, j, d, half):
    """Value element (token j, channel d) of one block as float32."""
    if bits == 16:
        return f16_to_f32(np.uint16(vc[j, d]))
    scale = f16_to_f32(vs[j])
    if bits == 8:
        return (np.float32(vc[j, d]) - np.float32(128.0)) * scale
    if d < half:
        return (np.float32(vc[j, d] & 0x0F) - np.float32(8.0)) * scale
    return (np.float32(vc[j, d - half] >> 4) - np.float32(8.0)) * scale


@njit(cache=True, nogil=True)
def _dequant_range(kv, n, k_out, v_out):
    """k_out, v_out (KVH, n, HD) float32 = positions [0, n) of the layer ``kv`` (LayerKV) decoded
    (keys in their block frame)."""
    bkc, bkb, bvc, bvs, okc, okb, ovc, ovs, tail_k, tail_v, nb_base, k_bits, v_bits = kv
    n_kv_heads, block, head_dim = tail_k.shape
    half = head_dim // 2
    n_full = n // block
    for h in range(n_kv_heads):
        for p in range(n):
            b = p // block
            j = p - b * block
            for d in range(head_dim):
                if b >= n_full:
                    k_out[h, p, d] = f16_to_f32(tail_k[h, j, d])
                    v_out[h, p, d] = f16_to_f32(tail_v[h, j, d])
                elif b < nb_base:
                    k_out[h, p, d] = decode_key(bkc[h, b], bkb[h, b], k_bits, j, d, half)
                    v_out[h, p, d] = decode_value(bvc[h, b], bvs[h, b], v_bits, j, d, half)
                else:
                    k_out[h, p, d] = decode_key(okc[h, b], okb[h, b], k_bits, j, d, half)
                    v_out[h, p, d] = decode_value(ovc[h, b], ovs[h, b], v_bits, j, d, half)
