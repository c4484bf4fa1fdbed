"""Pieces shared by the quantized-matrix kernels: the row-group weight layout and f16 bit tricks.

Row-group layout
----------------
A GGUF matrix stores each output row as a run of blocks (``d, m, qs...`` interleaved). Our
kernels instead vectorise *across output rows*: SIMD lane i works on row r0+i, so each weight
byte is multiplied by one broadcast activation and no block needs a horizontal sum (the
per-16-byte-block loop of the naive layout ran at ~1 GB/s, see DESIGN.md "Engine"). This is
the idea of llama.cpp's "repack" formats (ggml-cpu/repack.cpp, e.g. block_q4_0x8 interleaves
8 rows), here with GROUP = 16 rows: 16 int16 lanes fill one AVX2 register.

Each field of a block (scale, min, packed quants, ...) becomes its own *plane*: a matrix
``(n_out, k)`` with k units per row (bytes or uint16 values). A plane is cut into groups of 16
consecutive rows (the last group may be narrower, width ``w``) and every group is stored
column-major, so that element (r, c) lives at

    r0 * k + c * w + (r - r0)        with r0 = 16 * (r // 16), w = min(16, n_out - r0).

A kernel thus reads each group as one sequential sweep of ``16 * k`` units, and the 16 bytes
a vector load needs are adjacent. The planes of one matrix together hold exactly the bytes of
the GGUF tensor: no padding, no f32 copy (DESIGN.md "Weights stay quantized").

Threads take contiguous runs of groups (``chunk_groups``), so every matrix with a multiple of
32 rows splits evenly over 2 threads.

f16 scales
----------
numba has no float16 type on the CPU, so f16 bit patterns are converted with integer ops
that vectorise. Scales are converted per call (keeping them f16 keeps the byte count), so the
conversion is on the hot path: ``f16_to_f32_plain`` (shift, then one multiply by 2**112, which
moves the exponent bias exactly; 0.16 ns/value here) is used for planes that ``f16_plane_is_plain``
found to hold only zeros and normal finite values, and the general ``f16_to_f32`` (subnormals,
inf, nan; 0.5 ns/value) otherwise. Neither relies on denormal arithmetic, so both stay exact
with FTZ/DAZ set.

numba's on-disk cache (cache=True) keys a kernel on its own source file only: after editing
this module or kernels_act, delete app/engine/__pycache__/kernels_*.nbi / .nbc, or the
kernels of kernels_q / kernels_k / kernels_f keep the old inlined code.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit, types
from numba.extending import intrinsic
from numba.np.ufunc import parallel as _numba_parallel

from app.engine.threads import placed_empty

GROUP = 16  # rows per group: 16 int16 lanes of an AVX2 register

F32_F16_REBIAS = np.int32(112 << 23)  # (127 - 15) << 23: f16 exponent bias -> f32 exponent bias
TWO_P112 = np.float32(2.0 ** 112)     # the same rebias as a multiply
TWO_M24 = np.float32(2.0 ** -24)      # value of one f16 subnormal step
TWO_P24 = np.float32(2.0 ** 24)


# ---- row-group layout (numpy, once at load)

def tile_plane(plane: np.ndarray) -> np.ndarray:
    """plane (n_out, k) or (n_out, nb, B) any dtype and strides -> (n_out * k,) same dtype, in
    the row-group layout above (for 3-D input, c = b * B + j). Written in one pass from the
    strided view, so repacking a block field costs no temporary copy of the matrix."""
    src = plane if plane.ndim == 3 else plane[:, None, :]          # (n_out, nb, B)
    n_out, nb, bb = src.shape
    n_full = n_out // GROUP
    out = placed_empty(n_out * nb * bb, plane.dtype)              # (n_out * k,) on the readers' NUMA nodes
    split = n_full * GROUP * nb * bb
    out[:split].reshape(n_full, nb, bb, GROUP)[...] = (
        src[: n_full * GROUP].reshape(n_full, GROUP, nb, bb).transpose(0, 2, 3, 1))
    out[split:].reshape(nb, bb, n_out - n_full * GROUP)[...] = src[n_full * GROUP:].transpose(1, 2, 0)
    return out


def untile_plane(flat: np.ndarray, n_out: int, k: int) -> np.ndarray:
    """Inverse of tile_plane: flat (n_out * k,) -> (n_out, k)."""
    n_full = n_out // GROUP
    split = n_full * GROUP * k
    head = flat[:split].reshape(n_full, k, GROUP).transpose(0, 2, 1).reshape(n_full * GROUP, k)
    tail = flat[split:].reshape(k, n_out - n_full * GROUP).T
    return np.concatenate([head, tail], axis=0)


@njit(nogil=True, cache=True, inline="always")
def group_span(g, n_out):
    """(r0, w): first row and width of row group g."""
    r0 = g * GROUP
    return r0, min(GROUP, n_out - r0)


@njit(nogil=True, cache=True)
def pad_group(src, k, w):
    """src (k * w,) one narrow group of a plane (w < GROUP rows) -> (k * GROUP,) the same
    group widened with zero rows, so the kernels need only their full-width code (compiled
    once: a second copy for narrow groups doubled compile time). Only the last group of a
    matrix whose n_out is not a multiple of 16 comes here."""
    dst = np.zeros(k * GROUP, dtype=src.dtype)
    for c in range(k):
        dst[c * GROUP:c * GROUP + w] = src[c * w:(c + 1) * w]
    return dst


@njit(nogil=True, cache=True, inline="always")
def chunk_groups(c, n_chunks, n_groups):
    """(g0, g1): the contiguous run of groups that chunk c of n_chunks handles."""
    return c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks


def n_chunks_for(n_out: int) -> int:
    """Chunks for a kernel's prange: one per numba thread (each allocates its scratch once),
    never more than groups. Asked from Python: numba.get_num_threads() inside a kernel would
    stop it being cached."""
    return max(1, min(-(-n_out // GROUP), num_threads()))


_fast_get_num_threads = None


def num_threads() -> int:
    """numba's thread count for the calling thread (it is per thread, so it is asked each
    time, not cached). numba.get_num_threads() takes a lock on every call (1.4 us, and a
    decode step makes ~200 products); once numba's pool is up, its ctypes getter answers in
    0.2 us."""
    global _fast_get_num_threads
    getter = _fast_get_num_threads
    if getter is None:
        if not getattr(_numba_parallel, "_is_initialized", False):
            return get_num_threads()
        getter = _fast_get_num_threads = getattr(_numba_parallel, "_get_num_threads", get_num_threads)
    n = getter()
    return n if n > 0 else get_num_threads()


# ---- float helpers (numba)

@intrinsic
def fma_f32(typingctx, a, b, c):
    """a * b + c rounded once (llvm.fma: vfmadd with FMA hardware, libm fmaf without), as
    llama.cpp's _mm256_fmadd_ps. numba has no fma, and contraction under fastmath is not
    guaranteed to happen."""
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(args[0], args[1], args[2])

    return sig, codegen


@njit(nogil=True, cache=True, inline="always")
def hsum_8(a0, a1, a2, a3, a4, a5, a6, a7):
    """Sum of 8 float32 lanes in the order of llama.cpp's hsum_float_8 (arch/x86/quants.c):
    high half + low half, then the upper pair onto the lower, then the last two."""
    return ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))


# ---- f16 <-> f32 (numba)

@njit(nogil=True, cache=True)
def f16_to_f32(h, out):
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
def f16_to_f32_plain(h, out):
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
def f16_convert(h, out, plain):
    """f16_to_f32_plain when the plane is plain, else the general f16_to_f32."""
    if plain:
        f16_to_f32_plain(h, out)
    else:
        f16_to_f32(h, out)


def f16_plane_is_plain(*planes: np.ndarray) -> bool:
    """True when every f16 in the uint16 planes is a zero or a normal finite number."""
    for h in planes:
        exp = h & 0x7C00
        if np.any(exp == 0x7C00) or np.any((exp == 0) & ((h & 0x3FF) != 0)):
            return False
    return True


@njit(nogil=True, cache=True)
def round_to_f16(vals):
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
def round_to_bf16(vals):
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
