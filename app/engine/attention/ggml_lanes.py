"""The reductions and the softmax of llama.cpp's f16 attention path (no flash attention), as
numba helpers shared by the per-head kernels (dense.py) and the GQA-group kernels
(dense_groups.py): the same lanes and the same trees, so every kernel gives the same bits.

``WIDE``: the lanes of a llama.cpp built for this CPU. Where the CPU has AVX-512, ggml-cpu's
f16 dot product works in 16-lane registers (simd-mappings.h, __AVX512F__: GGML_F16_STEP 64,
GGML_F16_EPR 16, GGML_F32Cx16_REDUCE ending in _mm512_reduce_add_ps), its softmax sums 16
lanes at a time (vec.cpp ggml_vec_soft_max_f32) and tinyBLAS multiplies f16 on __m512 (one
16-lane accumulator a dot, hsum = _mm512_reduce_add_ps); elsewhere on x86 the 8-lane AVX2
forms (not followed: a native build on a CPU with AVX512-FP16, Sapphire Rapids and later, whose
f16 dot multiplies in f16, 32 lanes a step). The lanes matter: against an AVX-512 build of
llama.cpp, the 8-lane sums (and the AVX2 form of exp, ops/expf.py) add in another order and the
logits part from its logits from a prompt's second position on; with these lanes and that
build's exp, they are its logits bit for bit, prompt and decode steps.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.expf import AVX512_EXPF, expf8, ggml_expf
from ..ops.f16 import f16_to_f32
from ..ops.simd import add8, fma8, hadd_sum8, hmax8, hsum8, load8, load8_2d, max8, splat8, store8, zero8
from ..ops.simd16 import add16, cat8, fma16, hsum16, load16, load16_2d, store16, zero16
from ..ops.simd_int import host_cpu_features

WIDE = bool(host_cpu_features().get("avx512f"))
F16_STEP = 64 if WIDE else 32      # GGML_F16_STEP: elements of one step of ggml_vec_dot_f16's 4 accumulators
TINYBLAS_LANES = 16 if WIDE else 8  # KN of tinyBLAS's f16 kernel


@njit(inline="always")
def reduce4x8(g0, g1, g2, g3):
    """GGML_F32x8_REDUCE of ggml_vec_dot_f16's four accumulators: sum0 += sum2,
    sum1 += sum3, sum0 += sum1, then the horizontal part."""
    return hadd_sum8(add8(add8(g0, g2), add8(g1, g3)))


@njit(inline="always")
def softmax(s, n):
    """In place: s[:n] = exp(s - max) / sum, as ggml soft_max_f32 (the scale is applied):
    ggml_v_expf, each register's lanes summed in f32 then added to a double total, times
    (float)(1 / total)  (vec.cpp ggml_vec_soft_max_f32: 16 lanes under AVX-512 F and DQ, the
    guard of its exp too, so ``AVX512_EXPF``; else 8)."""
    # a max is the same in any order: +0 and -0 subtract alike below, and a NaN score makes every
    # output NaN either way
    s_max = np.float32(-np.inf)
    n8 = n - n % 8
    if n8 > 0:
        m = load8(s, 0)
        for j0 in range(8, n8, 8):
            m = max8(m, load8(s, j0))
        s_max = hmax8(m)
    for j in range(n8, n):
        s_max = max(s_max, s[j])
    minus_max = splat8(-s_max)
    total = 0.0  # ggml_float (double)
    width = 16 if AVX512_EXPF else 8
    n_main = n - n % width
    for j0 in range(0, n_main, width):
        e = expf8(add8(load8(s, j0), minus_max))
        store8(e, s, j0)
        if AVX512_EXPF:
            e2 = expf8(add8(load8(s, j0 + 8), minus_max))
            store8(e2, s, j0 + 8)
            total += hsum16(cat8(e, e2))
        else:
            total += hsum8(e)
    if n_main < n:  # llama.cpp pads the cells to a multiple of 256 with masked (zero) entries
        g = np.zeros(16, dtype=np.float32)
        for j in range(n_main, n):
            s[j] = ggml_expf(s[j] - s_max)
            g[j - n_main] = s[j]
        total += hsum16(load16(g, 0)) if AVX512_EXPF else hsum8(load8(g, 0))
    inv = np.float32(1.0 / total)
    for j in range(n):
        s[j] = s[j] * inv


# The reductions of lane sums below run 16 output dims at a time: each dim's adds are the scalar
# ones in the same order (lane-wise IEEE adds), so the same bits; one scalar add per element and
# per lane cost as much as the decode kernel's multiply-adds at 512 keys.
# acc # (>= n_acc, HD) float32;  out # (HD,) float32, C-contiguous (stored 16 dims at a time).


@njit(inline="always")
def _sum4(acc, a, b, c, e, d):
    """(acc[a] + acc[b]) + (acc[c] + acc[e]) at dims d .. d + 15."""
    return add16(add16(load16_2d(acc, a, d), load16_2d(acc, b, d)), add16(load16_2d(acc, c, d), load16_2d(acc, e, d)))


@njit(inline="always")
def _sum2(acc, a, b, d):
    """acc[a] + acc[b] at dims d .. d + 15."""
    return add16(load16_2d(acc, a, d), load16_2d(acc, b, d))


@njit(inline="always")
def _tree8v(x0, x1, x2, x3, x4, x5, x6, x7):
    """((x0 + x4) + (x1 + x5)) + ((x2 + x6) + (x3 + x7)), lane-wise: hadd_sum8's order per dim (the end of
    GGML_F32x8_REDUCE; not tinyBLAS's hsum8, which pairs (x0 + x4) with (x2 + x6))."""
    return add16(add16(add16(x0, x4), add16(x1, x5)), add16(add16(x2, x6), add16(x3, x7)))


@njit(inline="always")
def _tree16v(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15):
    """``_tree16`` lane-wise."""
    t0 = add16(add16(x0, x8), add16(x4, x12))
    t1 = add16(add16(x1, x9), add16(x5, x13))
    t2 = add16(add16(x2, x10), add16(x6, x14))
    t3 = add16(add16(x3, x11), add16(x7, x15))
    return add16(add16(t0, t2), add16(t1, t3))


@njit(inline="always")
def reduce_lanes32(acc, out):
    """out[d] = GGML_F32x8_REDUCE-order sum of the 32 partial sums acc[:, d]."""
    head_dim = out.shape[0]
    n_vec = head_dim - head_dim % 16
    for d in range(0, n_vec, 16):
        store16(_tree8v(_sum4(acc, 0, 16, 8, 24, d), _sum4(acc, 1, 17, 9, 25, d), _sum4(acc, 2, 18, 10, 26, d),
                        _sum4(acc, 3, 19, 11, 27, d), _sum4(acc, 4, 20, 12, 28, d), _sum4(acc, 5, 21, 13, 29, d),
                        _sum4(acc, 6, 22, 14, 30, d), _sum4(acc, 7, 23, 15, 31, d)), out, d)
    for d in range(n_vec, head_dim):
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
def _tree16(x0, x1, x2, x3, x4, x5, x6, x7, x8, x9, x10, x11, x12, x13, x14, x15):
    """_mm512_reduce_add_ps's order (as ops/simd16.py hsum16): halves added pairwise down to one."""
    t0, t1, t2, t3 = (x0 + x8) + (x4 + x12), (x1 + x9) + (x5 + x13), (x2 + x10) + (x6 + x14), (x3 + x11) + (x7 + x15)
    return (t0 + t2) + (t1 + t3)


@njit(inline="always")
def reduce_lanes64(acc, out):
    """out[d] = GGML_F32Cx16_REDUCE-order sum of the 64 partial sums acc[:, d] (four 16-lane
    accumulators: the first plus the third, the second plus the fourth, those two, then the
    16 lanes)."""
    head_dim = out.shape[0]
    n_vec = head_dim - head_dim % 16
    for d in range(0, n_vec, 16):
        store16(_tree16v(_sum4(acc, 0, 32, 16, 48, d), _sum4(acc, 1, 33, 17, 49, d), _sum4(acc, 2, 34, 18, 50, d),
                         _sum4(acc, 3, 35, 19, 51, d), _sum4(acc, 4, 36, 20, 52, d), _sum4(acc, 5, 37, 21, 53, d),
                         _sum4(acc, 6, 38, 22, 54, d), _sum4(acc, 7, 39, 23, 55, d), _sum4(acc, 8, 40, 24, 56, d),
                         _sum4(acc, 9, 41, 25, 57, d), _sum4(acc, 10, 42, 26, 58, d), _sum4(acc, 11, 43, 27, 59, d),
                         _sum4(acc, 12, 44, 28, 60, d), _sum4(acc, 13, 45, 29, 61, d),
                         _sum4(acc, 14, 46, 30, 62, d), _sum4(acc, 15, 47, 31, 63, d)), out, d)
    for d in range(n_vec, head_dim):
        x = np.empty(16, dtype=np.float32)
        for i in range(16):
            x[i] = (acc[i, d] + acc[32 + i, d]) + (acc[16 + i, d] + acc[48 + i, d])
        out[d] = _tree16(x[0], x[1], x[2], x[3], x[4], x[5], x[6], x[7],
                         x[8], x[9], x[10], x[11], x[12], x[13], x[14], x[15])


@njit(inline="always")
def reduce_lanes16(acc, out):
    """out[d] = tinyBLAS's hsum (_mm512_reduce_add_ps) of the 16 partial sums acc[:16, d]."""
    head_dim = out.shape[0]
    n_vec = head_dim - head_dim % 16
    for d in range(0, n_vec, 16):
        store16(_tree16v(load16_2d(acc, 0, d), load16_2d(acc, 1, d), load16_2d(acc, 2, d), load16_2d(acc, 3, d),
                         load16_2d(acc, 4, d), load16_2d(acc, 5, d), load16_2d(acc, 6, d), load16_2d(acc, 7, d),
                         load16_2d(acc, 8, d), load16_2d(acc, 9, d), load16_2d(acc, 10, d), load16_2d(acc, 11, d),
                         load16_2d(acc, 12, d), load16_2d(acc, 13, d), load16_2d(acc, 14, d),
                         load16_2d(acc, 15, d)), out, d)
    for d in range(n_vec, head_dim):
        out[d] = _tree16(acc[0, d], acc[1, d], acc[2, d], acc[3, d], acc[4, d], acc[5, d], acc[6, d], acc[7, d],
                         acc[8, d], acc[9, d], acc[10, d], acc[11, d], acc[12, d], acc[13, d], acc[14, d], acc[15, d])


@njit(inline="always")
def reduce_lanes(acc, n_acc, out):
    """out[d] = the sum of acc[:n_acc, d] in the order of the f16 product with that many lanes:
    64 or 32 (ggml_vec_dot_f16, WIDE or not), 16 or 8 (tinyBLAS)."""
    if n_acc == 64:
        reduce_lanes64(acc, out)
    elif n_acc == 32:
        reduce_lanes32(acc, out)
    elif n_acc == 16:
        reduce_lanes16(acc, out)
    else:
        reduce_lanes8(acc, out)


@njit(inline="always")
def reduce_lanes8(acc, out):
    """out[d] = tinyBLAS's hsum order of the 8 partial sums acc[:8, d]:
    ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))."""
    head_dim = out.shape[0]
    n_vec = head_dim - head_dim % 16
    for d in range(0, n_vec, 16):
        store16(add16(add16(_sum2(acc, 0, 4, d), _sum2(acc, 2, 6, d)), add16(_sum2(acc, 1, 5, d), _sum2(acc, 3, 7, d))),
                out, d)
    for d in range(n_vec, head_dim):
        out[d] = ((acc[0, d] + acc[4, d]) + (acc[2, d] + acc[6, d])) + \
                 ((acc[1, d] + acc[5, d]) + (acc[3, d] + acc[7, d]))


@njit(inline="always")
def reduce4x16(g0, g1, g2, g3):
    """GGML_F32Cx16_REDUCE of ggml_vec_dot_f16's four 16-lane accumulators: sum0 += sum2,
    sum1 += sum3, sum0 += sum1, then _mm512_reduce_add_ps."""
    return hsum16(add16(add16(g0, g2), add16(g1, g3)))


def _dot_kernels(load, fma, zero, reduce4, lanes):
    """ggml_vec_dot_f16's main loop in registers of ``lanes`` (one row, and four rows at once),
    built from that width's intrinsics: the 8-lane and 16-lane kernels are one body."""
    step = 4 * lanes

    @njit(inline="always")
    def one_row(k, j, q16, g, n_main):
        g0 = zero()
        g1 = zero()
        g2 = zero()
        g3 = zero()
        for e in range(0, n_main, step):
            g0 = fma(load(k, j, e), load(q16, g, e), g0)
            g1 = fma(load(k, j, e + lanes), load(q16, g, e + lanes), g1)
            g2 = fma(load(k, j, e + 2 * lanes), load(q16, g, e + 2 * lanes), g2)
            g3 = fma(load(k, j, e + 3 * lanes), load(q16, g, e + 3 * lanes), g3)
        return reduce4(g0, g1, g2, g3)

    @njit(inline="always")
    def fma4(k, j, e, q0, q1, q2, q3, g0, g1, g2, g3):
        """One step of row j: its four accumulators plus K[j, e:e + step] * q."""
        return (fma(load(k, j, e), q0, g0), fma(load(k, j, e + lanes), q1, g1),
                fma(load(k, j, e + 2 * lanes), q2, g2), fma(load(k, j, e + 3 * lanes), q3, g3))

    @njit(inline="always")
    def four_rows(k, j, q16, g, n_main):
        a0 = a1 = a2 = a3 = b0 = b1 = b2 = b3 = zero()
        c0 = c1 = c2 = c3 = d0 = d1 = d2 = d3 = zero()
        for e in range(0, n_main, step):
            q0, q1 = load(q16, g, e), load(q16, g, e + lanes)
            q2, q3 = load(q16, g, e + 2 * lanes), load(q16, g, e + 3 * lanes)
            a0, a1, a2, a3 = fma4(k, j, e, q0, q1, q2, q3, a0, a1, a2, a3)
            b0, b1, b2, b3 = fma4(k, j + 1, e, q0, q1, q2, q3, b0, b1, b2, b3)
            c0, c1, c2, c3 = fma4(k, j + 2, e, q0, q1, q2, q3, c0, c1, c2, c3)
            d0, d1, d2, d3 = fma4(k, j + 3, e, q0, q1, q2, q3, d0, d1, d2, d3)
        return (reduce4(a0, a1, a2, a3), reduce4(b0, b1, b2, b3), reduce4(c0, c1, c2, c3),
                reduce4(d0, d1, d2, d3))

    return one_row, four_rows


# dot_main: K[j] . q16[g] over elements 0 .. n_main (a multiple of 32) in four 8-lane accumulators
# over steps of 32, reduced by GGML_F32x8_REDUCE; k's rows are f16 bits, or float32 already
# converted from them (the same values, so the same sums). k # (C, HD) uint16 or float32;
# q16 # (G, HD) float32, already rounded to f16. dot_main4: rows j .. j + 3 at once, the same
# accumulators and order for each row (the same bits), sixteen chains in flight and each step of
# q loaded once for the four rows (one row at a time waits on its FMAs' latency, with a single
# chain per accumulator). dot_main16 / dot_main16x4: the same in 16-lane registers (WIDE),
# steps of 64, reduced as GGML_F32Cx16_REDUCE; n_main a multiple of 64.
dot_main, dot_main4 = _dot_kernels(load8_2d, fma8, zero8, reduce4x8, 8)
dot_main16, dot_main16x4 = _dot_kernels(load16_2d, fma16, zero16, reduce4x16, 16)
# The width a llama.cpp built for this CPU takes (WIDE), for kernels that follow it.
dot_row, dot_rows4 = (dot_main16, dot_main16x4) if WIDE else (dot_main, dot_main4)


@njit(inline="always")
def vec_dot_f16(k, j, q16, g):
    """K[j] . q16[g] with ggml_vec_dot_f16's lanes: ``dot_row`` (``dot_main``, or ``dot_main16``
    where WIDE), then the leftovers (HD % F16_STEP) added in double.

    k  # (C, HD) uint16 f16 bits;  q16  # (G, HD) float32, already rounded to f16
    """
    head_dim = q16.shape[1]
    n_main = head_dim - head_dim % F16_STEP
    dot = np.float64(dot_row(k, j, q16, g, n_main))
    for e in range(n_main, head_dim):
        dot += f16_to_f32(k[j, e]) * q16[g, e]
    return np.float32(dot)
