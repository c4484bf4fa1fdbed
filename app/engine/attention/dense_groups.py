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
from ..ops.simd16 import fma16, hsum16, load16_2d, splat16_2d, store16_2d, zero16
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


VALUE_STEPS = 16   # rows of each lane a pass takes: 16 x 4 rows of V (16 KiB at HD 128) stay in L1 for all
                   # the passes over their dims and heads


def _values_kernel(load, store, fma, splat, lanes):
    """``values_group`` in registers of ``lanes`` float32 (8, or 16 where the CPU has AVX-512: half
    the instructions), built from that width's intrinsics: one body for both."""

    @njit(inline="always")
    def two_heads(p, v, acc, g, lane, d, k0, k1):
        """Lane sums (g, lane + i) and (g + 1, lane + i), i < 4, at dims d .. d + lanes, plus the
        rows k * L + lane + i for k0 <= k < k1, in k order: each row of V converted once for both."""
        a, b = acc[g], acc[g + 1]   # (L, HD) float32 each
        a0, a1, a2, a3 = load(a, lane, d), load(a, lane + 1, d), load(a, lane + 2, d), load(a, lane + 3, d)
        b0, b1, b2, b3 = load(b, lane, d), load(b, lane + 1, d), load(b, lane + 2, d), load(b, lane + 3, d)
        for k in range(k0, k1):
            j = k * F16_STEP + lane
            v0, v1, v2, v3 = load(v, j, d), load(v, j + 1, d), load(v, j + 2, d), load(v, j + 3, d)
            a0, a1 = fma(v0, splat(p, g, j), a0), fma(v1, splat(p, g, j + 1), a1)
            a2, a3 = fma(v2, splat(p, g, j + 2), a2), fma(v3, splat(p, g, j + 3), a3)
            b0, b1 = fma(v0, splat(p, g + 1, j), b0), fma(v1, splat(p, g + 1, j + 1), b1)
            b2, b3 = fma(v2, splat(p, g + 1, j + 2), b2), fma(v3, splat(p, g + 1, j + 3), b3)
        store(a0, a, lane, d)
        store(a1, a, lane + 1, d)
        store(a2, a, lane + 2, d)
        store(a3, a, lane + 3, d)
        store(b0, b, lane, d)
        store(b1, b, lane + 1, d)
        store(b2, b, lane + 2, d)
        store(b3, b, lane + 3, d)

    @njit(inline="always")
    def one_head(p, v, acc, g, lane, d, k0, k1):
        """``two_heads`` for head g alone (the last of an odd number)."""
        a = acc[g]   # (L, HD) float32
        a0, a1, a2, a3 = load(a, lane, d), load(a, lane + 1, d), load(a, lane + 2, d), load(a, lane + 3, d)
        for k in range(k0, k1):
            j = k * F16_STEP + lane
            a0, a1 = fma(load(v, j, d), splat(p, g, j), a0), fma(load(v, j + 1, d), splat(p, g, j + 1), a1)
            a2, a3 = fma(load(v, j + 2, d), splat(p, g, j + 2), a2), fma(load(v, j + 3, d), splat(p, g, j + 3), a3)
        store(a0, a, lane, d)
        store(a1, a, lane + 1, d)
        store(a2, a, lane + 2, d)
        store(a3, a, lane + 3, d)

    @njit(inline="always")
    def values_group(p, v, n_kv, acc):
        """acc[g, l] = sum over j = l, l + L, ... of p[g, j] * V[j], by FMA in j order: for each
        query head g of a GQA group, the L = F16_STEP (32, or 64 where WIDE) partial sums of
        ggml_vec_dot_f16 over the cell index (dense.py's ``_weighted_values`` with L lanes).

        Why this shape: each row of V is converted from f16 once into a register and multiplied
        there for two heads; the lane sums of 4 lanes x 2 heads stay in registers over
        VALUE_STEPS rows of each lane, whose V rows stay in L1 while the passes go over the dims
        and the head pairs. Lane l takes rows l, l + L, ... in that order: the same adds, so the
        same bits. (Converting V into a float32 copy first and streaming it once for each head
        is L2-bound: the copy is twice the bytes of V, read again for every head.)

        p  # (G, >= n_kv) float32, probabilities already rounded to f16
        v  # (C, HD) uint16 f16 bits, HD % lanes == 0;  acc  # (G, L, HD) float32, overwritten
        """
        n_group, head_dim = p.shape[0], v.shape[1]
        acc[:] = 0.0
        k_whole = n_kv // F16_STEP   # rows k * L + l for k < k_whole exist for every lane l
        for k0 in range(0, k_whole, VALUE_STEPS):
            k1 = min(k0 + VALUE_STEPS, k_whole)
            for lane in range(0, F16_STEP, 4):
                for d in range(0, head_dim, lanes):
                    for g in range(0, n_group - 1, 2):
                        two_heads(p, v, acc, g, lane, d, k0, k1)
                    if n_group % 2:
                        one_head(p, v, acc, n_group - 1, lane, d, k0, k1)
        for i in range(n_kv - k_whole * F16_STEP):   # the last rows, fewer than L: each its lane's last
            j = k_whole * F16_STEP + i
            for g in range(n_group):
                a = acc[g]
                for d in range(0, head_dim, lanes):
                    store(fma(load(v, j, d), splat(p, g, j), load(a, i, d)), a, i, d)

    return values_group


_values_group8 = _values_kernel(load8_2d, store8_2d, fma8, splat8_2d, 8)
_values_group16 = _values_kernel(load16_2d, store16_2d, fma16, splat16_2d, 16)


@njit(inline="always")
def _values_group(p, v, n_kv, acc):
    """acc[g, l]: the lane sums of p[g] . V (``values_group`` above), in 16-lane registers where
    the CPU has AVX-512 and HD % 16 == 0, else in 8-lane ones (HD % 8 == 0)."""
    if WIDE and v.shape[1] % 16 == 0:
        _values_group16(p, v, n_kv, acc)
    else:
        _values_group8(p, v, n_kv, acc)


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
