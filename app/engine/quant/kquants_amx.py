"""Q4_K and Q6_K batches on Intel AMX tiles (ops/amx.py). Q4_K: the integers of the fours of
tokens that quant/kquants_avx2.py's _q4k_group multiplies, 16 tokens by 8 rows of a sub-block
in one tdpbusd, and the same float steps after them, so the outputs are the same bits. Q6_K:
below.

Why it fits: repack_q4_k_x8 lays a chunk's 8 weight rows as 8 vectors of 4 bytes per row,
which is exactly an AMX B tile (rows of 4 signed bytes per output column) once the nibbles
are split; the activations become the unsigned A tile by adding 128, which each row's nibble
sum times 128 takes back out. Measured here (2 cores, 512 tokens): 8960 x 1536 in 72 ms,
1536 x 8960 in 80 ms, against 100 ms with VNNI and 110 ms with AVX2 alone.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.amx import tile_dpbusd, tile_load, tile_shapes, tile_store, tile_zero
from ..ops.simd import fma8, load8, mul8, splat8, store8, zero8
from ..ops.simd_int import (add32, bcast32, dpbusd, load256, load_f16, madd16, mul32, sll32, splat32, srl32, store256,
                            sub8, to_f32, vand, zero8i)
from .activations import QK_K


AMX_TOKENS = 16     # tokens per AMX tile (its 16 rows)


@njit(nogil=True, cache=True, inline="always")
def _amx_weights(x8, base, c, wbuf, sc_lo, sc_hi):
    """Chunk c's nibbles as two B tiles in wbuf (low sub-block from 512 c, high from 512 c
    + 256: 8 rows of 32 bytes, as the chunk's 8 vectors lie); returns -128 (sc_lo * its
    low nibble sum + sc_hi * the high one) per weight row, as float32 (exact)."""
    m4 = splat32(0x0F0F0F0F)
    ones = splat32(0x01010101)
    nib_lo = zero8i()
    nib_hi = zero8i()
    for k in range(8):
        w = load256(x8, base + 128 + 256 * c + 32 * k)
        wl = vand(w, m4)
        wh = vand(srl32(w, 4), m4)
        store256(wl, wbuf, 512 * c + 32 * k)
        store256(wh, wbuf, 512 * c + 256 + 32 * k)
        nib_lo = dpbusd(nib_lo, wl, ones)
        nib_hi = dpbusd(nib_hi, wh, ones)
    return sub8(zero8(), to_f32(sll32(add32(mul32(sc_lo, nib_lo), mul32(sc_hi, nib_hi)), 7)))


@njit(nogil=True, cache=True, inline="always")
def q4k_gemm_amx(x8, base, b, nsb, n_in, xu, dk, bs_pairs, t0, t_end, scg, mins, dw, dm, acc, accm, bufs):
    """_q4k_gemm_fours on AMX tiles: 16 tokens' activation bytes (A: xu, each + 128 to make
    them unsigned) times a sub-block's 8 rows of nibbles (B: 8 rows of 4 bytes per weight row,
    which is how repack_q4_k_x8 lays them) give the 16 x 8 sums S' of the sub-block in one
    tdpbusd, S' = S + 128 * (the row's nibble sum). A chunk's integer I = sc_lo S_lo + sc_hi S_hi
    is then formed in float32, exactly: every term and partial sum is an integer below 2**24
    (|S'| <= 32 * 255 * 15, scales <= 63), so fma(sc_lo, S'_lo, fma(sc_hi, S'_hi, -offsets))
    is float(I) with no rounding, and the float steps per token are _q4k_sums', in the same
    order. Tiles (matmul_q4_k_x8's configuration): 0, 1 sums of the low and high sub-block;
    2, 3 their activations; 4, 5 their weights. bufs = (weights (2048,) uint8, sums (1024,)
    int32) of this thread."""
    wbuf, cbuf = bufs
    fsc = (to_f32(scg[0]), to_f32(scg[1]), to_f32(scg[2]), to_f32(scg[3]),
           to_f32(scg[4]), to_f32(scg[5]), to_f32(scg[6]), to_f32(scg[7]))
    neg = (_amx_weights(x8, base, 0, wbuf, scg[0], scg[1]), _amx_weights(x8, base, 1, wbuf, scg[2], scg[3]),
           _amx_weights(x8, base, 2, wbuf, scg[4], scg[5]), _amx_weights(x8, base, 3, wbuf, scg[6], scg[7]))
    for t in range(t0, t_end, AMX_TOKENS):
        xa = t * n_in + b * QK_K
        for c in range(4):
            tile_zero(0)
            tile_zero(1)
            tile_load(2, xu, xa + 64 * c, n_in)
            tile_load(3, xu, xa + 64 * c + 32, n_in)
            tile_load(4, wbuf, 512 * c, 32)
            tile_load(5, wbuf, 512 * c + 256, 32)
            tile_dpbusd(0, 2, 4)
            tile_dpbusd(1, 3, 5)
            tile_store(0, cbuf, 256 * c, 32)
            tile_store(1, cbuf, 256 * c + 128, 32)
        for u in range(min(AMX_TOKENS, t_end - t)):
            tt = t + u
            dx = splat8(dk[tt, b])
            wd = mul8(dw, dx)
            md = mul8(dm, dx)
            a = load8(acc, 8 * (tt - t0))
            am = load8(accm, 8 * (tt - t0))
            p = (tt * nsb + b) * 4
            for c in range(4):
                hi = fma8(fsc[2 * c + 1], to_f32(load256(cbuf, 256 * c + 128 + 8 * u)), neg[c])
                a = fma8(fma8(fsc[2 * c], to_f32(load256(cbuf, 256 * c + 8 * u)), hi), wd, a)
                am = fma8(to_f32(madd16(mins[c], bcast32(bs_pairs, p + c))), md, am)
            store8(a, acc, 8 * (tt - t0))
            store8(am, accm, 8 * (tt - t0))


# tile configuration of q4k_gemm_amx (rows, bytes): sums 16 tokens x 8 int32, activations 16
# tokens x 32 bytes, weights 8 rows of 4 bytes for each of the 8 weight rows
AMX_CONFIG = tile_shapes([(16, 32), (16, 32), (16, 32), (16, 32), (8, 32), (8, 32)])


@njit(nogil=True, cache=True)
def unsigned_acts(xq, n_tok, n_in, amx):
    """(n_tok + 16) * n_in uint8: each activation byte + 128 (0..255), then a tile's worth of
    rows at 128 (zero activations) that a last partial AMX tile may read; one byte without amx."""
    if not amx:
        return np.zeros(1, np.uint8)
    xu = np.full((n_tok + AMX_TOKENS) * n_in, 128, np.uint8)
    for i in range(n_tok * n_in):
        xu[i] = np.uint8(np.int32(xq[i]) + 128)
    return xu


# ---- Q6_K ------------------------------------------------------------------------------------
# llama.cpp's tiled kernel (which ggml takes for batches of 8+ tokens) adds, per row, token and
# block of 256, the exact integer s = sum_j sc_j sum_(e in sub-block j) (q_e - 32) a_e into
# fma(d_w * float(s), d_x, acc); quant/kquants_avx2.py's _q6_row_tokens does that on AVX2. Here
# the unsigned 6-bit weights of 16 rows are the A tile of a sub-block (16 rows x 16 bytes, no
# repacking: one row's 256 weights lie in a row of the buffer) and 16 tokens' activations the B
# tile (4 rows of 4 bytes per token, packed once per product); the C tile starts at -32 bsum_j
# of each token, so one tdpbusd gives the 16 x 16 sums (q - 32) a of a sub-block. The scales
# then multiply whole rows of C (16 tokens of one weight row) in int32: the same s, the same
# float step, the same bits.

Q6K_BYTES = 210     # block_q6_K
# tile configuration of q6k_rows_amx (rows, bytes): 0 the sums (16 weight rows x 16 tokens,
# int32), 1 the weights (16 rows x 16 bytes), 2 the activations (4 rows x 16 tokens x 4 bytes)
Q6K_AMX_CONFIG = tile_shapes([(16, 64), (16, 16), (4, 64)])


@njit(nogil=True, cache=True)
def q6k_pack_acts(xq, bs16, n_tok, n_in):
    """The B tiles and C starts of the first n_tok (a multiple of 16) tokens' Q8_K activations.

    xq    # (>= n_tok * n_in,) int8;  bs16  # (>= n_tok * nsb * 16,) int16: block_q8_K.bsums
    ->  bact   # (n_tok / 16 * nsb * 64 * 64,) int8: for tile T and block i, 64 rows (4 per
               #   sub-block), row q holding bytes 4q..4q+3 of each of the 16 tokens
        cstart # (n_tok / 16 * nsb * 16 * 16,) int32: -32 bsum of each sub-block and token
    """
    nsb = n_in // QK_K
    n_tiles = n_tok // AMX_TOKENS
    bact = np.empty(n_tiles * nsb * 64 * 64, np.int8)
    cstart = np.empty(n_tiles * nsb * 16 * 16, np.int32)
    words = xq[:n_tok * n_in].view(np.int32)              # 4 activation bytes a word
    packed = bact.view(np.int32)                          # (tiles * nsb * 64 * 16,) the B rows by word
    for tile in range(n_tiles):
        for i in range(nsb):
            bt = tile * nsb + i
            for m in range(AMX_TOKENS):
                t = tile * AMX_TOKENS + m
                src = (t * n_in + i * QK_K) // 4
                for q in range(64):
                    packed[(bt * 64 + q) * 16 + m] = words[src + q]
                for j in range(16):
                    cstart[(bt * 16 + j) * 16 + m] = -32 * np.int32(bs16[(t * nsb + i) * 16 + j])
    return bact, cstart


@njit(nogil=True, cache=True, inline="always")
def _q6k_row_weights(raw, blk, wbuf, off):
    """The 256 6-bit weights (0..63) of one Q6_K block, in element order, at wbuf[off:off+256]
    (ql low/high nibbles and qh's 2-bit pairs, as gguf's dequantize_blocks reads them)."""
    for h in range(2):
        ql = blk + 64 * h
        qh = blk + 128 + 32 * h
        o = off + 128 * h
        for l in range(32):
            a = raw[ql + l]
            b = raw[ql + l + 32]
            c = raw[qh + l]
            wbuf[o + l] = (a & 15) | ((c & 3) << 4)
            wbuf[o + l + 32] = (b & 15) | (((c >> 2) & 3) << 4)
            wbuf[o + l + 64] = (a >> 4) | (((c >> 4) & 3) << 4)
            wbuf[o + l + 96] = (b >> 4) | (((c >> 6) & 3) << 4)


@njit(nogil=True, cache=True)
def q6k_rows_amx(raw, r0, n_rows, nsb, bact, cstart, dk_t, n_tok, wbuf, cbuf, sc, dw, acc):
    """Rows r0 .. r0 + n_rows (at most 16) times the first n_tok tokens (a multiple of 16):
    acc (16 * n_tok,) float32, row r's token t at r * n_tok + t, gets llama.cpp's tiled chain.
    dk_t (nsb * n_tok_all,) float32: the tokens' Q8_K scales by block; wbuf (4096,) uint8,
    cbuf (4096,) int32, sc (256,) int32, dw (16,) float32: this thread's buffers. The tile
    configuration (Q6K_AMX_CONFIG) is loaded."""
    n_tiles = n_tok // AMX_TOKENS
    n_all = dk_t.shape[0] // nsb
    acc[:] = 0
    wbuf[256 * n_rows:] = 0          # rows past the last: their sums are computed and dropped
    for i in range(nsb):
        for r in range(n_rows):
            blk = ((r0 + r) * nsb + i) * Q6K_BYTES
            _q6k_row_weights(raw, blk, wbuf, 256 * r)
            for j in range(16):
                s = np.int32(raw[blk + 192 + j])
                sc[16 * r + j] = s - 256 if s > 127 else s
            dw[r] = load_f16(raw, blk + 208)
        for tile in range(n_tiles):
            bt = tile * nsb + i
            for j in range(16):
                tile_load(0, cstart, (bt * 16 + j) * 16, 0)
                tile_load(1, wbuf, 16 * j, 256)
                tile_load(2, bact, (bt * 64 + 4 * j) * 64, 64)
                tile_dpbusd(0, 1, 2)
                tile_store(0, cbuf, 256 * j, 64)
            dx0 = load8(dk_t, i * n_all + AMX_TOKENS * tile)
            dx1 = load8(dk_t, i * n_all + AMX_TOKENS * tile + 8)
            for r in range(n_rows):
                s0 = zero8i()
                s1 = zero8i()
                for j in range(16):
                    f = splat32(sc[16 * r + j])
                    s0 = add32(s0, mul32(load256(cbuf, 256 * j + 16 * r), f))
                    s1 = add32(s1, mul32(load256(cbuf, 256 * j + 16 * r + 8), f))
                d = splat8(dw[r])
                o = r * n_tok + AMX_TOKENS * tile
                store8(fma8(mul8(d, to_f32(s0)), dx0, load8(acc, o)), acc, o)
                store8(fma8(mul8(d, to_f32(s1)), dx1, load8(acc, o + 8)), acc, o + 8)
