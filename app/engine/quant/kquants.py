"""Kernels for the K-quant formats Q4_K, Q5_K and Q6_K (super-blocks of 256, row-group layout).

GGUF blocks (ggml-common.h):
    block_q4_K { f16 d; f16 dmin; u8 scales[12]; u8 qs[128]; }              144 bytes
    block_q5_K { f16 d; f16 dmin; u8 scales[12]; u8 qh[32]; u8 qs[128]; }   176 bytes
    block_q6_K { u8 ql[128]; u8 qh[64]; i8 scales[16]; f16 d; }              210 bytes
Q4_K/Q5_K: 8 sub-blocks of 32, each with a 6-bit scale sc and 6-bit min m packed in 12 bytes;
    w = d * sc * q - dmin * m. In each 64-element chunk c, byte l of qs[32c..32c+31] holds
    element 64c + l (low nibble) and 64c + 32 + l (high nibble); Q5_K's fifth bit of those is
    bit 2c / 2c + 1 of qh[l].
Q6_K: 16 sub-blocks of 16 with int8 scales, w = d * sc * (q - 32); see _q6_half.

Every field is a plane in the row-group layout of quant/layout.py; the loops run across the 16
rows of a group. Dot products against Q8_K activations follow llama.cpp (ggml-cpu/quants.c
ggml_vec_dot_q4_K_q8_K_generic and friends, arch/x86/quants.c for the AVX2 versions):
    Q4_K/Q5_K: d_w * d_x * sum_s sc_s * sum(q * a)  -  dmin_w * d_x * sum_s m_s * bsum_s
               where bsum_s = bsums[2s] + bsums[2s + 1] (sum of the 32 activations of sub-block s)
    Q6_K:      d_w * d_x * sum_s sc_s * sum((q - 32) * a)
All sums are exact integers; only the float adds across super-blocks are ordered differently.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import decode_f16, decode_f16_plane
from .activations import acts_q8_k
from .layout import GROUP, group_of, group_span, over_row_groups, tile_plane

QK_K = 256


# ---- repack (numpy, once at load)

def _split(raw, n_out, n_in, block_bytes):
    """raw (n_out, bytes_per_row) uint8 -> (n_out, nsb, block_bytes) uint8."""
    return np.asarray(raw, dtype=np.uint8).reshape(n_out, n_in // QK_K, block_bytes)


def _f16(blocks, offset):
    """(n_out, nsb, block_bytes) -> (n_out, nsb) uint16 field at offset."""
    return np.ascontiguousarray(blocks[:, :, offset:offset + 2]).view(np.uint16)[:, :, 0]


def _bytes(blocks, start, stop, n_out):
    """(n_out, nsb, block_bytes) -> (n_out, nsb, stop - start) uint8 field (a strided view)."""
    return blocks[:, :, start:stop]


def repack_q4_k(raw, n_out, n_in):
    """-> d, dmin (n_out*nsb,) uint16; scales (n_out*nsb*12,) uint8; qs (n_out*nsb*128,) uint8."""
    b = _split(raw, n_out, n_in, 144)
    return {"d": tile_plane(_f16(b, 0)), "dmin": tile_plane(_f16(b, 2)),
            "scales": tile_plane(_bytes(b, 4, 16, n_out)),
            "qs": tile_plane(_bytes(b, 16, 144, n_out))}


def repack_q5_k(raw, n_out, n_in):
    """-> as Q4_K plus qh (n_out*nsb*32,) uint8."""
    b = _split(raw, n_out, n_in, 176)
    return {"d": tile_plane(_f16(b, 0)), "dmin": tile_plane(_f16(b, 2)),
            "scales": tile_plane(_bytes(b, 4, 16, n_out)),
            "qh": tile_plane(_bytes(b, 16, 48, n_out)),
            "qs": tile_plane(_bytes(b, 48, 176, n_out))}


def repack_q6_k(raw, n_out, n_in):
    """-> ql (n_out*nsb*128,) uint8; qh (n_out*nsb*64,) uint8; scales (n_out*nsb*16,) int8;
    d (n_out*nsb,) uint16."""
    b = _split(raw, n_out, n_in, 210)
    return {"ql": tile_plane(_bytes(b, 0, 128, n_out)),
            "qh": tile_plane(_bytes(b, 128, 192, n_out)),
            "scales": tile_plane(_bytes(b, 192, 208, n_out).view(np.int8)),
            "d": tile_plane(_f16(b, 208))}


# ---- 6-bit scales and mins of Q4_K / Q5_K

@njit(nogil=True, cache=True, inline="always")
def unpack_scales(sb, w, sc, mn):
    """ggml-quants.c get_scale_min_k4, for every row of a group at once.

    sb      # (12 * w,) uint8: scale byte k of row i at k * w + i
    sc, mn  # (8, w) int16 out: 6-bit scales and mins of the 8 sub-blocks
    """
    for s in range(4):
        for i in range(w):
            lo = np.int16(sb[s * w + i])
            mid = np.int16(sb[(s + 4) * w + i])
            hi = np.int16(sb[(s + 8) * w + i])
            sc[s, i] = lo & 63
            mn[s, i] = mid & 63
            sc[s + 4, i] = (hi & 15) | ((lo >> 6) << 4)
            mn[s + 4, i] = (hi >> 4) | ((mid >> 6) << 4)


# ---- dequantize rows (bit-exact with gguf.quants; serial: a lookup is a few rows per step)

@njit(nogil=True, cache=True)
def rows_q45_k(d, dmin, scales, qh, qs, has_qh, n_out, ids, out):
    """Q4_K (has_qh False) / Q5_K rows: (d * sc) * q - (dmin * m).

    d, dmin  # (n_out*nsb,) uint16 row groups
    scales   # (n_out*nsb*12,) uint8 row groups
    qh       # (n_out*nsb*32,) uint8 row groups (Q5_K only)
    qs       # (n_out*nsb*128,) uint8 row groups
    ids      # (n_ids,) int64
    out      # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(2, np.uint16)                 # (2,) uint16
        f = np.empty(2, np.float32)                # (2,) float32: d, dmin
        sb = np.empty(12, np.uint8)                # (12,) uint8 scale bytes of this row
        sc = np.empty((8, 1), np.int16)            # (8, 1) int16
        mn = np.empty((8, 1), np.int16)            # (8, 1) int16
        for b in range(nsb):
            h[0] = d[r0 * nsb + b * w + i]
            h[1] = dmin[r0 * nsb + b * w + i]
            decode_f16(h, f)
            for k in range(12):
                sb[k] = scales[r0 * nsb * 12 + (b * 12 + k) * w + i]
            unpack_scales(sb, 1, sc, mn)
            qbase = r0 * nsb * 128 + b * 128 * w + i
            hbase = r0 * nsb * 32 + b * 32 * w + i
            for c in range(4):
                dl = f[0] * np.float32(sc[2 * c, 0])
                ml = f[1] * np.float32(mn[2 * c, 0])
                dh = f[0] * np.float32(sc[2 * c + 1, 0])
                mh = f[1] * np.float32(mn[2 * c + 1, 0])
                for l in range(32):
                    q = np.int32(qs[qbase + (c * 32 + l) * w])
                    lo, hi = q & 15, q >> 4
                    if has_qh:
                        hb = np.int32(qh[hbase + l * w])
                        lo |= ((hb >> (2 * c)) & 1) << 4
                        hi |= ((hb >> (2 * c + 1)) & 1) << 4
                    out[n, b * QK_K + c * 64 + l] = dl * np.float32(lo) - ml
                    out[n, b * QK_K + c * 64 + 32 + l] = dh * np.float32(hi) - mh


@njit(nogil=True, cache=True)
def rows_q6_k(ql, qh, scales, d, n_out, ids, out):
    """Q6_K rows: (d * sc) * (q - 32).

    ql      # (n_out*nsb*128,) uint8 row groups
    qh      # (n_out*nsb*64,) uint8 row groups
    scales  # (n_out*nsb*16,) int8 row groups
    d       # (n_out*nsb,) uint16 row groups
    ids     # (n_ids,) int64
    out     # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(1, np.uint16)                 # (1,) uint16
        f = np.empty(1, np.float32)                # (1,) float32
        for b in range(nsb):
            h[0] = d[r0 * nsb + b * w + i]
            decode_f16(h, f)
            lbase = r0 * nsb * 128 + b * 128 * w + i
            hbase = r0 * nsb * 64 + b * 64 * w + i
            sbase = r0 * nsb * 16 + b * 16 * w + i
            for half in range(2):
                for l in range(32):
                    a = np.int32(ql[lbase + (half * 64 + l) * w])
                    c = np.int32(ql[lbase + (half * 64 + 32 + l) * w])
                    hb = np.int32(qh[hbase + (half * 32 + l) * w])
                    q4 = ((a & 15) | ((hb & 3) << 4), (c & 15) | (((hb >> 2) & 3) << 4),
                          (a >> 4) | (((hb >> 4) & 3) << 4), (c >> 4) | (((hb >> 6) & 3) << 4))
                    for k in range(4):
                        e = half * 128 + k * 32 + l
                        s = np.float32(scales[sbase + (half * 8 + k * 2 + l // 16) * w])
                        out[n, b * QK_K + e] = (f[0] * s) * np.float32(q4[k] - 32)


# ---- matmul: out (n_tok, n_out) = x (n_tok, n_in) @ W.T
#
# The loops over the 16 rows of a group keep int16 as their widest type (LLVM sizes vectors by
# the widest type, and int32 would halve the lanes): they leave int16 partial sums in scratch,
# and a second pass per token applies the 6-bit / 8-bit scales in int32 and the floats.

@njit(nogil=True, cache=True, inline="always")
def _q4k_chunk(qs_c, w, x_lo, x_hi, p):
    """Q4_K, one 64-element chunk: p = [sum lo*x_lo over l < 16, over l >= 16,
    sum hi*x_hi over l < 16, over l >= 16] per row (16 * 15 * 127 < 2**15).

    qs_c        # (32 * w,) uint8: byte l of row i at l * w + i
    x_lo, x_hi  # (32,) int16: activations of the chunk's two sub-blocks
    p           # (8, GROUP) int16 out (rows 0-3 used)
    """
    for i in range(w):
        a0 = np.int16(0)
        b0 = np.int16(0)
        for l in range(16):
            q = np.int16(qs_c[l * w + i])
            a0 = np.int16(a0 + (q & 15) * x_lo[l])
            b0 = np.int16(b0 + (q >> 4) * x_hi[l])
        a1 = np.int16(0)
        b1 = np.int16(0)
        for l in range(16, 32):
            q = np.int16(qs_c[l * w + i])
            a1 = np.int16(a1 + (q & 15) * x_lo[l])
            b1 = np.int16(b1 + (q >> 4) * x_hi[l])
        p[0, i] = a0
        p[1, i] = a1
        p[2, i] = b0
        p[3, i] = b1


@njit(nogil=True, cache=True, inline="always")
def _q5k_chunk(qs_c, qh_b, c, w, x_lo, x_hi, p):
    """Q5_K, one chunk: the fifth bit of element l is bit 2c (low) / 2c+1 (high) of qh[l].
    p[g] / p[4 + g] = low / high sums over l in [8g, 8g + 8) (8 * 31 * 127 < 2**15).

    qh_b  # (32 * w,) uint8;  p  # (8, GROUP) int16 out
    """
    sh_lo = 2 * c
    sh_hi = 2 * c + 1
    for g in range(4):             # outside the row loop, so that loop stays small enough to vectorise
        for i in range(w):
            a = np.int16(0)
            b = np.int16(0)
            for l in range(g * 8, g * 8 + 8):
                q = np.int16(qs_c[l * w + i])
                hb = np.int16(qh_b[l * w + i])
                a = np.int16(a + ((q & 15) | (((hb >> sh_lo) & 1) << 4)) * x_lo[l])
                b = np.int16(b + ((q >> 4) | (((hb >> sh_hi) & 1) << 4)) * x_hi[l])
            p[g, i] = a
            p[4 + g, i] = b


@njit(nogil=True, cache=True, inline="always")
def _q45_group(d_g, m_g, sc_g, qh_g, qs_g, has_qh, xq, dk, bsums, sc, mn, part, acc):
    """One (full) row group of Q4_K / Q5_K against every token.

    d_g, m_g  # (nsb * GROUP,) float32 the group's d and dmin
    sc_g      # (nsb * 12 * GROUP,) uint8;  qh_g  # (nsb * 32 * GROUP,) uint8
    qs_g      # (nsb * 128 * GROUP,) uint8
    xq        # (n_tok, n_in) int16;  dk  # (n_tok, nsb) float32;  bsums  # (n_tok, nsb * 16) int32
    sc, mn    # (nsb, 8, GROUP) int16 scratch: 6-bit scales and mins
    part      # (nsb, 4, 8, GROUP) int16 scratch: partial sums per chunk
    acc       # (n_tok, GROUP) float32 out, zeroed by the caller
    """
    n_tok, nsb = dk.shape
    w = GROUP
    for b in range(nsb):
        unpack_scales(sc_g[b * 12 * w:(b + 1) * 12 * w], w, sc[b], mn[b])
    for k in range(n_tok):
        for b in range(nsb):
            xk = xq[k, b * QK_K:(b + 1) * QK_K]
            for c in range(4):
                qs_c = qs_g[(b * 128 + c * 32) * w:(b * 128 + c * 32 + 32) * w]
                if has_qh:
                    _q5k_chunk(qs_c, qh_g[b * 32 * w:(b + 1) * 32 * w], c, w,
                               xk[c * 64:c * 64 + 32], xk[c * 64 + 32:c * 64 + 64], part[b, c])
                else:
                    _q4k_chunk(qs_c, w, xk[c * 64:c * 64 + 32], xk[c * 64 + 32:c * 64 + 64], part[b, c])
        for b in range(nsb):
            dkk = dk[k, b]
            bs = bsums[k, b * 16:(b + 1) * 16]
            for i in range(w):           # int32 throughout (np.int32 casts: numba would widen to int64)
                sumi = np.int32(0)
                summ = np.int32(0)
                for c in range(4):
                    if has_qh:
                        lo = np.int32(np.int32(part[b, c, 0, i]) + np.int32(part[b, c, 1, i])
                                      + np.int32(part[b, c, 2, i]) + np.int32(part[b, c, 3, i]))
                        hi = np.int32(np.int32(part[b, c, 4, i]) + np.int32(part[b, c, 5, i])
                                      + np.int32(part[b, c, 6, i]) + np.int32(part[b, c, 7, i]))
                    else:
                        lo = np.int32(np.int32(part[b, c, 0, i]) + np.int32(part[b, c, 1, i]))
                        hi = np.int32(np.int32(part[b, c, 2, i]) + np.int32(part[b, c, 3, i]))
                    sumi = np.int32(sumi + np.int32(sc[b, 2 * c, i]) * lo + np.int32(sc[b, 2 * c + 1, i]) * hi)
                for s_ in range(8):
                    summ = np.int32(summ + np.int32(mn[b, s_, i]) * np.int32(bs[2 * s_] + bs[2 * s_ + 1]))
                acc[k, i] += (d_g[b * w + i] * dkk) * np.float32(sumi) - (m_g[b * w + i] * dkk) * np.float32(summ)


@njit(nogil=True, cache=True, inline="always")
def _q45_scratch(acts):
    """One thread's buffers for _q45_rows."""
    nsb = acts[1].shape[1]
    return (np.empty(nsb * GROUP, np.float32),           # dw (nsb, GROUP) float32
            np.empty(nsb * GROUP, np.float32),           # mw (nsb, GROUP) float32
            np.empty((nsb, 8, GROUP), np.int16),         # sc (nsb, 8, GROUP) int16
            np.empty((nsb, 8, GROUP), np.int16),         # mn (nsb, 8, GROUP) int16
            np.empty((nsb, 4, 8, GROUP), np.int16),      # part (nsb, 4, 8, GROUP) int16
            np.empty((acts[0].shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _q45_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q4_K / Q5_K against every token: out[:, r0:r0 + w]."""
    d, dmin, scales, qh, qs, has_qh, plain = planes
    xq, dk, bsums = acts
    dw, mw, sc, mn, part, acc = buffers
    nsb = dk.shape[1]
    decode_f16_plane(group_of(d, r0, w, nsb), dw, plain)
    decode_f16_plane(group_of(dmin, r0, w, nsb), mw, plain)
    qh_g = group_of(qh, r0, w, nsb * 32) if has_qh else qh
    acc[:, :] = 0
    _q45_group(dw, mw, group_of(scales, r0, w, nsb * 12), qh_g, group_of(qs, r0, w, nsb * 128), has_qh,
               xq, dk, bsums, sc, mn, part, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_q45_k(d, dmin, scales, qh, qs, has_qh, plain, n_out, n_chunks, x, out):
    """Q4_K (has_qh False) / Q5_K weights x Q8_K activations.

    d, dmin  # (n_out*nsb,) uint16 row groups
    scales   # (n_out*nsb*12,) uint8 row groups
    qh       # (n_out*nsb*32,) uint8 row groups (Q5_K; any uint8 array for Q4_K)
    qs       # (n_out*nsb*128,) uint8 row groups
    plain    # d and dmin hold only zeros and normal f16 (f16_plane_is_plain)
    n_chunks # runs of groups, one per thread (n_chunks_for)
    x        # (n_tok, n_in) float32
    out      # (n_tok, n_out) float32
    """
    over_row_groups(_q45_rows, _q45_scratch, (d, dmin, scales, qh, qs, has_qh, plain), acts_q8_k(x),
                    n_out, n_chunks, out)


@njit(nogil=True, cache=True, inline="always")
def _q6_half(ql_h, qh_h, w, xh, p):
    """One 128-element half of a Q6_K super-block. For l < 32:
        q(l)      = (ql[l] & 15)      | (qh[l] & 3) << 4          element l,      scale l // 16
        q(32 + l) = (ql[32 + l] & 15) | (qh[l] >> 2 & 3) << 4     element 32 + l, scale 2 + l // 16
        q(64 + l) = (ql[l] >> 4)      | (qh[l] >> 4 & 3) << 4     element 64 + l, scale 4 + l // 16
        q(96 + l) = (ql[32 + l] >> 4) | (qh[l] >> 6 & 3) << 4     element 96 + l, scale 6 + l // 16
    p[g, kk] = sum over l in [8g, 8g + 8) of (q(32 kk + l) - 32) * a (8 * 32 * 127 < 2**15).

    ql_h  # (64 * w,) uint8;  qh_h  # (32 * w,) uint8;  xh  # (128,) int16
    p     # (4, 4, GROUP) int16 out
    """
    for g in range(4):             # outside the row loop, so that loop stays small enough to vectorise
        for i in range(w):
            s0 = np.int16(0)
            s1 = np.int16(0)
            s2 = np.int16(0)
            s3 = np.int16(0)
            for l in range(g * 8, g * 8 + 8):
                a = np.int16(ql_h[l * w + i])
                c = np.int16(ql_h[(32 + l) * w + i])
                hb = np.int16(qh_h[l * w + i])
                s0 = np.int16(s0 + (((a & 15) | ((hb & 3) << 4)) - 32) * xh[l])
                s1 = np.int16(s1 + (((c & 15) | (((hb >> 2) & 3) << 4)) - 32) * xh[32 + l])
                s2 = np.int16(s2 + (((a >> 4) | (((hb >> 4) & 3) << 4)) - 32) * xh[64 + l])
                s3 = np.int16(s3 + (((c >> 4) | (((hb >> 6) & 3) << 4)) - 32) * xh[96 + l])
            p[g, 0, i] = s0
            p[g, 1, i] = s1
            p[g, 2, i] = s2
            p[g, 3, i] = s3


@njit(nogil=True, cache=True, inline="always")
def _q6_group(d_g, ql_g, qh_g, sc_g, xq, dk, part, acc):
    """One (full) row group of Q6_K against every token.

    d_g   # (nsb * GROUP,) float32;  ql_g  # (nsb * 128 * GROUP,) uint8
    qh_g  # (nsb * 64 * GROUP,) uint8;  sc_g  # (nsb * 16 * GROUP,) int8
    xq    # (n_tok, n_in) int16;  dk  # (n_tok, nsb) float32
    part  # (nsb, 2, 4, 4, GROUP) int16 scratch;  acc  # (n_tok, GROUP) float32 out, zeroed
    """
    n_tok, nsb = dk.shape
    w = GROUP
    for k in range(n_tok):
        for b in range(nsb):
            for half in range(2):
                _q6_half(ql_g[(b * 128 + half * 64) * w:(b * 128 + half * 64 + 64) * w],
                         qh_g[(b * 64 + half * 32) * w:(b * 64 + half * 32 + 32) * w], w,
                         xq[k, b * QK_K + half * 128:b * QK_K + (half + 1) * 128], part[b, half])
        for b in range(nsb):
            dkk = dk[k, b]
            for i in range(w):           # int32 throughout (np.int32 casts: numba would widen to int64)
                sumi = np.int32(0)
                for half in range(2):
                    for g in range(4):
                        for kk in range(4):
                            sc = np.int32(sc_g[(b * 16 + half * 8 + kk * 2 + g // 2) * w + i])
                            sumi = np.int32(sumi + sc * np.int32(part[b, half, g, kk, i]))
                acc[k, i] += (d_g[b * w + i] * dkk) * np.float32(sumi)


@njit(nogil=True, cache=True, inline="always")
def _q6_scratch(acts):
    """One thread's buffers for _q6_rows."""
    nsb = acts[1].shape[1]
    return (np.empty(nsb * GROUP, np.float32),              # dw (nsb, GROUP) float32
            np.empty((nsb, 2, 4, 4, GROUP), np.int16),      # part (nsb, 2, 4, 4, GROUP) int16
            np.empty((acts[0].shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _q6_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q6_K against every token: out[:, r0:r0 + w]."""
    ql, qh, scales, d, plain = planes
    xq, dk, _ = acts
    dw, part, acc = buffers
    nsb = dk.shape[1]
    decode_f16_plane(group_of(d, r0, w, nsb), dw, plain)
    acc[:, :] = 0
    _q6_group(dw, group_of(ql, r0, w, nsb * 128), group_of(qh, r0, w, nsb * 64), group_of(scales, r0, w, nsb * 16),
              xq, dk, part, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_q6_k(ql, qh, scales, d, plain, n_out, n_chunks, x, out):
    """Q6_K weights x Q8_K activations.

    ql      # (n_out*nsb*128,) uint8 row groups
    qh      # (n_out*nsb*64,) uint8 row groups
    scales  # (n_out*nsb*16,) int8 row groups
    d       # (n_out*nsb,) uint16 row groups
    plain   # d holds only zeros and normal f16
    n_chunks  # runs of groups, one per thread (n_chunks_for)
    x       # (n_tok, n_in) float32
    out     # (n_tok, n_out) float32
    """
    over_row_groups(_q6_rows, _q6_scratch, (ql, qh, scales, d, plain), acts_q8_k(x), n_out, n_chunks, out)
