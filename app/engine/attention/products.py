"""The products of prefill attention over decoded keys: out = softmax_masked(q k^T * scale) v,
as one-thread BLAS sgemms inside numba's threads (quant/blas.py says why inside numba).

Two ways to share the work between the threads, chosen by the shape (``attend``):

by queries  each thread takes a run of the queries over all the keys: scores (R, N), a masked
            softmax, then scores times values. Right for a long chunk over a short context
            (reading the start of a document), where the causal mask is most of the work.
by keys     each thread takes a run of the keys for all the queries, tile by tile, with an
            online softmax (FlashAttention, Dao et al. 2022) whose tile of scores stays in the
            core's L2, and the runs are merged by their log-sum-exp (flash decoding's split
            over the keys). Right for a question after a read document (25 tokens over 31K
            keys: each thread's sgemms get all 150 query rows, and no 9 MB score matrix
            goes through memory three times). It also gives the block masses a question
            votes with (attention/votes.py) from the same scores, when asked.

Splitting by keys pays where there are many keys per query (its merges and per-tile softmax
are overhead that a short context does not repay; a long chunk over few keys stays by
queries): hence ``KEYS_PER_QUERY``.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.expf import ggml_expf
from ..cpu.threads import chunk_groups

_NEG_INF = np.float32(-np.inf)
KEYS_PER_QUERY = 8       # split the keys when there are at least this many per query token
SCORE_FLOATS = 1 << 19   # one thread's tile of scores: 2 MB, the L2 of a Sapphire Rapids core
MAX_TILE = 1024          # keys per tile at most (sgemms of 150 x 1024 x 128 run at full speed)


def attend(qh: np.ndarray, k: np.ndarray, v: np.ndarray, key_pos: np.ndarray, query_pos: np.ndarray,
           group: int, scale: np.float32, n_parts: int, out: np.ndarray, masses=None) -> None:
    """out = softmax_masked(qh k^T * scale) v, the work shared by queries or by keys.

    qh, out  # (T*G, HD) float32: row t*G + g is query head g of token t
    k, v     # (N, HD) float32;  key_pos  # (N,) int64 ascending;  query_pos  # (T,) int64
    masses: by_keys' block masses, which only a split by keys gives (``splits_keys``).
    """
    if splits_keys(k.shape[0], query_pos.shape[0]):
        by_keys(qh, k, v, key_pos, query_pos, group, scale, n_parts, out, masses)
    else:
        if masses is not None:
            raise ValueError(f"block masses come from a split by keys, not {k.shape[0]} keys for "
                             f"{query_pos.shape[0]} queries")
        by_queries(qh, k, v, key_pos, query_pos, group, scale, min(n_parts, query_pos.shape[0]), out)


def splits_keys(n_keys: int, n_queries: int) -> bool:
    """Whether attend shares ``n_keys`` keys for ``n_queries`` query tokens by keys."""
    return n_keys >= KEYS_PER_QUERY * n_queries


@njit(cache=True, nogil=True, parallel=True)
def by_queries(qh, k, v, key_pos, query_pos, group, scale, n_parts, out):
    """attend, each thread taking a run of the queries (shapes as attend's)."""
    n_tok = query_pos.shape[0]
    for c in prange(n_parts):
        t0, t1 = chunk_groups(c, n_parts, n_tok)
        s = np.dot(qh[t0 * group:t1 * group], k.T)                       # (R, N)
        _masked_softmax(s, scale, key_pos, query_pos[t0:t1], group)
        out[t0 * group:t1 * group] = np.dot(s, v)                        # (R, HD)


@njit(cache=True, nogil=True, fastmath=True)
def _masked_softmax(s, scale, key_pos, query_pos, group):
    """In place: row r (query t = r // group) of s (T*G, N) becomes softmax(s * scale) over
    the keys at positions <= query_pos[t]; later keys get 0. key_pos is ascending, so the
    allowed keys are a prefix of the row. exp is ggml's (vectorises, unlike libm's)."""
    n_rows, n_keys = s.shape
    for r in range(n_rows):   # serial: each thread of by_queries runs its own rows
        cnt = np.searchsorted(key_pos, query_pos[r // group], side="right")
        mx = _NEG_INF
        for j in range(cnt):
            mx = max(mx, s[r, j] * scale)
        total = np.float32(0.0)
        for j in range(cnt):
            e = ggml_expf(s[r, j] * scale - mx)
            s[r, j] = e
            total += e
        inv = np.float32(1.0) / total
        for j in range(cnt):
            s[r, j] *= inv
        for j in range(cnt, n_keys):
            s[r, j] = 0.0


@njit(nogil=True, inline="always")
def visible_keys(key_pos, query_pos, group, n_out, n_rows):
    """(n_out,) int64: how many of the ascending ``key_pos`` each query row may see (a prefix:
    the causal mask). Row r is token r // group's; rows from n_rows on (a tile's padding)
    repeat the last one."""
    limit = np.empty(n_out, np.int64)
    for r in range(n_out):
        limit[r] = np.searchsorted(key_pos, query_pos[min(r, n_rows - 1) // group], side="right")
    return limit


def by_keys(qh, k, v, key_pos, query_pos, group, scale, n_parts, out, masses=None):
    """attend, each thread taking a run of the keys, tile by tile (shapes as attend's).

    masses: None, or (row0, block, mass) to have the same scores give the block masses the
    observed queries vote with (attention/votes.py): mass[r - row0, b] = log sum_j exp(scale
    qh[r] . k_j) over the key rows j of block b, [b*block, (b+1)*block), for the rows r >= row0
    and the blocks b < mass.shape[1], which every one of those rows must see whole.
    mass  # (T*G - row0, NB) float32
    """
    if masses is None:
        _by_keys(qh, k, v, key_pos, query_pos, group, scale, n_parts, out, qh.shape[0], 1, _NO_MASS)
    else:
        row0, block, mass = masses
        _by_keys(qh, k, v, key_pos, query_pos, group, scale, n_parts, out, row0, block, mass)


_NO_MASS = np.zeros((0, 0), np.float32)


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _by_keys(qh, k, v, key_pos, query_pos, group, scale, n_parts, out, row0, align, mass):
    """by_keys: the runs and tiles start at multiples of ``align`` (a block, where block masses
    are asked for, so that each block lies in one tile).

    part_m, part_l  # (P, T*G) float32: each run's running max and exp-sum per query row
    part_acc        # (P, T*G, HD) float32: its unnormalised output
    """
    n_rows, head_dim = qh.shape
    n_keys = k.shape[0]
    n_mass = mass.shape[1]
    width = max(64, min(MAX_TILE, SCORE_FLOATS // n_rows))
    width = max(align, width - width % align)
    part_m = np.empty((n_parts, n_rows), np.float32)
    part_l = np.empty((n_parts, n_rows), np.float32)
    part_acc = np.empty((n_parts, n_rows, head_dim), np.float32)
    limit = visible_keys(key_pos, query_pos, group, n_rows, n_rows)   # (T*G,)
    n_units = -(-n_keys // align)
    tile_blocks = width // align + 1
    for c in prange(n_parts):
        u0, u1 = chunk_groups(c, n_parts, n_units)
        j0 = u0 * align
        j1 = min(u1 * align, n_keys)
        m = part_m[c]
        l = part_l[c]
        acc = part_acc[c]
        m[:] = _NEG_INF
        l[:] = 0.0
        acc[:] = 0.0
        buf = np.empty(n_rows * width, np.float32)
        peak = np.empty(tile_blocks, np.float32)       # a row's highest scaled score in each block of the tile
        for t0 in range(j0, j1, width):
            t1 = min(t0 + width, j1)
            w = t1 - t0
            s = buf[:n_rows * w].reshape(n_rows, w)    # (T*G, W) this tile's scores
            np.dot(qh, k[t0:t1].T, s)
            for r in range(n_rows):
                cnt = min(limit[r], t1) - t0
                if cnt <= 0:
                    s[r, :] = 0.0
                    continue
                mx = m[r]
                for j in range(cnt):
                    mx = max(mx, s[r, j] * scale)
                b0 = t0 // align
                b1 = min(-(-t1 // align), n_mass) if r >= row0 else b0
                for b in range(b0, b1):
                    top = _NEG_INF
                    for j in range(b * align - t0, min((b + 1) * align, t1) - t0):
                        top = max(top, s[r, j] * scale)
                    peak[b - b0] = top
                corr = np.float32(np.exp(m[r] - mx)) if m[r] != _NEG_INF else np.float32(0.0)
                total = np.float32(0.0)
                for j in range(cnt):
                    e = ggml_expf(s[r, j] * scale - mx)
                    s[r, j] = e
                    total += e
                for j in range(cnt, w):
                    s[r, j] = 0.0
                l[r] = l[r] * corr + total
                m[r] = mx
                for d in range(head_dim):
                    acc[r, d] *= corr
                # Each block's log-sum-exp is mx + log(its share of the exp-sum); a block so far below
                # the row's running max that its share underflows gets its own highest score (within
                # log(block) of the true mass, its vote nil either way, but never -inf).
                for b in range(b0, b1):
                    part = np.float32(0.0)
                    for j in range(b * align - t0, min((b + 1) * align, t1) - t0):
                        part += s[r, j]
                    mass[r - row0, b] = mx + np.log(part) if part > 0 else peak[b - b0]
            acc += np.dot(s, v[t0:t1])
    for r in prange(n_rows):
        merge_runs(part_m, part_l, part_acc, r, out[r])


@njit(inline="always")
def merge_runs(part_m, part_l, part_acc, r, out):
    """out = row r of the runs' outputs merged by their log-sum-exp (flash decoding):
    each run's unnormalised output weighted by exp(its max - the overall max), divided by the
    weighted exp-sums. Runs that saw no key of the row (max -inf) add nothing.

    part_m, part_l  # (P, R) float32: each run's max and exp-sum per row
    part_acc        # (P, R, HD) float32: each run's unnormalised output
    out             # (HD,) float32, written
    Returns (mm, inv): the overall max and 1 / the total exp-sum (decode credits block mass with them).
    """
    n_parts = part_m.shape[0]
    head_dim = out.shape[0]
    mm = _NEG_INF
    for c in range(n_parts):
        mm = max(mm, part_m[c, r])
    total = np.float32(0.0)
    for d in range(head_dim):
        out[d] = 0.0
    for c in range(n_parts):
        if part_m[c, r] == _NEG_INF:     # no key of this run is visible to the row
            continue
        f = np.float32(np.exp(part_m[c, r] - mm))
        total += f * part_l[c, r]
        for d in range(head_dim):
            out[d] += f * part_acc[c, r, d]
    inv = np.float32(1.0) / total
    for d in range(head_dim):
        out[d] *= inv
    return mm, inv
