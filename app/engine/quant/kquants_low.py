"""Kernels for the low-bit K-quant formats Q2_K and Q3_K (super-blocks of 256, row-group
layout); Q4_K..Q6_K are in quant/kquants.py.

GGUF blocks (ggml-common.h):
    block_q2_K { u8 scales[16]; u8 qs[64]; f16 d; f16 dmin; }               84 bytes
    block_q3_K { u8 hmask[32]; u8 qs[64]; u8 scales[12]; f16 d; }           110 bytes
Both have 16 sub-blocks of 16 and 2-bit quants laid out alike: element e = 128 h + 32 j + l
(h < 2, j < 4, l < 32) is bits 2j..2j+1 of qs[32 h + l], and belongs to sub-block e // 16.
    Q2_K: sub-block s has a 4-bit scale sc = scales[s] & 15 and a 4-bit min m = scales[s] >> 4;
          w = (d * sc) * q - (dmin * m).
    Q3_K: the third bit of element e is bit 4h + j (= e // 32) of hmask[l]; a clear bit
          subtracts 4, so q = q2 - 4 * (1 - bit) in [-4, 3]. Sub-block s has a 6-bit scale,
          its low 4 bits in nibble s // 8 of scales[s % 8], its high 2 bits at bit 2 (s // 4)
          of scales[8 + s % 4]; w = (d * (sc - 32)) * q.

Dot products against Q8_K activations follow llama.cpp (ggml-cpu/quants.c
ggml_vec_dot_q2_K_q8_K_generic / _q3_K_q8_K_generic, arch/x86/quants.c for AVX2):
    Q2_K: d_w * d_x * sum_s sc_s * sum(q * a)  -  dmin_w * d_x * sum_s m_s * bsums[s]
    Q3_K: d_w * d_x * sum_s (sc_s - 32) * sum(q * a)
All sums are exact integers (16 products of |q| <= 4 by |a| <= 127 fit int16); only the float
adds across super-blocks are ordered differently from llama.cpp.
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


def repack_q2_k(raw, n_out, n_in):
    """-> scales (n_out*nsb*16,) uint8; qs (n_out*nsb*64,) uint8; d, dmin (n_out*nsb,) uint16."""
    b = _split(raw, n_out, n_in, 84)                                   # (n_out, nsb, 84) uint8
    return {"scales": tile_plane(b[:, :, 0:16]), "qs": tile_plane(b[:, :, 16:80]),
            "d": tile_plane(_f16(b, 80)), "dmin": tile_plane(_f16(b, 82))}


def repack_q3_k(raw, n_out, n_in):
    """-> hmask (n_out*nsb*32,) uint8; qs (n_out*nsb*64,) uint8; scales (n_out*nsb*12,) uint8;
    d (n_out*nsb,) uint16."""
    b = _split(raw, n_out, n_in, 110)                                  # (n_out, nsb, 110) uint8
    return {"hmask": tile_plane(b[:, :, 0:32]), "qs": tile_plane(b[:, :, 32:96]),
            "scales": tile_plane(b[:, :, 96:108]), "d": tile_plane(_f16(b, 108))}


# ---- scales

@njit(nogil=True, cache=True, inline="always")
def _q3_scales(sb, w, sc):
    """The 16 6-bit scales of Q3_K minus 32, for every row of a group (ggml-quants.c
    dequantize_row_q3_K's kmask unpacking, written per scale).

    sb  # (12 * w,) uint8: scale byte k of row i at k * w + i
    sc  # (16, w) int16 out
    """
    for s in range(16):
        for i in range(w):
            lo = (np.int16(sb[(s % 8) * w + i]) >> (4 * (s // 8))) & 15
            hi = (np.int16(sb[(8 + s % 4) * w + i]) >> (2 * (s // 4))) & 3
            sc[s, i] = np.int16((lo | (hi << 4)) - 32)


# ---- dequantize rows (bit-exact with gguf.quants; serial: a lookup is a few rows per step)

@njit(nogil=True, cache=True)
def rows_q2_k(scales, qs, d, dmin, n_out, ids, out):
    """Q2_K rows: (d * sc) * q - (dmin * m).

    scales  # (n_out*nsb*16,) uint8 row groups
    qs      # (n_out*nsb*64,) uint8 row groups
    d, dmin # (n_out*nsb,) uint16 row groups
    ids     # (n_ids,) int64
    out     # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(2, np.uint16)                 # (2,) uint16
        f = np.empty(2, np.float32)                # (2,) float32: d, dmin
        for b in range(nsb):
            h[0] = d[r0 * nsb + b * w + i]
            h[1] = dmin[r0 * nsb + b * w + i]
            decode_f16(h, f)
            qbase = r0 * nsb * 64 + b * 64 * w + i
            sbase = r0 * nsb * 16 + b * 16 * w + i
            for e in range(QK_K):
                s = e // 16
                sc = np.int32(scales[sbase + s * w])
                q = (np.int32(qs[qbase + ((e // 128) * 32 + e % 32) * w]) >> (2 * ((e // 32) % 4))) & 3
                out[n, b * QK_K + e] = (f[0] * np.float32(sc & 15)) * np.float32(q) - f[1] * np.float32(sc >> 4)


@njit(nogil=True, cache=True)
def rows_q3_k(hmask, qs, scales, d, n_out, ids, out):
    """Q3_K rows: (d * (sc - 32)) * q.

    hmask   # (n_out*nsb*32,) uint8 row groups
    qs      # (n_out*nsb*64,) uint8 row groups
    scales  # (n_out*nsb*12,) uint8 row groups
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
        sb = np.empty(12, np.uint8)                # (12,) uint8 scale bytes of this row
        sc = np.empty((16, 1), np.int16)           # (16, 1) int16
        for b in range(nsb):
            h[0] = d[r0 * nsb + b * w + i]
            decode_f16(h, f)
            for k in range(12):
                sb[k] = scales[r0 * nsb * 12 + (b * 12 + k) * w + i]
            _q3_scales(sb, 1, sc)
            qbase = r0 * nsb * 64 + b * 64 * w + i
            hbase = r0 * nsb * 32 + b * 32 * w + i
            for e in range(QK_K):
                l = e % 32
                q = (np.int32(qs[qbase + ((e // 128) * 32 + l) * w]) >> (2 * ((e // 32) % 4))) & 3
                hb = (np.int32(hmask[hbase + l * w]) >> (e // 32)) & 1
                out[n, b * QK_K + e] = (f[0] * np.float32(sc[e // 16, 0])) * np.float32(q - 4 * (1 - hb))


# ---- products
#
# As in quant/kquants.py: the loops across the 16 rows of a group keep int16 as their widest
# type and leave one partial sum per sub-block of 16; a second pass per token applies the
# scales in int32 and the floats.

@njit(nogil=True, cache=True, inline="always")
def _q2_sums(qs_b, w, xk, p):
    """Q2_K, one super-block: p[s, i] = sum over sub-block s of q * a (16 * 3 * 127 < 2**15).

    qs_b  # (64 * w,) uint8: the super-block's quants, byte k of row i at k * w + i
    xk    # (256,) int16;  p  # (16, GROUP) int16 out
    """
    for h in range(2):
        for j in range(4):
            for half in range(2):
                s = 8 * h + 2 * j + half
                for i in range(w):
                    t = np.int16(0)
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int16(qs_b[(h * 32 + l) * w + i]) >> (2 * j)) & 3
                        t = np.int16(t + q * xk[128 * h + 32 * j + l])
                    p[s, i] = t


@njit(nogil=True, cache=True, inline="always")
def _q3_sums(hm_b, qs_b, w, xk, p):
    """Q3_K, one super-block: p[s, i] = sum over sub-block s of q * a, q in [-4, 3]
    (16 * 4 * 127 < 2**15). Given the super-block's slices rather than the group's planes
    and an offset: with the offset, LLVM leaves this loop scalar.

    hm_b  # (32 * w,) uint8;  qs_b  # (64 * w,) uint8
    xk    # (256,) int16;  p  # (16, GROUP) int16 out
    """
    for h in range(2):
        for j in range(4):
            for half in range(2):
                s = 8 * h + 2 * j + half
                for i in range(w):
                    t = np.int16(0)
                    for l in range(16 * half, 16 * half + 16):
                        q = (np.int16(qs_b[(h * 32 + l) * w + i]) >> (2 * j)) & 3
                        hb = (np.int16(hm_b[l * w + i]) >> (4 * h + j)) & 1
                        t = np.int16(t + (q - 4 + 4 * hb) * xk[128 * h + 32 * j + l])
                    p[s, i] = t


@njit(nogil=True, cache=True, inline="always")
def _q2_group(sc_g, qs_g, d_g, m_g, xq, dk, bsums, part, acc):
    """One (full) row group of Q2_K against every token.

    sc_g  # (nsb * 16 * GROUP,) uint8;  qs_g  # (nsb * 64 * GROUP,) uint8
    d_g, m_g  # (nsb * GROUP,) float32 the group's d and dmin
    xq    # (n_tok, n_in) int16;  dk  # (n_tok, nsb) float32;  bsums  # (n_tok, nsb * 16) int32
    part  # (nsb, 16, GROUP) int16 scratch;  acc  # (n_tok, GROUP) float32 out, zeroed
    """
    n_tok, nsb = dk.shape
    w = GROUP
    for k in range(n_tok):
        for b in range(nsb):
            _q2_sums(qs_g[b * 64 * w:(b + 1) * 64 * w], w, xq[k, b * QK_K:(b + 1) * QK_K], part[b])
        for b in range(nsb):
            dkk = dk[k, b]
            bs = bsums[k, b * 16:(b + 1) * 16]
            for i in range(w):           # int32 throughout (np.int32 casts: numba would widen to int64)
                sumi = np.int32(0)
                summ = np.int32(0)
                for s in range(16):
                    sc = np.int32(sc_g[(b * 16 + s) * w + i])
                    sumi = np.int32(sumi + (sc & 15) * np.int32(part[b, s, i]))
                    summ = np.int32(summ + (sc >> 4) * bs[s])
                acc[k, i] += (d_g[b * w + i] * dkk) * np.float32(sumi) - (m_g[b * w + i] * dkk) * np.float32(summ)


@njit(nogil=True, cache=True, inline="always")
def _q3_group(hm_g, qs_g, sc_g, d_g, xq, dk, sc, part, acc):
    """One (full) row group of Q3_K against every token.

    hm_g  # (nsb * 32 * GROUP,) uint8;  qs_g  # (nsb * 64 * GROUP,) uint8
    sc_g  # (nsb * 12 * GROUP,) uint8;  d_g  # (nsb * GROUP,) float32
    xq    # (n_tok, n_in) int16;  dk  # (n_tok, nsb) float32
    sc    # (nsb, 16, GROUP) int16 scratch: the scales minus 32
    part  # (nsb, 16, GROUP) int16 scratch;  acc  # (n_tok, GROUP) float32 out, zeroed
    """
    n_tok, nsb = dk.shape
    w = GROUP
    for b in range(nsb):
        _q3_scales(sc_g[b * 12 * w:(b + 1) * 12 * w], w, sc[b])
    for k in range(n_tok):
        for b in range(nsb):
            _q3_sums(hm_g[b * 32 * w:(b + 1) * 32 * w], qs_g[b * 64 * w:(b + 1) * 64 * w], w,
                     xq[k, b * QK_K:(b + 1) * QK_K], part[b])
        for b in range(nsb):
            dkk = dk[k, b]
            for i in range(w):
                sumi = np.int32(0)
                for s in range(16):
                    sumi = np.int32(sumi + np.int32(sc[b, s, i]) * np.int32(part[b, s, i]))
                acc[k, i] += (d_g[b * w + i] * dkk) * np.float32(sumi)


@njit(nogil=True, cache=True, inline="always")
def _q2_scratch(acts):
    """One thread's buffers for _q2_rows."""
    nsb = acts[1].shape[1]
    return (np.empty(nsb * GROUP, np.float32),              # dw (nsb, GROUP) float32
            np.empty(nsb * GROUP, np.float32),              # mw (nsb, GROUP) float32
            np.empty((nsb, 16, GROUP), np.int16),           # part (nsb, 16, GROUP) int16
            np.empty((acts[0].shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _q2_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q2_K against every token: out[:, r0:r0 + w]."""
    scales, qs, d, dmin, plain = planes
    xq, dk, bsums = acts
    dw, mw, part, acc = buffers
    nsb = dk.shape[1]
    decode_f16_plane(group_of(d, r0, w, nsb), dw, plain)
    decode_f16_plane(group_of(dmin, r0, w, nsb), mw, plain)
    acc[:, :] = 0
    _q2_group(group_of(scales, r0, w, nsb * 16), group_of(qs, r0, w, nsb * 64), dw, mw, xq, dk, bsums, part, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_q2_k(scales, qs, d, dmin, plain, n_out, n_chunks, x, out):
    """Q2_K weights x Q8_K activations.

    scales   # (n_out*nsb*16,) uint8 row groups
    qs       # (n_out*nsb*64,) uint8 row groups
    d, dmin  # (n_out*nsb,) uint16 row groups
    plain    # d and dmin hold only zeros and normal f16 (f16_plane_is_plain)
    n_chunks # runs of groups, one per thread (n_chunks_for)
    x        # (n_tok, n_in) float32
    out      # (n_tok, n_out) float32
    """
    over_row_groups(_q2_rows, _q2_scratch, (scales, qs, d, dmin, plain), acts_q8_k(x), n_out, n_chunks, out)


@njit(nogil=True, cache=True, inline="always")
def _q3_scratch(acts):
    """One thread's buffers for _q3_rows."""
    nsb = acts[1].shape[1]
    return (np.empty(nsb * GROUP, np.float32),              # dw (nsb, GROUP) float32
            np.empty((nsb, 16, GROUP), np.int16),           # sc (nsb, 16, GROUP) int16
            np.empty((nsb, 16, GROUP), np.int16),           # part (nsb, 16, GROUP) int16
            np.empty((acts[0].shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _q3_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q3_K against every token: out[:, r0:r0 + w]."""
    hmask, qs, scales, d, plain = planes
    xq, dk, _ = acts
    dw, sc, part, acc = buffers
    nsb = dk.shape[1]
    decode_f16_plane(group_of(d, r0, w, nsb), dw, plain)
    acc[:, :] = 0
    _q3_group(group_of(hmask, r0, w, nsb * 32), group_of(qs, r0, w, nsb * 64), group_of(scales, r0, w, nsb * 12),
              dw, xq, dk, sc, part, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_q3_k(hmask, qs, scales, d, plain, n_out, n_chunks, x, out):
    """Q3_K weights x Q8_K activations.

    hmask    # (n_out*nsb*32,) uint8 row groups
    qs       # (n_out*nsb*64,) uint8 row groups
    scales   # (n_out*nsb*12,) uint8 row groups
    d        # (n_out*nsb,) uint16 row groups
    plain    # d holds only zeros and normal f16
    n_chunks # runs of groups, one per thread (n_chunks_for)
    x        # (n_tok, n_in) float32
    out      # (n_tok, n_out) float32
    """
    over_row_groups(_q3_rows, _q3_scratch, (hmask, qs, scales, d, plain), acts_q8_k(x), n_out, n_chunks, out)
