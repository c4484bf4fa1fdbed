"""Causal multi-head attention (GQA) over the f16 KV cache, as numba kernels.

Numerics follow llama.cpp's CPU path without flash attention
(src/llama-graph.cpp ``build_attn_mha``, non-flash branch) operation by operation:

  kq  = mul_mat(k, q)     K is f16, so ggml converts q to f16 (the vec_dot_type of
                          GGML_TYPE_F16, ggml-cpu/ggml-cpu.c type_traits_cpu);
  kq  = soft_max_ext(kq, mask, scale)   f32: x*scale (+0 mask), max, ggml_v_expf(x - max),
                          8-lane partial sums added in double, times (float)(1/sum)
                          (ggml-cpu/ops.cpp soft_max_f32, vec.cpp ggml_vec_soft_max_f32);
  kqv = mul_mat(v, kq)    V is f16, so the probabilities are rounded to f16 too.

The two f16 matmuls accumulate with FMAs into SIMD lanes whose layout depends on the batch:
one query token (decode) goes through ggml_vec_dot_f16 (vec.cpp: 4 accumulators x 8 lanes,
reduced by GGML_F32x8_REDUCE), two or more (prefill) through llamafile's tinyBLAS
(llamafile/sgemm.cpp: one 8-lane accumulator, then hsum). We keep the same lanes and the
same reduction trees, so for the same inputs the outputs agree bit for bit; the cost is
nil, the lanes are what SIMD code does anyway.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..kv.dense import KVCache
from ..quant.layout import num_threads
from ..ops.expf import expf8, ggml_expf
from ..ops.f16 import f16_to_f32, round_f16
from ..ops.simd import (
    add8,
    fma8,
    hadd_sum8,
    hsum8,
    load8,
    load8_2d,
    splat8,
    store8,
    store8_2d,
    zero8,
)


@njit(inline="always")
def _reduce4x8(g0, g1, g2, g3):
    """GGML_F32x8_REDUCE of ggml_vec_dot_f16's four accumulators: sum0 += sum2,
    sum1 += sum3, sum0 += sum1, then the horizontal part."""
    return hadd_sum8(add8(add8(g0, g2), add8(g1, g3)))


# ---- Kernels ---------------------------------------------------------------------------


@njit(inline="always")
def _scores_tinyblas(k, q16, n_kv, scale, s):
    """s[j] = (K[j] . q16) * scale with tinyBLAS's lanes: one 8-lane FMA accumulator per
    dot product, then hsum. Four rows at a time, for independent FMA chains.

    k  # (C, HD) uint16 f16 bits;  q16  # (HD,) float32;  s  # (>= n_kv,) float32
    """
    head_dim = q16.shape[0]
    j = 0
    while j + 4 <= n_kv:
        a0 = zero8()
        a1 = zero8()
        a2 = zero8()
        a3 = zero8()
        for e in range(0, head_dim, 8):
            qe = load8(q16, e)
            a0 = fma8(load8_2d(k, j, e), qe, a0)
            a1 = fma8(load8_2d(k, j + 1, e), qe, a1)
            a2 = fma8(load8_2d(k, j + 2, e), qe, a2)
            a3 = fma8(load8_2d(k, j + 3, e), qe, a3)
        s[j] = hsum8(a0) * scale
        s[j + 1] = hsum8(a1) * scale
        s[j + 2] = hsum8(a2) * scale
        s[j + 3] = hsum8(a3) * scale
        j += 4
    while j < n_kv:
        a0 = zero8()
        for e in range(0, head_dim, 8):
            a0 = fma8(load8_2d(k, j, e), load8(q16, e), a0)
        s[j] = hsum8(a0) * scale
        j += 1


@njit(inline="always")
def _scores_vec_dot(k, q16, n_kv, scale, s):
    """s[j] = (K[j] . q16) * scale with ggml_vec_dot_f16's lanes: four 8-lane accumulators
    over steps of 32, reduced by GGML_F32x8_REDUCE; leftovers (HD % 32) added in double."""
    head_dim = q16.shape[0]
    n_main = head_dim - head_dim % 32
    for j in range(n_kv):
        g0 = zero8()
        g1 = zero8()
        g2 = zero8()
        g3 = zero8()
        for e in range(0, n_main, 32):
            g0 = fma8(load8_2d(k, j, e), load8(q16, e), g0)
            g1 = fma8(load8_2d(k, j, e + 8), load8(q16, e + 8), g1)
            g2 = fma8(load8_2d(k, j, e + 16), load8(q16, e + 16), g2)
            g3 = fma8(load8_2d(k, j, e + 24), load8(q16, e + 24), g3)
        dot = np.float64(_reduce4x8(g0, g1, g2, g3))
        for e in range(n_main, head_dim):
            dot += f16_to_f32(k[j, e]) * q16[e]
        s[j] = np.float32(dot) * scale


@njit(inline="always")
def _softmax(s, n):
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
def _reduce_lanes32(acc, out):
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
def _weighted_values(p, v, n_kv, n_acc, acc, out):
    """out = sum_j f16(p[j]) * V[j] with the lanes of the matching f16 matmul: partial sum
    j % n_acc (32: ggml_vec_dot_f16, 8: tinyBLAS) by FMA in j order, then that reduction.
    (llama.cpp stores V transposed and runs one dot product per output dim; the lanes are
    the same.)

    p  # (>= n_kv,) float32;  v  # (C, HD) uint16 f16 bits
    acc  # (32, HD) float32 scratch;  out  # (HD,) float32
    """
    head_dim = v.shape[1]
    lane_mask = n_acc - 1
    acc[:n_acc] = 0.0
    for j in range(n_kv):
        pj = round_f16(p[j])
        if pj != 0.0:
            pv = splat8(pj)
            lane = j & lane_mask
            for d in range(0, head_dim, 8):
                store8_2d(fma8(load8_2d(v, j, d), pv, load8_2d(acc, lane, d)), acc, lane, d)
    if n_acc == 32:
        _reduce_lanes32(acc, out)
        return
    for d in range(head_dim):
        out[d] = ((acc[0, d] + acc[4, d]) + (acc[2, d] + acc[6, d])) + \
                 ((acc[1, d] + acc[5, d]) + (acc[3, d] + acc[7, d]))


def _attend_kernel(q, k_bits, v_bits, layer, pos0, scale, window, out):
    """out[t, h] = softmax(q[t, h] . K[j0:pos0+t+1] * scale) @ V[j0:pos0+t+1]  for each query,
    j0 = 0, or with a sliding ``window`` the first of the last ``window`` positions (gemma3:
    llama.cpp masks key p0 from query p1 when p1 - p0 >= n_swa, llama-hparams.cpp is_masked_swa;
    masked keys add exp(-inf) = 0, so leaving them out is the same sum).

    q       # (T, H, HD) float32, RoPE applied, query t sits at position pos0 + t
    k_bits  # (L, KVH, C, HD) uint16 (f16 bits), positions < pos0 + T filled
    v_bits  # (L, KVH, C, HD) uint16 (f16 bits)
    out     # (T, H, HD) float32
    """
    n_q, n_heads, head_dim = q.shape
    group = n_heads // k_bits.shape[1]
    # llama.cpp: one token -> ggml_vec_dot_f16 (32 partial sums); two or more -> tinyBLAS
    # (8 partial sums). The lanes of K.q follow HD, those of p.V follow the cell index.
    batched = n_q >= 2
    n_acc = 8 if batched else 32
    for item in prange(n_q * n_heads):
        t = item // n_heads
        h = item - t * n_heads
        n_kv = pos0 + t + 1
        j0 = max(0, n_kv - window) if window > 0 else 0
        k = k_bits[layer, h // group, j0:]  # (C - j0, HD) uint16
        v = v_bits[layer, h // group, j0:]  # (C - j0, HD) uint16
        n_kv -= j0
        q16 = np.empty(head_dim, dtype=np.float32)  # (HD,) q rounded to f16
        for d in range(head_dim):
            q16[d] = round_f16(q[t, h, d])
        s = np.empty(n_kv, dtype=np.float32)  # (n_kv,) scores, then probabilities
        if batched:
            _scores_tinyblas(k, q16, n_kv, scale, s)
        else:
            _scores_vec_dot(k, q16, n_kv, scale, s)
        _softmax(s, n_kv)
        acc = np.empty((32, head_dim), dtype=np.float32)  # (32, HD) lane partial sums
        _weighted_values(s, v, n_kv, n_acc, acc, out[t, h])


@njit(inline="always")
def _scores_group(k, q16, n_kv, scale, s):
    """s[g, j] = (K[j] . q16[g]) * scale for the query heads g of one GQA group, with
    ggml_vec_dot_f16's lanes as ``_scores_vec_dot``. Key row j is read once for all the
    heads (llama.cpp's mul_mat blocks the broadcast heads over the same rows the same way);
    each dot product keeps its own accumulators and order, so the scores are the same bits.

    k  # (C, HD) uint16 f16 bits;  q16  # (G, HD) float32;  s  # (G, >= n_kv) float32
    """
    n_group, head_dim = q16.shape
    n_main = head_dim - head_dim % 32
    for j in range(n_kv):
        for g in range(n_group):
            g0 = zero8()
            g1 = zero8()
            g2 = zero8()
            g3 = zero8()
            for e in range(0, n_main, 32):
                g0 = fma8(load8_2d(k, j, e), load8_2d(q16, g, e), g0)
                g1 = fma8(load8_2d(k, j, e + 8), load8_2d(q16, g, e + 8), g1)
                g2 = fma8(load8_2d(k, j, e + 16), load8_2d(q16, g, e + 16), g2)
                g3 = fma8(load8_2d(k, j, e + 24), load8_2d(q16, g, e + 24), g3)
            dot = np.float64(_reduce4x8(g0, g1, g2, g3))
            for e in range(n_main, head_dim):
                dot += f16_to_f32(k[j, e]) * q16[g, e]
            s[g, j] = np.float32(dot) * scale


@njit(inline="always")
def _values_group(p, v, n_kv, acc):
    """acc[g, l] = sum over j = l, l + 32, ... of p[g, j] * V[j], by FMA in j order: for each
    query head g of a GQA group, the 32 partial sums of ggml_vec_dot_f16 over the cell index
    (``_weighted_values`` with 32 lanes). 32 dims at a time, so a row of V (one cache line)
    is read once for every head of the group and the group's partial sums stay in L1.

    p  # (G, >= n_kv) float32, probabilities already rounded to f16
    v  # (C, HD) uint16 f16 bits, HD % 32 == 0;  acc  # (G, 32, HD) float32, overwritten
    """
    n_group = p.shape[0]
    head_dim = v.shape[1]
    acc[:] = 0.0
    for d in range(0, head_dim, 32):
        for j in range(n_kv):
            lane = j & 31
            v0 = load8_2d(v, j, d)
            v1 = load8_2d(v, j, d + 8)
            v2 = load8_2d(v, j, d + 16)
            v3 = load8_2d(v, j, d + 24)
            for g in range(n_group):
                a = acc[g]  # (32, HD) float32
                pv = splat8(p[g, j])
                store8_2d(fma8(v0, pv, load8_2d(a, lane, d)), a, lane, d)
                store8_2d(fma8(v1, pv, load8_2d(a, lane, d + 8)), a, lane, d + 8)
                store8_2d(fma8(v2, pv, load8_2d(a, lane, d + 16)), a, lane, d + 16)
                store8_2d(fma8(v3, pv, load8_2d(a, lane, d + 24)), a, lane, d + 24)


@njit(cache=True, nogil=True, parallel=True)
def _attend_one_kernel(q, k_bits, v_bits, layer, pos0, scale, window, per_item, out):
    """One query token (decode) as ``_attend_kernel`` computes it, bit for bit, a GQA group
    at a time: each work item takes ``per_item`` query heads that share a KV head, reads
    their keys once for all of them and keeps the value sums in registers. Needs
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
            _softmax(s[g], n_kv)
            for j in range(n_kv):
                s[g, j] = round_f16(s[g, j])  # V is f16, so ggml rounds the probabilities too
        acc = np.empty((per_item, 32, head_dim), dtype=np.float32)  # (G', 32, HD) lane partial sums
        _values_group(s, v, n_kv, acc)
        for g in range(per_item):
            _reduce_lanes32(acc[g], out[0, h0 + g])


def _heads_per_item(n_heads: int, n_kv_heads: int, n_threads: int) -> int:
    """Query heads per work item of the decode kernel: a whole GQA group when there are
    enough groups for the threads, else the group halved until there are (heads of one
    item must share their KV head)."""
    per_item = n_heads // n_kv_heads
    while n_heads // per_item < n_threads and per_item % 2 == 0:
        per_item //= 2
    return per_item


_attend_serial = njit(cache=True, nogil=True)(_attend_kernel)
_attend_parallel = njit(cache=True, nogil=True, parallel=True)(_attend_kernel)

# Below this many multiply-adds a call is faster on one thread than waking the pool.
PARALLEL_MIN_WORK = 1 << 17


# ---- Public API ------------------------------------------------------------------


def attend(q: np.ndarray, cache: KVCache, layer: int, pos0: int, out: np.ndarray | None = None,
           scale: float | None = None, window: int = 0) -> np.ndarray:
    """Causal attention of queries q (T, H, HD) float32 at positions pos0.. against the
    cache of ``layer`` (which already holds their own keys/values). Returns (T, H, HD) float32.
    ``scale`` multiplies the scores (None: 1/sqrt(HD)); ``window`` > 0 lets each query see
    only the last ``window`` positions, its own included (sliding-window layers)."""
    n_q, n_heads, head_dim = q.shape
    if out is None:
        out = np.empty(q.shape, dtype=np.float32)
    if scale is None:
        scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))  # llama.cpp: 1.0f/sqrtf(float(n_embd_head))
    n_keys = min(pos0 + n_q, window) if window > 0 else pos0 + n_q
    work = n_q * n_heads * head_dim * n_keys
    if n_q == 1 and head_dim % 32 == 0 and work >= PARALLEL_MIN_WORK:
        per_item = _heads_per_item(n_heads, cache.k_bits.shape[1], num_threads())
        _attend_one_kernel(q, cache.k_bits, cache.v_bits, layer, pos0, np.float32(scale), window,
                           per_item, out)
        return out
    kernel = _attend_parallel if work >= PARALLEL_MIN_WORK else _attend_serial
    kernel(q, cache.k_bits, cache.v_bits, layer, pos0, np.float32(scale), window, out)
    return out


def attend_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int, window: int = 0) -> np.ndarray:
    """Plain-numpy reference of ``attend`` (same roundings, numpy's summation order).

    q  # (T, H, HD) float32;  k, v  # (KVH, n_kv, HD) float16 (n_kv >= pos0 + T)
    """
    n_q, n_heads, head_dim = q.shape
    group = n_heads // k.shape[0]
    scale = np.float32(1.0 / math.sqrt(head_dim))
    out = np.empty(q.shape, dtype=np.float32)
    q16 = q.astype(np.float16).astype(np.float32)
    for t in range(n_q):
        n_kv = pos0 + t + 1
        j0 = max(0, n_kv - window) if window > 0 else 0
        for h in range(n_heads):
            kk = k[h // group, j0:n_kv].astype(np.float32)  # (n_kv - j0, HD)
            vv = v[h // group, j0:n_kv].astype(np.float32)
            s = (kk @ q16[t, h]).astype(np.float32) * scale
            e = np.exp(s - s.max(), dtype=np.float32)
            p = (e * np.float32(1.0 / e.sum(dtype=np.float64))).astype(np.float16).astype(np.float32)
            out[t, h] = p @ vv
    return out
