"""Intel AMX tiles for the engine's numba kernels: int8 matrix products of tiles of up to 16
rows of 64 bytes in one instruction (Sapphire Rapids and later), through LLVM's AMX intrinsics.

An AMX unit multiplies an A tile (up to 16 rows of 64 bytes) by a B tile (rows of 4 bytes per
output column, "VNNI-packed") into a C tile of int32 sums, exactly: the same
integers as any other order of the byte products. The tiles are eight registers (tmm0-7)
whose shapes a 64-byte configuration sets (``tile_config``; Intel SDM vol. 1 ch. 3.4, "Intel
AMX"). Linux gives a process the tile state only when it asks (arch_prctl
ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, kernel Documentation/arch/x86/xstate.rst):
``HAS_AMX`` is true only when the CPU has AMX-INT8 and that request succeeded.

The tile numbers are compile-time constants. Where the CPU has no AMX the intrinsics still
compile, to a trap: kernels take their AMX branch only when ``HAS_AMX``, so it never runs; where
it has AMX but the tile state was refused, the real instructions are compiled (and not run).
"""
from __future__ import annotations

import ctypes
import platform

import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .simd import elem_ptr
from .simd_int import host_cpu_features

_ARCH_PRCTL = 158              # x86-64 syscall number
_ARCH_REQ_XCOMP_PERM = 0x1023
_XFEATURE_XTILEDATA = 18
I8, I64 = ir.IntType(8), ir.IntType(64)
_VOID = ir.VoidType()
_P8 = I8.as_pointer()


def _cpu_has_amx() -> bool:
    """AMX-TILE and AMX-INT8 in the CPU features LLVM compiles for (those numba's cache is keyed by)."""
    features = host_cpu_features()
    return bool(features.get("amx-tile")) and bool(features.get("amx-int8"))


def _tile_state_granted() -> bool:
    """Ask Linux for the tile state (once per process; 0 is granted)."""
    if platform.system() != "Linux":
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0
    except (OSError, AttributeError):
        return False


# The instructions are compiled wherever the CPU has them, whether or not this process was
# granted the tile state: numba's disk cache is keyed by the CPU's features, so a kernel cached
# by a process that was refused must still hold the real instructions for one that is not.
_CPU_AMX = _cpu_has_amx()
HAS_AMX = _CPU_AMX and _tile_state_granted()
HAS_AMX_BF16 = HAS_AMX and bool(host_cpu_features().get("amx-bf16"))


def _trap(builder):
    builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, []), "llvm.trap"), [])


def _call(builder, name, arg_types, args):
    if not _CPU_AMX:         # compiled, never run (see the module's docstring)
        _trap(builder)
        return
    builder.call(cgutils.get_or_insert_function(builder.module, ir.FunctionType(_VOID, arg_types), name), args)


def _byte_ptr(context, builder, arrty, arr, i):
    return builder.bitcast(elem_ptr(context, builder, arrty, arr, [i]), _P8)


def _literal(*ts) -> bool:
    return all(isinstance(t, types.IntegerLiteral) for t in ts)


@intrinsic
def tile_config(typingctx, cfg):
    """Load the tile shapes of a 64-byte configuration (uint8 array, ``tile_shapes``) into
    this thread (ldtilecfg)."""
    if not (isinstance(cfg, types.Array) and cfg.dtype == types.uint8):
        return None

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.ldtilecfg", [_P8], [_byte_ptr(context, builder, sig.args[0], args[0], ir.Constant(I64, 0))])
        return context.get_dummy_value()

    return types.none(cfg), codegen


@intrinsic
def tile_release(typingctx):
    """Give the tile state back (tilerelease): after a thread's last tile instruction."""
    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilerelease", [], [])
        return context.get_dummy_value()

    return types.none(), codegen


def _memory_op(name):
    def typer(typingctx, t, arr, i, stride):
        if not (_literal(t) and isinstance(arr, types.Array) and arr.layout == "C" and arr.ndim == 1
                and isinstance(i, types.Integer) and isinstance(stride, types.Integer)):
            return None

        def codegen(context, builder, sig, args):
            stride64 = context.cast(builder, args[3], sig.args[3], types.int64)
            _call(builder, name, [I8, _P8, I64],
                  [ir.Constant(I8, t.literal_value), _byte_ptr(context, builder, sig.args[1], args[1], args[2]), stride64])
            return context.get_dummy_value()

        return types.none(t, arr, i, stride), codegen

    return intrinsic(typer)


# tile t <-> the rows of a flat array from element i, one row every `stride` bytes
tile_load = _memory_op("llvm.x86.tileloadd64")
tile_store = _memory_op("llvm.x86.tilestored64")


@intrinsic
def tile_zero(typingctx, t):
    """Tile t = 0 (tilezero)."""
    if not _literal(t):
        return None

    def codegen(context, builder, sig, args):
        _call(builder, "llvm.x86.tilezero", [I8], [ir.Constant(I8, t.literal_value)])
        return context.get_dummy_value()

    return types.none(t), codegen


def _dot_product(name):
    def typer(typingctx, c, a, b):
        if not _literal(c, a, b):
            return None

        def codegen(context, builder, sig, args):
            _call(builder, name, [I8, I8, I8], [ir.Constant(I8, t.literal_value) for t in sig.args])
            return context.get_dummy_value()

        return types.none(c, a, b), codegen

    return intrinsic(typer)


# Tile c += tile a x tile b in int32: each C[m, n] gains sum_k A[m, 4k + j] * B[k, 4n + j]
# (B holds 4 bytes per output column and row). tdpbusd reads A's bytes as unsigned and B's as
# signed; tdpbssd reads both as signed.
tile_dpbusd = _dot_product("llvm.x86.tdpbusd")
tile_dpbssd = _dot_product("llvm.x86.tdpbssd")
# Tile c += tile a x tile b in float32 from bfloat16 pairs: each C[m, n] gains
# sum_k A[m, 2k + j] * B[k, 2n + j] (B holds 2 bfloat16 per output column and row); the products
# of two bfloat16 are exact in float32, the sums rounded as float32 additions.
tile_dpbf16ps = _dot_product("llvm.x86.tdpbf16ps")


def tile_shapes(shapes) -> np.ndarray:
    """The 64-byte configuration (palette 1) giving tile t `shapes[t][0]` rows of
    `shapes[t][1]` bytes, for ``tile_config``; made once, where the kernels' tiles are named.
    shapes: (n_tiles, 2) ints -> (64,) uint8."""
    cfg = np.zeros(64, np.uint8)
    cfg[0] = 1
    for t, (rows, width) in enumerate(shapes):
        cfg[16 + 2 * t:18 + 2 * t] = np.frombuffer(np.uint16(width).tobytes(), np.uint8)
        cfg[48 + t] = rows
    return cfg
