"""Pinning: applying a thread plan (cpu/plan.py) to numba's, BLAS's and this process's threads.

This module and cpu/plan.py are the only places that decide how many threads run where: numba's
thread count, the BLAS libraries' thread count (threadpoolctl) and the ``n_threads``/``numa``
pair handed to llama.cpp (``plan.llamacpp_kwargs``). Nothing else in the project sets them.

Pinning (``apply``), as it behaves with numba 0.68:
  * the process: every existing thread (``/proc/self/task/*``) gets the plan's CPUs as its
    affinity, so threads created later (numba's pool, BLAS pools) inherit it;
  * numba's workers: a parallel loop with one iteration per worker, whose body calls libc
    ``sched_setaffinity(0, ...)`` (by symbol, so the kernel is cached), pins the calling worker to ``plan.cpus[t]``
    where ``t = numba.get_thread_id()``. ``apply`` then reads each worker's
    ``/proc/self/task/TID/status`` ``Cpus_allowed_list`` back and reports what it saw.
    With the ``omp`` layer the thread that starts the parallel region is worker 0;
    ``workqueue`` has a global pool of its own; ``tbb`` moves tasks between its threads, so
    there only the process-wide restriction applies.
  * numba's thread count is per calling thread, and with ``omp`` each calling thread gets
    its own team: call ``apply(plan)`` in the thread that runs the engine (the decode
    worker), not in the GUI thread. Repeated calls with the same plan are cheap.
  * pinning lasts until ``unpin()``, which gives every thread the process's startup CPUs
    back. An unpinned engine should call it: otherwise a run after a pinned one in the same
    process (``ellm bench --pin on,off``) is pinned too, caller on ``plan.cpus[0]``.
"""
from __future__ import annotations

import os
import platform
import threading
from dataclasses import dataclass

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .plan import ThreadPlan
from .topology import STARTUP_CPUS, format_cpulist, parse_cpulist

# ---- libc ------------------------------------------------------------------
# Called from numba's workers by symbol name (LLVM resolves it in the process when the kernel
# is loaded), not through ctypes pointers: a kernel holding a ctypes pointer cannot be cached
# and would be compiled again at every start.

_SYS_GETTID = {"x86_64": 186, "aarch64": 178}.get(platform.machine(), 186)

# numba's thread count, fixed in the environment before any plan narrows this process's CPUs:
# numba re-reads its settings at every compilation where a NUMBA_ variable changed since the last
# (the engine sets NUMBA_CACHE_DIR on import), and then counts the CPUs the process may use. After
# ``apply`` that count is the plan's, and numba refuses a thread count that differs from its
# running pool's ("Cannot set NUMBA_NUM_THREADS ... once the threads have been launched"), so a
# kernel compiled after pinning failed. A person's own NUMBA_NUM_THREADS is kept.
os.environ.setdefault("NUMBA_NUM_THREADS", str(numba.config.NUMBA_NUM_THREADS))


@intrinsic
def _gettid(typingctx):
    """The calling thread's id: libc syscall(SYS_gettid)."""
    def codegen(context, builder, sig, args):
        i64 = ir.IntType(64)
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i64, [i64], var_arg=True), "syscall")
        return builder.call(fn, [ir.Constant(i64, _SYS_GETTID)])

    return types.int64(), codegen


@intrinsic
def _pin_self(typingctx, masks, t):
    """libc sched_setaffinity(0, row bytes, &masks[t, 0]): pins the calling thread to the CPUs
    of row t of masks (n_threads, n_words) uint64. Returns its result (0: done)."""
    if not (isinstance(masks, types.Array) and masks.ndim == 2 and masks.layout == "C"
            and masks.dtype == types.uint64 and isinstance(t, types.Integer)):
        return None

    def codegen(context, builder, sig, args):
        i32, i64, p8 = ir.IntType(32), ir.IntType(64), ir.IntType(8).as_pointer()
        ary = context.make_array(sig.args[0])(context, builder, value=args[0])
        row = cgutils.get_item_pointer(context, builder, sig.args[0], ary,
                                       [context.cast(builder, args[1], sig.args[1], types.intp),
                                        context.get_constant(types.intp, 0)])
        fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(i32, [i32, i64, p8]), "sched_setaffinity")
        words = builder.extract_value(ary.shape, 1)
        size = builder.mul(words, ir.Constant(i64, 8))
        return builder.sext(builder.call(fn, [ir.Constant(i32, 0), size, builder.bitcast(row, p8)]), i64)

    return types.int64(masks, t), codegen


def current_plan() -> ThreadPlan | None:
    """The plan the calling thread last applied (``apply``), or None."""
    cached = getattr(_local, "applied", None)
    return cached[0] if cached is not None else None


# ---- Applying a plan -------------------------------------------------------

@numba.njit(parallel=True, cache=True)
def _warm_up(n):
    out = np.zeros(n, np.int64)
    for i in numba.prange(n):
        out[i] = numba.get_thread_id()
    return out


@numba.njit(parallel=True, cache=True)
def _pin_workers(masks, tids, rcs):
    """masks (n_threads, n_words) uint64: worker t -> its CPU's bit; tids, rcs (n_threads,) int64."""
    for _ in numba.prange(masks.shape[0]):
        t = numba.get_thread_id()
        rcs[t] = _pin_self(masks, t)
        tids[t] = _gettid()


@dataclass(frozen=True)
class AppliedThreads:
    """What ``apply`` did, as read back from the kernel."""

    numba_threads: int
    threading_layer: str
    blas_threads: int
    process_cpus: tuple[int, ...]          # affinity every thread got
    pinned: tuple[tuple[int, int], ...]    # (native thread id, CPU) per numba worker, read back
    notes: tuple[str, ...]                 # what could not be done, for people


_local = threading.local()      # per thread: (plan, generation, AppliedThreads) last applied
_generation = 0                 # bumped by every apply (and unpin) that changed the process's affinity
_pinned = False                 # an apply has pinned threads since the last unpin
_blas_limiter = None


def _cpus_allowed(tid: int) -> tuple[int, ...] | None:
    """Cpus_allowed_list of one of this process's threads, as the kernel reports it."""
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("Cpus_allowed_list:"):
                    return parse_cpulist(line.split(":", 1)[1])
    except OSError:
        return None
    return None


def _restrict_process(cpus: tuple[int, ...]) -> None:
    for name in os.listdir("/proc/self/task"):
        try:
            os.sched_setaffinity(int(name), cpus)
        except (ProcessLookupError, PermissionError):
            pass          # the thread ended meanwhile, or is not ours to move


def apply(plan: ThreadPlan) -> AppliedThreads:
    """Set numba's and BLAS's thread counts to the plan and pin the threads to its CPUs.

    Call it in the thread that will run the engine's kernels (see the module docstring).
    """
    global _blas_limiter, _generation, _pinned
    cached = getattr(_local, "applied", None)
    if cached is not None and cached[:2] == (plan, _generation):
        return cached[2]      # nothing changed since this thread applied this plan
    unknown = sorted(set(plan.cpus) - STARTUP_CPUS)
    if unknown:
        raise ValueError(f"the thread plan uses CPUs {format_cpulist(unknown)}, which this process may not "
                         f"run on (allowed: {format_cpulist(STARTUP_CPUS)}); was it made from another "
                         "machine's topology (--sysfs-root)?")
    notes: list[str] = []
    _restrict_process(plan.cpus)
    _pinned = True

    n = min(plan.count, numba.config.NUMBA_NUM_THREADS)
    if n < plan.count:
        notes.append(f"numba runs {n} threads, not {plan.count}: NUMBA_NUM_THREADS={numba.config.NUMBA_NUM_THREADS}")
    numba.set_num_threads(n)

    from threadpoolctl import threadpool_limits
    limiter = threadpool_limits(limits=plan.count, user_api="blas")
    if _blas_limiter is None:
        _blas_limiter = limiter      # the first one remembers the counts unpin() gives back

    _warm_up(n)        # starts the threading layer, so we can ask which one it is
    layer = numba.threading_layer()
    pinned: list[tuple[int, int]] = []
    if layer in ("omp", "workqueue"):
        words = max(16, max(plan.cpus) // 64 + 1)      # glibc's cpu_set_t is 1024 bits
        masks = np.zeros((n, words), np.uint64)         # (n_threads, words) one bit per worker
        for t, cpu in enumerate(plan.cpus[:n]):
            masks[t, cpu // 64] = np.uint64(1) << np.uint64(cpu % 64)
        tids = np.full(n, -1, np.int64)                 # (n_threads,) native thread id
        rcs = np.full(n, -1, np.int64)                  # (n_threads,) sched_setaffinity result
        _pin_workers(masks, tids, rcs)
        for t, cpu in enumerate(plan.cpus[:n]):
            seen = _cpus_allowed(int(tids[t])) if tids[t] > 0 else None
            if rcs[t] == 0 and seen == (cpu,):
                pinned.append((int(tids[t]), cpu))
            else:
                notes.append(f"worker {t} was not pinned to CPU {cpu} (rc {rcs[t]}, allowed {seen})")
    else:
        notes.append(f"numba's {layer} layer moves work between its threads: "
                     "threads are kept on the plan's CPUs but not pinned one per CPU")
    applied = AppliedThreads(
        numba_threads=n, threading_layer=layer, blas_threads=plan.count,
        process_cpus=plan.cpus, pinned=tuple(pinned), notes=tuple(notes),
    )
    _generation += 1      # the process-wide affinity changed: other threads must re-apply
    _local.applied = (plan, _generation, applied)
    return applied


def unpin(threads: int = 0) -> None:
    """Undo ``apply``: every thread may run on the CPUs the process started with again.

    For an unpinned engine (``EllmBackend(pin=False)``, ``ellm bench --pin off``), in place
    of ``apply``: pinning outlives the engine that asked for it. After ``apply`` the calling
    thread is worker 0, held on ``plan.cpus[0]``, and each worker on its own CPU; setting
    only numba's thread count leaves them there, so a later unpinned run in the same process
    (``ellm bench --pin on,off``) is measured pinned, and every thread the caller starts
    later (a llama.cpp pool, a worker thread) inherits its single CPU. ``threads``: numba's
    thread count for the calling thread (0: leave it). The BLAS libraries get back the
    thread counts they had. Threads that had applied a plan pin afresh on their next
    ``apply``. Cheap when nothing is pinned, so it may be called before every generation.
    """
    global _blas_limiter, _generation, _pinned
    if threads:
        numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    _local.applied = None
    if not _pinned:
        return
    _restrict_process(tuple(sorted(STARTUP_CPUS)))
    if _blas_limiter is not None:
        _blas_limiter.restore_original_limits()
        _blas_limiter = None
    _generation += 1      # every thread's cached apply is stale: its threads are no longer pinned
    _pinned = False
