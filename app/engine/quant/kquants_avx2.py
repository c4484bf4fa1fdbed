"""Q4_K and Q6_K products with AVX2's byte multiply-adds, equal bit for bit to what llama.cpp
computes for the same weights on an AVX2 machine (where the CPU has AMX, Q4_K's batches of 16+
tokens go to quant/kquants_amx.py instead, with each token's gemv bits).

These two formats carry almost all of a Q4_K_M model's bytes (Qwen2.5-1.5B: 0.77 GB Q4_K,
0.31 GB Q6_K), and a decode step reads every one of them, so their kernels decide the speed.
The portable kernels of quant/kquants.py widen each 4-bit weight to 16 bits and multiply one
at a time; here ``vpmaddubsw`` multiplies 32 weight bytes by 32 activation bytes and adds
them in pairs in one instruction, as llama.cpp does.

Which of llama.cpp's kernels (ggml-cpu, arch/x86) and why the results are equal:

Q4_K: llama.cpp repacks the weights of 8 rows side by side (repack.cpp, ``block_q4_Kx8``)
    and multiplies them with ``ggml_gemv_q4_K_8x8_q8_K``. Per row and super-block of 256 it
    forms two exact integers, I = sum_s sc_s * sum(q * a) and M = sum_s m_s * bsum_s, then
        acc  = fma(float(I), d_w * d_x, acc)       accm = fma(float(M), dmin_w * d_x, accm)
    in super-block order, and returns acc - accm. The integers do not depend on how they are
    summed, and each row's floats are a chain of their own, so any layout that gives every
    row the same chain gives the same bits. Ours (quant/q4k_x8.py ``repack_q4_k_x8``) keeps 8
    rows per group too, a 32-bit lane of each 32-byte vector being one row's 8 nibbles: one
    vpmaddubsw against the 4 activations broadcast, and 8 of them make a sub-block.
Q6_K: no repack on x86; ``ggml_vec_dot_q6_K_q8_K`` runs along each row. Its 8 int32 lanes
    are partial sums over fixed element sets (lane L: bytes 4L..4L+3 of each 32-byte vector,
    minus 32 * (bsum_2L sc_2L + bsum_2L+1 sc_2L+1)); each lane gets fma(d_x * d_w, float, .)
    per super-block, and the row ends with hsum_float_8. The lanes' integers are not the
    same as any other split's, so ``_q6_row`` repeats those instructions on the GGUF blocks
    as they are (no repack, no copy).

Activations are Q8_K (quant/activations.py quantize_q8_k, llama.cpp's quantize_row_q8_K),
handed over as int8 bytes with their bsums in the forms the kernels load.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..ops.amx import tile_config, tile_release
from ..ops.f16 import decode_f16
from ..ops.simd import fma, fma8, hsum8, load8, mul8, splat8, store8, zero8
from ..ops.simd_int import (add16, add32, bcast32, dpbusd, hsum32, hsum32x8, load256, load_f16, load_f16x8, madd16,
                            maddubs, mul32, prefetch, scale_halves, sext8to16, sll32, splat32, srl32, sub32,
                            to_f32, vand, vor, zero8i)
from ..cpu.threads import chunk_groups
from .activations import quantize_q8_k
from .kquants import unpack_scales
from .kquants_amx import AMX_CONFIG, AMX_TOKENS, q4k_pair_amx, q6k_pack_acts, q6k_rows_amx
from .q4k_x8 import Q4K_X8_BYTES, ROWS_X8, scale_words, scales8
from .q6k_blocks import Q6K_BYTES, q6k_weights

QK_K = 256
TILED_MIN_BATCH = 8              # ggml-cpu tiled/tiled.cpp ggml_tiled_min_batch
PREFETCH_AHEAD = 4 * Q4K_X8_BYTES


# ---- activations ------------------------------------------------------------------------------

@njit(nogil=True, cache=True)
def quantize_acts(x, xq, dk, bs_pairs, bs16):
    """Q8_K activations (quantize_q8_k) in the forms these kernels load.

    x         # (n_tok, n_in) float32
    xq        # (n_tok * n_in,) int8 out
    dk        # (n_tok, nsb) float32 out
    bs_pairs  # (n_tok * nsb * 4,) int32 out: for Q4_K's mins, word j of a super-block holds
              # bsum of sub-block 2j (low 16 bits) and 2j + 1 (high), a sub-block's bsum being
              # the sum of its 32 activations (< 2**12 in magnitude)
    bs16      # (n_tok * nsb * 16,) int16 out: block_q8_K.bsums, for Q6_K
    """
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    bsums = np.empty((n_tok, nsb * 16), np.int32)    # (n_tok, nsb * 16) int32
    # the quants straight into xq's bytes (each in -127..127); an int16 copy cost a third of a decode
    # step's quantization
    quantize_q8_k(x, xq[:n_tok * n_in].reshape((n_tok, n_in)), dk, bsums)
    for t in range(n_tok):
        for g in range(nsb * 16):
            bs16[t * nsb * 16 + g] = np.int16(bsums[t, g])
        for p in range(nsb * 4):
            lo = bsums[t, 4 * p] + bsums[t, 4 * p + 1]
            hi = bsums[t, 4 * p + 2] + bsums[t, 4 * p + 3]
            bs_pairs[t * nsb * 4 + p] = np.int32((lo & 0xFFFF) | (hi << 16))


@njit(nogil=True, cache=True)
def q8_k_acts(x):
    """x (n_tok, n_in) float32 -> (xq, dk, bs_pairs, bs16) of quantize_acts, freshly made;
    xq ((n_tok + pad) * n_in,): for a batch of a whole AMX tile or more, pad = 16 rows of zeros
    after the tokens, which the last partial tile of an AMX product reads
    (kquants_amx.q4k_pair_amx); none for decode steps, which never go to AMX."""
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    pad = AMX_TOKENS if n_tok >= AMX_TOKENS else 0
    acts = (np.empty((n_tok + pad) * n_in, np.int8), np.empty((n_tok, nsb), np.float32),
            np.empty(n_tok * nsb * 4, np.int32), np.empty(n_tok * nsb * 16, np.int16))
    acts[0][n_tok * n_in:] = 0
    if n_tok >= PARALLEL_ACTS:
        _quantize_acts_parallel(x, *acts)
    else:
        quantize_acts(x, *acts)
    return acts


PARALLEL_ACTS = 16   # tokens from which a batch's activations are quantized by all threads
ACTS_PARTS = 16      # runs of tokens they share (a constant: numba's thread count would keep this uncached)


@njit(nogil=True, cache=True, parallel=True)
def _quantize_acts_parallel(x, xq, dk, bs_pairs, bs16):
    """quantize_acts with runs of tokens in parallel (each token's bytes are its own): done
    serially, quantizing a long chunk's activations would be a one-thread step in every product
    while the other threads wait."""
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    n_parts = min(n_tok, ACTS_PARTS)
    for c in prange(n_parts):
        t0, t1 = chunk_groups(c, n_parts, n_tok)
        quantize_acts(x[t0:t1], xq[t0 * n_in:t1 * n_in], dk[t0:t1], bs_pairs[t0 * nsb * 4:t1 * nsb * 4],
                      bs16[t0 * nsb * 16:t1 * nsb * 16])


# ---- Q4_K kernel ------------------------------------------------------------------------------

@njit(nogil=True, cache=True, inline="always")
def _bytes_as_halves(v, h):
    """Bytes 2h and 2h + 1 of each 32-bit lane of v as its two 16-bit halves (two mins)."""
    t = srl32(v, 16 * h)
    return vor(vand(t, splat32(0xFF)), sll32(vand(t, splat32(0xFF00)), 8))


@njit(nogil=True, cache=True, inline="always")
def _q4k_chunk(x8, qbase, xq, xbase):
    """One 64-element chunk of 8 rows: (sum lo * x over the low sub-block, the same for the
    high one) as 16 int16 lanes each, two per row (8 vpmaddubsw of 2 products of at most
    15 * 127: below 2**15)."""
    m4 = splat32(0x0F0F0F0F)
    lo = zero8i()
    hi = zero8i()
    for k in range(8):
        w = load256(x8, qbase + 32 * k)
        lo = add16(lo, maddubs(vand(w, m4), bcast32(xq, xbase + 4 * k)))
        hi = add16(hi, maddubs(vand(srl32(w, 4), m4), bcast32(xq, xbase + 32 + 4 * k)))
    return lo, hi


Q4K_TILE_BYTES = 256 << 10   # Q8_K activations one pass of a chunk's groups reuses (half of a 512 KiB L2)
AMX_TILE_BYTES = 1 << 20     # the same on AMX (CPUs with 2 MiB of L2 a core), where each pass unpacks a group's
AMX_TILE_TOKENS = 256        # weights into tiles once: short passes unpack every group again for few
                             # tokens; the cap keeps a pass's float sums in L1


@njit(nogil=True, cache=True, inline="always")
def _madd_bytes(acc, w, x, vnni):
    """acc + the products of weight bytes w and activation bytes x: int32 sums of 4 (vpdpbusd)
    with vnni, else int16 sums of 2 added to int16 lanes (vpmaddubsw, vpaddw)."""
    if vnni:
        return dpbusd(acc, w, x)
    return add16(acc, maddubs(w, x))


@njit(nogil=True, cache=True, inline="always")
def _q4k_chunk4(x8, qbase, xq, xa, step, vnni):
    """_q4k_chunk for four tokens (activations from xa, xa + step, ...) sharing each weight
    vector, as ggml_gemm_q4_K_8x8_q8_K multiplies its fours of tokens. With vnni, each row's
    sum over a sub-block is one int32 lane (vpdpbusd: no 16-bit partial sums to add), which
    _q4k_sums scales with vpmulld: the same integers, so the same floats."""
    m4 = splat32(0x0F0F0F0F)
    lo0 = zero8i()
    hi0 = zero8i()
    lo1 = zero8i()
    hi1 = zero8i()
    lo2 = zero8i()
    hi2 = zero8i()
    lo3 = zero8i()
    hi3 = zero8i()
    xb = xa + step
    xc = xb + step
    xd = xc + step
    for k in range(8):
        w = load256(x8, qbase + 32 * k)
        wl = vand(w, m4)
        wh = vand(srl32(w, 4), m4)
        lo0 = _madd_bytes(lo0, wl, bcast32(xq, xa + 4 * k), vnni)
        hi0 = _madd_bytes(hi0, wh, bcast32(xq, xa + 32 + 4 * k), vnni)
        lo1 = _madd_bytes(lo1, wl, bcast32(xq, xb + 4 * k), vnni)
        hi1 = _madd_bytes(hi1, wh, bcast32(xq, xb + 32 + 4 * k), vnni)
        lo2 = _madd_bytes(lo2, wl, bcast32(xq, xc + 4 * k), vnni)
        hi2 = _madd_bytes(hi2, wh, bcast32(xq, xc + 32 + 4 * k), vnni)
        lo3 = _madd_bytes(lo3, wl, bcast32(xq, xd + 4 * k), vnni)
        hi3 = _madd_bytes(hi3, wh, bcast32(xq, xd + 32 + 4 * k), vnni)
    return lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3


@njit(nogil=True, cache=True, inline="always")
def _q4k_sums(lo, hi, s_lo, s_hi, mins, bs_pairs, p, dw, dm, dx, a, am, vnni):
    """One chunk's integer sums of one token into its float chains (acc a, mins am); the
    sub-blocks' sums times their scales (q4k_x8.scale_lanes) by vpmaddwd, or vpmulld with vnni."""
    if vnni:
        i = add32(mul32(lo, s_lo), mul32(hi, s_hi))
    else:
        i = add32(madd16(lo, s_lo), madd16(hi, s_hi))
    a = fma8(to_f32(i), mul8(dw, dx), a)
    am = fma8(to_f32(madd16(mins, bcast32(bs_pairs, p))), mul8(dm, dx), am)
    return a, am


@njit(nogil=True, cache=True, inline="always")
def _q4k_gemm_fours(x8, base, b, nsb, n_in, xq, dk, bs_pairs, t0, t_end, scg, mins, dw, dm, acc, accm, vnni):
    """Super-block b of a group (from byte base) against tokens t0..t_end, four at a time
    (they share each unpacked weight vector), as ggml_gemm_q4_K_8x8_q8_K."""
    for t in range(t0, t_end, 4):
        xa = t * n_in + b * QK_K
        pa = (t * nsb + b) * 4
        d0 = splat8(dk[t, b])
        d1 = splat8(dk[t + 1, b])
        d2 = splat8(dk[t + 2, b])
        d3 = splat8(dk[t + 3, b])
        a0 = load8(acc, 8 * (t - t0))
        am0 = load8(accm, 8 * (t - t0))
        a1 = load8(acc, 8 * (t - t0) + 8)
        am1 = load8(accm, 8 * (t - t0) + 8)
        a2 = load8(acc, 8 * (t - t0) + 16)
        am2 = load8(accm, 8 * (t - t0) + 16)
        a3 = load8(acc, 8 * (t - t0) + 24)
        am3 = load8(accm, 8 * (t - t0) + 24)
        for c in range(4):
            lo0, hi0, lo1, hi1, lo2, hi2, lo3, hi3 = _q4k_chunk4(x8, base + 128 + 256 * c, xq, xa + 64 * c, n_in, vnni)
            s_lo = scg[2 * c]
            s_hi = scg[2 * c + 1]
            a0, am0 = _q4k_sums(lo0, hi0, s_lo, s_hi, mins[c], bs_pairs, pa + c, dw, dm, d0, a0, am0, vnni)
            a1, am1 = _q4k_sums(lo1, hi1, s_lo, s_hi, mins[c], bs_pairs, pa + nsb * 4 + c, dw, dm, d1, a1, am1, vnni)
            a2, am2 = _q4k_sums(lo2, hi2, s_lo, s_hi, mins[c], bs_pairs, pa + nsb * 8 + c, dw, dm, d2, a2, am2, vnni)
            a3, am3 = _q4k_sums(lo3, hi3, s_lo, s_hi, mins[c], bs_pairs, pa + nsb * 12 + c, dw, dm, d3, a3, am3, vnni)
        store8(a0, acc, 8 * (t - t0))
        store8(am0, accm, 8 * (t - t0))
        store8(a1, acc, 8 * (t - t0) + 8)
        store8(am1, accm, 8 * (t - t0) + 8)
        store8(a2, acc, 8 * (t - t0) + 16)
        store8(am2, accm, 8 * (t - t0) + 16)
        store8(a3, acc, 8 * (t - t0) + 24)
        store8(am3, accm, 8 * (t - t0) + 24)


@njit(nogil=True, cache=True, inline="always")
def _q4k_group(x8, g, nsb, n_in, xq, dk, bs_pairs, t0, t1, n_gemm, acc, accm, vnni):
    """Every token against the 8 rows of group g: acc / accm (n_tok * 8,) float32 get the
    float chains of llama.cpp's repacked Q4_K product. ggml (repack.cpp forward_mul_mat_one_chunk)
    multiplies a batch's tokens in fours with ggml_gemm_q4_K_8x8_q8_K, which adds each 64-element
    chunk's integer into the float sums, and the last n % 4 tokens (every token of a batch of
    3 or fewer) with ggml_gemv_q4_K_8x8_q8_K, which adds once per super-block. The fours'
    integers come from vpmaddubsw or vpdpbusd (vnni): the same integers, so the same floats.
    (On AMX, kquants_amx.q4k_pair_amx takes batches of 16+ tokens instead, in the gemv chain.)"""
    for b in range(nsb):
        base = (g * nsb + b) * Q4K_X8_BYTES
        for ahead in range(0, Q4K_X8_BYTES, 64):
            prefetch(x8, base + PREFETCH_AHEAD + ahead)
        dw = load_f16x8(x8, base)
        dm = load_f16x8(x8, base + 16)
        s_lo, s_hi, n_lo, n_hi = scale_words(x8, base)
        mins = (_bytes_as_halves(n_lo, 0), _bytes_as_halves(n_lo, 1),
                _bytes_as_halves(n_hi, 0), _bytes_as_halves(n_hi, 1))
        sc = scales8(s_lo, s_hi, False)     # for gemv's 16-bit sums
        # ggml_gemm_q4_K_8x8_q8_K for the fours of tokens: one fma per 64-element chunk
        if t0 < n_gemm:
            _q4k_gemm_fours(x8, base, b, nsb, n_in, xq, dk, bs_pairs, t0, min(t1, n_gemm), scales8(s_lo, s_hi, vnni),
                            mins, dw, dm, acc, accm, vnni)
        # ggml_gemv_q4_K_8x8_q8_K for the rest: one fma per super-block
        for t in range(max(t0, n_gemm), t1):
            xbase = t * n_in + b * QK_K
            pb = (t * nsb + b) * 4
            dx = splat8(dk[t, b])
            iacc = zero8i()
            imin = zero8i()
            for c in range(4):
                lo, hi = _q4k_chunk(x8, base + 128 + 256 * c, xq, xbase + 64 * c)
                iacc = add32(iacc, add32(madd16(lo, sc[2 * c]), madd16(hi, sc[2 * c + 1])))
                imin = add32(imin, madd16(mins[c], bcast32(bs_pairs, pb + c)))
            store8(fma8(to_f32(iacc), mul8(dw, dx), load8(acc, 8 * (t - t0))), acc, 8 * (t - t0))
            store8(fma8(to_f32(imin), mul8(dm, dx), load8(accm, 8 * (t - t0))), accm, 8 * (t - t0))


@njit(nogil=True, cache=True, inline="always")
def _rows_out(acc, accm, width, lane0, t0, ta, tb, out, row0, n_rows):
    """out[t, row0 + i] = acc - accm of lane lane0 + i of token t (ta <= t < tb), the
    accumulators holding width lanes per token from token t0."""
    for t in range(ta, tb):
        k = width * (t - t0) + lane0
        for i in range(n_rows):
            out[t, row0 + i] = acc[k + i] - accm[k + i]


@njit(parallel=True, nogil=True, cache=True)
def matmul_q4_k_x8(x8, n_out, vnni, amx, n_chunks, x, out):
    """Q4_K weights (repack_q4_k_x8) x Q8_K activations; fours of tokens through vpdpbusd
    with vnni (the same bits, faster where HAS_VNNI); with amx, batches of 16 tokens or more on
    AMX tiles, two groups (16 rows) at a time, each token with the bits of its gemv.

    x8        # (groups * nsb * 1152,) uint8
    n_chunks  # runs of groups, one per thread
    x         # (n_tok, n_in) float32
    out       # (n_tok, n_out) float32
    """
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    xq, dk, bs_pairs, bs16 = q8_k_acts(x)
    n_groups = (n_out + ROWS_X8 - 1) // ROWS_X8
    n_gemm = n_tok - n_tok % 4
    amx = amx and n_gemm >= AMX_TOKENS
    # Tokens in passes whose activations (tile x n_in bytes) stay in L2 while the chunk's
    # groups go over them; a multiple of 4, so fours of tokens stay fours (16 for AMX's tiles).
    step = AMX_TOKENS if amx else 4
    fit = min(AMX_TILE_TOKENS, AMX_TILE_BYTES // n_in) if amx else Q4K_TILE_BYTES // n_in
    tile = max(step, min(n_tok, fit) // step * step)
    for c in prange(n_chunks):
        acc = np.empty(tile * 2 * ROWS_X8, np.float32)       # (tile, 8 or 16 rows) float32
        accm = np.empty(tile * 2 * ROWS_X8, np.float32)      # (tile, 8 or 16 rows) float32
        bufs = (np.empty(12288, np.uint8), np.empty(768, np.int32))
        if amx:
            tile_config(AMX_CONFIG)
        g0, g1 = chunk_groups(c, n_chunks, n_groups)
        for t0 in range(0, n_tok, tile):
            t1 = min(n_tok, t0 + tile)
            for g in range(g0, g1, 2 if amx else 1):
                acc[:] = 0
                accm[:] = 0
                if amx:
                    # two groups a tile; a thread's last group alone is multiplied twice, its copy dropped
                    g2 = min(g + 1, g1 - 1)
                    q4k_pair_amx(x8, g, g2, nsb, n_in, xq, dk, t0, t1, acc, accm, bufs)
                    for h in range(2 if g2 > g else 1):
                        row0 = (g + h) * ROWS_X8
                        _rows_out(acc, accm, 2 * ROWS_X8, ROWS_X8 * h, t0, t0, t1, out, row0, min(ROWS_X8, n_out - row0))
                else:
                    _q4k_group(x8, g, nsb, n_in, xq, dk, bs_pairs, t0, t1, n_gemm, acc, accm, vnni)
                    _rows_out(acc, accm, ROWS_X8, 0, t0, t0, t1, out, g * ROWS_X8, min(ROWS_X8, n_out - g * ROWS_X8))
        if amx:
            tile_release()


@njit(parallel=True, nogil=True, cache=True)
def matvec_q4_k_x8_stack(x8a, na, x8b, nb, x8c, nc, n_chunks, x, out_a, out_b, out_c):
    """Up to three Q4_K matrices (repack_q4_k_x8) times one token's activations in one call:
    out_a = A x, out_b = B x, out_c = C x, each row with the bits ``matmul_q4_k_x8`` gives it
    (the same gemv per group, the same Q8_K quants, made once). Why: a decode step's small
    products (q, k and v of a layer: 1536, 256 and 256 rows at Qwen2.5-1.5B) are small enough
    that each call's fixed costs (the call, the activations, the threads' start and the memory's
    first lines) weigh as much as their bytes; in one call the threads share out all the groups,
    and gate and up (two 8960-row matrices) pay those costs once. nc = 0 (any x8c) stacks two.

    x8a, x8b, x8c  # (groups * nsb * 1152,) uint8 each, the planes of (na | nb | nc, n_in) matrices
    x              # (1, n_in) float32
    out_a, out_b, out_c  # (1, na), (1, nb), (1, nc) float32
    """
    n_in = x.shape[1]
    nsb = n_in // QK_K
    xq, dk, bs_pairs, _ = q8_k_acts(x)
    ga, gb = (na + ROWS_X8 - 1) // ROWS_X8, (nb + ROWS_X8 - 1) // ROWS_X8
    n_groups = ga + gb + (nc + ROWS_X8 - 1) // ROWS_X8
    for c in prange(n_chunks):
        acc = np.empty(ROWS_X8, np.float32)    # (8 rows,) float32: one token's gemv chains
        accm = np.empty(ROWS_X8, np.float32)   # (8 rows,) float32: its mins' chains
        g0, g1 = chunk_groups(c, n_chunks, n_groups)
        for g in range(g0, g1):
            if g < ga:
                x8, out, n_out, gm = x8a, out_a, na, g
            elif g < ga + gb:
                x8, out, n_out, gm = x8b, out_b, nb, g - ga
            else:
                x8, out, n_out, gm = x8c, out_c, nc, g - ga - gb
            acc[:] = 0
            accm[:] = 0
            _q4k_group(x8, gm, nsb, n_in, xq, dk, bs_pairs, 0, 1, 0, acc, accm, False)
            _rows_out(acc, accm, ROWS_X8, 0, 0, 0, 1, out, gm * ROWS_X8, min(ROWS_X8, n_out - gm * ROWS_X8))


@njit(nogil=True, cache=True)
def rows_q4_k_x8(x8, n_out, ids, out):
    """Dequantized rows, bit-exact with gguf.quants: (d * sc) * q - (dmin * m).

    x8   # (groups * nsb * 1152,) uint8
    ids  # (n_ids,) int64
    out  # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    h = np.empty(2, np.uint16)                 # (2,) uint16
    f = np.empty(2, np.float32)                # (2,) float32: d, dmin
    sb = np.empty(12, np.uint8)                # (12,) uint8 scale bytes of the row
    sc = np.empty((8, 1), np.int16)            # (8, 1) int16 6-bit scales
    mn = np.empty((8, 1), np.int16)            # (8, 1) int16 6-bit mins
    for n in range(ids.shape[0]):
        g, r = ids[n] // ROWS_X8, ids[n] % ROWS_X8
        for b in range(nsb):
            base = (g * nsb + b) * Q4K_X8_BYTES
            h[0] = np.uint16(x8[base + 2 * r]) | (np.uint16(x8[base + 2 * r + 1]) << 8)
            h[1] = np.uint16(x8[base + 16 + 2 * r]) | (np.uint16(x8[base + 17 + 2 * r]) << 8)
            decode_f16(h, f)
            for k in range(12):
                sb[k] = x8[base + 32 + 4 * (8 * (k // 4) + r) + k % 4]
            unpack_scales(sb, 1, sc, mn)
            for c in range(4):
                for half in range(2):
                    dl = f[0] * np.float32(sc[2 * c + half, 0])
                    ml = f[1] * np.float32(mn[2 * c + half, 0])
                    for l in range(32):
                        q = np.int32(x8[base + 128 + c * 256 + (l // 4) * 32 + 4 * r + l % 4])
                        q = (q >> 4) if half else (q & 15)
                        out[n, b * QK_K + c * 64 + half * 32 + l] = dl * np.float32(q) - ml


# ---- Q6_K kernel (GGUF blocks as they are) -------------------------------------------------

@njit(nogil=True, cache=True)
def _q6_unpack(raw, blk, j):
    """The 6-bit weights of half j of a Q6_K block as 4 byte vectors (q6k_blocks.q6k_weights)
    and their scale pairs for vpmaddwd (_mm256_cvtepi8_epi16 of get_scale_shuffle)."""
    s = blk + 192 + 8 * j
    return (q6k_weights(raw, blk, j),
            (scale_halves(raw, s), scale_halves(raw, s + 2), scale_halves(raw, s + 4), scale_halves(raw, s + 6)))


@njit(nogil=True, cache=True, inline="always")
def _q6_products(w, sc, xq, xb):
    """Half a block (_q6_unpack's w, sc) times the 128 activations from xq[xb]: 8 int32 lanes,
    lane L holding scale * q * a over bytes 4L..4L+3 of each of the 4 vectors."""
    return add32(add32(madd16(sc[0], maddubs(w[0], load256(xq, xb))),
                       madd16(sc[1], maddubs(w[1], load256(xq, xb + 32)))),
                 add32(madd16(sc[2], maddubs(w[2], load256(xq, xb + 64))),
                       madd16(sc[3], maddubs(w[3], load256(xq, xb + 96)))))


@njit(nogil=True, cache=True, inline="always")
def _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb, bs16, pb):
    """ggml_vec_dot_q6_K_q8_K's sumi for one block and token: the two halves' products minus
    32 * (bsum_2L sc_2L + bsum_2L+1 sc_2L+1) in lane L (the -32 offset through the bsums)."""
    q8sclsub = sll32(madd16(load256(bs16, pb), sext8to16(raw, blk + 192)), 5)
    return sub32(add32(_q6_products(w0, s0, xq, xb), _q6_products(w1, s1, xq, xb + 128)), q8sclsub)


@njit(nogil=True, cache=True)
def _q6_row(raw, blk0, nsb, n_in, xq, t, dk, bs16):
    """One row (its blocks from byte blk0) times token t in the float order of
    ggml_vec_dot_q6_K_q8_K (AVX2): per block acc = fma(d_x * d_w, float(lanes), acc) in 8
    lanes, then hsum_float_8."""
    acc = zero8()
    for i in range(nsb):
        blk = blk0 + i * Q6K_BYTES
        w0, s0 = _q6_unpack(raw, blk, 0)
        w1, s1 = _q6_unpack(raw, blk, 1)
        lanes = _q6_lanes(raw, blk, w0, s0, w1, s1, xq, t * n_in + i * QK_K, bs16, (t * nsb + i) * 16)
        acc = fma8(splat8(dk[t, i] * load_f16(raw, blk + 208)), to_f32(lanes), acc)
    return hsum8(acc)


Q6K_AMX_TOKENS = 512  # tokens of a pass of matmul_q6_k_rows' AMX tiles
Q6K_TOKEN_TILE = 32   # tokens whose Q8_K activations (32 x n_in bytes) one pass of rows reuses


@njit(nogil=True, cache=True)
def _q6_row_tokens(raw, blk0, nsb, n_in, xq, dk, dk_t, bs16, t0, t1, acc):
    """One row times tokens t0..t1 in the order of llama.cpp's tiled K-quant matmul
    (tiled/tiled-kernel.cpp, which ggml takes for batches of TILED_MIN_BATCH tokens or more):
    per block the exact sum s of its products, then acc = fma(d_w * float(s), d_x, acc). Each
    block is unpacked once for all these tokens; eights of tokens add their lanes in one
    transposing tree (hsum32x8: the same int32 as hsum32) and take their float steps as
    vectors, the same ops per token. acc (>= t1 - t0,) float32, zeroed; dk_t (nsb * n_tok,)
    float32: dk transposed."""
    n_tok = dk.shape[0]
    for i in range(nsb):
        blk = blk0 + i * Q6K_BYTES
        dw = load_f16(raw, blk + 208)
        w0, s0 = _q6_unpack(raw, blk, 0)
        w1, s1 = _q6_unpack(raw, blk, 1)
        t8 = t0 + (t1 - t0) // 8 * 8
        for t in range(t0, t8, 8):
            xb = t * n_in + i * QK_K
            pb = (t * nsb + i) * 16
            sums = hsum32x8(_q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb, bs16, pb),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + n_in, bs16, pb + nsb * 16),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 2 * n_in, bs16, pb + nsb * 32),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 3 * n_in, bs16, pb + nsb * 48),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 4 * n_in, bs16, pb + nsb * 64),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 5 * n_in, bs16, pb + nsb * 80),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 6 * n_in, bs16, pb + nsb * 96),
                            _q6_lanes(raw, blk, w0, s0, w1, s1, xq, xb + 7 * n_in, bs16, pb + nsb * 112))
            a = fma8(mul8(splat8(dw), to_f32(sums)), load8(dk_t, i * n_tok + t), load8(acc, t - t0))
            store8(a, acc, t - t0)
        for t in range(t8, t1):
            lanes = _q6_lanes(raw, blk, w0, s0, w1, s1, xq, t * n_in + i * QK_K, bs16, (t * nsb + i) * 16)
            acc[t - t0] = fma(dw * np.float32(hsum32(lanes)), dk[t, i], acc[t - t0])


@njit(parallel=True, nogil=True, cache=True)
def matmul_q6_k_rows(raw, n_out, amx, n_chunks, x, out):
    """Q6_K weights (GGUF rows, flat) x Q8_K activations; with amx, batches' whole tiles of 16
    tokens on AMX tiles, 16 rows at a time (kquants_amx.q6k_rows_amx: the same integers and
    floats; its scales folded into the weights, so a tile product covers more than one
    16-element sub-block with no int32 scaling step between them).

    raw       # (n_out * nsb * 210,) uint8
    n_chunks  # runs of rows, one per thread
    x         # (n_tok, n_in) float32
    out       # (n_tok, n_out) float32
    """
    n_tok, n_in = x.shape
    nsb = n_in // QK_K
    xq, dk, bs_pairs, bs16 = q8_k_acts(x)
    tiled = n_tok >= TILED_MIN_BATCH
    # (nsb * n_tok,) float32: a block's scales of every token, for the batch paths only
    dk_t = np.ascontiguousarray(dk.T).reshape(-1) if tiled else dk.reshape(-1)
    n_amx = n_tok // AMX_TOKENS * AMX_TOKENS if amx and tiled else 0
    bact = q6k_pack_acts(xq, n_amx, n_in) if n_amx else np.empty(0, np.int8)   # (not for decode steps)
    # AMX passes over tokens: rebuilding the weight tiles costs more here than reading the
    # activations from L3, so the passes are long (Q6K_AMX_TOKENS) even past L2
    tile = max(AMX_TOKENS, min(n_amx, Q6K_AMX_TOKENS))
    for c in prange(n_chunks):
        r0, r1 = chunk_groups(c, n_chunks, n_out)
        if n_amx:
            tile_config(AMX_CONFIG)
            bufs = (np.empty(12288, np.uint8), np.empty(768, np.int32), np.empty(16, np.float32))
            acc = np.empty(16 * tile, np.float32)           # (16 rows, tile) float32
            for t0 in range(0, n_amx, tile):
                t1 = min(n_amx, t0 + tile)
                for g in range(r0, r1, 16):
                    n_rows = min(16, r1 - g)
                    acc[:] = 0
                    q6k_rows_amx(raw, g, n_rows, nsb, bact, dk_t, t0, t1, acc, bufs)
                    for t in range(t0, t1):
                        for r in range(n_rows):
                            out[t, g + r] = acc[r * (t1 - t0) + t - t0]
            tile_release()
        if tiled:
            # Tokens in tiles whose activations stay in L2 while the chunk's rows pass over
            # them (a whole batch of an 8960-wide input is 2.3 MB, re-read for every row).
            acc = np.empty(Q6K_TOKEN_TILE, np.float32)   # (tile,) float32
            for t0 in range(n_amx, n_tok, Q6K_TOKEN_TILE):
                t1 = min(n_tok, t0 + Q6K_TOKEN_TILE)
                for r in range(r0, r1):
                    acc[:] = 0
                    _q6_row_tokens(raw, r * nsb * Q6K_BYTES, nsb, n_in, xq, dk, dk_t, bs16, t0, t1, acc)
                    for t in range(t0, t1):
                        out[t, r] = acc[t - t0]
        else:
            for r in range(r0, r1):
                for t in range(n_tok):
                    out[t, r] = _q6_row(raw, r * nsb * Q6K_BYTES, nsb, n_in, xq, t, dk, bs16)


@njit(nogil=True, cache=True)
def rows_q6_k_rows(raw, n_out, ids, out):
    """Dequantized rows of GGUF Q6_K blocks, bit-exact with gguf.quants: (d * sc) * (q - 32).

    raw  # (n_out * nsb * 210,) uint8
    ids  # (n_ids,) int64
    out  # (n_ids, n_in) float32
    """
    nsb = out.shape[1] // QK_K
    h = np.empty(1, np.uint16)                 # (1,) uint16
    f = np.empty(1, np.float32)                # (1,) float32
    for n in range(ids.shape[0]):
        for b in range(nsb):
            blk = (ids[n] * nsb + b) * Q6K_BYTES
            h[0] = np.uint16(raw[blk + 208]) | (np.uint16(raw[blk + 209]) << 8)
            decode_f16(h, f)
            for half in range(2):
                for l in range(32):
                    a = np.int32(raw[blk + half * 64 + l])
                    c = np.int32(raw[blk + half * 64 + 32 + l])
                    hb = np.int32(raw[blk + 128 + half * 32 + l])
                    q4 = ((a & 15) | ((hb & 3) << 4), (c & 15) | (((hb >> 2) & 3) << 4),
                          (a >> 4) | (((hb >> 4) & 3) << 4), (c >> 4) | (((hb >> 6) & 3) << 4))
                    for k in range(4):
                        s = np.float32(np.int8(raw[blk + 192 + half * 8 + k * 2 + l // 16]))
                        out[n, b * QK_K + half * 128 + k * 32 + l] = (f[0] * s) * np.float32(q4[k] - 32)
