"""Q4_K and Q6_K batches on Intel AMX tiles (ops/amx.py).

Q4_K (q4k_pair_amx): 16 tokens by 16 rows (two repacked groups of 8, quant/q4k_x8.py) per
tile product, with each sub-block's 6-bit scale folded into the weight bytes (nibble x its low
and its high 3 bits, two B tiles) and the mins as a third B tile, so three C tiles sum a whole
super-block's integers, 64 elements per tdpbusd, with no float step between sub-blocks. The
float steps are then those of llama.cpp's gemv (one fma per super-block, lane-wise on 16 rows:
ops/simd16.py), so every token of a batch gets exactly the bits it gets alone in a decode step;
llama.cpp's AVX2 batch kernel (gemm, one fma per 64-element chunk) sums in another order, so a
batch's logits there agree with these to float rounding (tests/engine/test_model.py), as those
of llama.cpp's own AMX and AVX-512 builds do. Measured here (2 cores, 512 tokens, same process):
8960 x 1536 in 29 ms and 1536 x 8960 in 48 ms, against 72 and 94 ms through VNNI (the earlier
AMX kernel, one group a tile and the gemm's float steps per chunk, took 55-60 and 60-65 ms).
Q6_K: below.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.amx import tile_dpbusd, tile_load, tile_shapes, tile_store, tile_zero
from ..ops.simd import fma8, load8, mul8, splat8, store8
from ..ops.simd16 import (add16i, cat8, cat8i, fma16, load16, load16i, mul16, sll16i, splat16, store16, sub16i,
                          to_f32_16)
from ..ops.simd_int import (add32, dpbusd, load256, load_f16, load_f16x8, mul32, mullo16, prefetch, sll32, splat32,
                            srl32, store256, to_f32, vand, zero8i)
from .activations import QK_K
from .q4k_x8 import Q4K_X8_BYTES, scale_lanes, scale_words


AMX_TOKENS = 16     # tokens per AMX tile (its 16 rows)


@njit(nogil=True, cache=True, inline="always")
def _pair_tiles(x8, base, half, s_lo, s_hi, n_lo, n_hi, wbuf):
    """One group's half (columns 32 half .. + 32 of every 64-byte row) of a super-block's B
    tiles in wbuf: for chunk c, at 1024 c the nibbles times the low 3 bits of their sub-block's
    scale, at 4096 + 1024 c times its high 3 bits, at 8192 + 1024 c the sub-block's min in each
    byte (16 rows: the low sub-block's 32 elements, then the high one's). Returns the offsets
    the +128 of the activations adds, per row: (128 sum_j sc_j nib_j, 128 * 32 sum_j m_j)."""
    m4 = splat32(0x0F0F0F0F)
    m3 = splat32(0x00070007)
    ones = splat32(0x01010101)
    off_i = zero8i()
    off_m = zero8i()
    for c in range(4):
        sw = s_lo if c < 2 else s_hi
        nw = n_lo if c < 2 else n_hi
        j = 2 * (c % 2)
        sc_lo = scale_lanes(sw, j, False)           # the scale in both 16-bit halves of a row's lane
        sc_hi = scale_lanes(sw, j + 1, False)
        lo_l, lo_h = vand(sc_lo, m3), vand(srl32(sc_lo, 3), m3)
        hi_l, hi_h = vand(sc_hi, m3), vand(srl32(sc_hi, 3), m3)
        nib_lo = zero8i()
        nib_hi = zero8i()
        for k in range(8):
            w = load256(x8, base + 128 + 256 * c + 32 * k)
            wl = vand(w, m4)
            wh = vand(srl32(w, 4), m4)
            o = 1024 * c + 64 * k + 32 * half
            store256(mullo16(wl, lo_l), wbuf, o)                  # nibble x (3 bits) < 2**7: no carry
            store256(mullo16(wh, hi_l), wbuf, o + 512)
            store256(mullo16(wl, lo_h), wbuf, o + 4096)
            store256(mullo16(wh, hi_h), wbuf, o + 4096 + 512)
            nib_lo = dpbusd(nib_lo, wl, ones)
            nib_hi = dpbusd(nib_hi, wh, ones)
        off_i = add32(off_i, add32(mul32(scale_lanes(sw, j, True), nib_lo), mul32(scale_lanes(sw, j + 1, True), nib_hi)))
        m_lo = scale_lanes(nw, j, True)
        m_hi = scale_lanes(nw, j + 1, True)
        for k in range(8):
            store256(mul32(m_lo, ones), wbuf, 8192 + 1024 * c + 64 * k + 32 * half)
            store256(mul32(m_hi, ones), wbuf, 8192 + 1024 * c + 512 + 64 * k + 32 * half)
        off_m = add32(off_m, add32(m_lo, m_hi))
    return sll32(off_i, 7), sll32(off_m, 12)


@njit(nogil=True, cache=True)
def q4k_pair_amx(x8, g, g2, nsb, n_in, xu, dk, t0, t_end, acc, accm, bufs):
    """The rows of groups g and g2 against tokens t0 .. t_end (tiles of 16, the last one
    partial) on AMX tiles: acc / accm (tokens x 16,) float32, token t's rows at 16 (t - t0), g's
    8 then g2's, get each super-block's integers I = sum_j sc_j sum(q a) and M = sum_j m_j
    bsum_j in llama.cpp's gemv chain, acc = fma(float(I), d_w d_x, acc) and accm =
    fma(float(M), dmin_w d_x, accm): the float steps of ggml_gemv_q4_K_8x8_q8_K, so every
    token of a batch gets the bits it gets alone (_q4k_group's gemv).

    The scales go into the weights: sc = 8 h + l with h, l < 8, so nibble x l and nibble x h
    are bytes (< 2**7) and one C tile each sums a whole super-block, 64 elements (a chunk) per
    tdpbusd: I = C_l + 8 C_h. A third C tile sums the activations times each sub-block's min
    (M). The activations are the unsigned A tile (+128, xu), whose offsets come back out per
    row. bufs = (weights (12288,) uint8, sums (768,) int32) of this thread. Tiles (AMX_CONFIG):
    0, 1, 2 the sums C_l, C_h, M (16 tokens x 16 rows); 3 the activations of a chunk; 4, 5, 6
    its weights x l, x h and mins."""
    wbuf, cbuf = bufs
    for b in range(nsb):
        base0 = (g * nsb + b) * Q4K_X8_BYTES
        base1 = (g2 * nsb + b) * Q4K_X8_BYTES
        s_lo, s_hi, n_lo, n_hi = scale_words(x8, base0)
        oi0, om0 = _pair_tiles(x8, base0, 0, s_lo, s_hi, n_lo, n_hi, wbuf)
        s_lo, s_hi, n_lo, n_hi = scale_words(x8, base1)
        oi1, om1 = _pair_tiles(x8, base1, 1, s_lo, s_hi, n_lo, n_hi, wbuf)
        off_i = cat8i(oi0, oi1)
        off_m = cat8i(om0, om1)
        dw = cat8(load_f16x8(x8, base0), load_f16x8(x8, base1))
        dm = cat8(load_f16x8(x8, base0 + 16), load_f16x8(x8, base1 + 16))
        for t in range(t0, t_end, AMX_TOKENS):
            xa = t * n_in + b * QK_K
            tile_zero(0)
            tile_zero(1)
            tile_zero(2)
            for c in range(4):
                for r in range(AMX_TOKENS):             # the next tile's rows: L2 -> L1 ahead of its loads
                    prefetch(xu, xa + (AMX_TOKENS + r) * n_in + 64 * c)
                tile_load(3, xu, xa + 64 * c, n_in)
                tile_load(4, wbuf, 1024 * c, 64)
                tile_load(5, wbuf, 4096 + 1024 * c, 64)
                tile_load(6, wbuf, 8192 + 1024 * c, 64)
                tile_dpbusd(0, 3, 4)
                tile_dpbusd(1, 3, 5)
                tile_dpbusd(2, 3, 6)
            tile_store(0, cbuf, 0, 64)
            tile_store(1, cbuf, 256, 64)
            tile_store(2, cbuf, 512, 64)
            for u in range(min(AMX_TOKENS, t_end - t)):
                tt = t + u
                dx = splat16(dk[tt, b])
                i = sub16i(add16i(load16i(cbuf, 16 * u), sll16i(load16i(cbuf, 256 + 16 * u), 3)), off_i)
                m = sub16i(load16i(cbuf, 512 + 16 * u), off_m)
                o = 16 * (tt - t0)
                store16(fma16(to_f32_16(i), mul16(dw, dx), load16(acc, o)), acc, o)
                store16(fma16(to_f32_16(m), mul16(dm, dx), load16(accm, o)), accm, o)


# tile configuration of q4k_pair_amx (rows, bytes): sums 16 tokens x 16 int32 (3), activations
# 16 tokens x 64 bytes, weights 16 rows of 4 bytes for each of the 16 weight rows (3)
AMX_CONFIG = tile_shapes([(16, 64)] * 7)


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
