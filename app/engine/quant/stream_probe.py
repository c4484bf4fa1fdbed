"""How fast this machine's weight kernels stream a Q4_K_M model's bytes: the rate a decode step
reads its weights at, which the read-bandwidth probe (cpu/bandwidth.py) only bounds.

Why a second probe: a decode step multiplies every weight byte once, so its speed is the weight
bytes over the rate the kernels get through them. The read probe sums memory with nothing else
to do and says what the memory allows; the kernels also unpack, multiply and add, and on the
machine this was written on (2 Zen 4 cores) they streamed 30-38 GB/s from memory in minutes
when the read probe said 34-61 GB/s, and the 1.5B model decoded at what they streamed (30 tokens/s
of 0.98 GB). Speeds predicted from the read probe were up to twice what a person then got.

What it runs: one token through products shaped as a 1.5B model's feed-forward matrices, in
the proportions of a Q4_K_M file (two thirds of the bytes Q4_K, 8960 x 1536, a third Q6_K,
1536 x 8960: Qwen2.5-1.5B's 0.76 GB and 0.35 GB), far more bytes than any L3 cache holds, with
the engine's kernels and threads (quant/qmatrix.py). The weights are made up (their values do
not change the work); the matrices' own memory is written once before timing.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q

from .qmatrix import QMatrix

DEFAULT_STREAM_BYTES = 256 * 1024 * 1024   # 8x a 32 MiB L3
DEFAULT_REPEATS = 5
N_WIDE, N_NARROW = 8960, 1536               # a 1.5B model's feed-forward width and its model width
_F16_SCALE = np.float16(0.01).view(np.uint16)   # a scale (d, dmin) every made-up block carries


@dataclass(frozen=True)
class StreamProbe:
    best_gb_s: float
    median_gb_s: float
    nbytes: int          # weight bytes one repeat streams
    repeats: int
    threads: int         # numba threads the kernels ran on


def _made_up(qtype: Q, n_out: int, n_in: int) -> np.ndarray:
    """(n_out, bytes per row) uint8 GGUF blocks: patterned bytes with finite f16 scales."""
    block_bytes, d_at = {Q.Q4_K: (144, (0, 2)), Q.Q6_K: (210, (208,))}[qtype]
    n_blocks = n_out * (n_in // 256)
    raw = (np.arange(n_blocks * block_bytes, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8)
    blocks = raw.reshape(n_blocks, block_bytes)      # (n_blocks, block_bytes) uint8
    for at in d_at:
        blocks[:, at:at + 2] = np.frombuffer(_F16_SCALE.tobytes(), np.uint8)
    return blocks.reshape(n_out, -1)


def weight_matrices(nbytes: int = DEFAULT_STREAM_BYTES) -> list[QMatrix]:
    """Q4_K and Q6_K matrices of about ``nbytes`` together, two thirds of them Q4_K; each has
    memory of its own (Q4_K's repacked groups, a copy of the Q6_K blocks it reads in place)."""
    q4 = _made_up(Q.Q4_K, N_WIDE, N_NARROW)          # (8960, 864) uint8
    q6 = _made_up(Q.Q6_K, N_NARROW, N_WIDE)          # (1536, 7350) uint8
    n4 = max(1, round(nbytes * 2 / 3 / q4.nbytes))
    n6 = max(1, round(nbytes / 3 / q6.nbytes))
    return ([QMatrix(f"probe.q4_k.{i}", q4, Q.Q4_K, N_WIDE, N_NARROW) for i in range(n4)]
            + [QMatrix(f"probe.q6_k.{i}", q6.copy(), Q.Q6_K, N_NARROW, N_WIDE) for i in range(n6)])


def probe_weight_stream(nbytes: int = DEFAULT_STREAM_BYTES, repeats: int = DEFAULT_REPEATS) -> StreamProbe:
    """One token through every matrix of ``weight_matrices(nbytes)``, ``repeats`` times; the
    best and median weight GB/s. About 2 s on 2 cores (most of it making the matrices)."""
    matrices = weight_matrices(nbytes)
    x = {m.shape[1]: np.random.default_rng(0).standard_normal((1, m.shape[1])).astype(np.float32)
         for m in matrices}                            # n_in -> (1, n_in) float32 one token
    for m in matrices[:1] + matrices[-1:]:
        m.matmul(x[m.shape[1]])                        # compiled or loaded outside the timing
    total = sum(m.nbytes for m in matrices)
    rates = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        for m in matrices:
            m.matmul(x[m.shape[1]])
        rates.append(total / (time.perf_counter() - t0) / 1e9)
    return StreamProbe(best_gb_s=max(rates), median_gb_s=statistics.median(rates), nbytes=total,
                       repeats=len(rates), threads=numba.get_num_threads())
