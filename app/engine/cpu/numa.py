"""NUMA placement: arrays whose pages live on the node whose threads read them.

Linux places an anonymous page on the node of the CPU that first writes it; ``first_touch``
writes each thread's share of an array from that thread's CPU, in the split a kernel's
``prange`` uses (``plan.thread_row_ranges``). ``page_nodes`` reads back where pages are.
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

import numpy as np

from .pinning import current_plan
from .plan import ThreadPlan, thread_row_ranges

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

def first_touch(array: np.ndarray, plan: ThreadPlan, axis: int = 0, force: bool = False) -> np.ndarray:
    """Zero ``array`` so that each thread's chunk is first written from that thread's CPU.

    Linux places an anonymous page on the node of the CPU that first writes it (the default
    "local" memory policy). For a freshly allocated ``np.empty`` array this puts the rows a
    node's threads will read (``node_row_ranges``) in that node's memory. One Python thread
    per plan CPU, pinned with ``sched_setaffinity`` before it writes; numpy's fill releases
    the GIL, so they run in parallel. On a one-node plan it does nothing unless ``force``
    (there is nowhere else for the pages to go). Pages already touched stay where they are,
    and so do memory-mapped GGUF tensors (the page cache decides): repacked weights and the
    KV cache are the arrays to pass here. Returns ``array``.
    """
    if len(plan.per_node) <= 1 and not force:
        return array
    n_rows = array.shape[axis]
    errors: list[BaseException] = []

    def touch(cpu: int, start: int, stop: int) -> None:
        try:
            os.sched_setaffinity(0, {cpu})      # 0 = the calling thread on Linux
            index = [slice(None)] * array.ndim
            index[axis] = slice(start, stop)
            array[tuple(index)].fill(0)
        except BaseException as e:             # re-raised in the caller below
            errors.append(e)

    workers = [threading.Thread(target=touch, args=(cpu, start, stop), name=f"first-touch-{cpu}")
               for cpu, (start, stop) in zip(plan.cpus, thread_row_ranges(n_rows, plan.count), strict=True)
               if stop > start]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    if errors:
        raise RuntimeError(f"first touch failed: {errors[0]}") from errors[0]
    return array


def empty_first_touched(shape, dtype, plan: ThreadPlan, axis: int = 0) -> np.ndarray:
    """``np.zeros(shape, dtype)`` whose rows along ``axis`` live on the node that reads them."""
    array = np.empty(shape, dtype)
    if len(plan.per_node) <= 1:
        array.fill(0)
        return array
    return first_touch(array, plan, axis)


def placed_empty(shape, dtype, plan: ThreadPlan | None = None, axis: int = 0) -> np.ndarray:
    """``np.empty`` for an array the engine's threads will stream by rows (repacked weights).

    With a plan over several NUMA nodes (``distribute``) each thread's share of rows along
    ``axis`` is first touched from that thread's CPU, so it lives in the memory of the node
    that reads it (the kernels give each thread one contiguous run of row groups, which is
    how ``first_touch`` splits). One node, or no plan applied in this thread: plain
    ``np.empty`` — the pages land on the node of the loading thread, which ``isolate`` has
    pinned to its node. ``plan`` defaults to the one this thread applied.
    """
    plan = plan if plan is not None else current_plan()
    array = np.empty(shape, dtype)
    if plan is None or len(plan.per_node) <= 1:
        return array
    return first_touch(array, plan, axis)


_SYS_MOVE_PAGES = {"x86_64": 279, "aarch64": 239}.get(platform.machine())


def page_nodes(array: np.ndarray) -> np.ndarray:
    """The NUMA node of each page of ``array`` (negative errno for a page not yet present).

    move_pages(2) with no target nodes only reports; used to check first_touch on a real
    machine. Raises OSError where the kernel has no NUMA support.
    """
    page = os.sysconf("SC_PAGE_SIZE")
    start = array.ctypes.data // page * page
    end = array.ctypes.data + array.nbytes
    pages = np.arange(start, end, page, dtype=np.uint64)     # (n_pages,) page addresses
    status = np.full(len(pages), -1, dtype=np.int32)         # (n_pages,) node or -errno
    if _SYS_MOVE_PAGES is None:
        raise OSError(f"move_pages: unknown syscall number on {platform.machine()}")
    rc = _libc.syscall(ctypes.c_long(_SYS_MOVE_PAGES), ctypes.c_long(0), ctypes.c_ulong(len(pages)),
                       ctypes.c_void_p(pages.ctypes.data), ctypes.c_void_p(None),
                       ctypes.c_void_p(status.ctypes.data), ctypes.c_int(0))
    if rc != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"move_pages: {os.strerror(err)}")
    return status
