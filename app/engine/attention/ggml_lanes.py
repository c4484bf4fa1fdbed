"""The reductions and the softmax of llama.cpp's f16 attention path (no flash attention), as
numba helpers shared by the per-head kernels (dense.py) and the GQA-group kernels
(dense_groups.py): the same lanes and the same trees, so every kernel gives the same bits.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.expf import expf8, ggml_expf
from ..ops.f16 import f16_to_f32
from ..ops.simd import add8, fma8, hadd_sum8, hsum8, load8, load8_2d, splat8, store8, zero8


@njit(inline="always")
def reduce4x8(g0, g1, g2, g3):
    """GGML_F32x8_REDUCE of ggml_vec_dot_f16's four accumulators: sum0 += sum2,
    sum1 += sum3, sum0 += sum1, then the horizontal part."""
    return hadd_sum8(add8(add8(g0, g2), add8(g1, g3)))


@njit(inline="always")
def softmax(s, n):
    """In place: s[:n] = exp(s - max) / sum, as ggml soft_max_f32 (the scale is applied):
    ggml_v_expf, each 8-lane register summed in f32 then added to a double total,
    times (float)(1 / total)  (vec.cpp ggml_vec_soft_max_f32)."""
    s_max = np.float32(-np.inf)
    for j in range(n):
        s_max = max(s_max, s[j])
    minus_max = splat8(-s_max)
    total = 0.0  # ggml_float (double)
    n8 = n - n % 8
    for j0 in range(0, n8, 8):
        e = expf8(add8(load8(s, j0), minus_max))
        store8(e, s, j0)
        total += hsum8(e)
    if n8 < n:  # llama.cpp pads the cells to a multiple of 256 with masked (zero) entries
        g = np.zeros(8, dtype=np.float32)
        for j in range(n8, n):
            s[j] = ggml_expf(s[j] - s_max)
            g[j - n8] = s[j]
        total += hsum8(load8(g, 0))
    inv = np.float32(1.0 / total)
    for j in range(n):
        s[j] = s[j] * inv


@njit(inline="always")
def reduce_lanes32(acc, out):
    """out[d] = GGML_F32x8_REDUCE-order sum of the 32 partial sums acc[:, d]."""
    for d in range(acc.shape[1]):
        x0 = (acc[0, d] + acc[16, d]) + (acc[8, d] + acc[24, d])
        x1 = (acc[1, d] + acc[17, d]) + (acc[9, d] + acc[25, d])
        x2 = (acc[2, d] + acc[18, d]) + (acc[10, d] + acc[26, d])
        x3 = (acc[3, d] + acc[19, d]) + (acc[11, d] + acc[27, d])
        x4 = (acc[4, d] + acc[20, d]) + (acc[12, d] + acc[28, d])
        x5 = (acc[5, d] + acc[21, d]) + (acc[13, d] + acc[29, d])
        x6 = (acc[6, d] + acc[22, d]) + (acc[14, d] + acc[30, d])
        x7 = (acc[7, d] + acc[23, d]) + (acc[15, d] + acc[31, d])
        out[d] = ((x0 + x4) + (x1 + x5)) + ((x2 + x6) + (x3 + x7))


@njit(inline="always")
def reduce_lanes8(acc, out):
    """out[d] = tinyBLAS's hsum order of the 8 partial sums acc[:8, d]:
    ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    for d in range(out.shape[0]):
        out[d] = ((acc[0, d] + acc[4, d]) + (acc[2, d] + acc[6, d])) + \
                 ((acc[1, d] + acc[5, d]) + (acc[3, d] + acc[7, d]))


@njit(inline="always")
def dot_main(k, j, q16, g, n_main):
    """ggml_vec_dot_f16's main loop: K[j] . q16[g] over elements 0 .. n_main (a multiple of
    32) in four 8-lane accumulators over steps of 32, reduced by GGML_F32x8_REDUCE. k's rows
    are f16 bits, or float32 already converted from them (the same values, so the same sums).

    k  # (C, HD) uint16 or float32;  q16  # (G, HD) float32, already rounded to f16
    """
    g0 = zero8()
    g1 = zero8()
    g2 = zero8()
    g3 = zero8()
    for e in range(0, n_main, 32):
        g0 = fma8(load8_2d(k, j, e), load8_2d(q16, g, e), g0)
        g1 = fma8(load8_2d(k, j, e + 8), load8_2d(q16, g, e + 8), g1)
        g2 = fma8(load8_2d(k, j, e + 16), load8_2d(q16, g, e + 16), g2)
        g3 = fma8(load8_2d(k, j, e + 24), load8_2d(q16, g, e + 24), g3)
    return reduce4x8(g0, g1, g2, g3)


@njit(inline="always")
def _fma4(k, j, e, q0, q1, q2, q3, g0, g1, g2, g3):
    """One step of ``dot_main`` for row j: its four accumulators plus K[j, e:e + 32] * q."""
    return (fma8(load8_2d(k, j, e), q0, g0), fma8(load8_2d(k, j, e + 8), q1, g1),
            fma8(load8_2d(k, j, e + 16), q2, g2), fma8(load8_2d(k, j, e + 24), q3, g3))


@njit(inline="always")
def dot_main4(k, j, q16, g, n_main):
    """``dot_main`` of rows j .. j + 3 at once: the same accumulators and order for each row (the
    same bits), sixteen chains in flight instead of four, and each step of q loaded once for the
    four rows (one row at a time waited on its FMAs' latency: 1.3x slower on an AMD EPYC)."""
    a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = zero8()
    c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = zero8()
    for e in range(0, n_main, 32):
        q0, q1 = load8_2d(q16, g, e), load8_2d(q16, g, e + 8)
        q2, q3 = load8_2d(q16, g, e + 16), load8_2d(q16, g, e + 24)
        a0, a1, a2, a3 = _fma4(k, j, e, q0, q1, q2, q3, a0, a1, a2, a3)
        b0, b1, b2, b3 = _fma4(k, j + 1, e, q0, q1, q2, q3, b0, b1, b2, b3)
        c0, c1, c2, c3 = _fma4(k, j + 2, e, q0, q1, q2, q3, c0, c1, c2, c3)
        d0, d1, d2, d3 = _fma4(k, j + 3, e, q0, q1, q2, q3, d0, d1, d2, d3)
    return (reduce4x8(a0, a1, a2, a3), reduce4x8(b0, b1, b2, b3), reduce4x8(c0, c1, c2, c3),
            reduce4x8(d0, d1, d2, d3))


@njit(inline="always")
def vec_dot_f16(k, j, q16, g):
    """K[j] . q16[g] with ggml_vec_dot_f16's lanes: ``dot_main``, then the leftovers
    (HD % 32) added in double.

    k  # (C, HD) uint16 f16 bits;  q16  # (G, HD) float32, already rounded to f16
    """
    head_dim = q16.shape[1]
    n_main = head_dim - head_dim % 32
    dot = np.float64(dot_main(k, j, q16, g, n_main))
    for e in range(n_main, head_dim):
        dot += f16_to_f32(k[j, e]) * q16[g, e]
    return np.float32(dot)
