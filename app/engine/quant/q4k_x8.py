"""Q4_K weights repacked 8 rows at a time (llama.cpp's block_q4_Kx8, repack.cpp), the layout
that quant/kquants_avx2.py and quant/kquants_amx.py multiply. One super-block of a group of 8
rows lies in 1152 contiguous bytes:
    [0, 16)     d of the 8 rows (f16)          [16, 32)  dmin of the 8 rows (f16)
    [32, 128)   the 12 scale bytes as 3 words, word w of row r at 32 + 4 (8 w + r)
    [128, 1152) quants: for chunk c < 4 (64 elements) and k < 8, 32 bytes holding
                qs[32 c + 4 k .. + 4] of rows 0..7, so a 32-bit lane is one row
A lane's low nibbles are elements 64c + 4k .. + 4 and its high nibbles the same + 32. Here too:
decoding a super-block's 6-bit scales and mins for the 8 rows at once (get_scale_min_k4 on whole
words, as repack.cpp's utmp does).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..cpu.numa import placed_empty
from ..ops.simd_int import load256, sll32, splat32, srl32, vand, vor
from ..cpu.threads import chunk_groups
from .activations import QK_K
from .layout import n_chunks_for

ROWS_X8 = 8                      # rows of a Q4_K group
Q4K_BYTES = 144                  # block_q4_K
Q4K_X8_BYTES = ROWS_X8 * Q4K_BYTES


def repack_q4_k_x8(raw, n_out, n_in):
    """raw (n_out, n_in // 256 * 144) uint8 GGUF rows -> {"x8": (groups * nsb * 1152,) uint8} in
    the layout above; a last group of fewer than 8 rows is filled with zero rows. One parallel
    pass over the bytes, on every thread, where numpy's transposing copies would make four
    single-threaded passes at every start."""
    nsb = n_in // QK_K
    groups = -(-n_out // ROWS_X8)
    src = np.asarray(raw, dtype=np.uint8).reshape(n_out, nsb * Q4K_BYTES)
    out = placed_empty(groups * nsb * Q4K_X8_BYTES, np.uint8)
    if n_out % ROWS_X8:
        out[(groups - 1) * nsb * Q4K_X8_BYTES:] = 0     # the missing rows of the last group
    _repack_x8(src, out, n_chunks_for(n_out))
    return {"x8": out}


@njit(parallel=True, nogil=True, cache=True)
def _repack_x8(src, out, n_chunks):
    """src (n_out, nsb * 144) uint8 -> out (groups * nsb * 1152,) uint8, each thread a run of
    groups; the bytes of rows past n_out are left as they are."""
    n_out = src.shape[0]
    nsb = src.shape[1] // Q4K_BYTES
    groups = (n_out + ROWS_X8 - 1) // ROWS_X8
    for ch in prange(n_chunks):
        g0, g1 = chunk_groups(ch, n_chunks, groups)
        for g in range(g0, g1):
            for b in range(nsb):
                base = (g * nsb + b) * Q4K_X8_BYTES
                blk = b * Q4K_BYTES
                for r in range(min(ROWS_X8, n_out - g * ROWS_X8)):
                    row = g * ROWS_X8 + r
                    for j in range(2):
                        out[base + 2 * r + j] = src[row, blk + j]
                        out[base + 16 + 2 * r + j] = src[row, blk + 2 + j]
                    for w in range(3):
                        for j in range(4):
                            out[base + 32 + 32 * w + 4 * r + j] = src[row, blk + 4 + 4 * w + j]
                    for q in range(32):         # q = 8 c + k: bytes 32 c + 4 k .. + 4 of the row
                        for j in range(4):
                            out[base + 128 + 32 * q + 4 * r + j] = src[row, blk + 16 + 4 * q + j]


@njit(nogil=True, cache=True, inline="always")
def scale_words(x8, base):
    """The super-block at byte base of a group: (s_lo, s_hi, n_lo, n_hi), 8 lanes (one per row)
    of 4 bytes each: the 6-bit scales of sub-blocks 0-3, 4-7 and the mins of 0-3, 4-7."""
    m6 = splat32(0x3F3F3F3F)
    m4 = splat32(0x0F0F0F0F)
    m2 = splat32(0x03030303)
    u0 = load256(x8, base + 32)
    u1 = load256(x8, base + 64)
    u2 = load256(x8, base + 96)
    s_lo = vand(u0, m6)
    s_hi = vor(vand(u2, m4), sll32(vand(srl32(u0, 6), m2), 4))
    n_lo = vand(u1, m6)
    n_hi = vor(vand(srl32(u2, 4), m4), sll32(vand(srl32(u1, 6), m2), 4))
    return s_lo, s_hi, n_lo, n_hi


@njit(nogil=True, cache=True, inline="always")
def scale_lanes(v, j, vnni):
    """Byte j of each 32-bit lane of v (a sub-block's scale per row): in both 16-bit halves
    of the lane for vpmaddwd with 16-bit sums, as the lane itself for vnni's 32-bit sums."""
    t = vand(srl32(v, 8 * j), splat32(0xFF))
    if vnni:
        return t
    return vor(t, sll32(t, 16))


@njit(nogil=True, cache=True, inline="always")
def scales8(s_lo, s_hi, vnni):
    """The 8 sub-blocks' scales of a super-block (scale_lanes) from its two scale words."""
    return (scale_lanes(s_lo, 0, vnni), scale_lanes(s_lo, 1, vnni), scale_lanes(s_lo, 2, vnni),
            scale_lanes(s_lo, 3, vnni), scale_lanes(s_hi, 0, vnni), scale_lanes(s_hi, 1, vnni),
            scale_lanes(s_hi, 2, vnni), scale_lanes(s_hi, 3, vnni))
