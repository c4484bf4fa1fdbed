"""AVX2 integer vectors for the engine's numba kernels: the instructions llama.cpp's quantized
dot products are made of, so that our K-quant products are the same integers, added in the
same float order, and as fast.

``vec8i`` is an LLVM <8 x i32> (one ymm register), made and consumed only by these intrinsics;
the byte and 16-bit views an instruction needs are bitcasts of it. The instructions are those
of ggml-cpu's x86 kernels (arch/x86/quants.c, arch/x86/repack.cpp):

    maddubs   _mm256_maddubs_epi16  unsigned bytes x signed bytes, adjacent pairs summed to i16
    madd16    _mm256_madd_epi16     i16 x i16, adjacent pairs summed to i32
    add16     _mm256_add_epi16      (wrapping; callers keep sums below 2**15)
    dpbusd    _mm256_dpbusd_epi32   AVX-512 VNNI / AVX-VNNI: unsigned bytes x signed bytes,
                                    each 4 adjacent products summed into an i32 accumulator

The two multiply-adds exist only on x86 with AVX2 (``HAS_AVX2``); kernels built on them are
chosen by quant/qmatrix.py only there, and the portable kernels serve everywhere else.
``dpbusd`` is one instruction where the CPU has VNNI (``HAS_VNNI``) and the same integers from
widening multiplies elsewhere, so a kernel built on it compiles and is exact on any x86 machine
and is chosen for speed only where it is one instruction.
"""
from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

from .simd import V8F, elem_ptr, lanewise, splat, vec8

I8, I16, I32 = ir.IntType(8), ir.IntType(16), ir.IntType(32)
V32I8 = ir.VectorType(I8, 32)
V16I16 = ir.VectorType(I16, 16)
V8I = ir.VectorType(I32, 8)


def host_cpu_features() -> dict:
    """The CPU features LLVM compiles numba's kernels for (name -> bool); empty where the host
    gives no list, so every kernel choice falls back to the portable ones."""
    try:
        return dict(llvm.get_host_cpu_features())
    except RuntimeError:
        return {}


def _host_has_avx2() -> bool:
    features = host_cpu_features()
    return bool(features.get("avx2")) and bool(features.get("fma")) and bool(features.get("f16c"))


HAS_AVX2 = _host_has_avx2()


def _host_has_vnni() -> bool:
    """vpdpbusd on 256-bit vectors: AVX-512 VNNI with VL (Ice Lake, Sapphire Rapids, Zen 4)
    or AVX-VNNI (Alder Lake and later)."""
    features = host_cpu_features()
    return HAS_AVX2 and (bool(features.get("avxvnni"))
                         or (bool(features.get("avx512vnni")) and bool(features.get("avx512vl"))))


HAS_VNNI = _host_has_vnni()


class Vec8iType(types.Type):
    def __init__(self):
        super().__init__(name="vec8i32")


vec8i = Vec8iType()


@register_model(Vec8iType)
class _Vec8iModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V8I)


_BYTES = (types.uint8, types.int8)
_WORDS = (types.int32, types.uint32)
_HALVES = (types.int16,)


def _flat(arr, dtypes) -> bool:
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.ndim == 1 and arr.dtype in dtypes


def _as_i32(builder, value, ty):
    """An integer scalar of numba type ty as an LLVM i32 (truncated or extended)."""
    width = value.type.width
    if width > 32:
        return builder.trunc(value, I32)
    if width < 32:
        return builder.sext(value, I32) if ty.signed else builder.zext(value, I32)
    return value


# ---- loads ------------------------------------------------------------------------------

@intrinsic
def load256(typingctx, arr, i):
    """32 bytes from a flat array at element i: 32 uint8/int8, 16 int16 or 8 int32/uint32
    (unaligned, vmovdqu)."""
    if not (_flat(arr, _BYTES + _HALVES + _WORDS) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        return builder.load(builder.bitcast(ptr, V8I.as_pointer()), align=1)

    return vec8i(arr, i), codegen


@intrinsic
def store256(typingctx, v, arr, i):
    """The 32 bytes of v into a flat byte or int32 array from element i (vmovdqu)."""
    if not (v == vec8i and _flat(arr, _BYTES + _WORDS) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[1], args[1], [args[2]])
        builder.store(args[0], builder.bitcast(ptr, V8I.as_pointer()), align=1)
        return context.get_dummy_value()

    return types.none(v, arr, i), codegen


@intrinsic
def bcast32(typingctx, arr, i):
    """The 4 bytes at byte i of a flat uint8/int8 array, or element i of an int32/uint32
    array, in all 8 lanes (vpbroadcastd)."""
    if not (_flat(arr, _BYTES + _WORDS) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        return splat(builder, builder.load(builder.bitcast(ptr, I32.as_pointer()), align=1), V8I)

    return vec8i(arr, i), codegen


@intrinsic
def load_f16x8(typingctx, arr, i):
    """8 f16 bit patterns at byte i of a flat uint8 array, as 8 float32 (vcvtph2ps: exact)."""
    if not (_flat(arr, _BYTES) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        bits = builder.load(builder.bitcast(ptr, ir.VectorType(I16, 8).as_pointer()), align=1)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 8)), V8F)

    return vec8(arr, i), codegen


@intrinsic
def load_f16(typingctx, arr, i):
    """The f16 bit pattern at byte i of a flat uint8 array, as a float32 (exact)."""
    if not (_flat(arr, _BYTES) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        bits = builder.load(builder.bitcast(ptr, I16.as_pointer()), align=1)
        return builder.fpext(builder.bitcast(bits, ir.HalfType()), ir.FloatType())

    return types.float32(arr, i), codegen


@intrinsic
def scale_halves(typingctx, arr, i):
    """Signed bytes arr[i] and arr[i + 1] of a flat uint8/int8 array as 16 int16 lanes:
    the first 8 hold arr[i], the last 8 arr[i + 1] (Q6_K's two scales of a 32-byte vector:
    _mm256_cvtepi8_epi16 of _mm_shuffle_epi8(scales, get_scale_shuffle(k)))."""
    if not (_flat(arr, _BYTES) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        lo = builder.sext(builder.load(ptr), I16)
        hi = builder.sext(builder.load(builder.gep(ptr, [ir.Constant(I32, 1)])), I16)
        v8 = ir.VectorType(I16, 8)
        both = builder.shuffle_vector(splat(builder, lo, v8), splat(builder, hi, v8),
                                      ir.Constant(ir.VectorType(I32, 16), list(range(16))))
        return builder.bitcast(both, V8I)

    return vec8i(arr, i), codegen


@intrinsic
def splat32(typingctx, x):
    """An integer scalar (as int32) in all 8 lanes."""
    if not isinstance(x, types.Integer):
        return None

    def codegen(context, builder, sig, args):
        return splat(builder, _as_i32(builder, args[0], sig.args[0]), V8I)

    return vec8i(x), codegen


@intrinsic
def zero8i(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(V8I, [0] * 8)

    return vec8i(), codegen


# ---- lane-wise integer operations ---------------------------------------------------------

def _binary(op):
    return lanewise(vec8i, op)


vand = _binary(lambda b, x, y: b.and_(x, y))
vor = _binary(lambda b, x, y: b.or_(x, y))
add32 = _binary(lambda b, x, y: b.add(x, y))
sub32 = _binary(lambda b, x, y: b.sub(x, y))
add16 = _binary(lambda b, x, y: b.bitcast(b.add(b.bitcast(x, V16I16), b.bitcast(y, V16I16)), V8I))
sub16 = _binary(lambda b, x, y: b.bitcast(b.sub(b.bitcast(x, V16I16), b.bitcast(y, V16I16)), V8I))
sub8i = _binary(lambda b, x, y: b.bitcast(b.sub(b.bitcast(x, V32I8), b.bitcast(y, V32I8)), V8I))  # vpsubb (wrapping)
mullo16 = _binary(lambda b, x, y: b.bitcast(b.mul(b.bitcast(x, V16I16), b.bitcast(y, V16I16)), V8I))  # vpmullw
mul32 = _binary(lambda b, x, y: b.mul(x, y))    # low 32 bits of each lane's product (vpmulld)


def _shift(op):
    def typer(typingctx, a, n):
        if not (a == vec8i and isinstance(n, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            return op(builder, args[0], splat(builder, _as_i32(builder, args[1], sig.args[1]), V8I))

        return vec8i(a, n), codegen

    return intrinsic(typer)


srl32 = _shift(lambda b, x, n: b.lshr(x, n))   # logical shift right of each 32-bit lane
sll32 = _shift(lambda b, x, n: b.shl(x, n))


def _x86(name, ret, arg):
    def typer(typingctx, a, b):
        if not (a == b == vec8i):
            return None

        def codegen(context, builder, sig, args):
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ret, [arg, arg]), name)
            out = builder.call(fn, [builder.bitcast(args[0], arg), builder.bitcast(args[1], arg)])
            return builder.bitcast(out, V8I)

        return vec8i(a, b), codegen

    return intrinsic(typer)


maddubs = _x86("llvm.x86.avx2.pmadd.ub.sw", V16I16, V32I8)  # (u8 a) x (i8 b) -> i16 pairs, saturating
madd16 = _x86("llvm.x86.avx2.pmadd.wd", V8I, V16I16)        # i16 x i16 -> i32 pairs
mulhu16 = _x86("llvm.x86.avx2.pmulhu.w", V16I16, V16I16)    # high 16 bits of u16 x u16 (vpmulhuw)


@intrinsic
def spread16(typingctx, a, p):
    """16-bit lane 2p of a in lanes 0..7 and lane 2p + 1 in lanes 8..15 (p a constant < 8):
    one value for each 16-byte half, e.g. a sub-block's factor for its 16 bytes."""
    if not (a == vec8i and isinstance(p, types.IntegerLiteral) and 0 <= p.literal_value < 8):
        return None

    def codegen(context, builder, sig, args):
        q = 2 * sig.args[1].literal_value
        v = builder.bitcast(args[0], V16I16)
        mask = ir.Constant(ir.VectorType(I32, 16), [q] * 8 + [q + 1] * 8)
        return builder.bitcast(builder.shuffle_vector(v, ir.Constant(V16I16, ir.Undefined), mask), V8I)

    return vec8i(a, p), codegen


def _dpbusd_widened(builder, acc, a, b):
    """acc + the sums of 4 adjacent (u8 a) x (i8 b) products, from 32-bit multiplies: the
    integers vpdpbusd gives (it wraps in int32 as this does), on any CPU."""
    v32 = ir.VectorType(I32, 32)
    prod = builder.mul(builder.zext(builder.bitcast(a, V32I8), v32), builder.sext(builder.bitcast(b, V32I8), v32))
    total = acc
    for j in range(4):
        part = builder.shuffle_vector(prod, ir.Constant(v32, ir.Undefined),
                                      ir.Constant(V8I, [4 * i + j for i in range(8)]))
        total = builder.add(total, part)
    return total


def _dpbusd(native: bool):
    def typer(typingctx, acc, a, b):
        if not (acc == a == b == vec8i):
            return None

        def codegen(context, builder, sig, args):
            if not native:
                return _dpbusd_widened(builder, *args)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8I, [V8I, V8I, V8I]),
                                                "llvm.x86.avx512.vpdpbusd.256")
            return builder.call(fn, list(args))

        return vec8i(acc, a, b), codegen

    return intrinsic(typer)


dpbusd = _dpbusd(HAS_VNNI)              # acc + 4-byte dot products per i32 lane: vpdpbusd where the CPU has it
dpbusd_widened = _dpbusd(False)        # the same integers without VNNI (tests compare the two)


@intrinsic
def sext8to16(typingctx, arr, i):
    """16 bytes at byte i of a flat int8 (or uint8, read as signed) array, sign-extended to
    16 int16 lanes (_mm256_cvtepi8_epi16)."""
    if not (_flat(arr, _BYTES) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        v = builder.load(builder.bitcast(ptr, ir.VectorType(I8, 16).as_pointer()), align=1)
        return builder.bitcast(builder.sext(v, V16I16), V8I)

    return vec8i(arr, i), codegen


@intrinsic
def to_f32(typingctx, a):
    """The 8 int32 lanes as float32 (vcvtdq2ps, round to nearest)."""
    if a != vec8i:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], V8F)

    return vec8(a), codegen


@intrinsic
def hsum32(typingctx, a):
    """The sum of the 8 int32 lanes (wrapping in int32, as _mm_add_epi32 does), as int32."""
    if a != vec8i:
        return None

    def codegen(context, builder, sig, args):
        lanes = [builder.extract_element(args[0], ir.Constant(I32, i)) for i in range(8)]
        total = lanes[0]
        for v in lanes[1:]:
            total = builder.add(total, v)
        return total

    return types.int32(a), codegen


@intrinsic
def hsum32x8(typingctx, v0, v1, v2, v3, v4, v5, v6, v7):
    """Lane j = the sum of the 8 int32 lanes of vj (wrapping, as hsum32: the same int32), by
    a transposing tree of shuffles and adds: 7 adds for 8 sums instead of 7 per sum."""
    if not all(v == vec8i for v in (v0, v1, v2, v3, v4, v5, v6, v7)):
        return None

    def codegen(context, builder, sig, args):
        def fold(a, b, left, right):
            return builder.add(builder.shuffle_vector(a, b, ir.Constant(V8I, left)),
                               builder.shuffle_vector(a, b, ir.Constant(V8I, right)))
        # pairs of lanes, then fours, then eights; each level interleaves two vectors' sums
        p = [fold(args[2 * i], args[2 * i + 1], [0, 8, 2, 10, 4, 12, 6, 14], [1, 9, 3, 11, 5, 13, 7, 15])
             for i in range(4)]
        q = [fold(p[2 * i], p[2 * i + 1], [0, 1, 8, 9, 4, 5, 12, 13], [2, 3, 10, 11, 6, 7, 14, 15])
             for i in range(2)]
        return fold(q[0], q[1], [0, 1, 2, 3, 8, 9, 10, 11], [4, 5, 6, 7, 12, 13, 14, 15])

    return vec8i(v0, v1, v2, v3, v4, v5, v6, v7), codegen


@intrinsic
def prefetch(typingctx, arr, i):
    """Ask for the cache line holding arr[i] ahead of its use (prefetcht0); no effect on
    results, and no fault if i lies past the end."""
    if not (isinstance(arr, types.Array) and arr.layout == "C" and arr.ndim == 1 and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        ptr = builder.gep(ary.data, [args[1]])
        fn = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ir.IntType(8).as_pointer(), I32, I32, I32]), "llvm.prefetch.p0i8")
        builder.call(fn, [builder.bitcast(ptr, ir.IntType(8).as_pointer()), ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        return context.get_dummy_value()

    return types.none(arr, i), codegen
