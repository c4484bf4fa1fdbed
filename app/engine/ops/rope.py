"""Rotary position embeddings (RoPE): the cos/sin tables and the rotations that use them.

Tables are computed as ggml does (ggml-cpu/ops.cpp ggml_rope_cache_init, rope_yarn), so a
rotation here equals llama.cpp's bit for bit. ``rope_heads`` rotates q or k rows in place
(the forward pass); ``rotate_vec`` (one vector, inside numba kernels) and ``rotate`` (numpy)
turn queries to the position a KV block is placed at (sparse attention).
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
from numba import njit

from .simd import fma

if TYPE_CHECKING:
    from ..header.model_config import ModelConfig

NO_FACTORS = np.zeros(0, dtype=np.float32)  # (0,) float32: no per-frequency factors


@njit(cache=True, nogil=True)
def rope_heads(x, cos, sin, neox):
    """In place: rotate each head of x (T, n_heads, HD) float32 by its position's angles.

    cos,sin # (T, HD/2) float32 rows of the rope tables for these tokens' positions
    neox    # False: rotate pairs (2i, 2i+1) (GGML_ROPE_TYPE_NORMAL)
            # True:  rotate pairs (i, i + HD/2) (GGML_ROPE_TYPE_NEOX)
    ggml-cpu/ops.cpp rotate_pairs: y0 = x0*cos - x1*sin, y1 = x0*sin + x1*cos.
    """
    n_tok, n_heads, head_dim = x.shape
    half = head_dim // 2
    for t in range(n_tok):
        for h in range(n_heads):
            for i in range(half):
                if neox:
                    i0, i1 = i, i + half
                else:
                    i0, i1 = 2 * i, 2 * i + 1
                x0 = x[t, h, i0]
                x1 = x[t, h, i1]
                c = cos[t, i]
                s = sin[t, i]
                # GCC contracts llama.cpp's expressions into one FMA each (first product
                # fused, second rounded); the same IEEE ops keep us bit-identical.
                x[t, h, i0] = fma(x0, c, -(x1 * s))
                x[t, h, i1] = fma(x0, s, x1 * c)


@njit(cache=True, nogil=True)
def rope_cache(n_pos, n_dims, freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow,
                n_ctx_orig, freq_factors, cos, sin):
    """cos, sin (n_pos, n_dims/2) float32 of every (position, pair), computed as ggml does
    (ggml-cpu/ops.cpp ggml_rope_cache_init + rope_yarn, ggml.c ggml_rope_yarn_corr_dims):
    theta = p, multiplied by theta_scale = powf(base, -2/n_dims) once per pair, all in f32,
    cosf/sinf from libm (numba calls the same functions). freq_factors (n_dims/2,) or (0,).
    """
    f32 = np.float32
    theta_scale = f32(math.pow(freq_base, f32(-2.0) / f32(n_dims)))
    two_pi = f32(2.0) * f32(math.pi)
    log_base = f32(2.0) * f32(math.log(freq_base))
    start = math.floor(f32(n_dims) * f32(math.log(f32(n_ctx_orig) / (beta_fast * two_pi))) / log_base)
    end = math.ceil(f32(n_dims) * f32(math.log(f32(n_ctx_orig) / (beta_slow * two_pi))) / log_base)
    corr0 = f32(max(0.0, start))
    corr1 = f32(min(n_dims - 1.0, end))
    mscale = attn_factor
    if ext_factor != 0.0:
        mscale = mscale * fma(f32(0.1), f32(math.log(f32(1.0) / freq_scale)), f32(1.0))
    for p in range(n_pos):
        theta = f32(p)
        for i in range(n_dims // 2):
            ff = freq_factors[i] if freq_factors.shape[0] > 0 else f32(1.0)
            extrap = theta / ff
            interp = freq_scale * extrap
            th = interp
            if ext_factor != 0.0:
                y = (f32(i) - corr0) / max(f32(0.001), corr1 - corr0)
                ramp = (f32(1.0) - min(f32(1.0), max(f32(0.0), y))) * ext_factor
                th = fma(interp, f32(1.0) - ramp, extrap * ramp)
            cos[p, i] = math.cos(th) * mscale
            sin[p, i] = math.sin(th) * mscale
            theta = theta * theta_scale


class RopeTables:
    """cos/sin tables for positions 0..P-1, grown on demand."""

    def __init__(self, config: ModelConfig, freq_factors: np.ndarray | None = None):
        self.config = config
        # (HD/2,) float32: Llama 3 style per-frequency divisors (rope_freqs.weight), or (0,)
        self.freq_factors = NO_FACTORS if freq_factors is None else freq_factors.astype(np.float32)
        self.cos = np.empty((0, config.rope_dims // 2), dtype=np.float32)  # (P, HD/2) float32
        self.sin = np.empty((0, config.rope_dims // 2), dtype=np.float32)  # (P, HD/2) float32

    def rows(self, pos0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """cos, sin (n, HD/2) float32 for positions pos0 .. pos0+n-1."""
        if pos0 + n > self.cos.shape[0]:
            self._grow(max(pos0 + n, 2 * self.cos.shape[0], 256))
        return self.cos[pos0:pos0 + n], self.sin[pos0:pos0 + n]

    def _grow(self, n_pos: int) -> None:
        c = self.config
        f32 = np.float32
        cos = np.empty((n_pos, c.rope_dims // 2), dtype=np.float32)
        sin = np.empty((n_pos, c.rope_dims // 2), dtype=np.float32)
        rope_cache(n_pos, c.rope_dims, f32(c.rope_freq_base), f32(c.rope_freq_scale), f32(c.rope_ext_factor),
                    f32(c.rope_attn_factor), f32(c.rope_beta_fast), f32(c.rope_beta_slow), c.rope_orig_ctx,
                    self.freq_factors, cos, sin)
        self.cos, self.sin = cos, sin


@njit(inline="always")
def rotate_vec(x, cos_row, sin_row, neox, out):
    """out = RoPE rotation of x (HD,) by the angles of one position (ggml rotate_pairs);
    dims past 2 x len(cos_row) pass through (partial rotary). One loop per pairing, so
    that each vectorises (a branch inside the loop kept it scalar: the decode kernel
    rotates its queries once per block)."""
    half = cos_row.shape[0]
    head_dim = x.shape[0]
    if neox:
        for i in range(half):
            x0 = x[i]
            x1 = x[i + half]
            out[i] = x0 * cos_row[i] - x1 * sin_row[i]
            out[i + half] = x0 * sin_row[i] + x1 * cos_row[i]
    else:
        for i in range(half):
            x0 = x[2 * i]
            x1 = x[2 * i + 1]
            out[2 * i] = x0 * cos_row[i] - x1 * sin_row[i]
            out[2 * i + 1] = x0 * sin_row[i] + x1 * cos_row[i]
    for d in range(2 * half, head_dim):
        out[d] = x[d]


def rotate(x: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> np.ndarray:
    """x (N, n_heads, HD) float32 rotated row n by cos[n], sin[n] (N, R/2) -> new array."""
    half = cos.shape[1]
    out = x.copy()
    c = cos[:, None, :]
    s = sin[:, None, :]
    if neox:
        x0, x1 = x[..., :half], x[..., half:2 * half]
        out[..., :half] = x0 * c - x1 * s
        out[..., half:2 * half] = x0 * s + x1 * c
    else:
        x0, x1 = x[..., 0:2 * half:2], x[..., 1:2 * half:2]
        out[..., 0:2 * half:2] = x0 * c - x1 * s
        out[..., 1:2 * half:2] = x0 * s + x1 * c
    return out
