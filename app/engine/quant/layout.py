"""Pieces shared by the quantized-matrix kernels: the row-group weight layout and f16 bit tricks.

Row-group layout
----------------
A GGUF matrix stores each output row as a run of blocks (``d, m, qs...`` interleaved). Our
kernels instead vectorise *across output rows*: SIMD lane i works on row r0+i, so each weight
byte is multiplied by one broadcast activation and no block needs a horizontal sum (the
per-16-byte-block loop of the naive layout ran at ~1 GB/s, see docs/ARCHITECTURE.md, "Weights stay quantized"). This is
the idea of llama.cpp's "repack" formats (ggml-cpu/repack.cpp, e.g. block_q4_0x8 interleaves
8 rows), here with GROUP = 16 rows: 16 int16 lanes fill one AVX2 register.

Each field of a block (scale, min, packed quants, ...) becomes its own *plane*: a matrix
``(n_out, k)`` with k units per row (bytes or uint16 values). A plane is cut into groups of 16
consecutive rows (the last group may be narrower, width ``w``) and every group is stored
column-major, so that element (r, c) lives at

    r0 * k + c * w + (r - r0)        with r0 = 16 * (r // 16), w = min(16, n_out - r0).

A kernel thus reads each group as one sequential sweep of ``16 * k`` units, and the 16 bytes
a vector load needs are adjacent. The planes of one matrix together hold exactly the bytes of
the GGUF tensor: no padding, no f32 copy (docs/ARCHITECTURE.md, "Weights stay quantized").

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

numba's on-disk cache (cache=True) keys a kernel on its own source file only, so the engine keeps
its kernels in a folder keyed on all its sources (kernel_cache.py): editing this module starts
a fresh cache rather than leaving the kernels that inline it with the old code.
"""
from __future__ import annotations

import numpy as np
from numba import get_num_threads, njit
from numba.np.ufunc import parallel as _numba_parallel

from ..cpu.numa import placed_empty

GROUP = 16  # rows per group: 16 int16 lanes of an AVX2 register


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


# ---- f16 <-> f32 (numba)


