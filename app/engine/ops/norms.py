"""Elementwise kernels of the transformer block: RMS norm (with the residual add), SwiGLU and GeGLU.

Scalar loops in the order ggml-cpu runs them, so results agree bit for bit where the
operations are the same IEEE ops (no fastmath: no reassociation, no FMA contraction).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from .expf import AVX512_EXPF, silu8
from .f16 import f32_to_f16
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


@njit(cache=True, nogil=True, parallel=True)
def swiglu(gate, up, out):
    """out = silu(gate) * up  — ggml_vec_swiglu_f32 (vec.cpp): SIMD ggml_v_silu on blocks
    of 8 (16 under AVX-512 F and DQ, ``AVX512_EXPF``), then x / (1 + expf(-x)) for the tail.
    Tokens in parallel (a 512-token prefill chunk of Qwen2.5-1.5B's FFN is 4.6 M elements per
    layer, each with an exp: too much for one thread while the others wait).

    gate, up, out  # (T, F) float32
    """
    n_tok, n = gate.shape
    n_simd = n - n % (16 if AVX512_EXPF else 8)
    for t in prange(n_tok):
        for i in range(0, n_simd, 8):
            store8_2d(mul8(silu8(load8_2d(gate, t, i)), load8_2d(up, t, i)), out, t, i)
        for i in range(n_simd, n):
            g = gate[t, i]
            out[t, i] = g / (np.float32(1.0) + np.exp(-g)) * up[t, i]


def gelu_f16_table() -> np.ndarray:
    """(65536,) float32: gelu(x) for every f16 bit pattern x, rounded to f16, as ggml-cpu's
    ggml_table_gelu_f16 (ggml-cpu.c ggml_cpu_init, vec.h ggml_gelu_f32: the tanh approximation
    0.5 x (1 + tanh(sqrt(2/pi) x (1 + 0.044715 x^2))), in f32).

    As the C compiles: GCC contracts ``1.0f + GELU_COEF_A*x*x`` into one FMA (ggml-cpu is built
    with FMA), and tanhf is glibc's. Here the FMA is a float64 multiply-add rounded to float32
    (the product of two float32 is exact in float64; the two roundings of the sum never differ
    from the FMA's one on these inputs) and tanh is float64's rounded to float32: ggml's table
    entry for entry (tests/engine/model/test_architectures.py reads it from llama.cpp). numpy's
    float32 tanh without the FMA gave 234 of the 30,000 entries under |x| < 10 one f16 step
    away, which moved Gemma 3's prompt logits by up to 1.3 (its text parted from llama.cpp's on
    2 of 9 prompts)."""
    f32, f64 = np.float32, np.float64
    x = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)   # (65536,)
    with np.errstate(all="ignore"):   # the NaN and inf patterns are never looked up (|x| < 10 only)
        fma = ((f32(0.044715) * x).astype(f64) * x + 1.0).astype(f32)           # fmaf(0.044715f*x, x, 1)
        inner = (f32(0.79788456080286535587989211986876) * x) * fma
        tanh = np.tanh(inner.astype(f64)).astype(f32)                            # tanhf
        y = (f32(0.5) * x) * (f32(1.0) + tanh)
        return y.astype(np.float16).astype(np.float32)


@njit(cache=True, nogil=True, parallel=True)
def geglu(gate, up, table, out):
    """out = gelu(gate) * up — ggml_vec_geglu_f32 (vec.h, GGML_GELU_FP16): 0 for gate <= -10,
    gate itself for gate >= 10, else the f16 table at gate rounded to f16.

    gate, up, out  # (T, F) float32;  table  # (65536,) float32, gelu_f16_table()
    """
    n_tok, n = gate.shape
    for t in prange(n_tok):     # tokens in parallel, as swiglu
        for i in range(n):
            x = gate[t, i]
            if x <= np.float32(-10.0):
                out[t, i] = np.float32(0.0)
            elif x >= np.float32(10.0):
                out[t, i] = x * up[t, i]
            else:
                out[t, i] = table[f32_to_f16(x)] * up[t, i]
