"""Kernels for unquantized weights F32, F16 and BF16 (row-group layout).

The weight matrix is one plane in the row-group layout of quant/layout.py (element (r, j) at
``r0 * n_in + j * w + (r - r0)``): F32 as float32, F16 / BF16 as their uint16 bit patterns.

llama.cpp (ggml-cpu.c type_traits_cpu) converts the activations to the weight type first
(vec_dot_type F16 / BF16) and accumulates in float32 (vec.cpp ggml_vec_dot_f16 / _bf16 / _f32).
A product of two f16 (11-bit) or two bf16 (8-bit) significands is exact in float32, so our
multiply-then-add equals its FMA; sums run over j in order, per row.
"""
from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.f16 import decode_f16_plane
from .activations import round_acts
from .layout import GROUP, group_of, group_span, over_row_groups, tile_plane

KIND_F32, KIND_F16, KIND_BF16 = 0, 1, 2
J_CHUNK = 16  # columns converted to float32 at a time (keeps the converted chunk in L1)


def repack_float(raw, n_out, n_in):
    """raw (n_out, n_in) float32 / float16 / bf16-as-uint16, or the same bytes as uint8
    -> {"w": (n_out*n_in,) float32 (F32) or uint16 (F16, BF16 bit patterns), in row groups}."""
    a = np.ascontiguousarray(raw)
    if a.nbytes == 4 * n_out * n_in:
        plane = a.view(np.float32).reshape(n_out, n_in)
    else:
        plane = a.view(np.uint16).reshape(n_out, n_in)
    return {"w": tile_plane(plane)}


@njit(nogil=True, cache=True)
def bf16_to_f32(h, out):
    """h (n,) uint16 bf16 bit patterns -> out (n,) float32 (exact: bits << 16)."""
    bits = out.view(np.int32)
    for i in range(h.shape[0]):
        bits[i] = np.int32(np.int32(h[i]) << 16)


@njit(nogil=True, cache=True, inline="always")
def _to_f32(src, kind, plain, out):
    """src (n,) float32 or uint16 -> out (n,) float32 according to kind (plain: the F16
    plane holds only zeros and normal values, see ops/f16.py's f16_plane_is_plain)."""
    if kind == KIND_F16:
        decode_f16_plane(src, out, plain)
    elif kind == KIND_BF16:
        bf16_to_f32(src, out)
    else:
        for i in range(src.shape[0]):
            out[i] = src[i]


@njit(nogil=True, cache=True)
def rows_float(wt, kind, n_out, ids, out):
    """wt (n_out*n_in,) float32 / uint16 row groups; ids (n_ids,) int64; out (n_ids, n_in) float32."""
    n_in = out.shape[1]
    for n in range(ids.shape[0]):
        r = ids[n]
        r0, w = group_span(r // GROUP, n_out)
        row = wt[r0 * n_in + (r - r0):(r0 + w) * n_in:w]   # (n_in,) strided view of row r
        src = np.empty(n_in, wt.dtype)                     # (n_in,) contiguous copy
        src[:] = row
        _to_f32(src, kind, False, out[n])


@njit(nogil=True, cache=True, inline="always")
def _float_group(wg, kind, plain, xr, wf, acc):
    """One (full) row group against every token, J_CHUNK columns at a time.

    wg   # (n_in * GROUP,) float32 / uint16: column j of row i at j * GROUP + i
    xr   # (n_tok, n_in) float32 rounded activations
    wf   # (J_CHUNK * GROUP,) float32 scratch: converted columns
    acc  # (n_tok, GROUP) float32 out, zeroed by the caller
    """
    n_tok, n_in = xr.shape
    w = GROUP
    for j0 in range(0, n_in, J_CHUNK):
        nj = min(J_CHUNK, n_in - j0)
        _to_f32(wg[j0 * w:(j0 + nj) * w], kind, plain, wf[:nj * w])
        for k in range(n_tok):
            xk = xr[k, j0:j0 + nj]
            if nj == J_CHUNK:   # constant trip count: unrolled, the sum stays in a register
                for i in range(w):
                    s = acc[k, i]
                    for j in range(J_CHUNK):
                        s += wf[j * w + i] * xk[j]
                    acc[k, i] = s
            else:               # the last few columns; same order of additions
                for j in range(nj):
                    for i in range(w):
                        acc[k, i] += wf[j * w + i] * xk[j]


@njit(nogil=True, cache=True, inline="always")
def _float_scratch(xr):
    """One thread's buffers for _float_rows."""
    return (np.empty(J_CHUNK * GROUP, np.float32),      # wf (J_CHUNK, GROUP) float32
            np.empty((xr.shape[0], GROUP), np.float32))  # acc (n_tok, GROUP) float32


@njit(nogil=True, cache=True, inline="always")
def _float_rows(planes, r0, w, xr, buffers, out):
    """Row group (r0, w) against every token: out[:, r0:r0 + w]."""
    wt, kind, plain = planes
    wf, acc = buffers
    acc[:, :] = 0
    _float_group(group_of(wt, r0, w, xr.shape[1]), kind, plain, xr, wf, acc)
    out[:, r0:r0 + w] = acc[:, :w]


@njit(parallel=True, nogil=True, cache=True)
def matmul_float(wt, kind, plain, n_out, n_chunks, x, out):
    """F32 / F16 / BF16 weights; activations rounded to the weight type first.

    wt   # (n_out*n_in,) float32 (F32) or uint16 (F16, BF16) row groups
    plain  # F16 weights are all zeros or normal values
    n_chunks  # runs of groups, one per thread (n_chunks_for)
    x    # (n_tok, n_in) float32
    out  # (n_tok, n_out) float32
    """
    xr = np.empty(x.shape, np.float32)            # (n_tok, n_in) float32, rounded activations
    if kind == KIND_F32:
        xr[:, :] = x
    else:
        round_acts(x, xr, kind == KIND_BF16)
    over_row_groups(_float_rows, _float_scratch, (wt, kind, plain), xr, n_out, n_chunks, out)
