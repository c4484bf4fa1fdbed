"""Kernels for the non-linear 4-bit formats IQ4_NL (blocks of 32) and IQ4_XS (super-blocks of
256), row-group layout.

GGUF blocks (ggml-common.h):
    block_iq4_nl { f16 d; u8 qs[16]; }                                      18 bytes
    block_iq4_xs { f16 d; u16 scales_h; u8 scales_l[4]; u8 qs[128]; }      136 bytes
A 4-bit index q picks one of 16 int8 levels, kvalues_iq4nl (ggml-common.h), instead of
standing for the integer q itself:
    IQ4_NL: w = d * kv[q]; byte j holds element j (low nibble) and j + 16 (high nibble).
    IQ4_XS: 8 sub-blocks of 32, each with a 6-bit scale ls (low 4 bits in nibble ib % 2 of
            scales_l[ib // 2], high 2 bits at bit 2 ib of scales_h): w = d * (ls - 32) * kv[q];
            sub-block ib's 16 bytes qs[16 ib ...] hold its elements as in IQ4_NL.

Dot products (arch/x86/quants.c ggml_vec_dot_iq4_nl_q8_0 / ggml_vec_dot_iq4_xs_q8_K,
llamafile/sgemm.cpp tinyBLAS_Q0_AVX for IQ4_NL batches):
    IQ4_NL x Q8_0: d_w * d_x * sum(kv[q] * a), in Q4_0's 8 lanes of 4 products, one FMA per
        block and lane, hsum_float_8 at the end: tinyBLAS's order, so batches of 2+ tokens
        are bit-identical to llama.cpp. Its one-token vec_dot splits the blocks over two
        accumulators (even and odd blocks) and adds them before the hsum: a different float
        order, the same integers.
    IQ4_XS x Q8_K: d_w * d_x * sum_ib (ls_ib - 32) * sum(kv[q] * a), integers exact; only the
        float adds across super-blocks are ordered differently from llama.cpp.
kv * a reaches 127 * 127, so unlike the other 4-bit kernels the sums are int32 from the
first product (int16 would overflow at three products).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import decode_f16, decode_f16_plane
from ..ops.simd import fma, hsum_float_8
from .activations import acts_q8_0, acts_q8_k
from .layout import GROUP, group_of, group_span, over_row_groups, tile_plane

QK = 32
QK_K = 256

# kvalues_iq4nl (ggml-common.h): the 16 levels a 4-bit index stands for
IQ4NL_VALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113],
                        dtype=np.int32)  # (16,) int32


# ---- repack (numpy, once at load)

def _split(raw, n_out, n_in, block, block_bytes):
    """raw (n_out, bytes_per_row) uint8 -> (n_out, nb, block_bytes) uint8."""
    return np.asarray(raw, dtype=np.uint8).reshape(n_out, n_in // block, block_bytes)


def _u16(blocks, offset):
    """(n_out, nb, block_bytes) -> (n_out, nb) uint16 field at offset."""
    return np.ascontiguousarray(blocks[:, :, offset:offset + 2]).view(np.uint16)[:, :, 0]


def repack_iq4_nl(raw, n_out, n_in):
    """-> {"d": (n_out*nb,) uint16, "qs": (n_out*nb*16,) uint8}, both in row groups."""
    b = _split(raw, n_out, n_in, QK, 18)                                  # (n_out, nb, 18) uint8
    return {"d": tile_plane(_u16(b, 0)), "qs": tile_plane(b[:, :, 2:])}


def repack_iq4_xs(raw, n_out, n_in):
    """-> d, scales_h (n_out*nsb,) uint16; scales_l (n_out*nsb*4,) uint8;
    qs (n_out*nsb*128,) uint8, all in row groups."""
    b = _split(raw, n_out, n_in, QK_K, 136)                               # (n_out, nsb, 136) uint8
    return {"d": tile_plane(_u16(b, 0)), "scales_h": tile_plane(_u16(b, 2)),
            "scales_l": tile_plane(b[:, :, 4:8]), "qs": tile_plane(b[:, :, 8:])}


# ---- dequantize rows (bit-exact with gguf.quants; serial: a lookup is a few rows per step)

@njit(nogil=True, cache=True)
def rows_iq4_nl(qs, d, n_out, ids, out):
    """IQ4_NL rows: d * kv[q].  qs (n_out*nb*16,) uint8 row groups; d (n_out*nb,) uint16
    row groups; ids (n_ids,) int64; out (n_ids, n_in) float32."""
    nb = out.shape[1] // QK
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(1, np.uint16)    # (1,) uint16
        f = np.empty(1, np.float32)   # (1,) float32
        for b in range(nb):
            h[0] = d[r0 * nb + b * w + i]
            decode_f16(h, f)
            base = r0 * nb * 16 + b * 16 * w + i
            for j in range(16):
                q = np.int32(qs[base + j * w])
                out[n, b * QK + j] = f[0] * np.float32(IQ4NL_VALUES[q & 15])
                out[n, b * QK + 16 + j] = f[0] * np.float32(IQ4NL_VALUES[q >> 4])


@njit(nogil=True, cache=True, inline="always")
def _xs_scale(sh, sl, ib):
    """6-bit scale of IQ4_XS sub-block ib, minus 32.  sh: scales_h (int); sl: scales_l[ib // 2]."""
    return np.int32((((sl >> (4 * (ib & 1))) & 15) | (((sh >> (2 * ib)) & 3) << 4)) - 32)


@njit(nogil=True, cache=True)
def rows_iq4_xs(d, scales_h, scales_l, qs, n_out, ids, out):
    """IQ4_XS rows: (d * (ls - 32)) * kv[q].

    d, scales_h  # (n_out*nsb,) uint16 row groups
    scales_l     # (n_out*nsb*4,) uint8 row groups
    qs           # (n_out*nsb*128,) uint8 row groups
    ids          # (n_ids,) int64
    out          # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(1, np.uint16)    # (1,) uint16
        f = np.empty(1, np.float32)   # (1,) float32
        for b in range(nsb):
            h[0] = d[r0 * nsb + b * w + i]
            decode_f16(h, f)
            sh = np.int32(scales_h[r0 * nsb + b * w + i])
            qbase = r0 * nsb * 128 + b * 128 * w + i
            for ib in range(8):
                sl = np.int32(scales_l[r0 * nsb * 4 + (b * 4 + ib // 2) * w + i])
                dl = f[0] * np.float32(_xs_scale(sh, sl, ib))
                for j in range(16):
                    q = np.int32(qs[qbase + (ib * 16 + j) * w])
                    out[n, b * QK_K + ib * 32 + j] = dl * np.float32(IQ4NL_VALUES[q & 15])
                    out[n, b * QK_K + ib * 32 + 16 + j] = dl * np.float32(IQ4NL_VALUES[q >> 4])


# ---- products

@njit(nogil=True, cache=True, inline="always")
def _lane_sums(blk, w, xb, s):
    """s[l, i] = sum_k kv[q(4l + k)] * xb[4l + k]: llama.cpp's 8 lanes of one 32-block
    (lanes 0-3 the low nibbles, elements 0-15; 4-7 the high ones, elements 16-31).

    blk  # (16 * w,) uint8: byte j of row i at j * w + i
    xb   # (32,) int16
    s    # (8, GROUP) int32 out
    """
    for i in range(w):
        for l in range(4):
            lo = np.int32(0)
            hi = np.int32(0)
            for k in range(4):
                q = np.int32(blk[(4 * l + k) * w + i])
                lo += IQ4NL_VALUES[q & 15] * np.int32(xb[4 * l + k])
                hi += IQ4NL_VALUES[q >> 4] * np.int32(xb[16 + 4 * l + k])
            s[l, i] = lo
            s[4 + l, i] = hi


@njit(nogil=True, cache=True, inline="always")
def _iq4_nl_group(qs_g, dw, r0, n_valid, xq, dx, s, acc, out):
    """One (full) row group of IQ4_NL against every token: out[k, r0:r0 + n_valid].

    qs_g  # (nb * 16 * GROUP,) uint8;  dw  # (nb * GROUP,) float32
    xq    # (n_tok, n_in) int16;  dx  # (n_tok, nb) float32
    s     # (nb, 8, GROUP) int32 scratch;  acc  # (8, GROUP) float32 scratch
    out   # (n_tok, n_out) float32
    """
    n_tok = xq.shape[0]
    nb = dx.shape[1]
    w = GROUP
    for k in range(n_tok):
        for b in range(nb):
            _lane_sums(qs_g[b * 16 * w:(b + 1) * 16 * w], w, xq[k, b * QK:(b + 1) * QK], s[b])
        acc[:, :] = 0
        for b in range(nb):
            dxk = dx[k, b]
            for i in range(w):
                dd = dw[b * w + i] * dxk              # f16 x f16: exact in float32
                for l in range(8):
                    acc[l, i] = fma(dd, np.float32(s[b, l, i]), acc[l, i])
        for i in range(n_valid):
            out[k, r0 + i] = hsum_float_8(acc[0, i], acc[1, i], acc[2, i], acc[3, i],
                                          acc[4, i], acc[5, i], acc[6, i], acc[7, i])


@njit(nogil=True, cache=True, inline="always")
def _iq4_nl_scratch(acts):
    """One thread's buffers for _iq4_nl_rows."""
    nb = acts[1].shape[1]
    return (np.empty(nb * GROUP, np.float32),        # dw (nb, GROUP) float32
            np.empty((nb, 8, GROUP), np.int32),      # s (nb, 8, GROUP) int32
            np.empty((8, GROUP), np.float32))        # acc (8, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _iq4_nl_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of IQ4_NL against every token: out[:, r0:r0 + w]."""
    qs, d, plain = planes
    xq, dx, _ = acts
    dw, s, acc = buffers
    nb = dx.shape[1]
    decode_f16_plane(group_of(d, r0, w, nb), dw, plain)
    _iq4_nl_group(group_of(qs, r0, w, nb * 16), dw, r0, w, xq, dx, s, acc, out)


@njit(parallel=True, nogil=True, cache=True)
def matmul_iq4_nl(qs, d, plain, n_out, n_chunks, x, out):
    """IQ4_NL weights x Q8_0 activations.

    qs     # (n_out*nb*16,) uint8 row groups
    d      # (n_out*nb,) uint16 row groups
    plain  # d holds only zeros and normal f16
    n_chunks  # runs of groups, one per thread (n_chunks_for)
    x      # (n_tok, n_in) float32
    out    # (n_tok, n_out) float32
    """
    over_row_groups(_iq4_nl_rows, _iq4_nl_scratch, (qs, d, plain), acts_q8_0(x), n_out, n_chunks, out)


@njit(nogil=True, cache=True, inline="always")
def _iq4_xs_group(d_g, sh_g, sl_g, qs_g, xq, dk, part, acc):
    """One (full) row group of IQ4_XS against every token.

    d_g   # (nsb * GROUP,) float32;  sh_g  # (nsb * GROUP,) uint16
    sl_g  # (nsb * 4 * GROUP,) uint8;  qs_g  # (nsb * 128 * GROUP,) uint8
    xq    # (n_tok, n_in) int16;  dk  # (n_tok, nsb) float32
    part  # (nsb, 8, GROUP) int32 scratch: sum(kv[q] * a) per sub-block
    acc   # (n_tok, GROUP) float32 out, zeroed by the caller
    """
    n_tok, nsb = dk.shape
    w = GROUP
    for k in range(n_tok):
        for b in range(nsb):
            for ib in range(8):
                blk = qs_g[(b * 128 + ib * 16) * w:(b * 128 + ib * 16 + 16) * w]
                xb = xq[k, b * QK_K + ib * 32:b * QK_K + ib * 32 + 32]
                for i in range(w):
                    t = np.int32(0)
                    for j in range(16):
                        q = np.int32(blk[j * w + i])
                        t += IQ4NL_VALUES[q & 15] * np.int32(xb[j]) + IQ4NL_VALUES[q >> 4] * np.int32(xb[16 + j])
                    part[b, ib, i] = t
        for b in range(nsb):
            dkk = dk[k, b]
            for i in range(w):
                sh = np.int32(sh_g[b * w + i])
                sumi = np.int32(0)
                for ib in range(8):
                    sl = np.int32(sl_g[(b * 4 + ib // 2) * w + i])
                    sumi += _xs_scale(sh, sl, ib) * part[b, ib, i]
                acc[k, i] += (d_g[b * w + i] * dkk) * np.float32(sumi)


@njit(nogil=True, cache=True, inline="always")
def _iq4_xs_scratch(acts):
    """One thread's buffers for _iq4_xs_rows."""
    nsb = acts[1].shape[1]
    return (np.empty(nsb * GROUP, np.float32),              # dw (nsb, GROUP) float32
            np.empty((nsb, 8, GROUP), np.int32),            # part (nsb, 8, GROUP) int32
            np.empty((acts[0].shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _iq4_xs_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of IQ4_XS against every token: out[:, r0:r0 + w]."""
    d, scales_h, scales_l, qs, plain = planes
    xq, dk, _ = acts
    dw, part, acc = buffers
    nsb = dk.shape[1]
    decode_f16_plane(group_of(d, r0, w, nsb), dw, plain)
    acc[:, :] = 0
    _iq4_xs_group(dw, group_of(scales_h, r0, w, nsb), group_of(scales_l, r0, w, nsb * 4),
                  group_of(qs, r0, w, nsb * 128), xq, dk, part, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_iq4_xs(d, scales_h, scales_l, qs, plain, n_out, n_chunks, x, out):
    """IQ4_XS weights x Q8_K activations.

    d, scales_h  # (n_out*nsb,) uint16 row groups
    scales_l     # (n_out*nsb*4,) uint8 row groups
    qs           # (n_out*nsb*128,) uint8 row groups
    plain        # d holds only zeros and normal f16
    n_chunks     # runs of groups, one per thread (n_chunks_for)
    x            # (n_tok, n_in) float32
    out          # (n_tok, n_out) float32
    """
    over_row_groups(_iq4_xs_rows, _iq4_xs_scratch, (d, scales_h, scales_l, qs, plain), acts_q8_k(x),
                    n_out, n_chunks, out)
