"""How a kernel splits its work over numba's threads: the thread count of the calling thread,
and the contiguous run of row groups (or blocks) each chunk of a prange takes."""
from __future__ import annotations

from numba import get_num_threads, njit
from numba.np.ufunc import parallel as _numba_parallel


@njit(nogil=True, cache=True, inline="always")
def chunk_groups(c, n_chunks, n_groups):
    """(g0, g1): the contiguous run of groups that chunk c of n_chunks handles."""
    return c * n_groups // n_chunks, (c + 1) * n_groups // n_chunks


_fast_get_num_threads = None


def num_threads() -> int:
    """numba's thread count for the calling thread (it is per thread, so it is asked each
    time, not cached). numba.get_num_threads() takes a lock on every call, and a decode step
    makes ~200 products; once numba's pool is up, its ctypes getter answers without the lock."""
    global _fast_get_num_threads
    getter = _fast_get_num_threads
    if getter is None:
        if not getattr(_numba_parallel, "_is_initialized", False):
            return get_num_threads()
        getter = _fast_get_num_threads = getattr(_numba_parallel, "_get_num_threads", get_num_threads)
    n = getter()
    return n if n > 0 else get_num_threads()
