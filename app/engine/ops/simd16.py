"""16-lane vectors for the AMX kernels' steps after a tile product: ``vec16`` is an LLVM
<16 x float> and ``vec16i`` an <16 x i32> (one zmm register on AVX-512; two ymm where the CPU
has no AVX-512, with the same lane-wise results).

Why: an AMX product of 16 weight rows leaves 16 columns of int32 sums per token, and what each
row does with them (llama.cpp's float chain, lane by lane) is the same op for all 16 rows; one
16-lane op per step instead of two 8-lane ones halves that work. Lanes never mix here, so every
row's chain is the one the 8-lane kernels run: the same bits. Only generic LLVM vector IR is
used, so these compile for any x86-64 CPU. Decode attention's dot products (attention/blocks.py)
use them too, where no llama.cpp order is kept: half the instructions of 8 lanes.
"""
from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

from .simd import I32, c_array_of, elem_ptr, lanewise, splat, vec8

V16F = ir.VectorType(ir.FloatType(), 16)
V16I = ir.VectorType(I32, 16)


class Vec16Type(types.Type):
    def __init__(self):
        super().__init__(name="vec16f32")


vec16 = Vec16Type()


@register_model(Vec16Type)
class _Vec16Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V16F)


def _flat(arr, dtype) -> bool:
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.ndim == 1 and arr.dtype == dtype


@intrinsic
def splat16(typingctx, x):
    """A float32 scalar in all 16 lanes."""
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return splat(builder, args[0], V16F)

    return vec16(x), codegen


@intrinsic
def cat8(typingctx, lo, hi):
    """Two 8-lane float vectors as one of 16: lo in lanes 0-7, hi in 8-15."""
    if not (lo == hi == vec8):
        return None

    def codegen(context, builder, sig, args):
        return builder.shuffle_vector(args[0], args[1], ir.Constant(V16I, list(range(16))))

    return vec16(lo, hi), codegen


@intrinsic
def load16(typingctx, arr, i):
    """arr[i:i+16] of a flat float32 array, or of an int32 array converted to float32
    (vcvtdq2ps, round to nearest: exact below 2**24)."""
    if not ((_flat(arr, types.float32) or _flat(arr, types.int32)) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        if sig.args[0].dtype == types.float32:
            return builder.load(builder.bitcast(ptr, V16F.as_pointer()), align=4)
        return builder.sitofp(builder.load(builder.bitcast(ptr, V16I.as_pointer()), align=4), V16F)

    return vec16(arr, i), codegen


@intrinsic
def store16(typingctx, v, arr, i):
    """arr[i:i+16] = v for a flat float32 array."""
    if not (v == vec16 and _flat(arr, types.float32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[1], args[1], [args[2]])
        builder.store(args[0], builder.bitcast(ptr, V16F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i), codegen


@intrinsic
def fma16(typingctx, a, b, c):
    """Lane-wise a*b + c, one rounding (vfmadd on zmm)."""
    if not (a == b == c == vec16):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V16F, [V16F] * 3), "llvm.fma.v16f32")
        return builder.call(fn, args)

    return vec16(a, b, c), codegen


mul16 = lanewise(vec16, lambda b, x, y: b.fmul(x, y))


@intrinsic
def zero16(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(V16F, [0.0] * 16)

    return vec16(), codegen


@intrinsic
def load16_2d(typingctx, arr, i, j):
    """arr[i, j:j+16] of a 2-D C-contiguous float32 array, or of a uint16 array of f16 bits
    (converted, vcvtph2ps)."""
    if not (isinstance(arr, types.Array) and arr.layout == "C" and arr.ndim == 2
            and arr.dtype in (types.float32, types.uint16)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1], args[2]])
        if sig.args[0].dtype == types.float32:
            return builder.load(builder.bitcast(ptr, V16F.as_pointer()), align=4)
        bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), 16).as_pointer()), align=2)
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 16)), V16F)

    return vec16(arr, i, j), codegen


add16 = lanewise(vec16, lambda b, x, y: b.fadd(x, y))


@intrinsic
def store16_2d(typingctx, v, arr, i, j):
    """arr[i, j:j+16] = v for a 2-D C-contiguous float32 array."""
    if not (v == vec16 and c_array_of(arr, (types.float32,)) and arr.ndim == 2):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[1], args[1], [args[2], args[3]])
        builder.store(args[0], builder.bitcast(ptr, V16F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i, j), codegen


@intrinsic
def splat16_2d(typingctx, arr, i, j):
    """arr[i, j] of a 2-D C-contiguous float32 array in all 16 lanes, read straight from memory
    (one vbroadcastss; as ops/simd.py splat8_2d)."""
    if not (c_array_of(arr, (types.float32,)) and arr.ndim == 2):
        return None

    def codegen(context, builder, sig, args):
        return splat(builder, builder.load(elem_ptr(context, builder, sig.args[0], args[0], list(args[1:]))), V16F)

    return vec16(arr, i, j), codegen


@intrinsic
def hsum16(typingctx, a):
    """The sum of the 16 lanes, halves added pairwise down to one (a tree of 4 levels)."""
    if a != vec16:
        return None

    def codegen(context, builder, sig, args):
        v = args[0]
        n = 16
        while n > 1:
            n //= 2
            lo = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n))))
            hi = builder.shuffle_vector(v, v, ir.Constant(ir.VectorType(I32, n), list(range(n, 2 * n))))
            v = builder.fadd(lo, hi)
        return builder.extract_element(v, ir.Constant(I32, 0))

    return types.float32(a), codegen


@intrinsic
def store_sums4(typingctx, a, b, c, d, scale, arr, i, j):
    """arr[i, j:j+4] = (sum of a's lanes, b's, c's, d's) * scale for a 2-D C-contiguous float32
    array. The four trees share their shuffles (pairs of vectors folded into one at each level:
    15 shuffles and adds for four sums, where four hsum16 take 32)."""
    if not (a == b == c == d == vec16 and scale == types.float32 and isinstance(arr, types.Array)
            and arr.layout == "C" and arr.ndim == 2 and arr.dtype == types.float32):
        return None

    def codegen(context, builder, sig, args):
        va, vb, vc, vd, sc, ar, ii, jj = args

        def fold(x, y, lo_idx, hi_idx):
            mask = ir.VectorType(I32, len(lo_idx))
            return builder.fadd(builder.shuffle_vector(x, y, ir.Constant(mask, lo_idx)),
                                builder.shuffle_vector(x, y, ir.Constant(mask, hi_idx)))

        lo1 = list(range(8)) + list(range(16, 24))
        hi1 = list(range(8, 16)) + list(range(24, 32))
        ab = fold(va, vb, lo1, hi1)                  # a's 8 partial sums, then b's
        cd = fold(vc, vd, lo1, hi1)
        lo2 = [k + o for o in (0, 8, 16, 24) for k in range(4)]
        hi2 = [k + 4 + o for o in (0, 8, 16, 24) for k in range(4)]
        x = fold(ab, cd, lo2, hi2)                   # 4 partial sums each of a, b, c, d
        y = fold(x, x, [0, 1, 4, 5, 8, 9, 12, 13], [2, 3, 6, 7, 10, 11, 14, 15])
        z = fold(y, y, [0, 2, 4, 6], [1, 3, 5, 7])   # a, b, c, d
        v4 = ir.VectorType(ir.FloatType(), 4)
        sv = builder.insert_element(ir.Constant(v4, ir.Undefined), sc, ir.Constant(I32, 0))
        sv = builder.shuffle_vector(sv, sv, ir.Constant(ir.VectorType(I32, 4), [0] * 4))
        ptr = elem_ptr(context, builder, sig.args[5], ar, [ii, jj])
        builder.store(builder.fmul(z, sv), builder.bitcast(ptr, v4.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(a, b, c, d, scale, arr, i, j), codegen


# ---- 16 int32 lanes ------------------------------------------------------------------------

class Vec16iType(types.Type):
    def __init__(self):
        super().__init__(name="vec16i32")


vec16i = Vec16iType()


@register_model(Vec16iType)
class _Vec16iModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V16I)


@intrinsic
def load16i(typingctx, arr, i):
    """arr[i:i+16] of a flat int32 array."""
    if not (_flat(arr, types.int32) and isinstance(i, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[0], args[0], [args[1]])
        return builder.load(builder.bitcast(ptr, V16I.as_pointer()), align=4)

    return vec16i(arr, i), codegen


add16i = lanewise(vec16i, lambda b, x, y: b.add(x, y))
sub16i = lanewise(vec16i, lambda b, x, y: b.sub(x, y))


@intrinsic
def sll16i(typingctx, a, n):
    """Each int32 lane shifted left by the constant n."""
    if not (a == vec16i and isinstance(n, types.IntegerLiteral)):
        return None

    def codegen(context, builder, sig, args):
        return builder.shl(args[0], ir.Constant(V16I, [n.literal_value] * 16))

    return vec16i(a, n), codegen


@intrinsic
def to_f32_16(typingctx, a):
    """The 16 int32 lanes as float32 (vcvtdq2ps, round to nearest)."""
    if a != vec16i:
        return None

    def codegen(context, builder, sig, args):
        return builder.sitofp(args[0], V16F)

    return vec16(a), codegen
