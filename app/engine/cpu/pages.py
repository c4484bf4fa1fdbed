"""Arrays whose pages arrive as they are first written, 4 KiB at a time.

A KV cache is allocated for its whole context and filled a block at a time. numpy asks the
kernel for transparent huge pages on every large array (``madvise(MADV_HUGEPAGE)``), so the
first write into each 2 MiB of a fresh array zeroes the whole 2 MiB. The cache's arrays are laid
out ``[layer][kv_head][block]...``: one new block touches a different 2 MiB region in every
layer, head and array, and a question's first tokens after a cached document paid for zeroing
hundreds of megabytes they never used (docs/benchmarks.md, "A question after a read document").
An anonymous mapping with huge pages declined zeroes only the pages a write reaches.
"""
from __future__ import annotations

import mmap

import numpy as np


def lazy_zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """A zero-filled array of ``shape`` whose memory is mapped in 4 KiB pages on first write
    (and given back when the array goes)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if n == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):   # (Windows: no such mapping, no madvise either)
        return np.zeros(shape, dtype)
    area = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        try:
            area.madvise(mmap.MADV_NOHUGEPAGE)
        except OSError:   # a kernel built without huge pages: plain pages already
            pass
    return np.frombuffer(area, dtype).reshape(shape)
