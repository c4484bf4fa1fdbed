"""Batches of tokens through the 32-element block formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) with
llama.cpp's numbers, faster than a float32 sgemm where the CPU has VNNI.

Why: llama.cpp multiplies a prompt's batch by these formats with its integer dot products
(8-bit activations, ggml_vec_dot_*_q8_0 / tinyBLAS_Q0, the same lanes and order), so a
prompt read through float32 sgemm instead (quant/blas.py, what a BLAS build does) gives
logits without that 8-bit rounding (0.3-0.5 apart on Qwen2.5-0.5B and Gemma 3), and greedy
text parts at near-ties. legacy.py's per-token kernels
keep those numbers but unpack every weight nibble again for each token, far slower than sgemm
on a long batch (Qwen2.5-0.5B and Gemma 3 keep most of their matrices in Q5_0/Q8_0).

How: a group of 16 rows is unpacked once into float32 *integers* (q - 8, q - 16, q: the exact
quants, ``wf``), and every token's 8-bit activations are float32 integers too (``xf``). Lane l
of llama.cpp's dot product is the integer sum of elements 4l..4l+3 of a block; as products of
integers below 2**8 summed four at a time it stays below 2**24, so one multiply and three
fused multiply-adds in float32 give that integer exactly. Then, as llama.cpp does, one FMA per
block and lane by d_w * d_x (exact: two f16 values), the lanes' hsum_float_8 at the end, and
Q4_1/Q5_1's sum of m_w * s_x after it (legacy.py has the formulas and sources). The same
roundings in the same order, so the result is the per-token kernels' to the bit; only the
integer part moved to float units, where AVX2/AVX-512 do 8-16 multiply-adds per instruction.

The loop runs lane by lane: for one lane l, tokens k..k+3 and 16 rows, the chain over the
blocks holds 8 vectors of accumulators in registers and reuses each weight vector for 4
tokens, so the weights are unpacked once a batch and loaded once for 4 tokens.

Where the CPU has AVX-512 VNNI the integer part stays integer: each lane sum of 8 rows is one
``vpdpbusd`` (4 unsigned weight bytes times 4 signed activation bytes, summed into an int32),
started from -offset * (the 4 activations' sum) so the unsigned quants (q + 128 for Q8_0) give
the signed sum; one conversion to float and the same FMA follow. Four byte products an int32
lane and instruction make this form faster than sgemm on long batches (docs/benchmarks.md).
Both forms give the same integers, so the same bits; the tests run
both on any CPU (``dpbusd`` is emulated exactly without VNNI).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import decode_f16_plane
from ..ops.simd import add8, fma8, load8, mul8, splat8_2d, store8, store8_2d, zero8
from ..ops.simd_int import bcast32, dpbusd, load256, to_f32
from .activations import acts_q8_0, acts_q8_1
from .layout import GROUP, over_row_groups
from .legacy import group_planes

QK = 32
TOKENS = 4  # tokens per pass over a group's weights: 8 accumulators + 8 weight vectors in registers
LANES = 8 * GROUP  # one token's lane sums in the lanes scratch: 8 lanes of GROUP rows
# From this many tokens VNNI's form is the faster (its second unpacking costs more than it saves
# in a short batch)
VNNI_MIN_TOKENS = 32

# unpack codes: how a row group's bytes become wf (legacy.KIND_* for the nibble formats)
UNPACK_Q8_0 = 4


# ---- unpack one row group to float32 integers (once per group and batch)

@njit(nogil=True, cache=True, inline="always")
def _unpack_nibbles(qs_g, qh_g, has_qh, offset, nb, wf):
    """Q4/Q5 quants of a row group as float32: element e of block b, row i at (b*32 + e)*16 + i.

    qs_g  # (nb * 16 * GROUP,) uint8: byte j of block b, row i at (b*16 + j)*16 + i
    qh_g  # (nb * 4 * GROUP,) uint8: Q5's fifth bits (bit e of the block's little-endian uint32)
    offset  # 8 (Q4_0), 16 (Q5_0) or 0 (Q4_1, Q5_1)
    wf    # (nb * 32 * GROUP,) float32 out
    """
    w = GROUP
    for b in range(nb):
        for j in range(16):
            lo_at = (b * QK + j) * w
            hi_at = (b * QK + 16 + j) * w
            for i in range(w):
                q = np.int32(qs_g[(b * 16 + j) * w + i])
                lo = q & 15
                hi = q >> 4
                if has_qh:
                    lo |= ((np.int32(qh_g[(b * 4 + (j >> 3)) * w + i]) >> (j & 7)) & 1) << 4
                    hi |= ((np.int32(qh_g[(b * 4 + 2 + (j >> 3)) * w + i]) >> (j & 7)) & 1) << 4
                wf[lo_at + i] = np.float32(lo - offset)
                wf[hi_at + i] = np.float32(hi - offset)


@njit(nogil=True, cache=True, inline="always")
def _unpack_q8(qs_g, nb, wf):
    """Q8_0 quants of a row group as float32, in the order of _unpack_nibbles.
    qs_g  # (nb * 32 * GROUP,) int8, already element-major;  wf  # (nb * 32 * GROUP,) float32 out"""
    for c in range(nb * QK * GROUP):
        wf[c] = np.float32(qs_g[c])


@njit(nogil=True, cache=True, inline="always")
def _unpack_bytes(wf, nb, offset, wb):
    """The quants of a row group as the unsigned bytes VNNI multiplies: wb[((b*8 + l)*16 + i)*4 + k]
    = q + offset for element 4l + k of block b, row i (so rows 0-7 and 8-15 of one lane are
    32 bytes each).  wf  # (nb * 32 * GROUP,) float32 from _unpack_*;  wb  # (nb * 32 * GROUP,) uint8 out"""
    for b in range(nb):
        for l in range(8):
            o = (b * 8 + l) * 64
            for i in range(GROUP):
                for k in range(4):
                    wb[o + i * 4 + k] = np.uint8(np.int32(wf[(b * QK + 4 * l + k) * GROUP + i]) + offset)


# ---- one lane of llama.cpp's dot product for 16 rows and up to 4 tokens

@njit(nogil=True, cache=True, inline="always")
def _block_lane(vnni, wf, wb, xf, xb, off, n_in, da, db, dx, k, b, l, acc_a, acc_b):
    """(acc_a, acc_b) after block b of token k: lane l of rows 0-7 and 8-15. The lane's
    integer sum comes from float FMAs on ``wf`` (exact, module docstring) or, with ``vnni``,
    from vpdpbusd on ``wb``: x's 4 bytes against 4 weight bytes a row, started from -bias *
    their sum (``off``). The weight loads repeat for each token of a pass; LLVM keeps one.

    wf  # (nb * 32 * GROUP,) float32;  wb  # (nb * 32 * GROUP,) uint8 (_unpack_bytes)
    xf  # (n_tok, n_in) float32 (float form);  xb  # (n_tok * n_in,) int8;  off  # (n_tok * nb * 8,) int32 (VNNI)
    """
    e = b * QK + 4 * l
    if vnni:
        o = (b * 8 + l) * 64
        xv = bcast32(xb, k * n_in + e)
        start = bcast32(off, (k * (n_in // QK) + b) * 8 + l)
        sa = to_f32(dpbusd(start, load256(wb, o), xv))
        sb = to_f32(dpbusd(start, load256(wb, o + 32), xv))
    else:
        o = e * GROUP
        x0 = splat8_2d(xf, k, e)
        x1 = splat8_2d(xf, k, e + 1)
        x2 = splat8_2d(xf, k, e + 2)
        x3 = splat8_2d(xf, k, e + 3)
        sa = fma8(load8(wf, o + 48), x3, fma8(load8(wf, o + 32), x2, fma8(load8(wf, o + 16), x1,
                                                                             mul8(load8(wf, o), x0))))
        sb = fma8(load8(wf, o + 56), x3, fma8(load8(wf, o + 40), x2, fma8(load8(wf, o + 24), x1,
                                                                             mul8(load8(wf, o + 8), x0))))
    dk = splat8_2d(dx, k, b)
    return fma8(mul8(da, dk), sa, acc_a), fma8(mul8(db, dk), sb, acc_b)


@njit(nogil=True, cache=True, inline="always")
def _lane(vnni, wf, wb, dw, nb, xf, xb, off, n_in, dx, k, n, l, lanes):
    """lanes[t*LANES + l*GROUP + i] = lane l of row i for token k + t (t < n; n is 4 or 1).

    dw     # (nb * GROUP,) float32 d_w;  dx  # (n_tok, nb) float32 d_x
    lanes  # (TOKENS * LANES,) float32 out
    """
    a0a = zero8()
    a0b = zero8()
    a1a = zero8()
    a1b = zero8()
    a2a = zero8()
    a2b = zero8()
    a3a = zero8()
    a3b = zero8()
    for b in range(nb):
        da = load8(dw, b * GROUP)
        db = load8(dw, b * GROUP + 8)
        a0a, a0b = _block_lane(vnni, wf, wb, xf, xb, off, n_in, da, db, dx, k, b, l, a0a, a0b)
        if n == TOKENS:
            a1a, a1b = _block_lane(vnni, wf, wb, xf, xb, off, n_in, da, db, dx, k + 1, b, l, a1a, a1b)
            a2a, a2b = _block_lane(vnni, wf, wb, xf, xb, off, n_in, da, db, dx, k + 2, b, l, a2a, a2b)
            a3a, a3b = _block_lane(vnni, wf, wb, xf, xb, off, n_in, da, db, dx, k + 3, b, l, a3a, a3b)
    o = l * GROUP
    store8(a0a, lanes, o)
    store8(a0b, lanes, o + 8)
    if n == TOKENS:
        store8(a1a, lanes, LANES + o)
        store8(a1b, lanes, LANES + o + 8)
        store8(a2a, lanes, 2 * LANES + o)
        store8(a2b, lanes, 2 * LANES + o + 8)
        store8(a3a, lanes, 3 * LANES + o)
        store8(a3b, lanes, 3 * LANES + o + 8)


@njit(nogil=True, cache=True, inline="always")
def _finish(lanes, t, has_min, summs, k, r0, w, tmp, out):
    """out[k, r0:r0 + w] = hsum_float_8 of token t's 8 lanes (ops/simd.hsum8's order), then
    + summs[k*GROUP + i] for Q4_1 / Q5_1 (only there: adding +0 would turn a -0 into +0).
    tmp  # (8,) float32 scratch for a narrow group"""
    for h in range(2):
        o = t * LANES + 8 * h
        g = GROUP
        v = add8(add8(add8(load8(lanes, o), load8(lanes, o + 4 * g)),
                      add8(load8(lanes, o + 2 * g), load8(lanes, o + 6 * g))),
                 add8(add8(load8(lanes, o + g), load8(lanes, o + 5 * g)),
                      add8(load8(lanes, o + 3 * g), load8(lanes, o + 7 * g))))
        if has_min:
            v = add8(v, load8(summs, k * GROUP + 8 * h))
        if w == GROUP:
            store8_2d(v, out, k, r0 + 8 * h)
        else:
            store8(v, tmp, 0)
            for i in range(8 * h, min(w, 8 * h + 8)):
                out[k, r0 + i] = tmp[i - 8 * h]


@njit(nogil=True, cache=True, inline="always")
def _group_tokens(wf, wb, vnni, dw, nb, xf, xb, off, dx, has_min, summs, r0, w, lanes, tmp, out):
    """Every token against one unpacked row group: out[:, r0:r0 + w]."""
    n_tok, n_in = out.shape[0], nb * QK
    k = 0
    while k < n_tok:
        n = TOKENS if k + TOKENS <= n_tok else 1
        for l in range(8):
            _lane(vnni, wf, wb, dw, nb, xf, xb, off, n_in, dx, k, n, l, lanes)
        for t in range(n):
            _finish(lanes, t, has_min, summs, k + t, r0, w, tmp, out)
        k += n


# ---- matmul: out (n_tok, n_out) = x (n_tok, n_in) @ W.T, the formats' llama.cpp numbers

@njit(nogil=True, cache=True, inline="always")
def _form(unpack):
    """(is_q8, has_min, has_qh, offset) of an ``unpack`` kind: offset is what the nibbles' unsigned
    bytes carry above q (0 for Q8_0 and the formats with a min)."""
    is_q8 = unpack == UNPACK_Q8_0
    has_min = not is_q8 and (unpack & 1) == 1
    has_qh = not is_q8 and (unpack & 2) == 2
    return is_q8, has_min, has_qh, 0 if (is_q8 or has_min) else (16 if has_qh else 8)


@njit(nogil=True, cache=True, inline="always")
def _batch_scratch(acts):
    """One thread's buffers for _batch_rows."""
    n_tok, nb = acts[0].shape
    return (np.empty(nb * QK * GROUP, np.float32),           # wf (nb, 32, GROUP) float32
            np.empty(nb * QK * GROUP, np.uint8),             # wb (nb, 8, GROUP, 4) uint8 (VNNI)
            np.empty(nb * GROUP, np.float32),                # dw (nb, GROUP) float32
            np.empty(nb * GROUP, np.float32),                # mw (nb, GROUP) float32
            np.empty(TOKENS * LANES, np.float32),            # lanes (TOKENS, 8, GROUP) float32
            np.empty(8, np.float32),                         # tmp (8,) float32
            np.empty(n_tok * GROUP, np.float32))             # summs (n_tok, GROUP) float32: Q4_1 / Q5_1


@njit(nogil=True, cache=True, inline="always")
def _batch_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) unpacked once, then every token against it: out[:, r0:r0 + w]."""
    qs, qh, d, m, unpack, plain, vnni = planes
    dx, sx, xf, xb, off = acts
    wf, wb, dw, mw, lanes, tmp, summs = buffers
    n_tok, nb = dx.shape
    is_q8, has_min, has_qh, offset = _form(unpack)
    qs_g, qh_g, d_g, m_g = group_planes(qs, qh, d, m, QK if is_q8 else 16, has_qh, has_min, nb, r0, w)
    decode_f16_plane(d_g, dw, plain)
    if is_q8:
        _unpack_q8(qs_g, nb, wf)
    else:
        _unpack_nibbles(qs_g, qh_g, has_qh, offset, nb, wf)
    if has_min:
        decode_f16_plane(m_g, mw, plain)
        for k in range(n_tok):     # m_w * s_x is exact, so one FMA is llama.cpp's fma
            sa = zero8()
            sb = zero8()
            for b in range(nb):
                sk = splat8_2d(sx, k, b)
                sa = fma8(load8(mw, b * GROUP), sk, sa)
                sb = fma8(load8(mw, b * GROUP + 8), sk, sb)
            store8(sa, summs, k * GROUP)
            store8(sb, summs, k * GROUP + 8)
    if vnni:
        _unpack_bytes(wf, nb, 128 if is_q8 else offset, wb)
    _group_tokens(wf, wb, vnni, dw, nb, xf, xb, off, dx, has_min, summs, r0, w, lanes, tmp, out)


@njit(parallel=True, nogil=True, cache=True)
def matmul_legacy_batch(qs, qh, d, m, unpack, plain, vnni, n_out, n_chunks, x, out):
    """Q4_0 / Q5_0 / Q8_0 (against Q8_0 activations) or Q4_1 / Q5_1 (against Q8_1).

    qs      # (n_out*nb*16,) uint8 row groups (Q8_0: (n_out*nb*32,) int8)
    qh      # (n_out*nb*4,) uint8 row groups (Q5; any uint8 array otherwise)
    d, m    # (n_out*nb,) uint16 row groups (m: Q4_1 / Q5_1 only)
    unpack  # legacy.KIND_* or UNPACK_Q8_0
    plain   # d and m hold only zeros and normal f16 (f16_plane_is_plain)
    vnni    # the lane sums by vpdpbusd (HAS_VNNI; the same integers emulated elsewhere)
    n_chunks  # runs of groups, one per thread
    x       # (n_tok, n_in) float32
    out     # (n_tok, n_out) float32
    """
    n_tok, n_in = x.shape
    nb = n_in // QK
    is_q8, has_min, _, offset = _form(unpack)
    if has_min:
        xq, dx, sx = acts_q8_1(x)
    else:
        xq, dx, _ = acts_q8_0(x)
        sx = np.zeros((n_tok, nb), np.float32)  # (n_tok, nb) float32: Q8_1's s, unused without a min
    # each form gets the activations it multiplies (the other's arrays stay empty)
    xf = xq.astype(np.float32) if not vnni else np.empty((0, n_in), np.float32)  # (n_tok, n_in) float32: integers
    xb = xq.astype(np.int8).reshape(-1) if vnni else np.empty(0, np.int8)        # (n_tok * n_in,) int8
    bias = 128 if is_q8 else offset           # VNNI's weight bytes are q + bias, unsigned
    off = np.empty(n_tok * nb * 8 if vnni else 0, np.int32)  # (n_tok, nb, 8) int32: -bias * the lane's 4 activations
    if vnni:
        for t in range(n_tok):
            for g4 in range(nb * 8):
                off[t * nb * 8 + g4] = -bias * (np.int32(xq[t, 4 * g4]) + np.int32(xq[t, 4 * g4 + 1])
                                                + np.int32(xq[t, 4 * g4 + 2]) + np.int32(xq[t, 4 * g4 + 3]))
    acts = (dx, sx, xf, xb, off)
    over_row_groups(_batch_rows, _batch_scratch, (qs, qh, d, m, unpack, plain, vnni), acts, n_out, n_chunks, out)
