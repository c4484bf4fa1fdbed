"""One decoded block of the blocked KV cache against the query heads of its GQA group: the
scores, their exponentials, the weighted values (attention/blocks.py's decode kernel runs them
block after block with an online softmax).

The block's keys and values are decoded to float32 once (B x HD, in L1) and read by every query
head of the group. Where the head size is a multiple of 32 the products are 16 lanes wide
(ops/simd16.py; plain loops otherwise): keys four at a time, their four sums reduced together,
and each value row loaded once for three query heads (Qwen2.5-1.5B's shapes: 6 query heads per
KV head, HD 128, blocks of 64 tokens): fewer loads and more FMA chains in flight than one key
and one head at a time. docs/benchmarks.md has the long-context decode figures.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.expf import expf8, ggml_expf
from ..ops.simd import add8, fma8, hmax8, hsum8, load8_2d, max8, splat8, store8_2d, zero8
from ..ops.simd16 import add16, fma16, hsum16, load16_2d, store_sums4, zero16

_NEG_INF = np.float32(-np.inf)


@njit(inline="always")
def scores(k, qr, n_valid, scale, s):
    """s[g, j] = (qr[g] . k[j]) * scale for the query heads g of one KV head over one block.

    k  # (>= n_valid, HD) float32;  qr  # (G, HD) float32;  s  # (G, >= n_valid) float32
    """
    if qr.shape[1] % 32 == 0:
        _scores16(k, qr, n_valid, scale, s)
    else:
        _scores_any(k, qr, n_valid, scale, s)


@njit(inline="always")
def exp_block(s, g, n_valid):
    """s[g, :n_valid] = exp(s[g] - its max), 8 lanes at a time (ggml_v_expf); returns (the max,
    the sum of the exponentials).

    s  # (G, >= n_valid) float32 scores, overwritten
    """
    n8 = n_valid - n_valid % 8
    m8 = splat8(_NEG_INF)
    for j in range(0, n8, 8):
        m8 = max8(m8, load8_2d(s, g, j))
    bm = hmax8(m8)
    for j in range(n8, n_valid):
        bm = max(bm, s[g, j])
    minus = splat8(-bm)
    t8 = zero8()
    for j in range(0, n8, 8):
        e = expf8(add8(load8_2d(s, g, j), minus))
        store8_2d(e, s, g, j)
        t8 = add8(t8, e)
    bs = hsum8(t8)
    for j in range(n8, n_valid):
        e = ggml_expf(s[g, j] - bm)
        s[g, j] = e
        bs += e
    return bm, bs


@njit(inline="always")
def add_values(v, p, n_valid, acc):
    """acc[g] += sum_j p[g, j] v[j] for every query head g of the group, over one block: three
    heads at a time, then one at a time.

    v  # (>= n_valid, HD) float32;  p  # (G, >= n_valid) float32;  acc  # (G, HD) float32
    """
    group, head_dim = p.shape[0], v.shape[1]
    if head_dim % 32:
        for g in range(group):
            _add_values_any(v, p, g, n_valid, acc)
        return
    threes = group - group % 3
    for g in range(0, threes, 3):
        _add_values3(v, p, g, n_valid, acc)
    for g in range(threes, group):
        _add_values1(v, p, g, n_valid, acc)


# ---- 16 lanes (HD % 32 == 0) ------------------------------------------------------------------


@njit(inline="always")
def _scores16(k, qr, n_valid, scale, s):
    """``scores`` 16 lanes wide: four keys at a time with two sums each (eight FMA chains in
    flight), the four sums reduced together (``store_sums4``). Not eight keys at a time: twice
    the accumulators, and the registers spill."""
    group, head_dim = qr.shape
    j0 = n_valid - n_valid % 4
    for j in range(0, j0, 4):
        for g in range(group):
            a0 = a1 = b0 = b1 = c0 = c1 = d0 = d1 = zero16()
            for e in range(0, head_dim, 32):
                q0 = load16_2d(qr, g, e)
                q1 = load16_2d(qr, g, e + 16)
                a0 = fma16(load16_2d(k, j, e), q0, a0)
                a1 = fma16(load16_2d(k, j, e + 16), q1, a1)
                b0 = fma16(load16_2d(k, j + 1, e), q0, b0)
                b1 = fma16(load16_2d(k, j + 1, e + 16), q1, b1)
                c0 = fma16(load16_2d(k, j + 2, e), q0, c0)
                c1 = fma16(load16_2d(k, j + 2, e + 16), q1, c1)
                d0 = fma16(load16_2d(k, j + 3, e), q0, d0)
                d1 = fma16(load16_2d(k, j + 3, e + 16), q1, d1)
            store_sums4(add16(a0, a1), add16(b0, b1), add16(c0, c1), add16(d0, d1), scale, s, g, j)
    for j in range(j0, n_valid):
        for g in range(group):
            a0 = a1 = zero16()
            for e in range(0, head_dim, 32):
                a0 = fma16(load16_2d(k, j, e), load16_2d(qr, g, e), a0)
                a1 = fma16(load16_2d(k, j, e + 16), load16_2d(qr, g, e + 16), a1)
            s[g, j] = hsum16(add16(a0, a1)) * scale


@njit(inline="always")
def _add_values3(v, p, g, n_valid, acc):
    """acc[g + c] += sum_j p[g + c, j] v[j] for c < 3: 32 dims at a time, each row of v loaded
    once for the three heads (a head at a time read the block from L2 once per head). The
    twelve sums and the four rows fit AVX-512's 32 registers (AVX2's 16 would spill)."""
    head_dim = v.shape[1]
    for e in range(0, head_dim, 32):
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = c0 = c1 = c2 = c3 = zero8()
        for j in range(n_valid):
            pa = splat8(p[g, j])
            pb = splat8(p[g + 1, j])
            pc = splat8(p[g + 2, j])
            v0 = load8_2d(v, j, e)
            v1 = load8_2d(v, j, e + 8)
            v2 = load8_2d(v, j, e + 16)
            v3 = load8_2d(v, j, e + 24)
            a0, a1, a2, a3 = fma8(v0, pa, a0), fma8(v1, pa, a1), fma8(v2, pa, a2), fma8(v3, pa, a3)
            b0, b1, b2, b3 = fma8(v0, pb, b0), fma8(v1, pb, b1), fma8(v2, pb, b2), fma8(v3, pb, b3)
            c0, c1, c2, c3 = fma8(v0, pc, c0), fma8(v1, pc, c1), fma8(v2, pc, c2), fma8(v3, pc, c3)
        _add4(acc, g, e, a0, a1, a2, a3)
        _add4(acc, g + 1, e, b0, b1, b2, b3)
        _add4(acc, g + 2, e, c0, c1, c2, c3)


@njit(inline="always")
def _add_values1(v, p, g, n_valid, acc):
    """acc[g] += sum_j p[g, j] v[j] for one head: 32 dims and two keys at a time (eight FMA
    chains), the sums kept in registers across the block."""
    head_dim = v.shape[1]
    j0 = n_valid - n_valid % 2
    for e in range(0, head_dim, 32):
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = zero8()
        for j in range(0, j0, 2):
            a0, a1, a2, a3 = _fma_row(v, j, e, splat8(p[g, j]), a0, a1, a2, a3)
            b0, b1, b2, b3 = _fma_row(v, j + 1, e, splat8(p[g, j + 1]), b0, b1, b2, b3)
        if j0 < n_valid:
            a0, a1, a2, a3 = _fma_row(v, j0, e, splat8(p[g, j0]), a0, a1, a2, a3)
        _add4(acc, g, e, add8(a0, b0), add8(a1, b1), add8(a2, b2), add8(a3, b3))


@njit(inline="always")
def _fma_row(v, j, e, pj, a0, a1, a2, a3):
    """(a0, a1, a2, a3) + pj * v[j, e:e + 32]: four 8-lane FMAs."""
    return (fma8(load8_2d(v, j, e), pj, a0), fma8(load8_2d(v, j, e + 8), pj, a1),
            fma8(load8_2d(v, j, e + 16), pj, a2), fma8(load8_2d(v, j, e + 24), pj, a3))


@njit(inline="always")
def _add4(acc, g, e, a0, a1, a2, a3):
    """acc[g, e:e + 32] += (a0, a1, a2, a3)."""
    store8_2d(add8(a0, load8_2d(acc, g, e)), acc, g, e)
    store8_2d(add8(a1, load8_2d(acc, g, e + 8)), acc, g, e + 8)
    store8_2d(add8(a2, load8_2d(acc, g, e + 16)), acc, g, e + 16)
    store8_2d(add8(a3, load8_2d(acc, g, e + 24)), acc, g, e + 24)


# ---- Any HD --------------------------------------------------------------------------------------


@njit(inline="always")
def _scores_any(k, qr, n_valid, scale, s):
    group, head_dim = qr.shape
    for j in range(n_valid):
        for g in range(group):
            acc = np.float32(0.0)
            for d in range(head_dim):
                acc += qr[g, d] * k[j, d]
            s[g, j] = acc * scale


@njit(inline="always")
def _add_values_any(v, p, g, n_valid, acc):
    for j in range(n_valid):
        pj = p[g, j]
        for d in range(v.shape[1]):
            acc[g, d] += pj * v[j, d]
