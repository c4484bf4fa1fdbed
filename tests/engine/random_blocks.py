"""Random, valid GGUF blocks of the types gguf.quants cannot quantize to (the K-quants, IQ4_NL,
IQ4_XS): every byte pattern of their quants and sub-block scales is a valid block, so the
blocks are random bytes with finite f16 super-block scales written at their offsets
(ggml-common.h layouts)."""
from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import quants

# qtype -> (elements per block, bytes per block, byte offsets of the f16 scales)
LAYOUT = {Q.Q2_K: (256, 84, (80, 82)), Q.Q3_K: (256, 110, (108,)), Q.Q4_K: (256, 144, (0, 2)),
          Q.Q5_K: (256, 176, (0, 2)), Q.Q6_K: (256, 210, (208,)), Q.IQ4_NL: (32, 18, (0,)),
          Q.IQ4_XS: (256, 136, (0,))}
SIGNED_SCALES = (Q.Q3_K, Q.Q6_K, Q.IQ4_NL, Q.IQ4_XS)   # no min: a negative d is as valid


def f16_bytes(a: np.ndarray) -> np.ndarray:
    """(...,) float -> (..., 2) uint8 little-endian f16."""
    return np.frombuffer(np.asarray(a).astype(np.float16).tobytes(), np.uint8).reshape(np.shape(a) + (2,))


def random_blocks(qtype, n_out: int, n_in: int, rng: np.random.Generator,
                  high: float = 0.01) -> np.ndarray:
    """(n_out, bytes_per_row) uint8: random blocks whose f16 scales are uniform in
    [0.05 * high, high] (types with a min) or [-high, high]."""
    block, size, offsets = LAYOUT[qtype]
    nb = n_in // block
    raw = rng.integers(0, 256, (n_out, nb, size), dtype=np.uint8)   # (n_out, nb, size) uint8
    for off in offsets:
        low = -high if qtype in SIGNED_SCALES else 0.05 * high
        raw[:, :, off:off + 2] = f16_bytes(rng.uniform(low, high, (n_out, nb)))
    return raw.reshape(n_out, -1)


def random_weights(qtype, n_out: int, n_in: int, rms: float, rng: np.random.Generator) -> np.ndarray:
    """Random blocks as above, scaled so the dequantized matrix has about the given RMS
    (dequantization is linear in the super-block scales)."""
    trial = random_blocks(qtype, n_out, n_in, rng)
    got = float(np.sqrt(np.mean(quants.dequantize(trial, qtype).astype(np.float64) ** 2)))
    return random_blocks(qtype, n_out, n_in, rng, high=0.01 * rms / got)
