"""f16 attention a GQA group at a time: the query heads (and, in prefill, the tokens) that
share a KV head are attended together, so each key and value row is read once for several
query vectors instead of once for each. Every dot product and every lane sum keeps the order of
dense.py's per-head kernels, which are llama.cpp's (ggml_vec_dot_f16 for one token, tinyBLAS
for more), so the results are the same bits; only the loops around them change.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.f16 import round_f16
from ..ops.simd import fma8, hsum8, load8_2d, splat8, splat8_2d, store8_2d, zero8
from ..ops.simd16 import fma16, hsum16, load16_2d, zero16
from .ggml_lanes import F16_STEP, TINYBLAS_LANES, WIDE, dot_row, dot_rows4, reduce_lanes, softmax, vec_dot_f16

# ---- One query token (decode) -----------------------------------------------------------------


KEY_BLOCK = 64   # key rows converted to f32 at a time (32 KiB at HD 128: they stay in L1)


@njit(inline="always")
def _scores_group(k, q16, n_kv, scale, s):
    """s[g, j] = (K[j] . q16[g]) * scale for the query heads g of one GQA group, with
    ggml_vec_dot_f16's lanes. Key rows are converted from f16 once, KEY_BLOCK at a time, for
    all the heads (converting them for each head's dot cost half the kernel); each dot keeps
    its own accumulators and order, so the scores are the same bits (four keys at a time,
    ``dot_rows4``: 8 or, WIDE, 16 lanes; with HD % 64 != 0 there, row by row with the leftovers,
    ``vec_dot_f16``). HD % 32 == 0.

    k  # (C, HD) uint16 f16 bits;  q16  # (G, HD) float32;  s  # (G, >= n_kv) float32
    """
    head_dim = q16.shape[1]
    kf = np.empty((KEY_BLOCK, head_dim), dtype=np.float32)  # (KEY_BLOCK, HD) key rows in f32
    for j0 in range(0, n_kv, KEY_BLOCK):
        nb = min(KEY_BLOCK, n_kv - j0)
        for i in range(nb):
            for e in range(0, head_dim, 8):
                store8_2d(load8_2d(k, j0 + i, e), kf, i, e)
        n4 = nb - nb % 4
        for g in range(q16.shape[0]):
            if head_dim % F16_STEP:   # leftovers after the last step (WIDE: HD % 64), in double
                for i in range(nb):
                    s[g, j0 + i] = vec_dot_f16(k, j0 + i, q16, g) * scale
                continue
            for i in range(0, n4, 4):
                d0, d1, d2, d3 = dot_rows4(kf, i, q16, g, head_dim)
                s[g, j0 + i], s[g, j0 + i + 1] = d0 * scale, d1 * scale
                s[g, j0 + i + 2], s[g, j0 + i + 3] = d2 * scale, d3 * scale
            for i in range(n4, nb):
                s[g, j0 + i] = dot_row(kf, i, q16, g, head_dim) * scale


VALUE_BLOCK = 512        # value rows converted to f32 at a time (256 KiB at HD 128: in L2)
_CHUNK_ROWS = VALUE_BLOCK + 2   # rows of one 8-dim chunk in that copy: not a multiple of 4 KiB apart


@njit(inline="always")
def _load4(a, lane, d):
    return load8_2d(a, lane, d), load8_2d(a, lane + 1, d), load8_2d(a, lane + 2, d), load8_2d(a, lane + 3, d)


@njit(inline="always")
def _store4(sums, a, lane, d):
    store8_2d(sums[0], a, lane, d)
    store8_2d(sums[1], a, lane + 1, d)
    store8_2d(sums[2], a, lane + 2, d)
    store8_2d(sums[3], a, lane + 3, d)


@njit(inline="always")
def _fma4(vf, row, p, g, j, sums):
    """Four consecutive rows of one chunk of V times p[g, j .. j + 3], each into its own sum."""
    return (fma8(load8_2d(vf, row, 0), splat8_2d(p, g, j), sums[0]),
            fma8(load8_2d(vf, row + 1, 0), splat8_2d(p, g, j + 1), sums[1]),
            fma8(load8_2d(vf, row + 2, 0), splat8_2d(p, g, j + 2), sums[2]),
            fma8(load8_2d(vf, row + 3, 0), splat8_2d(p, g, j + 3), sums[3]))


@njit(inline="always")
def _values_group(p, v, n_kv, acc):
    """acc[g, l] = sum over j = l, l + L, ... of p[g, j] * V[j], by FMA in j order: for each
    query head g of a GQA group, the L = F16_STEP (32, or 64 where WIDE) partial sums of
    ggml_vec_dot_f16 over the cell index (dense.py's ``_weighted_values`` with L lanes).

    Why this shape: V is converted from f16 once for all the group's heads, VALUE_BLOCK rows at a
    time, into 8-dim chunks whose rows are contiguous; then for each head and chunk, 16 of the L
    lane sums at a time stay in registers over the block's rows (lane l takes rows l, l + L, ...:
    the same adds in the same order, so the same bits). Sums kept in memory instead (a load and a
    store around every multiply-add) made this kernel twice as slow.

    p  # (G, >= n_kv) float32, probabilities already rounded to f16
    v  # (C, HD) uint16 f16 bits, HD % 8 == 0;  acc  # (G, L, HD) float32, overwritten
    """
    n_group = p.shape[0]
    n_chunks = v.shape[1] // 8
    vf = np.empty((n_chunks * _CHUNK_ROWS, 8), dtype=np.float32)  # (chunks x rows, 8) the block in f32
    acc[:] = 0.0
    n_lanes = F16_STEP
    for jb in range(0, n_kv, VALUE_BLOCK):   # jb % L == 0: row i of a block is lane i & (L - 1)
        nb = min(VALUE_BLOCK, n_kv - jb)
        for i in range(nb):
            for c in range(n_chunks):
                store8_2d(load8_2d(v, jb + i, 8 * c), vf, c * _CHUNK_ROWS + i, 0)
        n_whole = nb - nb % n_lanes
        for g in range(n_group):
            a = acc[g]  # (L, HD) float32
            for c in range(n_chunks):
                d, base = 8 * c, c * _CHUNK_ROWS
                for half in range(0, n_lanes, 16):
                    s0, s1 = _load4(a, half, d), _load4(a, half + 4, d)
                    s2, s3 = _load4(a, half + 8, d), _load4(a, half + 12, d)
                    for r in range(half, n_whole, n_lanes):
                        s0 = _fma4(vf, base + r, p, g, jb + r, s0)
                        s1 = _fma4(vf, base + r + 4, p, g, jb + r + 4, s1)
                        s2 = _fma4(vf, base + r + 8, p, g, jb + r + 8, s2)
                        s3 = _fma4(vf, base + r + 12, p, g, jb + r + 12, s3)
                    _store4(s0, a, half, d)
                    _store4(s1, a, half + 4, d)
                    _store4(s2, a, half + 8, d)
                    _store4(s3, a, half + 12, d)
                for i in range(n_whole, nb):   # the last rows, fewer than L
                    lane = i & (n_lanes - 1)
                    store8_2d(fma8(load8_2d(vf, base + i, 0), splat8_2d(p, g, jb + i), load8_2d(a, lane, d)),
                              a, lane, d)


@njit(cache=True, nogil=True, parallel=True)
def attend_one(q, k_bits, v_bits, layer, pos0, scale, window, per_item, out):
    """One query token (decode) as dense.py's ``_attend_kernel`` computes it, bit for bit, a GQA group
    at a time: each work item takes ``per_item`` query heads that share a KV head and reads
    each key and value row once for all of them (the group's lane sums stay in L1). Needs
    HD % 32 == 0.

    q  # (1, H, HD) float32;  k_bits, v_bits  # (L, KVH, C, HD) uint16;  out  # (1, H, HD) float32
    """
    n_heads, head_dim = q.shape[1], q.shape[2]
    group = n_heads // k_bits.shape[1]
    n_kv = pos0 + 1
    j0 = max(0, n_kv - window) if window > 0 else 0
    n_kv -= j0
    for item in prange(n_heads // per_item):
        h0 = item * per_item
        k = k_bits[layer, h0 // group, j0:]  # (C - j0, HD) uint16
        v = v_bits[layer, h0 // group, j0:]  # (C - j0, HD) uint16
        q16 = np.empty((per_item, head_dim), dtype=np.float32)  # (G', HD) q rounded to f16
        for g in range(per_item):
            for d in range(head_dim):
                q16[g, d] = round_f16(q[0, h0 + g, d])
        s = np.empty((per_item, n_kv), dtype=np.float32)  # (G', n_kv) scores, then probabilities
        _scores_group(k, q16, n_kv, scale, s)
        for g in range(per_item):
            softmax(s[g], n_kv)
            for j in range(n_kv):
                s[g, j] = round_f16(s[g, j])  # V is f16, so ggml rounds the probabilities too
        acc = np.empty((per_item, F16_STEP, head_dim), dtype=np.float32)  # (G', L, HD) lane partial sums
        _values_group(s, v, n_kv, acc)
        for g in range(per_item):
            reduce_lanes(acc[g], F16_STEP, out[0, h0 + g])


def heads_per_item(n_heads: int, n_kv_heads: int, n_threads: int) -> int:
    """Query heads per work item of the decode kernel: a whole GQA group when there are
    enough groups for the threads, else the group halved until there are (heads of one
    item must share their KV head)."""
    per_item = n_heads // n_kv_heads
    while n_heads // per_item < n_threads and per_item % 2 == 0:
        per_item //= 2
    return per_item


# ---- Two or more query tokens (prefill) -------------------------------------------------------

TILE = 8            # query vectors (token, head) attended together: 8 accumulators in registers
TILE_GROUP = 8      # tiles of one KV head that go over each block of keys and values together
ATTEND_BLOCK = 128  # keys a block (32 KiB of f16 rows at HD 128: in L1 while the tiles pass)


def _tile_scores(load, fma, zero, hsum, lanes):
    """The kernel below in registers of ``lanes`` (tinyBLAS's 8, or 16 on __m512), built from
    that width's intrinsics: one body for both."""

    @njit(inline="always")
    def scores_tile(k, q16, j0, j1, scale, s):
        """s[i, j] = (K[j] . q16[i]) * scale for keys j0 .. j1 and the TILE query vectors of a
        tile, each dot with tinyBLAS's lanes (dense.py ``_scores_tinyblas``: one accumulator of
        ``lanes``, then hsum); each ``lanes`` values of key row j are converted once for the
        tile's 8 dots. HD % lanes == 0.

        k  # (C, HD) uint16 f16 bits;  q16  # (TILE, HD) float32;  s  # (TILE, >= j1) float32
        """
        head_dim = q16.shape[1]
        for j in range(j0, j1):
            a0 = zero()
            a1 = zero()
            a2 = zero()
            a3 = zero()
            a4 = zero()
            a5 = zero()
            a6 = zero()
            a7 = zero()
            for e in range(0, head_dim, lanes):
                ke = load(k, j, e)
                a0 = fma(ke, load(q16, 0, e), a0)
                a1 = fma(ke, load(q16, 1, e), a1)
                a2 = fma(ke, load(q16, 2, e), a2)
                a3 = fma(ke, load(q16, 3, e), a3)
                a4 = fma(ke, load(q16, 4, e), a4)
                a5 = fma(ke, load(q16, 5, e), a5)
                a6 = fma(ke, load(q16, 6, e), a6)
                a7 = fma(ke, load(q16, 7, e), a7)
            s[0, j] = hsum(a0) * scale
            s[1, j] = hsum(a1) * scale
            s[2, j] = hsum(a2) * scale
            s[3, j] = hsum(a3) * scale
            s[4, j] = hsum(a4) * scale
            s[5, j] = hsum(a5) * scale
            s[6, j] = hsum(a6) * scale
            s[7, j] = hsum(a7) * scale

    return scores_tile


# tinyBLAS's width in a llama.cpp built for this CPU (WIDE: 16 lanes, hsum = _mm512_reduce_add_ps)
_scores_tile = (_tile_scores(load16_2d, fma16, zero16, hsum16, 16) if WIDE
                else _tile_scores(load8_2d, fma8, zero8, hsum8, 8))


@njit(inline="always")
def _values_tile(pt, v, j0, j1, acc):
    """acc[i, l] += sum over j = l, l + L, ... in j0 .. j1 of pt[j, i] * V[j], by FMA in j
    order: tinyBLAS's L = TINYBLAS_LANES (8, or 16 where WIDE) partial sums over the cell
    index (dense.py ``_weighted_values`` with L lanes) for the TILE query vectors, 8 dims at a
    time with their sums in registers, so each value row is read once for the tile. j0 is a
    multiple of L, so that the blocks of keys continue each lane's sum in order (zeros before
    the first). A probability of 0 (a masked key) adds an exact zero.

    pt  # (>= j1, TILE) float32, probabilities already rounded to f16, by key
    v   # (C, HD) uint16 f16 bits;  acc  # (TILE, L, HD) float32
    """
    head_dim = v.shape[1]
    n_lanes = TINYBLAS_LANES
    for d in range(0, head_dim, 8):
        for lane in range(n_lanes):
            a0 = load8_2d(acc[0], lane, d)
            a1 = load8_2d(acc[1], lane, d)
            a2 = load8_2d(acc[2], lane, d)
            a3 = load8_2d(acc[3], lane, d)
            a4 = load8_2d(acc[4], lane, d)
            a5 = load8_2d(acc[5], lane, d)
            a6 = load8_2d(acc[6], lane, d)
            a7 = load8_2d(acc[7], lane, d)
            for j in range(j0 + lane, j1, n_lanes):
                vj = load8_2d(v, j, d)
                a0 = fma8(vj, splat8(pt[j, 0]), a0)
                a1 = fma8(vj, splat8(pt[j, 1]), a1)
                a2 = fma8(vj, splat8(pt[j, 2]), a2)
                a3 = fma8(vj, splat8(pt[j, 3]), a3)
                a4 = fma8(vj, splat8(pt[j, 4]), a4)
                a5 = fma8(vj, splat8(pt[j, 5]), a5)
                a6 = fma8(vj, splat8(pt[j, 6]), a6)
                a7 = fma8(vj, splat8(pt[j, 7]), a7)
            store8_2d(a0, acc[0], lane, d)
            store8_2d(a1, acc[1], lane, d)
            store8_2d(a2, acc[2], lane, d)
            store8_2d(a3, acc[3], lane, d)
            store8_2d(a4, acc[4], lane, d)
            store8_2d(a5, acc[5], lane, d)
            store8_2d(a6, acc[6], lane, d)
            store8_2d(a7, acc[7], lane, d)


@njit(cache=True, nogil=True, parallel=True)
def attend_batch(q, k_bits, v_bits, layer, pos0, scale, out):
    """Two or more query tokens (prefill, no sliding window) as dense.py's ``_attend_kernel``
    computes them, bit for bit, TILE query vectors at a time: the heads of one GQA group for
    consecutive tokens (vector m of KV head kvh is token m // G, head kvh * G + m % G). Each
    query sees its own causal prefix; keys past it get probability 0 in the shared sweep. Needs
    HD % TINYBLAS_LANES == 0.

    TILE_GROUP tiles go over the keys and values together, a block of ATTEND_BLOCK rows at a
    time, so each row is read from memory once for the group rather than once for each tile
    (a question of 30 tokens after a 31K-token document read each K and V row 23 times, ~20 GB
    over the model's layers); each score is its own dot and each value sum keeps its lanes'
    order across the blocks, so the bits are those of one sweep per tile.

    q  # (T, H, HD) float32;  k_bits, v_bits  # (L, KVH, C, HD) uint16;  out  # (T, H, HD) float32
    """
    n_q, n_heads, head_dim = q.shape
    n_kv_heads = k_bits.shape[1]
    group = n_heads // n_kv_heads
    per_head = n_q * group                   # query vectors of one KV head
    n_tiles = (per_head + TILE - 1) // TILE
    n_groups = (n_tiles + TILE_GROUP - 1) // TILE_GROUP
    for item in prange(n_kv_heads * n_groups):
        kvh = item // n_groups
        first = (item - kvh * n_groups) * TILE_GROUP * TILE         # the group's first query vector
        n_vec = min(TILE_GROUP * TILE, per_head - first)
        n_tg = (n_vec + TILE - 1) // TILE
        n_max = pos0 + (first + n_vec - 1) // group + 1              # keys of the group's last token
        k = k_bits[layer, kvh]  # (C, HD) uint16
        v = v_bits[layer, kvh]  # (C, HD) uint16
        q16 = np.zeros((n_tg, TILE, head_dim), dtype=np.float32)    # (tiles, TILE, HD) q rounded to f16
        for i in range(n_vec):
            t = (first + i) // group
            h = kvh * group + (first + i) % group
            for d in range(head_dim):
                q16[i // TILE, i % TILE, d] = round_f16(q[t, h, d])
        s = np.empty((n_tg, TILE, n_max), dtype=np.float32)         # (tiles, TILE, n_max) scores
        for j0 in range(0, n_max, ATTEND_BLOCK):
            for tt in range(n_tg):
                j1 = min(j0 + ATTEND_BLOCK, _tile_keys(tt, n_vec, first, pos0, group))
                if j1 > j0:
                    _scores_tile(k, q16[tt], j0, j1, scale, s[tt])
        pt = np.zeros((n_tg, n_max, TILE), dtype=np.float32)        # (tiles, n_max, TILE) probabilities by key
        for i in range(n_vec):
            n_kv = pos0 + (first + i) // group + 1
            row = s[i // TILE, i % TILE]
            softmax(row, n_kv)
            for j in range(n_kv):
                pt[i // TILE, j, i % TILE] = round_f16(row[j])   # V is f16, so ggml rounds the probabilities too
        acc = np.zeros((n_tg, TILE, TINYBLAS_LANES, head_dim), dtype=np.float32)  # (tiles, TILE, L, HD) lane sums
        for j0 in range(0, n_max, ATTEND_BLOCK):
            for tt in range(n_tg):
                j1 = min(j0 + ATTEND_BLOCK, _tile_keys(tt, n_vec, first, pos0, group))
                if j1 > j0:
                    _values_tile(pt[tt], v, j0, j1, acc[tt])
        for i in range(n_vec):
            reduce_lanes(acc[i // TILE, i % TILE], TINYBLAS_LANES,
                         out[(first + i) // group, kvh * group + (first + i) % group])


@njit(inline="always")
def _tile_keys(tt, n_vec, first, pos0, group):
    """Keys that tile tt of a group sees: those of its last query vector's token."""
    last = min(TILE * (tt + 1), n_vec) - 1
    return pos0 + (first + last) // group + 1
