"""IEEE half (f16) and bfloat16 conversions for numba kernels.

numba has no float16 type on the CPU. Two kinds of conversion live here:

* scalar intrinsics, ``f16_to_f32`` / ``f32_to_f16`` / ``round_f16``: they lower to LLVM
  ``fpext half`` / ``fptrunc ... to half``, which on x86 with F16C are vcvtph2ps / vcvtps2ph
  (round to nearest even, like ggml's GGML_CPU_FP32_TO_FP16) and vectorise inside loops;
* whole planes of f16 bit patterns, ``decode_f16`` (every pattern, exactly) and
  ``decode_f16_plain`` (zeros and normal numbers only, and cheaper: shift, then one multiply by
  2**112, which moves the exponent bias exactly, with no pass or select for subnormals, inf
  or nan), chosen per plane by ``f16_plane_is_plain``;
  and in-place rounding of float32 arrays to f16 or bf16 values (``round_f16_in_place``,
  ``round_bf16_in_place``), as llama.cpp rounds activations. None of them relies on denormal
  arithmetic, so all stay exact with FTZ/DAZ set.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# ---- Scalars -----------------------------------------------------------------------------

@intrinsic
def f16_to_f32(typingctx, bits):
    """uint16 bits of an IEEE half -> float32 (exact)."""
    if not isinstance(bits, types.Integer) or bits.bitwidth != 16:
        return None

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(bits), codegen


@intrinsic
def f32_to_f16(typingctx, x):
    """float32 -> uint16 bits of the nearest IEEE half (round to nearest even)."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(x), codegen


@njit(inline="always")
def round_f16(x):
    """float32 rounded to the nearest f16 value, returned as float32."""
    return f16_to_f32(f32_to_f16(x))


# ---- Planes ----------------------------------------------------------------------------

F32_F16_REBIAS = np.int32(112 << 23)  # (127 - 15) << 23: f16 exponent bias -> f32 exponent bias


TWO_P112 = np.float32(2.0 ** 112)     # the same rebias as a multiply
TWO_M24 = np.float32(2.0 ** -24)      # value of one f16 subnormal step
TWO_P24 = np.float32(2.0 ** 24)


@njit(nogil=True, cache=True)
def decode_f16(h, out):
    """h (n,) uint16 f16 bit patterns -> out (n,) float32, exact for every pattern.

    Normal and inf/nan values are rebuilt by moving exponent and mantissa into f32 position;
    subnormals (exponent 0) are ``mantissa * 2**-24`` computed in float, which is exact.
    """
    bits = out.view(np.int32)
    for i in range(h.shape[0]):
        v = np.int32(h[i])
        mag = v & 0x7FFF
        sign = (v & 0x8000) << 16
        b = (mag << 13) + F32_F16_REBIAS
        if mag >= 0x7C00:  # inf / nan: all-ones f32 exponent
            b = 0x7F800000 | ((mag & 0x3FF) << 13)
        bits[i] = np.int32(b | sign)
    for i in range(h.shape[0]):
        mag = np.int32(h[i]) & 0x7FFF
        sub = np.float32(mag) * TWO_M24
        if np.int32(h[i]) & 0x8000:
            sub = -sub
        out[i] = sub if mag < 0x400 else out[i]


@njit(nogil=True, cache=True, inline="always")
def decode_f16_plain(h, out):
    """h (n,) uint16 -> out (n,) float32 for zeros and normal finite f16 only: the f16 bits
    moved into f32 position give a (normal) f32 2**112 too small; multiplying fixes that
    exactly. Subnormals, inf and nan would come out wrong: see f16_plane_is_plain."""
    bits = out.view(np.int32)
    for i in range(h.shape[0]):
        v = np.int32(h[i])
        bits[i] = np.int32(np.int32(np.int32(v & np.int32(0x7FFF)) << np.int32(13))
                           | np.int32(np.int32(v & np.int32(0x8000)) << np.int32(16)))
    for i in range(h.shape[0]):
        out[i] = out[i] * TWO_P112


@njit(nogil=True, cache=True, inline="always")
def decode_f16_plane(h, out, plain):
    """decode_f16_plain when the plane is plain, else the general decode_f16."""
    if plain:
        decode_f16_plain(h, out)
    else:
        decode_f16(h, out)


def f16_plane_is_plain(*planes: np.ndarray) -> bool:
    """True when every f16 in the uint16 planes is a zero or a normal finite number."""
    for h in planes:
        exp = h & 0x7C00
        if np.any(exp == 0x7C00) or np.any((exp == 0) & ((h & 0x3FF) != 0)):
            return False
    return True


@njit(nogil=True, cache=True)
def round_f16_in_place(vals):
    """vals (n,) float32, in place: round each value to the nearest f16 (ties to even) and
    keep it as float32, i.e. the f32 value of GGML_CPU_FP32_TO_FP16 (F16C ``vcvtps2ph`` with
    round-to-nearest, ggml-cpu/simd-mappings.h) followed by FP16_TO_FP32."""
    bits = vals.view(np.int32)
    for i in range(vals.shape[0]):
        u = np.int64(bits[i])
        a = u & 0x7FFFFFFF
        neg = u < 0
        if a > 0x7F800000:      # nan stays nan
            continue
        if a >= 0x477FF000:     # >= 65520 rounds to f16 inf
            r = np.int64(0x7F800000)
        elif a >= 0x38800000:   # f16 normal range: keep 10 mantissa bits, ties to even
            r = (a + 0xFFF + ((a >> 13) & 1)) & 0x7FFFE000
        else:                   # f16 subnormal range: multiples of 2**-24
            mag = np.float32(np.rint(np.abs(vals[i]) * TWO_P24)) * TWO_M24
            vals[i] = -mag if neg else mag
            continue
        if neg:
            r |= np.int64(-2147483648)
        bits[i] = np.int32(r)


@njit(nogil=True, cache=True)
def round_bf16_in_place(vals):
    """vals (n,) float32, in place: GGML_FP32_TO_BF16 (ggml-impl.h ggml_compute_fp32_to_bf16:
    ties to even, nan forced quiet) and back to float32."""
    bits = vals.view(np.int32)
    for i in range(vals.shape[0]):
        u = np.int64(bits[i]) & 0xFFFFFFFF
        if (u & 0x7FFFFFFF) > 0x7F800000:
            h = (u >> 16) | 64
        else:
            h = ((u + (0x7FFF + ((u >> 16) & 1))) >> 16) & 0xFFFF
        bits[i] = np.int32(np.int64(np.int16(h)) << 16)
