"""Causal multi-head attention (GQA) over the f16 KV cache, as numba kernels.

Numerics follow llama.cpp's CPU path without flash attention
(src/llama-graph.cpp ``build_attn_mha``, non-flash branch) operation by operation:

  kq  = mul_mat(k, q)     K is f16, so ggml converts q to f16 (the vec_dot_type of
                          GGML_TYPE_F16, ggml-cpu/ggml-cpu.c type_traits_cpu);
  kq  = soft_max_ext(kq, mask, scale)   f32: x*scale (+0 mask), max, ggml_v_expf(x - max),
                          8- or 16-lane partial sums added in double, times (float)(1/sum)
                          (ggml-cpu/ops.cpp soft_max_f32, vec.cpp ggml_vec_soft_max_f32);
  kqv = mul_mat(v, kq)    V is f16, so the probabilities are rounded to f16 too.

The two f16 matmuls accumulate with FMAs into SIMD lanes whose layout depends on the batch:
one query token (decode) goes through ggml_vec_dot_f16 (vec.cpp: 4 accumulators x 8 lanes,
reduced by GGML_F32x8_REDUCE), two or more (prefill) through llamafile's tinyBLAS
(llamafile/sgemm.cpp: one 8-lane accumulator, then hsum) -- 16 lanes each where the CPU has
AVX-512, as a llama.cpp built there has them (ggml_lanes.py ``WIDE``). We keep the same lanes
and the same reduction trees, so for the same inputs the outputs agree bit for bit; the cost
is nil, the lanes are what SIMD code does anyway.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ..kv.contiguous import KVCache
from ..ops.f16 import round_f16
from ..ops.simd import fma8, hsum8, load8, load8_2d, splat8, store8_2d, zero8
from ..ops.simd16 import fma16, hsum16, load16, load16_2d, zero16
from ..cpu.threads import num_threads
from . import dense_groups
from .ggml_lanes import F16_STEP, TINYBLAS_LANES, WIDE, reduce_lanes, softmax, vec_dot_f16


# ---- Kernels ---------------------------------------------------------------------------


@njit(inline="always")
def _scores_tinyblas16(k, q16, n_kv, scale, s):
    """``_scores_tinyblas`` with tinyBLAS's 16 lanes (WIDE): one 16-lane accumulator per dot,
    then _mm512_reduce_add_ps. HD % 16 == 0.

    k  # (C, HD) uint16 f16 bits;  q16  # (HD,) float32;  s  # (>= n_kv,) float32
    """
    head_dim = q16.shape[0]
    for j in range(n_kv):
        a0 = zero16()
        for e in range(0, head_dim, 16):
            a0 = fma16(load16_2d(k, j, e), load16(q16, e), a0)
        s[j] = hsum16(a0) * scale


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
    """s[j] = (K[j] . q16) * scale with ggml_vec_dot_f16's lanes (one decode token).

    k  # (C, HD) uint16 f16 bits;  q16  # (HD,) float32;  s  # (>= n_kv,) float32
    """
    q2 = q16.reshape((1, q16.shape[0]))  # (1, HD)
    for j in range(n_kv):
        s[j] = vec_dot_f16(k, j, q2, 0) * scale


@njit(inline="always")
def _weighted_values(p, v, n_kv, n_acc, acc, out):
    """out = sum_j f16(p[j]) * V[j] with the lanes of the matching f16 matmul: partial sum
    j % n_acc (ggml_vec_dot_f16's 4 x 8 = 32 or, WIDE, 4 x 16 = 64; tinyBLAS's 8 or 16) by FMA
    in j order, then that reduction. (llama.cpp stores V transposed and runs one dot product
    per output dim; the lanes are the same.)

    p  # (>= n_kv,) float32;  v  # (C, HD) uint16 f16 bits
    acc  # (>= n_acc, HD) float32 scratch;  out  # (HD,) float32
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
    reduce_lanes(acc, n_acc, out)


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
    # llama.cpp: one token -> ggml_vec_dot_f16 (4 accumulators: 32 or, WIDE, 64 partial sums);
    # two or more -> tinyBLAS (8 or 16). The lanes of K.q follow HD, those of p.V the cell index:
    # p.V's length is llama.cpp's n_kv, padded to a multiple of 256 with zero probabilities
    # (without flash attention), so tinyBLAS takes it and no cell is a leftover.
    batched = n_q >= 2
    n_acc = TINYBLAS_LANES if batched else F16_STEP   # 4 accumulators of F16_STEP / 4 lanes
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
        if batched and WIDE and head_dim % 16 == 0:
            _scores_tinyblas16(k, q16, n_kv, scale, s)
        elif batched and not WIDE and head_dim % 8 == 0:
            _scores_tinyblas(k, q16, n_kv, scale, s)
        else:   # one token, or a head size tinyBLAS refuses (k % its lanes): ggml_vec_dot_f16
            _scores_vec_dot(k, q16, n_kv, scale, s)
        softmax(s, n_kv)
        acc = np.empty((64, head_dim), dtype=np.float32)  # (64, HD) lane partial sums
        _weighted_values(s, v, n_kv, n_acc, acc, out[t, h])


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
    if work >= PARALLEL_MIN_WORK:
        # The GQA-group kernels (same bits, each key and value row read once per group)
        if n_q == 1 and head_dim % 32 == 0:
            per_item = dense_groups.heads_per_item(n_heads, cache.k_bits.shape[1], num_threads())
            dense_groups.attend_one(q, cache.k_bits, cache.v_bits, layer, pos0, np.float32(scale), window,
                                    per_item, out)
            return out
        if n_q > 1 and head_dim % TINYBLAS_LANES == 0 and window == 0:
            dense_groups.attend_batch(q, cache.k_bits, cache.v_bits, layer, pos0, np.float32(scale), out)
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
