"""Numeric primitives shared by the engine's kernels: SIMD lanes, FMA, ggml's exp, f16
conversions, norms and RoPE."""
