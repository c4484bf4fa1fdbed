"""The products of prefill attention on Intel AMX tiles in bfloat16 pairs: the same
out = softmax_masked(q k^T * scale) v as attention/products.py's sgemms, 16 x 16 x 32 products
an instruction (ops/amx.py, tdpbf16ps) where an sgemm's AVX-512 FMA makes 16.

Precision. Each float32 operand x is written as two bfloat16, hi = x truncated to bfloat16 and
lo = x - hi rounded to bfloat16, so hi + lo holds about 16 of float32's 24 significand bits
(relative error <= 2^-16; an f16 key or value, 11 bits, is held exactly). A product takes three tile
products, hi*hi + hi*lo + lo*hi, each exact in float32 and summed in float32; the dropped lo*lo
is <= 2^-14 of it. Scores and outputs so differ from the sgemms' by about 1e-5 relative: far
below what an f16 cache itself rounds away. (The split is the bf16x3 of Henry, Tang and Heinecke,
"Leveraging the bfloat16 Artificial Intelligence Datatype for Higher-Precision Computations",
ARITH 2019.)

Shape of the work (one KV head): the keys are shared by the threads in runs, as products.by_keys
does (FlashAttention's online softmax over tiles of TILE_KEYS keys, runs merged by their
log-sum-exp); inside a tile, blocks of 32 query rows: four C tiles of scores (32 rows x 32 keys)
over the head's dimensions, the masked softmax of those rows, then sixteen C tiles of output
(32 rows x 128 dimensions, two at a time) over the tile's keys. Blocks whose rows see no key of
the tile (the causal mask) are skipped.

Layouts (uint16 bfloat16 bits, flat; hi and lo arrays alike; HD the head dimension, a
multiple of 32):
  queries  (rows_pad * HD,): row-major, rows padded with zeros to a multiple of 32 (A tiles)
  keys     (keys_pad // 16, HD // 2, 16, 2): per 16 keys, row r of a B tile holds each key's
           dimensions 2r and 2r + 1 (tdpbf16ps' pairs), so a tile's 32 dimensions are 16
           consecutive rows of 64 bytes
  values   (keys_pad // 32, HD // 16, 16, 16, 2): per 32 keys and 16 dimensions, row r holds
           keys 2r and 2r + 1 of each dimension
keys_pad is a multiple of 32 and the padding zeros.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.amx import tile_config, tile_dpbf16ps, tile_load, tile_release, tile_shapes, tile_store, tile_zero
from ..ops.expf import ggml_expf
from ..ops.simd import bits_f32, f32_bits, hmax8, load8, max8, splat8
from ..cpu.threads import chunk_groups
from .products import merge_runs, visible_keys

_NEG_INF = np.float32(-np.inf)
TILE_KEYS = 256          # keys per tile of the online softmax (a 32-row block's scores: 32 KB)
ROWS = 32                # query rows per block: two A tiles
KEYS = 32                # keys per step of the scores (two B tiles) and of the values (one A tile's row)
# tmm0-3 C (float32 16 x 16), tmm4-5 A, tmm6-7 B: every tile 16 rows of 64 bytes
BF16_CONFIG = tile_shapes([(16, 64)] * 8)


@njit(cache=True, nogil=True, inline="always")
def padded(n: int, m: int) -> int:
    """n rounded up to a multiple of m."""
    return (n + m - 1) // m * m


@njit(nogil=True, inline="always")
def _bf16_pair(x):
    """float32 x -> (hi, lo) bfloat16 bits (the module's split), branch-free so loops vectorise."""
    t = f32_bits(x) & 0xFFFF0000
    r = f32_bits(x - bits_f32(t))               # exact: x and its truncation share the exponent
    return np.uint16(t >> 16), np.uint16(((r + 0x7FFF + ((r >> 16) & 1)) >> 16) & 0xFFFF)


@njit(nogil=True, inline="always")
def _split_row(x, hi, lo):
    """hi, lo (n,) uint16 = x (n,) float32 as bfloat16 pairs."""
    for i in range(x.shape[0]):
        hi[i], lo[i] = _bf16_pair(x[i])


@njit(cache=True, nogil=True, parallel=True)
def pack_queries(qh, n_parts):
    """qh (R, HD) float32 -> (hi, lo) (padded(R, 32) * HD,) uint16, row-major, zero rows after R."""
    n_rows, hd = qh.shape
    rows_pad = padded(n_rows, ROWS)
    hi = np.empty(rows_pad * hd, np.uint16)
    lo = np.empty(rows_pad * hd, np.uint16)
    hi[n_rows * hd:] = 0
    lo[n_rows * hd:] = 0
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_rows)
        for r in range(r0, r1):
            _split_row(qh[r], hi[r * hd:(r + 1) * hd], lo[r * hd:(r + 1) * hd])
    return hi, lo


def packed_size(n_keys: int, head_dim: int) -> int:
    """Elements of each of the packed key and value arrays for n_keys keys."""
    return padded(n_keys, KEYS) * head_dim


@njit(nogil=True, inline="always")
def pack_key(row, j, k_hi, k_lo):
    """Key j, row (HD,) float32, into its place in the key layout."""
    hd = row.shape[0]
    base = (j // 16) * (hd // 2) * 32 + (j % 16) * 2
    for d in range(hd):
        i = base + (d // 2) * 32 + d % 2
        k_hi[i], k_lo[i] = _bf16_pair(row[d])


@njit(nogil=True, inline="always")
def pack_value(row, j, v_hi, v_lo):
    """Value j, row (HD,) float32, into its place in the value layout."""
    hd = row.shape[0]
    base = (j // KEYS) * hd * KEYS + ((j % KEYS) // 2) * 32 + j % 2
    for d in range(hd):
        i = base + (d // 16) * 512 + (d % 16) * 2
        v_hi[i], v_lo[i] = _bf16_pair(row[d])


@njit(cache=True, nogil=True)
def zero_padding(n_keys, hd, k_hi, k_lo, v_hi, v_lo):
    """Zero the places of keys n_keys.. up to the next multiple of 32 (the padding the tiles read)."""
    zero = np.zeros(hd, np.float32)
    for j in range(n_keys, padded(n_keys, KEYS)):
        pack_key(zero, j, k_hi, k_lo)
        pack_value(zero, j, v_hi, v_lo)


@njit(cache=True, nogil=True, parallel=True)
def pack_keys_values(k, v, n_parts):
    """k, v (N, HD) float32 -> (k_hi, k_lo, v_hi, v_lo), each (padded(N, 32) * HD,) uint16 in
    the module's key and value layouts."""
    n, hd = k.shape
    size = padded(n, KEYS) * hd
    k_hi = np.empty(size, np.uint16)
    k_lo = np.empty(size, np.uint16)
    v_hi = np.empty(size, np.uint16)
    v_lo = np.empty(size, np.uint16)
    for c in prange(n_parts):
        j0, j1 = chunk_groups(c, n_parts, n)
        for j in range(j0, j1):
            pack_key(k[j], j, k_hi, k_lo)
            pack_value(v[j], j, v_hi, v_lo)
    zero_padding(n, hd, k_hi, k_lo, v_hi, v_lo)
    return k_hi, k_lo, v_hi, v_lo


@njit(nogil=True, inline="always")
def _two_by_two():
    """C tiles 0-3 += A tiles 4, 5 x B tiles 6, 7 (two row blocks by two column blocks)."""
    tile_dpbf16ps(0, 4, 6)
    tile_dpbf16ps(1, 4, 7)
    tile_dpbf16ps(2, 5, 6)
    tile_dpbf16ps(3, 5, 7)


@njit(cache=True, nogil=True, inline="always")
def _scores(q_hi, q_lo, k_hi, k_lo, hd, row0, key0, s, col):
    """s[32 rows, col..col+31] (row stride TILE_KEYS) = the block's queries (rows row0..) times
    keys key0..key0+31, as the three bfloat16 products."""
    qs = hd * 2                                   # bytes between query rows
    tile_zero(0)
    tile_zero(1)
    tile_zero(2)
    tile_zero(3)
    for c in range(hd // 32):
        qa = row0 * hd + 32 * c
        kb = ((key0 // 16) * (hd // 2) + 16 * c) * 32
        kb2 = kb + (hd // 2) * 32                   # the next 16 keys
        tile_load(4, q_hi, qa, qs)
        tile_load(5, q_hi, qa + 16 * hd, qs)
        tile_load(6, k_hi, kb, 64)
        tile_load(7, k_hi, kb2, 64)
        _two_by_two()
        tile_load(6, k_lo, kb, 64)
        tile_load(7, k_lo, kb2, 64)
        _two_by_two()
        tile_load(4, q_lo, qa, qs)
        tile_load(5, q_lo, qa + 16 * hd, qs)
        tile_load(6, k_hi, kb, 64)
        tile_load(7, k_hi, kb2, 64)
        _two_by_two()
    ss = TILE_KEYS * 4
    tile_store(0, s, col, ss)
    tile_store(1, s, col + 16, ss)
    tile_store(2, s, 16 * TILE_KEYS + col, ss)
    tile_store(3, s, 16 * TILE_KEYS + col + 16, ss)


@njit(cache=True, nogil=True, inline="always")
def _values(p_hi, p_lo, v_hi, v_lo, hd, n_cols, key0, acc, row0):
    """acc rows row0..row0+31 (HD floats each) += the block's probabilities (p, row stride
    TILE_KEYS, columns 0..n_cols-1) times the values of keys key0.., as the three products."""
    accs = hd * 4
    ps = TILE_KEYS * 2
    for g in range(0, hd // 16, 2):
        a0 = row0 * hd + 16 * g
        tile_load(0, acc, a0, accs)
        tile_load(1, acc, a0 + 16, accs)
        tile_load(2, acc, a0 + 16 * hd, accs)
        tile_load(3, acc, a0 + 16 * hd + 16, accs)
        for col in range(0, n_cols, KEYS):
            vb = (((key0 + col) // KEYS) * (hd // 16) + g) * 512
            tile_load(4, p_hi, col, ps)
            tile_load(5, p_hi, 16 * TILE_KEYS + col, ps)
            tile_load(6, v_hi, vb, 64)
            tile_load(7, v_hi, vb + 512, 64)
            _two_by_two()
            tile_load(6, v_lo, vb, 64)
            tile_load(7, v_lo, vb + 512, 64)
            _two_by_two()
            tile_load(4, p_lo, col, ps)
            tile_load(5, p_lo, 16 * TILE_KEYS + col, ps)
            tile_load(6, v_hi, vb, 64)
            tile_load(7, v_hi, vb + 512, 64)
            _two_by_two()
        tile_store(0, acc, a0, accs)
        tile_store(1, acc, a0 + 16, accs)
        tile_store(2, acc, a0 + 16 * hd, accs)
        tile_store(3, acc, a0 + 16 * hd + 16, accs)


@njit(nogil=True, inline="always")
def _row_max(s, i0, n):
    """max of s[i0:i0+n], n >= 1, 8 lanes at a time."""
    v = splat8(s[i0])
    n8 = n // 8 * 8
    for j in range(0, n8, 8):
        v = max8(v, load8(s, i0 + j))
    mx = hmax8(v)
    for j in range(n8, n):
        mx = s[i0 + j] if s[i0 + j] > mx else mx
    return mx


@njit(cache=True, nogil=True, inline="always")
def _softmax_rows(s, p_hi, p_lo, row0, n_rows, limit, t0, t1, scale, m, l, acc, hd):
    """The online softmax of the block's rows over keys t0..t1-1 (scores in s): each row's
    running max m and exp-sum l updated, its output so far in acc rescaled, its probabilities
    written to p_hi, p_lo as bfloat16 pairs (zeros past the keys it may see)."""
    w = t1 - t0
    for i in range(ROWS):
        r = row0 + i
        ph = p_hi[i * TILE_KEYS:(i + 1) * TILE_KEYS]
        pl = p_lo[i * TILE_KEYS:(i + 1) * TILE_KEYS]
        cnt = min(limit[r], t1) - t0 if r < n_rows else 0
        if cnt <= 0:
            ph[:w] = 0
            pl[:w] = 0
            continue
        srow = s[i * TILE_KEYS:i * TILE_KEYS + cnt]
        mx = _row_max(s, i * TILE_KEYS, cnt) * scale       # (scale > 0: the max of the scaled scores)
        mx = mx if mx > m[r] else m[r]
        corr = np.float32(np.exp(m[r] - mx)) if m[r] != _NEG_INF else np.float32(0.0)
        total = np.float32(0.0)
        for j in range(cnt):
            x = ggml_expf(srow[j] * scale - mx)
            total += x
            ph[j], pl[j] = _bf16_pair(x)
        ph[cnt:w] = 0
        pl[cnt:w] = 0
        l[r] = l[r] * corr + total
        m[r] = mx
        if corr != 1.0:
            for d in range(hd):
                acc[r * hd + d] *= corr


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def attend(q_hi, q_lo, k_hi, k_lo, v_hi, v_lo, n_keys, key_pos, query_pos, n_rows, group, scale,
           n_parts, out):
    """out = softmax_masked(q k^T * scale) v over the packed operands (the module's layouts),
    the keys shared by the threads in runs (products.by_keys' shape).

    key_pos  # (N,) int64 ascending;  query_pos  # (T,) int64;  out  # (T*G, HD) float32
    """
    hd = out.shape[1]
    rows_pad = q_hi.shape[0] // hd
    n_chunks = (n_keys + KEYS - 1) // KEYS
    part_m = np.empty((n_parts, n_rows), np.float32)
    part_l = np.empty((n_parts, n_rows), np.float32)
    part_acc = np.empty((n_parts, rows_pad, hd), np.float32)
    limit = visible_keys(key_pos[:n_keys], query_pos, group, rows_pad, n_rows)   # (rows_pad,)
    for c in prange(n_parts):
        tile_config(BF16_CONFIG)
        j0, j1 = chunk_groups(c, n_parts, n_chunks)
        j0 *= KEYS
        j1 = min(n_keys, j1 * KEYS)
        m = part_m[c]
        l = part_l[c]
        acc = part_acc[c].reshape(-1)
        m[:] = _NEG_INF
        l[:] = 0.0
        acc[:] = 0.0
        s = np.empty(ROWS * TILE_KEYS, np.float32)        # (32, TILE_KEYS) a block's scores
        p_hi = np.empty(ROWS * TILE_KEYS, np.uint16)      # (32, TILE_KEYS) its probabilities
        p_lo = np.empty(ROWS * TILE_KEYS, np.uint16)
        for t0 in range(j0, j1, TILE_KEYS):
            t1 = min(t0 + TILE_KEYS, j1)
            w = padded(t1 - t0, KEYS)
            for row0 in range(0, rows_pad, ROWS):
                if limit[row0 + ROWS - 1] <= t0:         # the causal mask hides the whole tile
                    continue
                for col in range(0, w, KEYS):
                    _scores(q_hi, q_lo, k_hi, k_lo, hd, row0, t0 + col, s, col)
                _softmax_rows(s, p_hi, p_lo, row0, n_rows, limit, t0, t1, scale, m, l, acc, hd)
                _values(p_hi, p_lo, v_hi, v_lo, hd, w, t0, acc, row0)
        tile_release()
    for r in prange(n_rows):
        merge_runs(part_m, part_l, part_acc, r, out[r])
