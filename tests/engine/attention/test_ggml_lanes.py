"""The f16 attention sums of attention/ggml_lanes.py against numpy models of ggml's orders, in
both widths, on any CPU: ggml_vec_dot_f16 with 4 accumulators of 8 lanes reduced by
GGML_F32x8_REDUCE (an AVX2 build), or of 16 lanes reduced by GGML_F32Cx16_REDUCE and
_mm512_reduce_add_ps (an AVX-512 build), and the trees of the value sums. The engine takes the
width a llama.cpp built for its CPU takes (``WIDE``); these check both whichever that is."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from app.engine.attention.ggml_lanes import (dot_main, dot_main4, dot_main16, dot_main16x4, reduce_lanes,
                                             reduce_lanes8, reduce_lanes16, reduce_lanes32, reduce_lanes64, softmax)

F = np.float32


def _fma(a, b, c):
    """float32 fma: the product exact in 80-bit long double, rounded there and then to float32 (a
    second rounding lands on a float32 tie about once in 2**40)."""
    ld = np.longdouble
    return (ld(a) * ld(b) + ld(c)).astype(F)


def _reduce16(x):
    """_mm512_reduce_add_ps (GCC and clang): halves of 8 added, then of 4, of 2, of 1."""
    t = (x[:8] + x[8:]).astype(F)
    t = (t[:4] + t[4:]).astype(F)
    t = (t[:2] + t[2:]).astype(F)
    return F(t[0] + t[1])


def _reduce8_hadd(x):
    """The end of GGML_F32x8_REDUCE: low + high 128 bits, then two _mm_hadd_ps."""
    t = (x[:4] + x[4:]).astype(F)
    return F(F(t[0] + t[1]) + F(t[2] + t[3]))


def _ggml_dot(k, q, lanes):
    """ggml_vec_dot_f16's main loop: 4 accumulators of ``lanes`` over steps of 4 * lanes, then
    acc0 + acc2, acc1 + acc3, their sum, and the horizontal sum of that register."""
    acc = np.zeros((4, lanes), F)
    for e in range(0, len(q), 4 * lanes):
        for a in range(4):
            s = slice(e + a * lanes, e + (a + 1) * lanes)
            acc[a] = _fma(k[s], q[s], acc[a])
    x = ((acc[0] + acc[2]).astype(F) + (acc[1] + acc[3]).astype(F)).astype(F)
    return _reduce16(x) if lanes == 16 else _reduce8_hadd(x)


@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_dot_products_take_ggmls_order_in_both_widths(head_dim):
    rng = np.random.default_rng(head_dim)
    k = rng.standard_normal((200, head_dim)).astype(np.float16)     # (rows, HD) key rows
    q = rng.standard_normal((1, head_dim)).astype(np.float16).astype(F)   # (1, HD) q rounded to f16
    bits = k.view(np.uint16)
    kf = k.astype(F)
    for j in range(200):
        assert dot_main(bits, j, q, 0, head_dim) == _ggml_dot(kf[j], q[0], 8)
        assert dot_main16(bits, j, q, 0, head_dim) == _ggml_dot(kf[j], q[0], 16)
    for j in (0, 4):   # four rows at a time: each row's own accumulators, the same bits
        assert dot_main4(kf, j, q, 0, head_dim) == tuple(dot_main(kf, j + i, q, 0, head_dim) for i in range(4))
        assert dot_main16x4(kf, j, q, 0, head_dim) == tuple(dot_main16(kf, j + i, q, 0, head_dim) for i in range(4))
    # the two orders are different sums: over many rows some differ in the last bit
    many = rng.standard_normal((400, head_dim)).astype(np.float16)
    differ = sum(dot_main(many.view(np.uint16), j, q, 0, head_dim) != dot_main16(many.view(np.uint16), j, q, 0, head_dim)
                 for j in range(400))
    assert differ > 0


def test_value_sums_reduce_in_ggmls_trees():
    """Each output dim summed in ggml's tree, whether it falls in the kernels' 16-dim vector steps
    (dims 0-31 here) or in the scalar tail (32-36)."""
    rng = np.random.default_rng(7)
    head_dim = 37
    acc = rng.standard_normal((64, head_dim)).astype(F)      # (lanes, HD) partial sums
    out = np.empty(head_dim, F)
    reduce_lanes64(acc, out)
    for d in range(head_dim):
        a = acc[:, d]   # partial sum j % 64: accumulator (j % 64) // 16, lane j % 16
        x = ((a[0:16] + a[32:48]).astype(F) + (a[16:32] + a[48:64]).astype(F)).astype(F)
        assert out[d] == _reduce16(x)
    reduce_lanes16(acc, out)
    assert out.tolist() == [_reduce16(acc[:16, d]) for d in range(head_dim)]
    reduce_lanes32(acc, out)
    for d in range(head_dim):   # 4 accumulators of 8 lanes: GGML_F32x8_REDUCE
        a = acc[:32, d]
        x = ((a[0:8] + a[16:24]).astype(F) + (a[8:16] + a[24:32]).astype(F)).astype(F)
        assert out[d] == _reduce8_hadd(x)
    reduce_lanes8(acc, out)
    for d in range(head_dim):   # tinyBLAS's hsum of 8 lanes
        a = acc[:8, d]
        t = (a[:4] + a[4:]).astype(F)
        assert out[d] == F(F(t[0] + t[2]) + F(t[1] + t[3]))
    for n_acc in (64, 32, 16, 8):      # the dispatcher picks the tree of each width
        got = np.empty(head_dim, F)
        reduce_lanes(acc, n_acc, got)
        assert np.allclose(got, acc[:n_acc].sum(axis=0, dtype=np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("n", [1, 7, 8, 9, 16, 23, 37])
def test_the_softmax_subtracts_the_largest_score_wherever_it_lies(n):
    """The max goes 8 lanes at a time and then through the leftovers: a score of 200 among zeros, at
    every position, must come out as probability 1 (a max that missed it would leave exp(200) = inf,
    and inf / inf = NaN); scores all alike, however negative, share the mass equally."""
    run = njit(lambda s, n: softmax(s, n))
    for spike in range(n):
        s = np.zeros(n + 2, F)
        s[spike] = 200.0
        s[n:] = 1000.0          # beyond n: not part of the softmax
        run(s, n)
        assert s[spike] == 1.0 and np.all(s[:n][np.arange(n) != spike] == 0.0)
    s = np.full(n, -3000.0, F)
    run(s, n)
    assert np.allclose(s, 1.0 / n, rtol=1e-6)
