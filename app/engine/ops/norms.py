"""Elementwise kernels of the transformer block: RMS norm (with the residual add) and SwiGLU.

Scalar loops in the order ggml-cpu runs them, so results agree bit for bit where the
operations are the same IEEE ops (no fastmath: no reassociation, no FMA contraction).
"""
from __future__ import annotations

import numpy as np
from numba import njit

from .expf import silu8
from .simd import load8_2d, mul8, store8_2d


@njit(cache=True, nogil=True)
def rms_norm_rows(x, w, eps, out):
    """out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w   — ggml-cpu/ops.cpp rms_norm_f32:
    squares in f32 summed in double, mean and scale in f32, then (x*scale)*w.

    x, out  # (T, D) float32;  w  # (D,) float32
    """
    n_tok, dim = x.shape
    for t in range(n_tok):
        total = 0.0
        for i in range(dim):
            total += x[t, i] * x[t, i]
        mean = np.float32(total / dim)
        scale = np.float32(1.0) / np.sqrt(mean + eps)
        for i in range(dim):
            out[t, i] = (x[t, i] * scale) * w[i]


@njit(cache=True, nogil=True)
def add_rms_norm_rows(x, r, w, eps, out):
    """x += r (the residual add, ggml_add), then out = rms_norm(x) * w.

    x, r, out  # (T, D) float32;  w  # (D,) float32
    """
    n_tok, dim = x.shape
    for t in range(n_tok):
        for i in range(dim):
            x[t, i] = x[t, i] + r[t, i]
    rms_norm_rows(x, w, eps, out)


@njit(cache=True, nogil=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up  — ggml_vec_swiglu_f32 (vec.cpp): SIMD ggml_v_silu on blocks
    of 8, then x / (1 + expf(-x)) for the tail.

    gate, up, out  # (T, F) float32
    """
    n_tok, n = gate.shape
    n_simd = n - n % 8
    for t in range(n_tok):
        for i in range(0, n_simd, 8):
            store8_2d(mul8(silu8(load8_2d(gate, t, i)), load8_2d(up, t, i)), out, t, i)
        for i in range(n_simd, n):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]
