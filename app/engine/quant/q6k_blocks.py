"""Q6_K blocks as GGUF stores them (block_q6_K, ggml-common.h), read by the AVX2 and AMX
kernels (quant/kquants_avx2.py, quant/kquants_amx.py). A block of 256 weights is 210 bytes:
    [0, 128)    ql: the low 4 bits, elements 128 h + l and 128 h + l + 64 at byte 64 h + l (l < 64)
    [128, 192)  qh: the high 2 bits, four elements a byte
    [192, 208)  16 int8 scales, one per sub-block of 16 elements
    [208, 210)  d (f16)
and weight e is d * scale[e // 16] * (q_e - 32) with q_e in 0..63.

The AMX kernel multiplies the scales into signed weight bytes, where sc * (q - 32) does not
fit: sc is written in balanced base 7, sc = s0 + 7 s1 + 49 s2 with digits -3..3 (they reach
+-171, past int8's range), so each digit x (q - 32) is a byte (|.| <= 96) and the three digit
products' integer sums give the block's s = C0 + 7 (C1 + 7 C2) exactly.
"""
from __future__ import annotations

from numba import njit

from ..ops.simd_int import add16, load256, mulhu16, mullo16, sext8to16, sll32, splat32, srl32, sub16, vand, vor

Q6K_BYTES = 210         # block_q6_K
SCALE_DIGITS = 3        # balanced base-7 digits of an int8 scale


@njit(nogil=True, cache=True, inline="always")
def scale_digits(raw, blk):
    """The block's 16 scales in balanced base 7: three vectors of 16 int16 lanes, lane j of
    vector k holding digit k (-3..3) of sub-block j's scale. Through u = sc + 171 =
    sum_k (d_k + 3) 7**k, whose ordinary base-7 digits come from u // 7 = (u * 9363) >> 16
    (exact for u < 300: 9363 * 7 = 2**16 + 5)."""
    u = add16(sext8to16(raw, blk + 192), splat32(171 * 0x10001))
    seven = splat32(7 * 0x10001)
    magic = splat32(9363 * 0x10001)
    three = splat32(3 * 0x10001)
    q1 = mulhu16(u, magic)
    q2 = mulhu16(q1, magic)
    return (sub16(sub16(u, mullo16(q1, seven)), three), sub16(sub16(q1, mullo16(q2, seven)), three),
            sub16(q2, three))


@njit(nogil=True, cache=True, inline="always")
def q6k_weights(raw, blk, j):
    """The 6-bit weights (0..63) of half j of the block at raw[blk]: 4 byte vectors holding
    elements 128 j + 32 m .. + 32 (m < 4) in order, as ggml_vec_dot_q6_K_q8_K's q4_0..q4_3."""
    m3 = splat32(0x03030303)
    m12 = splat32(0x0C0C0C0C)
    m48 = splat32(0x30303030)
    mc0 = splat32(0xC0C0C0C0)
    m15 = splat32(0x0F0F0F0F)
    q1 = load256(raw, blk + 64 * j)
    q2 = load256(raw, blk + 64 * j + 32)
    qh = load256(raw, blk + 128 + 32 * j)
    return (vor(vand(q1, m15), sll32(vand(qh, m3), 4)), vor(vand(q2, m15), sll32(vand(qh, m12), 2)),
            vor(vand(srl32(q1, 4), m15), vand(qh, m48)), vor(vand(srl32(q2, 4), m15), srl32(vand(qh, mc0), 2)))
