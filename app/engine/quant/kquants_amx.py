"""Q4_K and Q6_K batches on Intel AMX tiles (ops/amx.py).

Q4_K (q4k_pair_amx): 16 tokens by 16 rows (two repacked groups of 8, quant/q4k_x8.py) per
tile product, with each sub-block's 6-bit scale folded into the weight bytes (nibble x its low
and its high 3 bits, two B tiles) and the mins as a third B tile, so three C tiles sum a whole
super-block's integers, 64 elements per tdpbssd, with no float step between sub-blocks. The
float steps are then those of llama.cpp's gemv (one fma per super-block, lane-wise on 16 rows:
ops/simd16.py), so every token of a batch gets exactly the bits it gets alone in a decode step;
llama.cpp's AVX2 batch kernel (gemm, one fma per 64-element chunk) sums in another order, so a
batch's logits there agree with these to float rounding (tests/engine/model/test_model.py), as those
of llama.cpp's own AMX and AVX-512 builds do. Folding the scales in is what makes the tiles pay:
one group a tile, with the gemm's float steps per chunk, leaves float work between the tile
products and gains far less over VNNI (docs/benchmarks.md has the figures).
Q6_K (q6k_rows_amx): the same tile shapes with the roles turned (the weights are the A tiles,
the activations the B tile), its scales folded into the weights through their balanced base-7
digits (below).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.amx import tile_dpbssd, tile_load, tile_shapes, tile_store, tile_zero
from ..ops.simd16 import add16i, cat8, fma16, load16, load16i, mul16, sll16i, splat16, store16, sub16i, to_f32_16
from ..ops.simd_int import (load256, load_f16, load_f16x8, mul32, mullo16, prefetch, splat32, spread16, srl32,
                            store256, sub8i, vand, vor)
from .activations import QK_K
from .q4k_x8 import Q4K_X8_BYTES, scale_lanes, scale_words
from .q6k_blocks import Q6K_BYTES, SCALE_DIGITS, q6k_weights, scale_digits


AMX_TOKENS = 16     # tokens per AMX tile (its 16 rows)


@njit(nogil=True, cache=True, inline="always")
def _pair_tiles(x8, base, half, s_lo, s_hi, n_lo, n_hi, wbuf):
    """One group's half (columns 32 half .. + 32 of every 64-byte row) of a super-block's B
    tiles in wbuf: for chunk c, at 1024 c the nibbles times the low 3 bits of their sub-block's
    scale, at 4096 + 1024 c times its high 3 bits, at 8192 + 1024 c the sub-block's min in each
    byte (16 rows: the low sub-block's 32 elements, then the high one's); all below 2**7, so
    signed bytes as much as unsigned ones."""
    m4 = splat32(0x0F0F0F0F)
    m3 = splat32(0x00070007)
    ones = splat32(0x01010101)
    for c in range(4):
        sw = s_lo if c < 2 else s_hi
        nw = n_lo if c < 2 else n_hi
        j = 2 * (c % 2)
        sc_lo = scale_lanes(sw, j, False)           # the scale in both 16-bit halves of a row's lane
        sc_hi = scale_lanes(sw, j + 1, False)
        lo_l, lo_h = vand(sc_lo, m3), vand(srl32(sc_lo, 3), m3)
        hi_l, hi_h = vand(sc_hi, m3), vand(srl32(sc_hi, 3), m3)
        for k in range(8):
            w = load256(x8, base + 128 + 256 * c + 32 * k)
            wl = vand(w, m4)
            wh = vand(srl32(w, 4), m4)
            o = 1024 * c + 64 * k + 32 * half
            store256(mullo16(wl, lo_l), wbuf, o)                  # nibble x (3 bits) < 2**7: no carry
            store256(mullo16(wh, hi_l), wbuf, o + 512)
            store256(mullo16(wl, lo_h), wbuf, o + 4096)
            store256(mullo16(wh, hi_h), wbuf, o + 4096 + 512)
        m_lo = mul32(scale_lanes(nw, j, True), ones)            # the min in each byte of a row's lane
        m_hi = mul32(scale_lanes(nw, j + 1, True), ones)
        for k in range(8):
            store256(m_lo, wbuf, 8192 + 1024 * c + 64 * k + 32 * half)
            store256(m_hi, wbuf, 8192 + 1024 * c + 512 + 64 * k + 32 * half)


@njit(nogil=True, cache=True, inline="always")
def _block_sums(acts, a0, stride, chunk, wbuf, cbuf, acts_left):
    """The three C tiles of one block of 256 elements (4 chunks of 64) into cbuf (768,) int32,
    256 each: tile 3 holds a chunk's activations (from acts[a0 + chunk c], rows `stride` bytes
    apart), tiles 4, 5, 6 its three weight tiles (wbuf at 4096 k + 1024 c); with acts_left the
    activations are the A tile (C is tokens x rows), else the B tile (rows x tokens)."""
    tile_zero(0)
    tile_zero(1)
    tile_zero(2)
    for c in range(4):
        tile_load(3, acts, a0 + chunk * c, stride)
        tile_load(4, wbuf, 1024 * c, 64)
        tile_load(5, wbuf, 4096 + 1024 * c, 64)
        tile_load(6, wbuf, 8192 + 1024 * c, 64)
        if acts_left:
            tile_dpbssd(0, 3, 4)
            tile_dpbssd(1, 3, 5)
            tile_dpbssd(2, 3, 6)
        else:
            tile_dpbssd(0, 4, 3)
            tile_dpbssd(1, 5, 3)
            tile_dpbssd(2, 6, 3)
    tile_store(0, cbuf, 0, 64)
    tile_store(1, cbuf, 256, 64)
    tile_store(2, cbuf, 512, 64)


@njit(nogil=True, cache=True)
def q4k_pair_amx(x8, g, g2, nsb, n_in, xq, dk, t0, t_end, acc, accm, bufs):
    """The rows of groups g and g2 against tokens t0 .. t_end (tiles of 16, the last one
    partial) on AMX tiles: acc / accm (tokens x 16,) float32, token t's rows at 16 (t - t0), g's
    8 then g2's, get each super-block's integers I = sum_j sc_j sum(q a) and M = sum_j m_j
    bsum_j in llama.cpp's gemv chain, acc = fma(float(I), d_w d_x, acc) and accm =
    fma(float(M), dmin_w d_x, accm): the float steps of ggml_gemv_q4_K_8x8_q8_K, so every
    token of a batch gets the bits it gets alone (_q4k_group's gemv).

    The scales go into the weights: sc = 8 h + l with h, l < 8, so nibble x l and nibble x h
    are bytes (< 2**7) and one C tile each sums a whole super-block, 64 elements (a chunk) per
    tdpbssd: I = C_l + 8 C_h. A third C tile sums the activations times each sub-block's min
    (M). The activations are the A tile as they are (signed bytes; xq holds 16 rows of zeros
    past the last token, which a last partial tile reads). bufs = (weights (12288,) uint8,
    sums (768,) int32) of this thread. Tiles (AMX_CONFIG):
    0, 1, 2 the sums C_l, C_h, M (16 tokens x 16 rows); 3 the activations of a chunk; 4, 5, 6
    its weights x l, x h and mins."""
    wbuf, cbuf = bufs
    for b in range(nsb):
        base0 = (g * nsb + b) * Q4K_X8_BYTES
        base1 = (g2 * nsb + b) * Q4K_X8_BYTES
        s_lo, s_hi, n_lo, n_hi = scale_words(x8, base0)
        _pair_tiles(x8, base0, 0, s_lo, s_hi, n_lo, n_hi, wbuf)
        s_lo, s_hi, n_lo, n_hi = scale_words(x8, base1)
        _pair_tiles(x8, base1, 1, s_lo, s_hi, n_lo, n_hi, wbuf)
        dw = cat8(load_f16x8(x8, base0), load_f16x8(x8, base1))
        dm = cat8(load_f16x8(x8, base0 + 16), load_f16x8(x8, base1 + 16))
        for t in range(t0, t_end, AMX_TOKENS):
            xa = t * n_in + b * QK_K
            for r in range(AMX_TOKENS):                 # the next tile's rows: L2 -> L1 ahead of its loads
                for c in range(4):
                    prefetch(xq, xa + (AMX_TOKENS + r) * n_in + 64 * c)
            _block_sums(xq, xa, n_in, 64, wbuf, cbuf, True)
            for u in range(min(AMX_TOKENS, t_end - t)):
                tt = t + u
                dx = splat16(dk[tt, b])
                i = add16i(load16i(cbuf, 16 * u), sll16i(load16i(cbuf, 256 + 16 * u), 3))
                m = load16i(cbuf, 512 + 16 * u)
                o = 16 * (tt - t0)
                store16(fma16(to_f32_16(i), mul16(dw, dx), load16(acc, o)), acc, o)
                store16(fma16(to_f32_16(m), mul16(dm, dx), load16(accm, o)), accm, o)


# tile configuration of q4k_pair_amx and q6k_rows_amx (rows, bytes), seven tiles of 16 x 64:
# three C tiles of 16 x 16 int32 sums, one of a chunk's activations, three of its weights (for
# Q4_K the activations are A, 16 tokens x 64 bytes, and the weights B; for Q6_K the other way)
AMX_CONFIG = tile_shapes([(16, 64)] * 7)


# ---- Q6_K ------------------------------------------------------------------------------------
# llama.cpp's tiled kernel (which ggml takes for batches of 8+ tokens) adds, per row, token and
# block of 256, the exact integer s = sum_j sc_j sum_(e in sub-block j) (q_e - 32) a_e into
# fma(d_w * float(s), d_x, acc); quant/kquants_avx2.py's _q6_row_tokens does that on AVX2. Here
# 16 rows' weights are the A tiles, with each sub-block's scale folded into the weight bytes
# through its balanced base-7 digits (quant/q6k_blocks.py): A_k = (q - 32) x digit k, three
# signed tiles; 16 tokens' activations, packed once per product, are the B tile; so three C
# tiles (tdpbssd, 64 elements a product) sum a whole block and s = C0 + 7 (C1 + 7 C2) is the
# same integer. The float step is the tiled kernel's, lane-wise on 16 tokens: the same bits as
# the AVX2 kernel. No transposing of weights: a row's 64 elements of a chunk are a tile row.


@njit(parallel=True, nogil=True, cache=True)
def q6k_pack_acts(xq, n_tok, n_in):
    """The B tiles of the first n_tok (a multiple of 16) tokens' Q8_K activations.

    xq   # (>= n_tok * n_in,) int8
    ->   # (n_tok * n_in,) int8: for block b, tile T of 16 tokens and chunk c (64 elements), a
         #   tile of 16 rows of 64 bytes at ((b * n_tiles + T) * 4 + c) * 1024, row kk holding
         #   bytes 4 kk .. + 4 of the chunk of each of the 16 tokens; a block's tiles in a row
    """
    nsb = n_in // QK_K
    n_tiles = n_tok // AMX_TOKENS
    bact = np.empty(n_tok * n_in, np.int8)
    words = xq[:n_tok * n_in].view(np.int32)              # 4 activation bytes a word
    packed = bact.view(np.int32)                          # the tiles' rows by word
    for bt in prange(nsb * n_tiles):
        b = bt // n_tiles
        t0 = (bt % n_tiles) * AMX_TOKENS
        for m in range(AMX_TOKENS):
            src = ((t0 + m) * n_in + b * QK_K) // 4
            for q in range(64):                           # chunk q // 16, tile row q % 16
                packed[bt * 1024 + 16 * q + m] = words[src + q]
    return bact


@njit(nogil=True, cache=True, inline="always")
def _times7(v):
    return sub16i(sll16i(v, 3), v)


@njit(nogil=True, cache=True, inline="always")
def _digit_rows(x, dg, wbuf, o, p):
    """Weight bytes x (32 elements: sub-blocks 2p, 2p + 1) times each scale digit, at wbuf[o]
    + 4096 k: bytes x digit on 16-bit lanes, even and odd bytes apart, keeping each product's
    low byte, which is the signed product since |(q - 32) x digit| <= 96."""
    lo = splat32(0x00FF00FF)
    hi = splat32(0xFF00FF00)
    xl = vand(x, lo)
    xh = vand(x, hi)
    for k in range(SCALE_DIGITS):
        d = spread16(dg[k], p)
        store256(vor(vand(mullo16(xl, d), lo), mullo16(xh, d)), wbuf, o + 4096 * k)


@njit(nogil=True, cache=True, inline="always")
def _q6k_tiles(raw, r0, n_rows, nsb, b, wbuf, dw):
    """Block b of rows r0 .. r0 + n_rows (at most 16; the others weigh 0) as the A tiles of
    q6k_rows_amx in wbuf (12288,) uint8: digit k's chunk c at 4096 k + 1024 c, tile row n
    holding row r0 + n's (q - 32) x digit k of elements 64 c .. + 64; dw (16,) float32 the d."""
    m32 = splat32(0x20202020)
    for n in range(16):
        o = 64 * n
        if n < n_rows:
            blk = ((r0 + n) * nsb + b) * Q6K_BYTES
            dg = scale_digits(raw, blk)
            w = q6k_weights(raw, blk, 0)                 # elements 32 m .. + 32: chunk m // 2
            _digit_rows(sub8i(w[0], m32), dg, wbuf, o, 0)
            _digit_rows(sub8i(w[1], m32), dg, wbuf, o + 32, 1)
            _digit_rows(sub8i(w[2], m32), dg, wbuf, o + 1024, 2)
            _digit_rows(sub8i(w[3], m32), dg, wbuf, o + 1024 + 32, 3)
            w = q6k_weights(raw, blk, 1)                 # elements 128 + 32 m .. + 32
            _digit_rows(sub8i(w[0], m32), dg, wbuf, o + 2048, 4)
            _digit_rows(sub8i(w[1], m32), dg, wbuf, o + 2048 + 32, 5)
            _digit_rows(sub8i(w[2], m32), dg, wbuf, o + 3072, 6)
            _digit_rows(sub8i(w[3], m32), dg, wbuf, o + 3072 + 32, 7)
            dw[n] = load_f16(raw, blk + 208)
        else:
            for k in range(SCALE_DIGITS):
                for c in range(4):
                    wbuf[4096 * k + 1024 * c + o:4096 * k + 1024 * c + o + 64] = 0
            dw[n] = 0


@njit(nogil=True, cache=True)
def q6k_rows_amx(raw, r0, n_rows, nsb, bact, dk_t, t0, t_end, acc, bufs):
    """Rows r0 .. r0 + n_rows (at most 16) times tokens t0 .. t_end (whole tiles of 16): acc
    (16 rows x (t_end - t0)) float32 gets llama.cpp's tiled chain, acc = fma(d_w * float(s),
    d_x, acc) block by block. bact: q6k_pack_acts of the batch's whole tiles; dk_t (nsb * n_tok,)
    float32 their Q8_K scales by block. bufs = (weights (12288,) uint8, sums (768,) int32,
    d (16,) float32) of this thread. Tiles (AMX_CONFIG): 0, 1, 2 the sums of digits 0, 1, 2
    (16 rows x 16 tokens); 3 the activations of a chunk; 4, 5, 6 its weights x each digit."""
    wbuf, cbuf, dw = bufs
    n_tok = dk_t.shape[0] // nsb
    n_tiles = bact.shape[0] // (4096 * nsb)      # the packed tiles (n_tok // 16)
    width = t_end - t0
    for b in range(nsb):
        _q6k_tiles(raw, r0, n_rows, nsb, b, wbuf, dw)
        for t in range(t0, t_end, AMX_TOKENS):
            xb = (b * n_tiles + t // AMX_TOKENS) * 4096
            _block_sums(bact, xb, 64, 1024, wbuf, cbuf, False)
            dx = load16(dk_t, b * n_tok + t)
            for n in range(16):
                c1 = add16i(load16i(cbuf, 256 + 16 * n), _times7(load16i(cbuf, 512 + 16 * n)))
                s = add16i(load16i(cbuf, 16 * n), _times7(c1))
                o = n * width + t - t0
                store16(fma16(mul16(splat16(dw[n]), to_f32_16(s)), dx, load16(acc, o)), acc, o)
