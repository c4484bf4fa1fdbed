"""Pieces shared by the quantized-matrix kernels: the row-group weight layout (and why the f16
scales convert as they do, with ops/f16.py).

Row-group layout
----------------
A GGUF matrix stores each output row as a run of blocks (``d, m, qs...`` interleaved). Our
kernels instead vectorise *across output rows*: SIMD lane i works on row r0+i, so each weight
byte is multiplied by one broadcast activation and no block needs a horizontal sum (the naive
layout's loop over 16-byte blocks pays one for every block and streams far below the memory's
rate, see docs/ARCHITECTURE.md, "Weights stay quantized"). This is
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

Threads take contiguous runs of groups (``chunk_groups``, cpu/threads.py), so every matrix with a multiple of
32 rows splits evenly over 2 threads.

One driver
----------
Every row-group product kernel (legacy.py, legacy_batch.py, kquants.py, kquants_low.py,
iquants.py, floats.py) is the same loop around its format's arithmetic: quantize the
activations once, give each thread a run of groups and its own scratch, widen the last group
where it is narrow, and write each group's rows of the output. ``over_row_groups`` is that loop;
a kernel names its format's ``rows`` function (one group of its planes against every token) and
``scratch`` function (a thread's buffers), and reads each plane's group with ``group_of``. The
driver is inlined into each kernel (numba cannot cache a kernel that takes another kernel as an
argument, and a kernel inlining it keeps its own cache entry and its own ``prange``).

f16 scales
----------
The conversions live in ops/f16.py. Scales are converted per call (keeping them f16 keeps the
byte count), so the conversion is on the hot path: ``decode_f16_plain`` (shift, then one
multiply by 2**112, fewer operations a value) is used for planes that ``f16_plane_is_plain``
found to hold only zeros and normal finite values, and the general ``decode_f16`` (subnormals,
inf, nan) otherwise (``decode_f16_plane`` chooses).

numba's on-disk cache (cache=True) keys a kernel on its own source file only, so the engine keeps
its kernels in a folder keyed on all its sources (kernel_cache.py): editing this module starts
a fresh cache rather than leaving the kernels that inline it with the old code.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..cpu.numa import placed_empty
from ..cpu.threads import chunk_groups, num_threads

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
def group_of(plane, r0, w, k):
    """Row group (r0, w) of a plane with k units a row: (k * GROUP,), the group itself where it
    is full, else widened with zero rows (pad_group)."""
    g = plane[r0 * k:(r0 + w) * k]
    if w < GROUP:
        return pad_group(g, k, w)
    return g


@njit(nogil=True, inline="always")
def over_row_groups(rows, scratch, planes, acts, n_out, n_chunks, out):
    """The row-group product: out (n_tok, n_out) = W @ x for every token (see "One driver").

    rows     # rows(planes, r0, w, acts, buffers, out): one group of W against every token,
             # writing out[:, r0:r0 + w]
    scratch  # scratch(acts) -> buffers: one thread's, made once per thread
    planes   # the format's planes (and flags), as its rows function takes them
    acts     # the quantized activations, as its rows function takes them
    n_chunks # runs of groups, one per thread (n_chunks_for)
    """
    n_groups = (n_out + GROUP - 1) // GROUP
    for c in prange(n_chunks):
        buffers = scratch(acts)
        g0, g1 = chunk_groups(c, n_chunks, n_groups)
        for g in range(g0, g1):
            r0, w = group_span(g, n_out)
            rows(planes, r0, w, acts, buffers, out)


def n_chunks_for(n_out: int) -> int:
    """Chunks for a kernel's prange: one per numba thread (each allocates its scratch once),
    never more than groups. Asked from Python: numba.get_num_threads() inside a kernel would
    stop it being cached."""
    return max(1, min(-(-n_out // GROUP), num_threads()))
