"""Kernels for the 32-element block formats Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 (row-group layout).

GGUF blocks (ggml-common.h):
    block_q4_0  { f16 d;          u8 qs[16]; }            18 bytes, w = d * (q - 8)
    block_q4_1  { f16 d; f16 m;   u8 qs[16]; }            20 bytes, w = d * q + m
    block_q5_0  { f16 d;          u8 qh[4]; u8 qs[16]; }  22 bytes, w = d * (q - 16)
    block_q5_1  { f16 d; f16 m;   u8 qh[4]; u8 qs[16]; }  24 bytes, w = d * q + m
    block_q8_0  { f16 d;          i8 qs[32]; }            34 bytes, w = d * q
In Q4/Q5 blocks byte j holds element j in its low nibble and element j + 16 in its high
nibble; Q5's fifth bit of element e is bit e of qh read as a little-endian uint32, i.e. bit
e % 8 of qh[e // 8].

Each field becomes a plane in the row-group layout of quant/layout.py: for a group of w (16)
rows, block b, byte j of row i sits at ``r0*nb*B + (b*B + j)*w + i`` (B bytes per block), so
one block of a whole group is a contiguous (B, 16) tile and a vector load takes byte j of 16
rows.

Dot products are llama.cpp's (arch/x86/quants.c), float order included (see "per-group
products" below): integer sums of 4 products per lane against the int8 activations, one FMA
per block and lane by the product of the two f16 scales, then the lanes' sum:
    Q4_0 x Q8_0: d_w * d_x * sum((q - 8) * a)        ggml_vec_dot_q4_0_q8_0
    Q4_1 x Q8_1: d_w * d_x * sum(q * a) + m_w * s_x  ggml_vec_dot_q4_1_q8_1
    Q5_0 x Q8_0: d_w * d_x * sum((q - 16) * a)       ggml_vec_dot_q5_0_q8_0
    Q5_1 x Q8_1: d_w * d_x * sum(q * a) + m_w * s_x  ggml_vec_dot_q5_1_q8_1
    Q8_0 x Q8_0: d_w * d_x * sum(q * a)              ggml_vec_dot_q8_0_q8_0
Q5 uses Q4's lanes: the AVX2 code ORs the fifth bits into the nibbles (bytes_from_bits_32) and
then runs the same mul_sum_i8_pairs / mul_sum_us8_pairs and FMA per block.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import decode_f16, decode_f16_plane
from ..ops.simd import fma, hsum_float_8
from .activations import acts_q8_0, acts_q8_1
from .layout import GROUP, group_of, group_span, over_row_groups, tile_plane

QK = 32
EIGHT = np.int32(8)
SIXTEEN = np.int32(16)

# kind codes of the nibble formats (matmul_nibbles): bit 0 = has a min (Q8_1 activations),
# bit 1 = has a fifth bit (qh)
KIND_Q4_0, KIND_Q4_1, KIND_Q5_0, KIND_Q5_1 = 0, 1, 2, 3


# ---- repack (numpy, once at load)

def _split_blocks(raw: np.ndarray, n_out: int, n_in: int, block_bytes: int) -> np.ndarray:
    """raw (n_out, bytes_per_row) uint8 -> (n_out, nb, block_bytes) uint8."""
    return np.asarray(raw, dtype=np.uint8).reshape(n_out, n_in // QK, block_bytes)


def _f16_plane(blocks: np.ndarray, offset: int) -> np.ndarray:
    """(n_out, nb, block_bytes) uint8 -> (n_out, nb) uint16: the f16 field at byte offset."""
    return np.ascontiguousarray(blocks[:, :, offset:offset + 2]).view(np.uint16)[:, :, 0]


def repack_q4_0(raw, n_out, n_in):
    """-> {"d": (n_out*nb,) uint16, "qs": (n_out*nb*16,) uint8}, both in row groups."""
    blocks = _split_blocks(raw, n_out, n_in, 18)                          # (n_out, nb, 18) uint8
    return {"d": tile_plane(_f16_plane(blocks, 0)),
            "qs": tile_plane(blocks[:, :, 2:])}


def repack_q4_1(raw, n_out, n_in):
    """-> {"d", "m": (n_out*nb,) uint16, "qs": (n_out*nb*16,) uint8}, all in row groups."""
    blocks = _split_blocks(raw, n_out, n_in, 20)                          # (n_out, nb, 20) uint8
    return {"d": tile_plane(_f16_plane(blocks, 0)),
            "m": tile_plane(_f16_plane(blocks, 2)),
            "qs": tile_plane(blocks[:, :, 4:])}


def repack_q5_0(raw, n_out, n_in):
    """-> {"d": (n_out*nb,) uint16, "qh": (n_out*nb*4,) uint8, "qs": (n_out*nb*16,) uint8}."""
    blocks = _split_blocks(raw, n_out, n_in, 22)                          # (n_out, nb, 22) uint8
    return {"d": tile_plane(_f16_plane(blocks, 0)),
            "qh": tile_plane(blocks[:, :, 2:6]),
            "qs": tile_plane(blocks[:, :, 6:])}


def repack_q5_1(raw, n_out, n_in):
    """-> {"d", "m": (n_out*nb,) uint16, "qh": (n_out*nb*4,) uint8, "qs": (n_out*nb*16,) uint8}."""
    blocks = _split_blocks(raw, n_out, n_in, 24)                          # (n_out, nb, 24) uint8
    return {"d": tile_plane(_f16_plane(blocks, 0)),
            "m": tile_plane(_f16_plane(blocks, 2)),
            "qh": tile_plane(blocks[:, :, 4:8]),
            "qs": tile_plane(blocks[:, :, 8:])}


def repack_q8_0(raw, n_out, n_in):
    """-> {"d": (n_out*nb,) uint16, "qs": (n_out*nb*32,) int8}, both in row groups."""
    blocks = _split_blocks(raw, n_out, n_in, 34)                          # (n_out, nb, 34) uint8
    return {"d": tile_plane(_f16_plane(blocks, 0)),
            "qs": tile_plane(blocks[:, :, 2:].view(np.int8))}


# ---- dequantize rows (bit-exact with gguf.quants; serial: a lookup is a few rows per step)

@njit(nogil=True, cache=True)
def rows_q4(qs, d, m, has_min, n_out, ids, out):
    """Q4_0 (has_min False: d * (q - 8)) or Q4_1 (d * q + m) rows.

    qs   # (n_out*nb*16,) uint8 row groups
    d, m # (n_out*nb,) uint16 row groups (m unused for Q4_0)
    ids  # (n_ids,) int64
    out  # (n_ids, n_in) float32
    """
    nb = out.shape[1] // QK
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(2, np.uint16)    # (2,) uint16: d, m bits
        f = np.empty(2, np.float32)   # (2,) float32: d, m
        for b in range(nb):
            h[0] = d[r0 * nb + b * w + i]
            h[1] = m[r0 * nb + b * w + i] if has_min else 0
            decode_f16(h, f)
            base = r0 * nb * 16 + b * 16 * w + i
            for j in range(16):
                q = np.int32(qs[base + j * w])
                lo, hi = q & 15, q >> 4
                if has_min:
                    out[n, b * QK + j] = f[0] * np.float32(lo) + f[1]
                    out[n, b * QK + 16 + j] = f[0] * np.float32(hi) + f[1]
                else:
                    out[n, b * QK + j] = f[0] * np.float32(lo - EIGHT)
                    out[n, b * QK + 16 + j] = f[0] * np.float32(hi - EIGHT)


@njit(nogil=True, cache=True)
def rows_q5(qs, qh, d, m, has_min, n_out, ids, out):
    """Q5_0 (has_min False: d * (q - 16)) or Q5_1 (d * q + m) rows, q = nibble | fifth bit << 4.

    qs   # (n_out*nb*16,) uint8 row groups
    qh   # (n_out*nb*4,) uint8 row groups
    d, m # (n_out*nb,) uint16 row groups (m unused for Q5_0)
    ids  # (n_ids,) int64
    out  # (n_ids, n_in) float32
    """
    nb = out.shape[1] // QK
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        i = r - r0
        h = np.empty(2, np.uint16)    # (2,) uint16: d, m bits
        f = np.empty(2, np.float32)   # (2,) float32: d, m
        for b in range(nb):
            h[0] = d[r0 * nb + b * w + i]
            h[1] = m[r0 * nb + b * w + i] if has_min else 0
            decode_f16(h, f)
            base = r0 * nb * 16 + b * 16 * w + i
            hbase = r0 * nb * 4 + b * 4 * w + i
            bits = np.int64(0)        # qh as the little-endian uint32 it is
            for k in range(4):
                bits |= np.int64(qh[hbase + k * w]) << (8 * k)
            for j in range(16):
                q = np.int32(qs[base + j * w])
                lo = (q & 15) | np.int32(((bits >> j) & 1) << 4)
                hi = (q >> 4) | np.int32(((bits >> (j + 16)) & 1) << 4)
                if has_min:
                    out[n, b * QK + j] = f[0] * np.float32(lo) + f[1]
                    out[n, b * QK + 16 + j] = f[0] * np.float32(hi) + f[1]
                else:
                    out[n, b * QK + j] = f[0] * np.float32(lo - SIXTEEN)
                    out[n, b * QK + 16 + j] = f[0] * np.float32(hi - SIXTEEN)


@njit(nogil=True, cache=True)
def rows_q8_0(qs, d, n_out, ids, out):
    """Q8_0 rows: q * d.  qs (n_out*nb*32,) int8 row groups; d (n_out*nb,) uint16 row groups;
    ids (n_ids,) int64; out (n_ids, n_in) float32."""
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
            base = r0 * nb * QK + b * QK * w + i
            for j in range(QK):
                out[n, b * QK + j] = np.float32(qs[base + j * w]) * f[0]


# ---- per-group products (always a full group: w = GROUP is a constant, so loops unroll)
#
# llama.cpp's AVX2 dot product (ggml_vec_dot_q4_0_q8_0, _q4_1_q8_1, _q8_0_q8_0 in
# arch/x86/quants.c) keeps 8 float lanes: lane l gets the integer sum of elements 4l..4l+3
# of each block (vpmaddubsw + vpmaddwd), multiplied by d_w * d_x and added with one FMA;
# the 8 lanes are summed at the end by hsum_float_8 (Q4_1 then adds sum(m_w * s_x)). We do
# exactly that per row, so our products are bit-identical to llama.cpp's on an AVX2 build
# (tinyBLAS, which llama.cpp uses for Q4_0/Q8_0 prefill, keeps the same lanes and order),
# and greedy decoding follows the same path through near-ties. Vectors run across 16 rows.

@njit(nogil=True, cache=True, inline="always")
def _nibble_lane_sums(blk, w, xb, offset, s):
    """s[l, i] (l < 4) = sum_k (lo(q[4l+k, i]) - offset) * xb[4l+k], and s[4+l, i] the same
    for the high nibbles against xb[16+4l+k]: llama.cpp's 8 lanes (lanes 0-3 are elements
    0-15, the low nibbles; 4-7 elements 16-31). Four products fit int16, and the loop has no
    wider type: LLVM sizes vectors by the widest type, and int32 here would halve the lanes.

    blk     # (16 * w,) uint8: byte j of row i at j * w + i
    xb      # (32,) int16: the block's activations
    offset  # 8 for Q4_0 (q - 8), 0 for Q4_1
    s       # (8, GROUP) int16 out
    """
    for i in range(w):
        for l in range(4):
            lo = np.int16(0)
            hi = np.int16(0)
            for k in range(4):
                q = np.int16(blk[(4 * l + k) * w + i])
                lo = np.int16(lo + ((q & 15) - offset) * xb[4 * l + k])
                hi = np.int16(hi + ((q >> 4) - offset) * xb[16 + 4 * l + k])
            s[l, i] = lo
            s[4 + l, i] = hi


@njit(nogil=True, cache=True, inline="always")
def _nibble5_lane_sums(blk, hb, w, xb, offset, s):
    """As _nibble_lane_sums for Q5: element e (< 16) is lo(q[e]) | bit e of qh << 4, element
    16 + e is hi(q[e]) | bit 16 + e << 4 (4 * 31 * 127 < 2**15, so int16 still holds a lane).

    blk     # (16 * w,) uint8 quants;  hb  # (4 * w,) uint8: qh byte k of row i at k * w + i
    xb      # (32,) int16
    offset  # 16 for Q5_0 (q - 16), 0 for Q5_1
    s       # (8, GROUP) int16 out
    """
    for i in range(w):
        for l in range(4):
            lo = np.int16(0)
            hi = np.int16(0)
            for k in range(4):
                e = 4 * l + k
                q = np.int16(blk[e * w + i])
                bl = np.int16(hb[(e >> 3) * w + i])
                bh = np.int16(hb[(2 + (e >> 3)) * w + i])
                ql = np.int16((q & 15) | (((bl >> (e & 7)) & 1) << 4))
                qh = np.int16((q >> 4) | (((bh >> (e & 7)) & 1) << 4))
                lo = np.int16(lo + (ql - offset) * xb[e])
                hi = np.int16(hi + (qh - offset) * xb[16 + e])
            s[l, i] = lo
            s[4 + l, i] = hi


@njit(nogil=True, cache=True, inline="always")
def _int8_pair_sums(blk, w, xb, p):
    """p[m, i] = q[2m, i] * xb[2m] + q[2m+1, i] * xb[2m+1] (|.| <= 2 * 128 * 127 fits int16);
    lane l of llama.cpp is p[2l] + p[2l+1].

    blk  # (32 * w,) int8: byte j of row i at j * w + i
    xb   # (32,) int16
    p    # (16, GROUP) int16 out
    """
    for i in range(w):
        for m in range(16):
            p[m, i] = np.int16(np.int16(blk[2 * m * w + i]) * xb[2 * m]
                               + np.int16(blk[(2 * m + 1) * w + i]) * xb[2 * m + 1])


@njit(nogil=True, cache=True, inline="always")
def _nibble_group(qs_g, qh_g, dw, mw, kind, r0, n_valid, xq, dx, sx, s, acc, summs, out):
    """One row group against every token: out[k, r0:r0 + n_valid]. kind: KIND_Q4_0 ...
    KIND_Q5_1. Per token, first the integer lane sums of every block, then the float pass:
    reading back int16 that were just stored as one 32-byte vector stalled store forwarding
    when the two were interleaved.

    qs_g       # (nb * 16 * GROUP,) uint8 the group's quants
    qh_g       # (nb * 4 * GROUP,) uint8 the group's fifth bits (Q5 only)
    dw, mw     # (nb * GROUP,) float32 the group's scales / mins
    xq         # (n_tok, n_in) int16;  dx, sx  # (n_tok, nb) float32 (sx: Q4_1 / Q5_1 only)
    s          # (nb, 8, GROUP) int16 scratch
    acc        # (8, GROUP) float32 scratch: llama.cpp's 8 lanes, per row
    summs      # (GROUP,) float32 scratch: the sum of m_w * s_x
    out        # (n_tok, n_out) float32
    """
    n_tok = xq.shape[0]
    nb = dx.shape[1]
    w = GROUP
    has_min = (kind & 1) == 1
    has_qh = (kind & 2) == 2
    if has_min:
        offset = np.int16(0)
    else:
        offset = np.int16(16) if has_qh else np.int16(8)
    for k in range(n_tok):
        for b in range(nb):
            if has_qh:
                _nibble5_lane_sums(qs_g[b * 16 * w:(b + 1) * 16 * w], qh_g[b * 4 * w:(b + 1) * 4 * w], w,
                                   xq[k, b * QK:(b + 1) * QK], offset, s[b])
            else:
                _nibble_lane_sums(qs_g[b * 16 * w:(b + 1) * 16 * w], w, xq[k, b * QK:(b + 1) * QK], offset, s[b])
        acc[:, :] = 0
        summs[:] = 0
        for b in range(nb):
            dxk = dx[k, b]
            sxk = sx[k, b]
            for i in range(w):
                dd = dw[b * w + i] * dxk              # f16 x f16: exact in float32
                for l in range(8):
                    acc[l, i] = fma(dd, np.float32(s[b, l, i]), acc[l, i])
                if has_min:
                    summs[i] += mw[b * w + i] * sxk   # exact product, so as llama.cpp's fma
        for i in range(n_valid):
            out[k, r0 + i] = hsum_float_8(acc[0, i], acc[1, i], acc[2, i], acc[3, i],
                                    acc[4, i], acc[5, i], acc[6, i], acc[7, i]) + summs[i]


@njit(nogil=True, cache=True, inline="always")
def _q8_group(qs_g, dw, r0, n_valid, xq, dx, p, acc, out):
    """As _nibble_group for Q8_0.  qs_g  # (nb * 32 * GROUP,) int8;  p  # (nb, 16, GROUP) int16"""
    n_tok = xq.shape[0]
    nb = dx.shape[1]
    w = GROUP
    for k in range(n_tok):
        for b in range(nb):
            _int8_pair_sums(qs_g[b * QK * w:(b + 1) * QK * w], w, xq[k, b * QK:(b + 1) * QK], p[b])
        acc[:, :] = 0
        for b in range(nb):
            dxk = dx[k, b]
            for i in range(w):
                dd = dw[b * w + i] * dxk
                for l in range(8):
                    lane = np.int32(np.int32(p[b, 2 * l, i]) + np.int32(p[b, 2 * l + 1, i]))
                    acc[l, i] = fma(dd, np.float32(lane), acc[l, i])
        for i in range(n_valid):
            out[k, r0 + i] = hsum_float_8(acc[0, i], acc[1, i], acc[2, i], acc[3, i],
                                    acc[4, i], acc[5, i], acc[6, i], acc[7, i])


@njit(nogil=True, cache=True, inline="always")
def group_planes(qs, qh, d, m, per_block, has_qh, has_min, nb, r0, w):
    """(qs, qh, d, m) of the row group at r0 (w rows), a narrow last group widened to GROUP
    rows (layout.py group_of); qh and m come back as given where the format has none.
    per_block: the bytes of qs a block and row (16 for Q4/Q5, 32 for Q8_0)."""
    qh_g = group_of(qh, r0, w, nb * 4) if has_qh else qh
    m_g = group_of(m, r0, w, nb) if has_min else m
    return group_of(qs, r0, w, nb * per_block), qh_g, group_of(d, r0, w, nb), m_g


# ---- matmul: out (n_tok, n_out) = x (n_tok, n_in) @ W.T

@njit(nogil=True, cache=True, inline="always")
def _nibble_scratch(acts):
    """One thread's buffers for _nibble_rows."""
    nb = acts[1].shape[1]
    return (np.empty(nb * GROUP, np.float32),       # dw (nb, GROUP) float32
            np.zeros(nb * GROUP, np.float32),       # mw (nb, GROUP) float32 (zeros: Q4_0 / Q5_0)
            np.empty((nb, 8, GROUP), np.int16),     # s (nb, 8, GROUP) int16
            np.empty((8, GROUP), np.float32),       # acc (8, GROUP) float32
            np.empty(GROUP, np.float32))            # summs (GROUP,) float32


@njit(nogil=True, cache=True, inline="always")
def _nibble_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q4_0 / Q4_1 / Q5_0 / Q5_1 against every token: out[:, r0:r0 + w]."""
    qs, qh, d, m, kind, plain = planes
    xq, dx, sx = acts
    dw, mw, s, acc, summs = buffers
    has_min = (kind & 1) == 1
    qs_g, qh_g, d_g, m_g = group_planes(qs, qh, d, m, 16, (kind & 2) == 2, has_min, dx.shape[1], r0, w)
    decode_f16_plane(d_g, dw, plain)
    if has_min:
        decode_f16_plane(m_g, mw, plain)
    _nibble_group(qs_g, qh_g, dw, mw, kind, r0, w, xq, dx, sx, s, acc, summs, out)


@njit(parallel=True, nogil=True, cache=True)
def matmul_nibbles(qs, qh, d, m, kind, plain, n_out, n_chunks, x, out):
    """Q4_0 / Q5_0 (kind KIND_Q4_0 / KIND_Q5_0, against Q8_0 activations) or Q4_1 / Q5_1
    (KIND_Q4_1 / KIND_Q5_1, against Q8_1).

    qs     # (n_out*nb*16,) uint8 row groups
    qh     # (n_out*nb*4,) uint8 row groups (Q5; any uint8 array for Q4)
    d, m   # (n_out*nb,) uint16 row groups (m unused for Q4_0 / Q5_0)
    plain  # d and m hold only zeros and normal f16 (f16_plane_is_plain)
    n_chunks  # runs of groups, one per thread (n_chunks_for)
    x      # (n_tok, n_in) float32
    out    # (n_tok, n_out) float32
    """
    if (kind & 1) == 1:
        acts = acts_q8_1(x)
    else:
        xq, dx, _ = acts_q8_0(x)
        acts = (xq, dx, np.zeros(dx.shape, np.float32))   # Q8_1's s: unused without a min
    over_row_groups(_nibble_rows, _nibble_scratch, (qs, qh, d, m, kind, plain), acts, n_out, n_chunks, out)


@njit(nogil=True, cache=True, inline="always")
def _q8_scratch(acts):
    """One thread's buffers for _q8_rows."""
    nb = acts[1].shape[1]
    return (np.empty(nb * GROUP, np.float32),       # dw (nb, GROUP) float32
            np.empty((nb, 16, GROUP), np.int16),    # p (nb, 16, GROUP) int16
            np.empty((8, GROUP), np.float32))       # acc (8, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _q8_rows(planes, r0, w, acts, buffers, out):
    """Row group (r0, w) of Q8_0 against every token: out[:, r0:r0 + w]."""
    qs, d, plain = planes
    xq, dx, _ = acts
    dw, p, acc = buffers
    nb = dx.shape[1]
    decode_f16_plane(group_of(d, r0, w, nb), dw, plain)
    _q8_group(group_of(qs, r0, w, nb * QK), dw, r0, w, xq, dx, p, acc, out)


@njit(parallel=True, nogil=True, cache=True)
def matmul_q8_0(qs, d, plain, n_out, n_chunks, x, out):
    """Q8_0 weights x Q8_0 activations.

    qs     # (n_out*nb*32,) int8 row groups
    d      # (n_out*nb,) uint16 row groups
    plain  # d holds only zeros and normal f16
    n_chunks  # runs of groups, one per thread (n_chunks_for)
    x      # (n_tok, n_in) float32
    out    # (n_tok, n_out) float32
    """
    over_row_groups(_q8_rows, _q8_scratch, (qs, d, plain), acts_q8_0(x), n_out, n_chunks, out)
