"""ggml's exp, in one lane and on 8 lanes.

ggml-cpu evaluates exp in softmax and SiLU with its own vectorised approximation
(ggml-cpu/vec.h ggml_v_expf), which differs from expf in the last bit now and then; with
activations re-quantized to 8 bits at every matmul, such bits can flip a rounding and move a
greedy token. So we evaluate the same sequence of IEEE operations, lane by lane: ``ggml_expf``
on a float32, ``expf8`` / ``silu8`` on a ``vec8`` (ops/simd.py).

It has two forms, and a llama.cpp built for this CPU takes the AVX-512 one where the CPU has
AVX-512 F and DQ (``AVX512_EXPF``): the AVX2 form ends with fma(j, 2^n, 2^n) (two steps for
|n| > 126), the AVX-512 form adds the 1 inside the polynomial and scales by 2^n with
_mm512_scalef_ps, one rounding; the two differ in the last bit for about a quarter of inputs.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import V8F, V8I, bits_f32, f32_bits, fma, splat_const, vec8
from .simd_int import host_cpu_features

AVX512_EXPF = all(bool(host_cpu_features().get(k)) for k in ("avx512f", "avx512dq"))

# ggml_v_expf's constants, spelled as in vec.h
_F = np.float32


_MASK32 = 0xFFFFFFFF
_R = _F(float.fromhex("0x1.8p23"))
_LOG2E = _F(float.fromhex("0x1.715476p+0"))
_LN2_HI = _F(float.fromhex("0x1.62e4p-1"))
_LN2_LO = _F(float.fromhex("0x1.7f7d1cp-20"))
_C1 = _F(float.fromhex("0x1.ffffecp-1"))
_C2 = _F(float.fromhex("0x1.fffdb6p-2"))
_C3 = _F(float.fromhex("0x1.555e66p-3"))
_C4 = _F(float.fromhex("0x1.573e2ep-5"))
_C5 = _F(float.fromhex("0x1.0e4020p-7"))


@njit(inline="always")
def ggml_expf(x):
    """exp(x) for float32 x, as ggml_v_expf computes it in one SIMD lane (its AVX-512 form
    where AVX512_EXPF)."""
    if AVX512_EXPF:
        return expf_avx512(x)
    return expf_avx2(x)


@njit(inline="always")
def expf_avx2(x):
    """ggml_v_expf's AVX2 form in one lane. Both of its branches are evaluated and selected,
    as the SIMD code does, so loops vectorise."""
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    e = (f32_bits(z) << 23) & _MASK32
    k = bits_f32((e + 0x3F800000) & _MASK32)
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, _C1 * b)
    near = fma(j, k, k)                     # |n| <= 126: the usual case
    g = 0x82000000 if n <= _F(0.0) else 0    # far from 0: scale in two steps
    s1 = bits_f32((g + 0x7F000000) & _MASK32)
    s2 = bits_f32((e - g) & _MASK32)
    far = s1 * s1 if abs(n) > _F(192.0) else fma(s2, j, s2) * s1
    return far if abs(n) > _F(126.0) else near


@njit(inline="always")
def expf_avx512(x):
    """ggml_v_expf's AVX-512 form in one lane: j = 1 + c1 b + ... (the 1 inside the polynomial),
    then j * 2^n rounded once (_mm512_scalef_ps: j times 2^(n/2) times 2^(n - n/2), both exact
    in float64, then to float32); |n| > 192 gives 0 or inf, NaN stays NaN. No branch and no
    libm call, so loops over it vectorise."""
    z = fma(x, _LOG2E, _R)
    n = z - _R
    b = fma(-n, _LN2_LO, fma(-n, _LN2_HI, x))
    u = b * b
    j = fma(fma(fma(_C5, b, _C4), u, fma(_C3, b, _C2)), u, fma(_C1, b, _F(1.0)))
    far = abs(n) > _F(192.0)
    ni = np.int32(n) if abs(n) <= _F(192.0) else np.int32(0)     # NaN and |n| > 192: 0 (not used)
    a = ni >> 1
    s1 = bits_f32(((a + 127) << 23) & _MASK32)
    s2 = bits_f32(((ni - a + 127) << 23) & _MASK32)
    scaled = _F(np.float64(j) * np.float64(s1) * np.float64(s2))
    alt = _F(0.0) if n <= _F(0.0) else _F(np.inf)
    return alt if far else scaled


def _expf_avx512_ir(builder, x):
    """ggml_v_expf's AVX-512 form (vec.h, __m512) in LLVM IR on <8 x float>, lane for lane."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F, [V8F] * 3), "llvm.fma.v8f32")
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F, [V8F]), "llvm.fabs.v8f32")
    v8d = ir.VectorType(ir.DoubleType(), 8)
    v8l = ir.VectorType(ir.IntType(64), 8)

    def f(v):
        return splat_const(float(v))

    z = builder.call(fma, [x, f(_LOG2E), f(_R)])
    n = builder.fsub(z, f(_R))
    neg_n = builder.fsub(f(-0.0), n)
    b = builder.call(fma, [neg_n, f(_LN2_LO), builder.call(fma, [neg_n, f(_LN2_HI), x])])
    u = builder.fmul(b, b)
    j = builder.call(fma, [builder.call(fma, [builder.call(fma, [f(_C5), b, f(_C4)]), u,
                                              builder.call(fma, [f(_C3), b, f(_C2)])]),
                           u, builder.call(fma, [f(_C1), b, f(1.0)])])
    abs_n = builder.call(fabs, [n])
    # 2^n as a float64 (exact for |n| <= 192), the product exact in float64, one rounding to float32
    big = builder.fcmp_ordered(">", abs_n, f(192.0))
    n_safe = builder.select(builder.fcmp_ordered("<=", abs_n, f(192.0)), n, f(0.0))   # NaN: 0, j stays NaN
    bits = builder.shl(builder.add(builder.fptosi(n_safe, v8l), ir.Constant(v8l, [1023] * 8)),
                       ir.Constant(v8l, [52] * 8))
    scaled = builder.fptrunc(builder.fmul(builder.fpext(j, v8d), builder.bitcast(bits, v8d)), V8F)
    alt = builder.select(builder.fcmp_ordered("<=", n, f(0.0)), f(0.0), f(float("inf")))
    return builder.select(big, alt, scaled)


def _ggml_expf_ir(builder, x, avx512=AVX512_EXPF):
    """ggml_v_expf (vec.h) in LLVM IR on <8 x float>, op for op: its AVX-512 form where
    AVX512_EXPF, else the AVX2 + FMA one."""
    if avx512:
        return _expf_avx512_ir(builder, x)
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F, [V8F] * 3), "llvm.fma.v8f32")
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F, [V8F]), "llvm.fabs.v8f32")

    def f(v):
        return splat_const(float(v))

    def i(v):
        return splat_const(v - (1 << 32) if v >= 1 << 31 else v, V8I)

    z = builder.call(fma, [x, f(_LOG2E), f(_R)])
    n = builder.fsub(z, f(_R))
    neg_n = builder.fsub(f(-0.0), n)
    b = builder.call(fma, [neg_n, f(_LN2_LO), builder.call(fma, [neg_n, f(_LN2_HI), x])])
    e = builder.shl(builder.bitcast(z, V8I), i(23))
    k = builder.bitcast(builder.add(e, i(0x3F800000)), V8F)
    abs_n = builder.call(fabs, [n])
    u = builder.fmul(b, b)
    j = builder.call(fma, [builder.call(fma, [builder.call(fma, [f(_C5), b, f(_C4)]), u,
                                              builder.call(fma, [f(_C3), b, f(_C2)])]),
                           u, builder.fmul(f(_C1), b)])
    near = builder.call(fma, [j, k, k])
    g = builder.select(builder.fcmp_ordered("<=", n, f(0.0)), i(0x82000000), i(0))
    s1 = builder.bitcast(builder.add(g, i(0x7F000000)), V8F)
    s2 = builder.bitcast(builder.sub(e, g), V8F)
    far = builder.select(builder.fcmp_ordered(">", abs_n, f(192.0)), builder.fmul(s1, s1),
                         builder.fmul(builder.call(fma, [s2, j, s2]), s1))
    return builder.select(builder.fcmp_ordered(">", abs_n, f(126.0)), far, near)


def _expf8(avx512):
    def typer(typingctx, x):
        if x != vec8:
            return None

        def codegen(context, builder, sig, args):
            return _ggml_expf_ir(builder, args[0], avx512)

        return vec8(x), codegen

    return intrinsic(typer)


expf8 = _expf8(AVX512_EXPF)          # ggml_v_expf on 8 lanes, in this CPU's llama.cpp form
expf8_avx2 = _expf8(False)           # each form on any CPU (tests compare them everywhere)
expf8_avx512 = _expf8(True)


@intrinsic
def silu8(typingctx, x):
    """ggml_v_silu on 8 lanes: x / (1 + expf(0 - x))."""
    if x != vec8:
        return None

    def codegen(context, builder, sig, args):
        ex = _ggml_expf_ir(builder, builder.fsub(splat_const(0.0), args[0]))
        return builder.fdiv(args[0], builder.fadd(splat_const(1.0), ex))

    return vec8(x), codegen
