"""SIMD building blocks for the engine's numba kernels: one FMA, IEEE bit casts, and 8-lane
float vectors.

numba has no SIMD types, so here is one: ``vec8`` is an LLVM <8 x float> (one ymm register),
made and consumed only by these intrinsics. Sums written with them compile to the AVX2 code
llama.cpp runs, in its lane order, instead of what the auto-vectoriser guesses: that is what
keeps our attention and matmul results bit for bit equal to llama.cpp's where they must be.
The reduction orders are those of ggml (ggml-cpu/simd-mappings.h GGML_F32x8_REDUCE,
arch/x86/quants.c hsum_float_8, llamafile/sgemm.cpp hsum).
"""
from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.datamodel import models
from numba.extending import intrinsic, register_model

# ---- Scalars ---------------------------------------------------------------------------

@intrinsic
def fma(typingctx, a, b, c):
    """Fused a*b + c in float32 (one rounding), llvm.fma.f32 -> vfmadd."""
    if not (a == b == c == types.float32):
        return None

    def codegen(context, builder, signature, args):
        f32 = ir.FloatType()
        fn = builder.module.declare_intrinsic("llvm.fma", [f32], ir.FunctionType(f32, [f32, f32, f32]))
        return builder.call(fn, args)

    return types.float32(a, b, c), codegen


@intrinsic
def f32_bits(typingctx, x):
    """float32 -> its IEEE bits as a non-negative int64."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return builder.zext(builder.bitcast(args[0], ir.IntType(32)), ir.IntType(64))

    return types.int64(x), codegen


@intrinsic
def bits_f32(typingctx, i):
    """Low 32 bits of an int64 -> the float32 with those IEEE bits."""
    if i != types.int64:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.trunc(args[0], ir.IntType(32)), ir.FloatType())

    return types.float32(i), codegen


@njit(nogil=True, cache=True, inline="always")
def hsum_float_8(a0, a1, a2, a3, a4, a5, a6, a7):
    """Sum of 8 float32 lanes in the order of llama.cpp's hsum_float_8 (arch/x86/quants.c):
    high half + low half, then the upper pair onto the lower, then the last two."""
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


# ---- 8-lane vectors ---------------------------------------------------------------------

V8F = ir.VectorType(ir.FloatType(), 8)


I32 = ir.IntType(32)


class Vec8Type(types.Type):
    def __init__(self):
        super().__init__(name="vec8f32")


vec8 = Vec8Type()


@register_model(Vec8Type)
class _Vec8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, V8F)


def elem_ptr(context, builder, arrty, arr, idx):
    ary = context.make_array(arrty)(context, builder, value=arr)
    return cgutils.get_item_pointer(context, builder, arrty, ary, idx)


def c_array_of(arr, dtypes) -> bool:
    """Whether the numba type ``arr`` is a C-contiguous array of one of ``dtypes`` (the intrinsics'
    pointer arithmetic assumes it)."""
    return isinstance(arr, types.Array) and arr.layout == "C" and arr.dtype in dtypes


@intrinsic
def zero8(typingctx):
    def codegen(context, builder, sig, args):
        return ir.Constant(V8F, [0.0] * 8)

    return vec8(), codegen


def splat(builder, x, ty=V8F):
    """The scalar x in every lane of a vector of LLVM type ``ty`` (the codegen of every splat here,
    in simd_int and in simd16)."""
    v = builder.insert_element(ir.Constant(ty, ir.Undefined), x, ir.Constant(I32, 0))
    return builder.shuffle_vector(v, ir.Constant(ty, ir.Undefined), ir.Constant(ir.VectorType(I32, ty.count), [0] * ty.count))


@intrinsic
def splat8(typingctx, x):
    if x != types.float32:
        return None

    def codegen(context, builder, sig, args):
        return splat(builder, args[0])

    return vec8(x), codegen


@intrinsic
def splat8_2d(typingctx, arr, i, j):
    """arr[i, j] of a 2-D C-contiguous float32 array in all 8 lanes, read straight from memory
    (one vbroadcastss): numba's own arr[i, j] wraps negative indices, a compare and a move per
    read, which cost more than the multiply-add it feeds in a hot loop."""
    if not (c_array_of(arr, (types.float32,)) and arr.ndim == 2):
        return None

    def codegen(context, builder, sig, args):
        return splat(builder, builder.load(elem_ptr(context, builder, sig.args[0], args[0], list(args[1:]))))

    return vec8(arr, i, j), codegen


def _load8_codegen(context, builder, sig, args):
    ptr = elem_ptr(context, builder, sig.args[0], args[0], list(args[1:]))
    if sig.args[0].dtype == types.float32:
        return builder.load(builder.bitcast(ptr, V8F.as_pointer()), align=4)
    bits = builder.load(builder.bitcast(ptr, ir.VectorType(ir.IntType(16), 8).as_pointer()), align=2)
    return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), 8)), V8F)


@intrinsic
def load8(typingctx, arr, i):
    """arr[i:i+8] of a 1-D C-contiguous float32 array, or of a uint16 array of f16 bits
    (converted, vcvtph2ps)."""
    if not (c_array_of(arr, (types.float32, types.uint16)) and arr.ndim == 1):
        return None
    return vec8(arr, i), _load8_codegen


@intrinsic
def load8_2d(typingctx, arr, i, j):
    """arr[i, j:j+8] of a 2-D C-contiguous array, as load8. Indexing here instead of
    taking a row view spares numba a reference count per row."""
    if not (c_array_of(arr, (types.float32, types.uint16)) and arr.ndim == 2):
        return None
    return vec8(arr, i, j), _load8_codegen


@intrinsic
def store8_2d(typingctx, v, arr, i, j):
    """arr[i, j:j+8] = v for a 2-D C-contiguous float32 array."""
    if not (v == vec8 and c_array_of(arr, (types.float32,)) and arr.ndim == 2):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[1], args[1], [args[2], args[3]])
        builder.store(args[0], builder.bitcast(ptr, V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i, j), codegen


@intrinsic
def fma8(typingctx, a, b, c):
    """Lane-wise a*b + c, one rounding (vfmadd on ymm)."""
    if not (a == b == c == vec8):
        return None

    def codegen(context, builder, sig, args):
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(V8F, [V8F] * 3), "llvm.fma.v8f32")
        return builder.call(fn, args)

    return vec8(a, b, c), codegen


def lanewise(vtype, op):
    """A lane-wise intrinsic of two vectors of ``vtype`` (vec8 here; simd_int's and simd16's
    vectors too): op(builder, a, b) gives the result, a vector of the same type."""
    def typer(typingctx, a, b):
        if not (a == b == vtype):
            return None

        def codegen(context, builder, sig, args):
            return op(builder, args[0], args[1])

        return vtype(a, b), codegen

    return intrinsic(typer)


add8 = lanewise(vec8, lambda b, x, y: b.fadd(x, y))


def _lanes(builder, v):
    return [builder.extract_element(v, ir.Constant(I32, i)) for i in range(8)]


@intrinsic
def hsum8(typingctx, a):
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
def hadd_sum8(typingctx, a):
    """The end of GGML_F32x8_REDUCE: low128 + high128, then two _mm_hadd_ps,
    i.e. ((a0+a4) + (a1+a5)) + ((a2+a6) + (a3+a7))."""
    if a != vec8:
        return None

    def codegen(context, builder, sig, args):
        x = _lanes(builder, args[0])
        t = [builder.fadd(x[i], x[i + 4]) for i in range(4)]
        return builder.fadd(builder.fadd(t[0], t[1]), builder.fadd(t[2], t[3]))

    return types.float32(a), codegen


# Lane-wise max (vmaxps): numba's max() of two floats keeps its NaN rule and does not vectorise.
max8 = lanewise(vec8, lambda b, x, y: b.select(b.fcmp_ordered(">", x, y), x, y))


@intrinsic
def hmax8(typingctx, a):
    """The largest of the 8 lanes."""
    if a != vec8:
        return None

    def codegen(context, builder, sig, args):
        x = _lanes(builder, args[0])
        while len(x) > 1:
            x = [builder.select(builder.fcmp_ordered(">", x[i], x[i + 1]), x[i], x[i + 1]) for i in range(0, len(x), 2)]
        return x[0]

    return types.float32(a), codegen


@intrinsic
def store8(typingctx, v, arr, i):
    """arr[i:i+8] = v for a 1-D C-contiguous float32 array."""
    if not (v == vec8 and c_array_of(arr, (types.float32,)) and arr.ndim == 1):
        return None

    def codegen(context, builder, sig, args):
        ptr = elem_ptr(context, builder, sig.args[1], args[1], [args[2]])
        builder.store(args[0], builder.bitcast(ptr, V8F.as_pointer()), align=4)
        return context.get_dummy_value()

    return types.none(v, arr, i), codegen


mul8 = lanewise(vec8, lambda b, x, y: b.fmul(x, y))


V8I = ir.VectorType(I32, 8)


def splat_const(value, ty=V8F):
    return ir.Constant(ty, [value] * 8)
