"""Activation quantization, exactly as llama.cpp's CPU backend does it before a dot product.

ggml-cpu multiplies a quantized weight row by a row of activations that it has first converted
to the weight type's ``vec_dot_type`` (ggml-cpu.c, ``type_traits_cpu``):

    weights          activations     converter (x86 AVX2 build, the one pip builds here)
    Q4_0, Q8_0   ->  Q8_0            arch/x86/quants.c quantize_row_q8_0
    Q4_1         ->  Q8_1            arch/x86/quants.c quantize_row_q8_1
    Q4_K/Q5_K/Q6_K -> Q8_K           ggml-quants.c quantize_row_q8_K_ref (x86 calls the ref)
    F16          ->  F16             ggml-cpu.c ggml_cpu_fp32_to_fp16 (vcvtps2ph, nearest-even)
    BF16         ->  BF16            ggml-impl.h ggml_compute_fp32_to_bf16
    F32          ->  F32             as is

Q8_0 / Q8_1 on AVX2 (not the ``_ref`` versions, which differ in rounding):
    amax = max |x| over the block of 32          (exact, order-free)
    d    = amax / 127.f                          (float division)
    id   = amax != 0 ? 127.f / amax : 0          (NOT 1/d)
    q    = round-half-even(x * id)               (_mm256_round_ps(_MM_ROUND_NEAREST))
    d is stored as f16 (nearest-even); Q8_1 also stores s = f16(d * (float) sum(q)), with the
    unrounded float d.
Q8_K (blocks of 256, float d, no f16 anywhere):
    max  = the x with the largest |x| (first one on ties); if it is 0 then d = 0, q = 0
    iscale = -127.f / max;  q = min(127, nearest_int(iscale * x))   (nearest_int: ties to even)
    d = 1 / iscale;  bsums[k] = sum of q over the k-th group of 16.

Quantized activations are handed to the kernels as int16 (so a broadcast needs no sign
extension) with float32 scales that already hold the f16-rounded values.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import round_bf16_in_place, round_f16_in_place
from ..ops.simd import hmax8, load8_2d, max8, mul8, splat8, zero8

QK8 = 32    # Q8_0 / Q8_1 block
QK_K = 256  # K-quant super-block

F127 = np.float32(127.0)
M127 = np.float32(-127.0)
ONE = np.float32(1.0)


@njit(nogil=True, cache=True)
def quantize_q8_0(x, xq, dx, qsum):
    """Q8_0 activations (arch/x86/quants.c quantize_row_q8_0).

    x     # (n_tok, n_in) float32
    xq    # (n_tok, n_in) int16 out: q in [-127, 127]
    dx    # (n_tok, n_in // 32) float32 out: f16-rounded d
    qsum  # (n_tok, n_in // 32) int32 out: sum of q per block (Q4_0's -8 offset, Q8_1's s)
    """
    _quantize_blocks_32(x, xq, dx, qsum)
    for t in range(dx.shape[0]):
        round_f16_in_place(dx[t])


@njit(nogil=True, cache=True)
def quantize_q8_1(x, xq, dx, sx):
    """Q8_1 activations (arch/x86/quants.c quantize_row_q8_1): as Q8_0 plus
    sx = f16(d * (float) sum(q)), computed with the unrounded float d.

    x   # (n_tok, n_in) float32
    xq  # (n_tok, n_in) int16 out
    dx  # (n_tok, n_in // 32) float32 out: f16-rounded d
    sx  # (n_tok, n_in // 32) float32 out: f16-rounded d * sum(q)
    """
    qsum = np.empty(dx.shape, np.int32)  # (n_tok, nb) int32
    _quantize_blocks_32(x, xq, dx, qsum)
    for t in range(dx.shape[0]):
        for b in range(dx.shape[1]):
            sx[t, b] = dx[t, b] * np.float32(qsum[t, b])
        round_f16_in_place(sx[t])
        round_f16_in_place(dx[t])


@njit(nogil=True, cache=True)
def _quantize_blocks_32(x, xq, dx, qsum):
    """The part shared by Q8_0 and Q8_1; dx gets the unrounded float d."""
    n_tok, n_in = x.shape
    nb = n_in // QK8
    for t in range(n_tok):
        for b in range(nb):
            amax = np.float32(0.0)
            for j in range(QK8):
                amax = max(amax, np.abs(x[t, b * QK8 + j]))
            d = amax / F127
            inv = F127 / amax if amax != 0 else np.float32(0.0)
            s = 0
            for j in range(QK8):
                q = np.int16(np.rint(x[t, b * QK8 + j] * inv))
                xq[t, b * QK8 + j] = q
                s += q
            dx[t, b] = d
            qsum[t, b] = s


@njit(nogil=True, cache=True, inline="always")
def _first_largest(x, t, base):
    """(amax, vmax) of the super-block x[t, base:base + QK_K]: the largest |x| and the first value
    with that magnitude, as quantize_row_q8_K_ref's scan (ax > amax: a later equal one does not
    replace it; NaNs never win). The magnitude 8 lanes at a time, then a scan for its first place:
    the scan's branch kept the compiler from vectorising the whole search.

    x  # (n_tok, n_in) float32
    """
    minus = splat8(np.float32(-1.0))
    m = zero8()
    for j in range(0, QK_K, 8):
        v = load8_2d(x, t, base + j)
        m = max8(max8(v, mul8(v, minus)), m)   # |v|, and a NaN lane keeps m
    amax = hmax8(m)
    for j in range(QK_K):
        if np.abs(x[t, base + j]) == amax:
            return amax, x[t, base + j]
    return amax, np.float32(0.0)   # amax == 0 and no x is +-0: cannot happen, but keeps the types


@njit(nogil=True, cache=True)
def quantize_q8_k(x, xq, dk, bsums):
    """Q8_K activations (ggml-quants.c quantize_row_q8_K_ref).

    x      # (n_tok, n_in) float32
    xq     # (n_tok, n_in) int16 or int8 out (the quants lie in -127..127)
    dk     # (n_tok, n_in // 256) float32 out
    bsums  # (n_tok, n_in // 16) int32 out: sum of q per group of 16
    """
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    for t in range(n_tok):
        for b in range(nsb):
            base = b * QK_K
            amax, vmax = _first_largest(x, t, base)
            if amax == 0:
                dk[t, b] = 0
                for j in range(QK_K):
                    xq[t, base + j] = 0
            else:
                iscale = M127 / vmax
                for j in range(QK_K):
                    xq[t, base + j] = np.int16(min(F127, np.rint(iscale * x[t, base + j])))
                dk[t, b] = ONE / iscale
            for g in range(QK_K // 16):
                s = 0
                for j in range(16):
                    s += xq[t, base + g * 16 + j]
                bsums[t, b * 16 + g] = s


# ---- the activations of a row-group product (quant/layout.py over_row_groups), freshly made

@njit(nogil=True, cache=True)
def acts_q8_0(x):
    """x (n_tok, n_in) float32 -> (xq (n_tok, n_in) int16, dx (n_tok, nb) float32,
    qsum (n_tok, nb) int32) of quantize_q8_0."""
    n_tok, n_in = x.shape
    acts = (np.empty((n_tok, n_in), np.int16), np.empty((n_tok, n_in // 32), np.float32),
            np.empty((n_tok, n_in // 32), np.int32))
    quantize_q8_0(x, *acts)
    return acts


@njit(nogil=True, cache=True)
def acts_q8_1(x):
    """x (n_tok, n_in) float32 -> (xq (n_tok, n_in) int16, dx (n_tok, nb) float32,
    sx (n_tok, nb) float32) of quantize_q8_1."""
    n_tok, n_in = x.shape
    acts = (np.empty((n_tok, n_in), np.int16), np.empty((n_tok, n_in // 32), np.float32),
            np.empty((n_tok, n_in // 32), np.float32))
    quantize_q8_1(x, *acts)
    return acts


@njit(nogil=True, cache=True)
def acts_q8_k(x):
    """x (n_tok, n_in) float32 -> (xq (n_tok, n_in) int16, dk (n_tok, nsb) float32,
    bsums (n_tok, nsb * 16) int32) of quantize_q8_k."""
    n_tok, n_in = x.shape
    acts = (np.empty((n_tok, n_in), np.int16), np.empty((n_tok, n_in // QK_K), np.float32),
            np.empty((n_tok, n_in // 16), np.int32))
    quantize_q8_k(x, *acts)
    return acts


@njit(nogil=True, cache=True)
def round_acts(x, out, to_bf16):
    """F16 / BF16 activations: out = x rounded to f16 (ggml_cpu_fp32_to_fp16) or to bf16
    (GGML_FP32_TO_BF16), kept as float32.  x, out  # (n_tok, n_in) float32"""
    for t in range(x.shape[0]):
        out[t, :] = x[t, :]
        if to_bf16:
            round_bf16_in_place(out[t])
        else:
            round_f16_in_place(out[t])
