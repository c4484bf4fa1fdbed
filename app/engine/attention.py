"""Causal multi-head attention (GQA) over the f16 KV cache, as numba kernels.

Numerics follow llama.cpp's CPU path without flash attention
(src/llama-graph.cpp ``build_attn_mha``, non-flash branch) operation by operation:

  kq  = mul_mat(k, q)     K is f16, so ggml converts q to f16 (the vec_dot_type of
                          GGML_TYPE_F16, ggml-cpu/ggml-cpu.c type_traits_cpu);
  kq  = soft_max_ext(kq, mask, scale)   f32: x*scale (+0 mask), max, ggml_v_expf(x - max),
                          8-lane partial sums added in double, times (float)(1/sum)
                          (ggml-cpu/ops.cpp soft_max_f32, vec.cpp ggml_vec_soft_max_f32);
  kqv = mul_mat(v, kq)    V is f16, so the probabilities are rounded to f16 too.

The two f16 matmuls accumulate with FMAs into SIMD lanes whose layout depends on the batch:
one query token (decode) goes through ggml_vec_dot_f16 (vec.cpp: 4 accumulators x 8 lanes,
reduced by GGML_F32x8_REDUCE), two or more (prefill) through llamafile's tinyBLAS
(llamafile/sgemm.cpp: one 8-lane accumulator, then hsum). We keep the same lanes and the
same reduction trees, so for the same inputs the outputs agree bit for bit; the cost is
nil, the lanes are what SIMD code does anyway.
"""
from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

from .kvcache import KVCache, f16_to_f32, f32_to_f16


@njit(inline="always")
def round_f16(x):
    """float32 rounded to the nearest f16 value, returned as float32."""
    return f16_to_f32(f32_to_f16(x))


# ---- ggml's exp ------------------------------------------------------------------
# ggml-cpu evaluates exp in softmax and SiLU with its own vectorised approximation
# (ggml-cpu/vec.h ggml_v_expf, AVX2 + FMA branch), which differs from expf in the last bit
# now and then; with activations re-quantized to 8 bits at every matmul, such bits can
# flip a rounding and move a greedy token. So we evaluate the same sequence of IEEE
# operations, lane by lane.


@intrinsic
def _fma(typingctx, a, b, c):
    """Fused a*b + c in float32 (one rounding), llvm.fma.f32 -> vfmadd."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return types.float32(a, b, c), codegen


@intrinsic
def _f32_bits(typingctx, x):
    """float32 -> its IEEE bits as a non-negative int64."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))

    return types.int64(x), codegen


@intrinsic
def _bits_f32(typingctx, i):
    """Low 32 bits of an int64 -> the float32 with those IEEE bits."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())

    return types.float32(i), codegen


_F = np.float32
_MASK32 = 0xFFFFFFFF


# ggml_v_expf's constants, spelled as in vec.h
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
    """exp(x) for float32 x, as ggml_v_expf computes it in one SIMD lane. Both of its
    branches are evaluated and selected, as the SIMD code does, so loops vectorise."""
    z = _fma(x, _LOG2E, _R)
    n = z - _R
    b = _fma(-n, _LN2_LO, _fma(-n, _LN2_HI, x))
    e = (_f32_bits(z) << 23) & _MASK32
    k = _bits_f32((e + 0x3F800000) & _MASK32)
    u = b * b
    j = _fma(_fma(_fma(_C5, b, _C4), u, _fma(_C3, b, _C2)), u, _C1 * b)
    near = _fma(j, k, k)                     # |n| <= 126: the usual case
    g = 0x82000000 if n <= _F(0.0) else 0    # far from 0: scale in two steps
    s1 = _bits_f32((g + 0x7F000000) & _MASK32)
    s2 = _bits_f32((e - g) & _MASK32)
    far = s1 * s1 if abs(n) > _F(192.0) else _fma(s2, j, s2) * s1
    return far if abs(n) > _F(126.0) else near


# ---- 8-lane vectors ------------------------------------------------------------------
# numba has no SIMD types, so here is one: ``vec8`` is an LLVM <8 x float> (one ymm
# register), made and consumed only by these intrinsics. The lane-exact sums below then
# compile to the AVX2 code llama.cpp runs, instead of what the auto-vectoriser guesses.

_v8f = ir.VectorType(ir.FloatType(), 8)
_I32 = ir.IntType(32)


class Vec8Type(types.Type):
    def __init__(self):
        super().__init__(name="vec8f32")


vec8 = Vec8Type()


@register_model(Vec8Type)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _v8f)


def _elem_ptr(context, builder, arrty, arr, idx):
    ary = context.make_array(arrty)(context, builder, value=arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, idx)


def _is_c(arr, dtypes) -> bool:
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype in dtypes


@intrinsic
def _zero8(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(_v8f, [0.0] * 8)

    return vec8(), codegen


@intrinsic
def _splat8(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        v = builder.insert_element(ir.Constant(_v8f, ir.Undefined), args[0], ir.Constant(_I32, 0))
        return builder.shuffle_vector(v, ir.Constant(_v8f, ir.Undefined), ir.Constant(ir.VectorType(_I32, 8), [0] * 8))

    return vec8(x), codegen


def _load8_codegen(context, builder, sig, args):
    ptr = _elem_ptr(context, builder, sig.args[0], args[0], list(args[1:]))
    if sig.args[0].dtype == types.float32:
        return builder.load(builder.bitcast(ptr, _v8f.as_pointer()), align=4)
    bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), 8).as_pointer()), align=2)
    return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 8)), _v8f)


@intrinsic
def _load8(typingctx, arr, i):
    """arr[i:i+8] of a 1-D C-contiguous float32 array, or of a uint16 array of f16 bits
    (converted, vcvtph2ps)."""
    if not (_is_c(arr, (types.float32, types.uint16)) and arr.ndim == 1):
        return None
    return vec8(arr, i), _load8_codegen


@intrinsic
def _load8_2d(typingctx, arr, i, j):
    """arr[i, j:j+8] of a 2-D C-contiguous array, as _load8. Indexing here instead of
    taking a row view spares numba a reference count per row."""
    if not (_is_c(arr, (types.float32, types.uint16)) and arr.ndim == 2):
        return None
    return vec8(arr, i, j), _load8_codegen


@intrinsic
def _store8_2d(typingctx, v, arr, i, j):
    """arr[i, j:j+8] = v for a 2-D C-contiguous float32 array."""
    if not (v == vec8 and _is_c(arr, (types.float32,)) and arr.ndim == 2):
        return None

    def codegen(context, builder, sig, args):
        ptr = _elem_ptr(context, builder, sig.args[1], args[1], [args[2], args[3]])
        builder.store(args[0], builder.bitcast(ptr, _v8f.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i, j), codegen


@intrinsic
def _fma8(typingctx, a, b, c):
    """Lane-wise a*b + c, one rounding (vfmadd on ymm)."""
    if not (a == b == c == vec8):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f, [_v8f] * 3), "llvm.fma.v8f32")
        return builder.call(fn, args)

    return vec8(a, b, c), codegen


@intrinsic
def _add8(typingctx, a, b):
    if not (a == b == vec8):
        return None

    def codegen(context, builder, sig, args):
        return builder.fadd(args[0], args[1])

    return vec8(a, b), codegen


def _lanes(builder, v):
    return [builder.extract_element(v, ir.Constant(_I32, i)) for i in range(8)]


@intrinsic
def _hsum8(typingctx, a):
    """tinyBLAS hsum / ggml hsum_float_8: low128 + high128, then movehl add, movehdup
    add_ss, i.e. ((a0+a4) + (a2+a6)) + ((a1+a5) + (a3+a7))."""
    if a != vec8:
        return None

    def codegen(context, builder, sig, args):
        x = _lanes(builder, args[0])
        t = [builder.fadd(x[i], x[i + 4]) for i in range(4)]
        return builder.fadd(builder.fadd(t[0], t[2]), builder.fadd(t[1], t[3]))

    return types.float32(a), codegen


@intrinsic
def _hadd_sum8(typingctx, a):
    """The end of GGML_F32x8_REDUCE: low128 + high128, then two _mm_hadd_ps,
    i.e. ((a0+a4) + (a1+a5)) + ((a2+a6) + (a3+a7))."""
    if a != vec8:
        return None

    def codegen(context, builder, sig, args):
        x = _lanes(builder, args[0])
        t = [builder.fadd(x[i], x[i + 4]) for i in range(4)]
        return builder.fadd(builder.fadd(t[0], t[1]), builder.fadd(t[2], t[3]))

    return types.float32(a), codegen


@intrinsic
def _store8(typingctx, v, arr, i):
    """arr[i:i+8] = v for a 1-D C-contiguous float32 array."""
    if not (v == vec8 and _is_c(arr, (types.float32,)) and arr.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        ptr = _elem_ptr(context, builder, sig.args[1], args[1], [args[2]])
        builder.store(args[0], builder.bitcast(ptr, _v8f.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i), codegen


@intrinsic
def _mul8(typingctx, a, b):
    if not (a == b == vec8):
        return None

    def codegen(context, builder, sig, args):
        return builder.fmul(args[0], args[1])

    return vec8(a, b), codegen


_v8i = ir.VectorType(_I32, 8)


def _splat_const(value, ty=_v8f):
    return ir.Constant(ty, [value] * 8)


def _ggml_expf_ir(builder, x):
    """ggml_v_expf (vec.h, AVX2 + FMA branch) in LLVM IR on <8 x float>, op for op."""
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f, [_v8f] * 3), "llvm.fma.v8f32")
    fabs = cgutils.get_or_insert_function(builder.module, ir.FunctionType(_v8f, [_v8f]), "llvm.fabs.v8f32")

    def f(v):
        return _splat_const(float(v))

    def i(v):
        return _splat_const(v - (1 << 32) if v >= 1 << 31 else v, _v8i)

    z = builder.call(fma, [x, f(_LOG2E), f(_R)])
    n = builder.fsub(z, f(_R))
    neg_n = builder.fsub(f(-0.0), n)
    b = builder.call(fma, [neg_n, f(_LN2_LO), builder.call(fma, [neg_n, f(_LN2_HI), x])])
    e = builder.shl(builder.bitcast(z, _v8i), i(23))
    k = builder.bitcast(builder.add(e, i(0x3F800000)), _v8f)
    abs_n = builder.call(fabs, [n])
    u = builder.fmul(b, b)
    j = builder.call(fma, [builder.call(fma, [builder.call(fma, [f(_C5), b, f(_C4)]), u,
                                              builder.call(fma, [f(_C3), b, f(_C2)])]),
                           u, builder.fmul(f(_C1), b)])
    near = builder.call(fma, [j, k, k])
    g = builder.select(builder.fcmp_ordered("<=", n, f(0.0)), i(0x82000000), i(0))
    s1 = builder.bitcast(builder.add(g, i(0x7F000000)), _v8f)
    s2 = builder.bitcast(builder.sub(e, g), _v8f)
    far = builder.select(builder.fcmp_ordered(">", abs_n, f(192.0)), builder.fmul(s1, s1),
                         builder.fmul(builder.call(fma, [s2, j, s2]), s1))
    return builder.select(builder.fcmp_ordered(">", abs_n, f(126.0)), far, near)


@intrinsic
def _expf8(typingctx, x):
    """ggml_v_expf on 8 lanes."""
    if x != vec8:
        return None

    def codegen(context, builder, sig, args):
        return _ggml_expf_ir(builder, args[0])

    return vec8(x), codegen


@intrinsic
def _silu8(typingctx, x):
    """ggml_v_silu on 8 lanes: x / (1 + expf(0 - x))."""
    if x != vec8:
        return None

    def codegen(context, builder, sig, args):
        ex = _ggml_expf_ir(builder, builder.fsub(_splat_const(0.0), args[0]))
        return builder.fdiv(args[0], builder.fadd(_splat_const(1.0), ex))

    return vec8(x), codegen


@njit(inline="always")
def _reduce4x8(g0, g1, g2, g3):
    """GGML_F32x8_REDUCE of ggml_vec_dot_f16's four accumulators: sum0 += sum2,
    sum1 += sum3, sum0 += sum1, then the horizontal part."""
    return _hadd_sum8(_add8(_add8(g0, g2), _add8(g1, g3)))


# ---- Kernels ---------------------------------------------------------------------------


@njit(inline="always")
def _scores_tinyblas(k, q16, n_kv, scale, s):
    """s[j] = (K[j] . q16) * scale with tinyBLAS's lanes: one 8-lane FMA accumulator per
    dot product, then hsum. Four rows at a time, for independent FMA chains.

    k  # (C, HD) uint16 f16 bits;  q16  # (HD,) float32;  s  # (>= n_kv,) float32
    """
    head_dim = q16.shape[0]
    j = 0
    while j + 4 <= n_kv:
        a0 = _zero8()
        a1 = _zero8()
        a2 = _zero8()
        a3 = _zero8()
        for e in range(0, head_dim, 8):
            qe = _load8(q16, e)
            a0 = _fma8(_load8_2d(k, j, e), qe, a0)
            a1 = _fma8(_load8_2d(k, j + 1, e), qe, a1)
            a2 = _fma8(_load8_2d(k, j + 2, e), qe, a2)
            a3 = _fma8(_load8_2d(k, j + 3, e), qe, a3)
        s[j] = _hsum8(a0) * scale
        s[j + 1] = _hsum8(a1) * scale
        s[j + 2] = _hsum8(a2) * scale
        s[j + 3] = _hsum8(a3) * scale
        j += 4
    while j < n_kv:
        a0 = _zero8()
        for e in range(0, head_dim, 8):
            a0 = _fma8(_load8_2d(k, j, e), _load8(q16, e), a0)
        s[j] = _hsum8(a0) * scale
        j += 1


@njit(inline="always")
def _scores_vec_dot(k, q16, n_kv, scale, s):
    """s[j] = (K[j] . q16) * scale with ggml_vec_dot_f16's lanes: four 8-lane accumulators
    over steps of 32, reduced by GGML_F32x8_REDUCE; leftovers (HD % 32) added in double."""
    head_dim = q16.shape[0]
    n_main = head_dim - head_dim % 32
    for j in range(n_kv):
        g0 = _zero8()
        g1 = _zero8()
        g2 = _zero8()
        g3 = _zero8()
        for e in range(0, n_main, 32):
            g0 = _fma8(_load8_2d(k, j, e), _load8(q16, e), g0)
            g1 = _fma8(_load8_2d(k, j, e + 8), _load8(q16, e + 8), g1)
            g2 = _fma8(_load8_2d(k, j, e + 16), _load8(q16, e + 16), g2)
            g3 = _fma8(_load8_2d(k, j, e + 24), _load8(q16, e + 24), g3)
        dot = np.float64(_reduce4x8(g0, g1, g2, g3))
        for e in range(n_main, head_dim):
            dot += f16_to_f32(k[j, e]) * q16[e]
        s[j] = np.float32(dot) * scale


@njit(inline="always")
def _softmax(s, n):
    """In place: s[:n] = exp(s - max) / sum, as ggml soft_max_f32 (the scale is applied):
    ggml_v_expf, each 8-lane register summed in f32 then added to a double total,
    times (float)(1 / total)  (vec.cpp ggml_vec_soft_max_f32)."""
    s_max = _F(-np.inf)
    for j in range(n):
        s_max = max(s_max, s[j])
    minus_max = _splat8(-s_max)
    total = 0.0  # ggml_float (double)
    n8 = n - n % 8
    for j0 in range(0, n8, 8):
        e = _expf8(_add8(_load8(s, j0), minus_max))
        _store8(e, s, j0)
        total += _hsum8(e)
    if n8 < n:  # llama.cpp pads the cells to a multiple of 256 with masked (zero) entries
        g = np.zeros(8, dtype=np.float32)
        for j in range(n8, n):
            s[j] = ggml_expf(s[j] - s_max)
            g[j - n8] = s[j]
        total += _hsum8(_load8(g, 0))
    inv = np.float32(1.0 / total)
    for j in range(n):
        s[j] = s[j] * inv


@njit(inline="always")
def _weighted_values(p, v, n_kv, n_acc, acc, out):
    """out = sum_j f16(p[j]) * V[j] with the lanes of the matching f16 matmul: partial sum
    j % n_acc (32: ggml_vec_dot_f16, 8: tinyBLAS) by FMA in j order, then that reduction.
    (llama.cpp stores V transposed and runs one dot product per output dim; the lanes are
    the same.)

    p  # (>= n_kv,) float32;  v  # (C, HD) uint16 f16 bits
    acc  # (32, HD) float32 scratch;  out  # (HD,) float32
    """
    head_dim = v.shape[1]
    lane_mask = n_acc - 1
    acc[:n_acc] = 0.0
    for j in range(n_kv):
        pj = round_f16(p[j])
        if pj != 0.0:
            pv = _splat8(pj)
            lane = j & lane_mask
            for d in range(0, head_dim, 8):
                _store8_2d(_fma8(_load8_2d(v, j, d), pv, _load8_2d(acc, lane, d)), acc, lane, d)
    for d in range(head_dim):
        if n_acc == 32:
            x0 = (acc[0, d] + acc[16, d]) + (acc[8, d] + acc[24, d])
            x1 = (acc[1, d] + acc[17, d]) + (acc[9, d] + acc[25, d])
            x2 = (acc[2, d] + acc[18, d]) + (acc[10, d] + acc[26, d])
            x3 = (acc[3, d] + acc[19, d]) + (acc[11, d] + acc[27, d])
            x4 = (acc[4, d] + acc[20, d]) + (acc[12, d] + acc[28, d])
            x5 = (acc[5, d] + acc[21, d]) + (acc[13, d] + acc[29, d])
            x6 = (acc[6, d] + acc[22, d]) + (acc[14, d] + acc[30, d])
            x7 = (acc[7, d] + acc[23, d]) + (acc[15, d] + acc[31, d])
            out[d] = ((x0 + x4) + (x1 + x5)) + ((x2 + x6) + (x3 + x7))
        else:
            out[d] = ((acc[0, d] + acc[4, d]) + (acc[2, d] + acc[6, d])) + \
                     ((acc[1, d] + acc[5, d]) + (acc[3, d] + acc[7, d]))


def _attend_kernel(q, k_bits, v_bits, layer, pos0, scale, out):
    """out[t, h] = softmax(q[t, h] . K[:pos0+t+1] * scale) @ V[:pos0+t+1]  for each query.

    q       # (T, H, HD) float32, RoPE applied, query t sits at position pos0 + t
    k_bits  # (L, KVH, C, HD) uint16 (f16 bits), positions < pos0 + T filled
    v_bits  # (L, KVH, C, HD) uint16 (f16 bits)
    out     # (T, H, HD) float32
    """
    n_q, n_heads, head_dim = q.shape
    group = n_heads // k_bits.shape[1]
    # llama.cpp: one token -> ggml_vec_dot_f16 (32 partial sums); two or more -> tinyBLAS
    # (8 partial sums). The lanes of K.q follow HD, those of p.V follow the cell index.
    batched = n_q >= 2
    n_acc = 8 if batched else 32
    for item in prange(n_q * n_heads):
        t = item // n_heads
        h = item - t * n_heads
        k = k_bits[layer, h // group]  # (C, HD) uint16
        v = v_bits[layer, h // group]  # (C, HD) uint16
        n_kv = pos0 + t + 1
        q16 = np.empty(head_dim, dtype=np.float32)  # (HD,) q rounded to f16
        for d in range(head_dim):
            q16[d] = round_f16(q[t, h, d])
        s = np.empty(n_kv, dtype=np.float32)  # (n_kv,) scores, then probabilities
        if batched:
            _scores_tinyblas(k, q16, n_kv, scale, s)
        else:
            _scores_vec_dot(k, q16, n_kv, scale, s)
        _softmax(s, n_kv)
        acc = np.empty((32, head_dim), dtype=np.float32)  # (32, HD) lane partial sums
        _weighted_values(s, v, n_kv, n_acc, acc, out[t, h])


_attend_serial = njit(cache=True, nogil=True)(_attend_kernel)
_attend_parallel = njit(cache=True, nogil=True, parallel=True)(_attend_kernel)

# Below this many multiply-adds a call is faster on one thread than waking the pool.
PARALLEL_MIN_WORK = 1 << 17


# ---- Public API ------------------------------------------------------------------


def attend(q: np.ndarray, cache: KVCache, layer: int, pos0: int, out: np.ndarray | None = None) -> np.ndarray:
    """Causal attention of queries q (T, H, HD) float32 at positions pos0.. against the
    cache of ``layer`` (which already holds their own keys/values). Returns (T, H, HD) float32."""
    n_q, n_heads, head_dim = q.shape
    if out is None:
        out = np.empty(q.shape, dtype=np.float32)
    scale = np.float32(1.0) / np.sqrt(np.float32(head_dim))  # llama.cpp: 1.0f/sqrtf(float(n_embd_head))
    work = n_q * n_heads * head_dim * (pos0 + n_q)
    kernel = _attend_parallel if work >= PARALLEL_MIN_WORK else _attend_serial
    kernel(q, cache.k_bits, cache.v_bits, layer, pos0, scale, out)
    return out


def attend_reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, pos0: int) -> np.ndarray:
    """Plain-numpy reference of ``attend`` (same roundings, numpy's summation order).

    q  # (T, H, HD) float32;  k, v  # (KVH, n_kv, HD) float16 (n_kv >= pos0 + T)
    """
    n_q, n_heads, head_dim = q.shape
    group = n_heads // k.shape[0]
    scale = np.float32(1.0 / math.sqrt(head_dim))
    out = np.empty(q.shape, dtype=np.float32)
    q16 = q.astype(np.float16).astype(np.float32)
    for t in range(n_q):
        n_kv = pos0 + t + 1
        for h in range(n_heads):
            kk = k[h // group, :n_kv].astype(np.float32)  # (n_kv, HD)
            vv = v[h // group, :n_kv].astype(np.float32)
            s = (kk @ q16[t, h]).astype(np.float32) * scale
            e = np.exp(s - s.max(), dtype=np.float32)
            p = (e * np.float32(1.0 / e.sum(dtype=np.float64))).astype(np.float16).astype(np.float32)
            out[t, h] = p @ vv
    return out
