"""How fast this machine's weight kernels stream a Q4_K_M model's bytes for one token: the ceiling
of decode speed on this machine, closer to it than the read bandwidth (cpu/bandwidth.py).

Why a second probe: a decode step multiplies every weight byte once, so its speed is at most the
weight bytes over the rate the kernels get through them. The read probe sums memory with nothing
else to do and says what the memory allows; the kernels also unpack, multiply and add, so they
stream less than that, and by an amount that varies with the machine. Decode then reaches most
of the kernels' figure (attention, norms and the calls between products take the rest) but a
smaller and less steady share of the read probe's, so a speed predicted from the read probe
overstates what a person gets (docs/benchmarks.md has the figures).

What it runs: one token through products shaped as a 1.5B model's feed-forward matrices, in
the proportions of a Q4_K_M file (two thirds of the bytes Q4_K, 8960 x 1536, a third Q6_K,
1536 x 8960: Qwen2.5-1.5B's 0.76 GB and 0.35 GB), several times the machine's L3, with the
engine's kernels (quant/qmatrix.py) on the threads asked for. The weights are made up (their
values do not change the work; ``made_up_blocks``).
"""
from __future__ import annotations

import glob
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numba
import numpy as np
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as Q

from ..ops.simd_int import HAS_AVX2
from .qmatrix import QMatrix

MIN_STREAM_BYTES = 256 * 1024 * 1024
L3_MULTIPLE = 4                             # bytes streamed: at least this many times all L3 caches
DEFAULT_REPEATS = 5
N_WIDE, N_NARROW = 8960, 1536               # a 1.5B model's feed-forward width and its model width
SCALE_OFFSETS = {Q.Q4_K: (0, 2), Q.Q5_K: (0, 2), Q.Q6_K: (208,)}   # f16 d (and dmin) in each block


@dataclass(frozen=True)
class StreamProbe:
    best_gb_s: float
    median_gb_s: float
    nbytes: int          # weight bytes one repeat streams
    repeats: int
    threads: int         # numba threads the kernels ran on


def made_up_blocks(qtype: Q, n_out: int, n_in: int, rng: np.random.Generator | None = None) -> np.ndarray:
    """(n_out, bytes per row) uint8 GGUF K-quant blocks whose f16 scales are all 0.01 (finite, so
    products stay finite): patterned bytes, or random ones from ``rng``."""
    block, block_bytes = GGML_QUANT_SIZES[qtype]
    n_blocks = n_out * (n_in // block)
    if rng is None:
        raw = (np.arange(n_blocks * block_bytes, dtype=np.uint32) * 2654435761 >> 24).astype(np.uint8)
    else:
        raw = rng.integers(0, 256, n_blocks * block_bytes, dtype=np.uint8)
    blocks = raw.reshape(n_blocks, block_bytes)      # (n_blocks, block_bytes) uint8
    for at in SCALE_OFFSETS[qtype]:
        blocks[:, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    return blocks.reshape(n_out, -1)


def l3_bytes(sysfs_cpu: str = "/sys/devices/system/cpu") -> int:
    """All L3 caches of the machine together (each shared cache once); 0 where sysfs says nothing."""
    seen, total = set(), 0
    for index in glob.glob(f"{sysfs_cpu}/cpu[0-9]*/cache/index3"):
        try:
            shared = Path(index, "shared_cpu_list").read_text().strip()
            size = Path(index, "size").read_text().strip()
        except OSError:
            continue
        if shared in seen or not size.endswith("K"):
            continue
        seen.add(shared)
        total += int(size[:-1]) * 1024
    return total


def default_stream_bytes() -> int:
    return max(MIN_STREAM_BYTES, L3_MULTIPLE * l3_bytes())


def weight_matrices(nbytes: int) -> list[QMatrix]:
    """Q4_K and Q6_K matrices of about ``nbytes`` together, two thirds of them Q4_K; each has
    memory of its own (Q4_K's repacked groups; on AVX2 machines, where Q6_K is multiplied in the
    blocks as they lie, a copy of them)."""
    q4 = made_up_blocks(Q.Q4_K, N_WIDE, N_NARROW)          # (8960, 864) uint8
    q6 = made_up_blocks(Q.Q6_K, N_NARROW, N_WIDE)          # (1536, 7350) uint8
    n4 = max(1, round(nbytes * 2 / 3 / q4.nbytes))
    n6 = max(1, round(nbytes / 3 / q6.nbytes))
    return ([QMatrix(f"probe.q4_k.{i}", q4, Q.Q4_K, N_WIDE, N_NARROW) for i in range(n4)]
            + [QMatrix(f"probe.q6_k.{i}", q6.copy() if HAS_AVX2 else q6, Q.Q6_K, N_NARROW, N_WIDE)
               for i in range(n6)])


def probe_weight_stream(threads: int = 0, nbytes: int = 0, repeats: int = DEFAULT_REPEATS) -> StreamProbe:
    """One token through every matrix of ``weight_matrices(nbytes)`` (0: ``default_stream_bytes()``)
    on ``threads`` numba threads (0: the calling thread's count), ``repeats`` times; the best and
    median weight GB/s. Most of the time is making the matrices, not streaming them."""
    matrices = weight_matrices(nbytes or default_stream_bytes())
    rng = np.random.default_rng(0)
    x = {n: rng.standard_normal((1, n)).astype(np.float32) for n in (N_NARROW, N_WIDE)}  # n_in -> (1, n_in)
    before = numba.get_num_threads()
    if threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        for m in matrices[:1] + matrices[-1:]:
            m.matmul(x[m.shape[1]])                        # compiled or loaded outside the timing
        total = sum(m.nbytes for m in matrices)
        rates = []
        for _ in range(max(1, repeats)):
            t0 = time.perf_counter()
            for m in matrices:
                m.matmul(x[m.shape[1]])
            rates.append(total / (time.perf_counter() - t0) / 1e9)
        used = numba.get_num_threads()
    finally:
        numba.set_num_threads(before)
    return StreamProbe(best_gb_s=max(rates), median_gb_s=statistics.median(rates), nbytes=total,
                       repeats=len(rates), threads=used)
