"""Float products through BLAS, split over numba's threads: prefill's weight products and
the products of sparse prefill attention.

Why BLAS for prefill: our quantized kernels (kernels_q, kernels_k) reproduce llama.cpp's
integer dot products bit for bit, which is what decode needs (one token: memory bound). A
prefill chunk is compute bound, and an f32 sgemm does more multiply-adds per second than the
integer kernels (it is blocked for the caches and registers, with no blocks to unpack and no
activations to quantize). So a chunk of ``BLAS_MIN_TOKENS`` or more tokens dequantizes each
weight matrix to float32 and multiplies with sgemm: what llama.cpp's own BLAS backend does for
batches of 32 or more (ggml/src/ggml-blas/ggml-blas.cpp: ``to_float`` into a work buffer, then
``cblas_sgemm``; its ``min_batch = 32``). Results then equal the exact float products up to
summation order, not llama.cpp's CPU build (whose activations are quantized to 8 bits first);
chunks under 32 tokens (and every decode step) keep the bit-exact kernels.

Why inside numba: numba's ``np.dot`` calls BLAS through scipy.linalg.cython_blas, so one
parallel kernel gives each of numba's threads a run of rows and a one-thread sgemm on them.
Calling BLAS from Python threads instead (or letting OpenBLAS run its own) put two sets of
threads on the same cores: numba's OpenMP workers spin after every kernel and OpenBLAS's
after every call, and each starved the other; inside one numba kernel there is one set of
threads, and the products run as fast interleaved with numba kernels as alone.
"""
from __future__ import annotations

import threading

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (numba's np.dot binds to it)
from numba import njit, prange

from ..cpu.threads import chunk_groups, num_threads
from . import floats, iquants, kquants, kquants_avx2, kquants_low, legacy
from .qmatrix import QMatrix

BLAS_MIN_TOKENS = 32  # llama.cpp's BLAS backend: min_batch (ggml-blas.cpp)

_local = threading.local()
_controller = None


def one_blas_thread():
    """A context in which the BLAS libraries use one thread each (threadpoolctl): our
    kernels run one sgemm per numba thread."""
    global _controller
    if _controller is None:
        from threadpoolctl import ThreadpoolController

        _controller = ThreadpoolController()  # after scipy's BLAS is loaded (import above)
    return _controller.limit(limits=1, user_api="blas")


def _scratch(size: int) -> np.ndarray:
    """(>= size,) float32 owned by the calling thread and reused: a fresh multi-megabyte
    array per product costs its page faults every time."""
    buf = getattr(_local, "buf", None)
    if buf is None or buf.shape[0] < size:
        buf = _local.buf = np.empty(size, np.float32)
    return buf


def matmul(w: QMatrix, x: np.ndarray) -> np.ndarray:
    """x (T, n_in) float32 -> (T, n_out) float32 = x @ W.T with W dequantized to float32."""
    x = w.activations(x)                                             # (T, n_in) float32
    n_out, n_in = w.shape
    wf = _scratch(n_out * n_in)[:n_out * n_in].reshape(n_out, n_in)  # (n_out, n_in) float32
    n_parts = min(num_threads(), n_out)
    kernel, args = w.rows_kernel
    _PARALLEL_ROWS[kernel](*args, n_parts, wf)
    out = np.empty((x.shape[0], n_out), np.float32)                  # (T, n_out) float32
    with one_blas_thread():
        _dot_rows(x, wf, n_parts, out)
    return out


@njit(parallel=True, nogil=True, cache=True)
def _dot_rows(x, w, n_parts, out):
    """out = x @ w.T, each thread taking a run of w's rows (out's columns).

    x    # (T, K) float32
    w    # (N, K) float32
    out  # (T, N) float32
    """
    n = w.shape[0]
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n)
        out[:, r0:r1] = np.dot(x, w[r0:r1].T)


# ---- Dequantizing every row, each thread a run of them: the serial rows kernels of each
# weight family (bit-exact with gguf.quants) on parts of the matrix. One small kernel per
# family, because numba does not cache a kernel that takes another kernel as an argument.

@njit(parallel=True, nogil=True, cache=True)
def _rows_q4(qs, d, m, has_min, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        legacy.rows_q4(qs, d, m, has_min, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q5(qs, qh, d, m, has_min, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        legacy.rows_q5(qs, qh, d, m, has_min, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q8_0(qs, d, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        legacy.rows_q8_0(qs, d, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q45_k(d, dmin, scales, qh, qs, has_qh, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants.rows_q45_k(d, dmin, scales, qh, qs, has_qh, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q6_k(ql, qh, scales, d, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants.rows_q6_k(ql, qh, scales, d, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q2_k(scales, qs, d, dmin, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants_low.rows_q2_k(scales, qs, d, dmin, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q3_k(hmask, qs, scales, d, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants_low.rows_q3_k(hmask, qs, scales, d, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_iq4_nl(qs, d, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        iquants.rows_iq4_nl(qs, d, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_iq4_xs(d, scales_h, scales_l, qs, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        iquants.rows_iq4_xs(d, scales_h, scales_l, qs, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_float(wt, kind, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        floats.rows_float(wt, kind, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q4_k_x8(x8, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants_avx2.rows_q4_k_x8(x8, n_out, np.arange(r0, r1), out[r0:r1])


@njit(parallel=True, nogil=True, cache=True)
def _rows_q6_k_rows(raw, n_out, n_parts, out):
    for c in prange(n_parts):
        r0, r1 = chunk_groups(c, n_parts, n_out)
        kquants_avx2.rows_q6_k_rows(raw, n_out, np.arange(r0, r1), out[r0:r1])


_PARALLEL_ROWS = {kquants_avx2.rows_q4_k_x8: _rows_q4_k_x8, kquants_avx2.rows_q6_k_rows: _rows_q6_k_rows,
                  legacy.rows_q4: _rows_q4, legacy.rows_q5: _rows_q5, legacy.rows_q8_0: _rows_q8_0,
                  kquants.rows_q45_k: _rows_q45_k, kquants.rows_q6_k: _rows_q6_k,
                  kquants_low.rows_q2_k: _rows_q2_k, kquants_low.rows_q3_k: _rows_q3_k,
                  iquants.rows_iq4_nl: _rows_iq4_nl, iquants.rows_iq4_xs: _rows_iq4_xs,
                  floats.rows_float: _rows_float}
