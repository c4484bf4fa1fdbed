"""Memory read bandwidth: what the machine can stream, and what a decode step achieved.

Decode speed is ``read bandwidth / bytes moved per token`` (docs/ARCHITECTURE.md, "Performance is counted
in bytes"). ``probe_read_bandwidth`` measures the first number with the same tools the engine
uses (numba, all its threads); ``achieved_gb_s`` turns a decode's bytes per token and tokens/s
into the second, so the two can be printed side by side.

Units: GB/s are 1e9 bytes per second, as memory vendors and STREAM count them.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numba
import numpy as np

DEFAULT_PROBE_BYTES = 512 * 1024 * 1024    # far larger than any L3 cache
DEFAULT_REPEATS = 5


@dataclass(frozen=True)
class BandwidthProbe:
    best_gb_s: float
    median_gb_s: float
    nbytes: int          # bytes read per repeat
    repeats: int
    threads: int         # numba threads that read


@numba.njit(parallel=True, cache=True)
def _fill(a, n_threads):
    """Write every element from the worker that will later read it (first touch: local pages)."""
    chunk = (a.shape[0] + n_threads - 1) // n_threads
    for t in numba.prange(n_threads):
        for i in range(t * chunk, min((t + 1) * chunk, a.shape[0])):
            a[i] = i & 7


@numba.njit(cache=True, nogil=True)
def _sum_slice(a):
    """Sum of a (n,) int64 in one loop that LLVM vectorises (integer adds need no fastmath)."""
    s = 0
    for i in range(a.shape[0]):
        s += a[i]
    return s


@numba.njit(parallel=True, cache=True)
def _sum(a, n_threads):
    """Sum of a (n,) int64, one slice per worker. Each worker sums its slice in a loop of its
    own: written inline, with bounds that depend on the prange index, the loop is not
    vectorised and reads memory far slower than a vectorised loop (or numpy's own sum) does, so
    the probe would report less than decoders achieve."""
    chunk = (a.shape[0] + n_threads - 1) // n_threads
    partial = np.zeros(n_threads, np.int64)        # (n_threads,) one sum per worker
    for t in numba.prange(n_threads):
        partial[t] = _sum_slice(a[t * chunk:min((t + 1) * chunk, a.shape[0])])
    return partial.sum()


def probe_read_bandwidth(nbytes: int = DEFAULT_PROBE_BYTES, repeats: int = DEFAULT_REPEATS) -> BandwidthProbe:
    """Read ``nbytes`` with every numba thread ``repeats`` times; best and median GB/s.

    The array is written first (an untouched ``np.zeros`` array maps every page to the one
    shared zero page and would "read" from cache). Most of the time is that first-time fill;
    numba's compiled code is cached on disk.
    """
    n_threads = numba.get_num_threads()   # numba.get_num_threads() inside njit code would defeat caching
    a = np.empty(max(nbytes // 8, 1024), np.int64)     # (n,) the data to stream
    _fill(a, n_threads)
    expected = int(np.arange(8).sum()) * (a.shape[0] // 8) + sum(range(a.shape[0] % 8))
    _sum(a[:1024], n_threads)                                      # compile outside the timing
    rates = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        total = _sum(a, n_threads)
        dt = time.perf_counter() - t0
        if total != expected:     # the read really happened and read the right data
            raise RuntimeError(f"bandwidth probe read a wrong sum {total} (expected {expected})")
        rates.append(a.nbytes / dt / 1e9)
    return BandwidthProbe(best_gb_s=max(rates), median_gb_s=statistics.median(rates),
                          nbytes=a.nbytes, repeats=len(rates), threads=n_threads)


# ---- Achieved bandwidth of a decode ----------------------------------------


@dataclass(frozen=True)
class DecodeBytes:
    """Bytes one decode step reads (docs/ARCHITECTURE.md: weights + KV + metadata)."""

    weights: int
    kv: int
    metadata: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.metadata


def achieved_gb_s(bytes_per_token: int | DecodeBytes, tokens_per_s: float) -> float:
    """Bytes moved per token x tokens per second, in GB/s."""
    total = bytes_per_token.total if isinstance(bytes_per_token, DecodeBytes) else bytes_per_token
    return total * tokens_per_s / 1e9


def bandwidth_line(bytes_per_token: int | DecodeBytes, tokens_per_s: float, peak_gb_s: float | None) -> str:
    """'12.3 tok/s x 0.10 GB/token = 1.23 GB/s (8% of the measured 15.1 GB/s)'."""
    total = bytes_per_token.total if isinstance(bytes_per_token, DecodeBytes) else bytes_per_token
    gb_s = achieved_gb_s(total, tokens_per_s)
    line = f"{tokens_per_s:.1f} tok/s x {total / 1e9:.3f} GB/token = {gb_s:.2f} GB/s"
    if peak_gb_s:
        line += f" ({100 * gb_s / peak_gb_s:.0f}% of the measured {peak_gb_s:.1f} GB/s)"
    return line
