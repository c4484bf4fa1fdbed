"""Threads: the one module that decides how many threads run where.

It owns numba's thread count, the BLAS libraries' thread count (threadpoolctl) and the
``n_threads``/``numa`` pair handed to llama.cpp. Nothing else in the project sets them.

The plan (``plan_threads``) is pure arithmetic over a ``Topology``:
  * default: one thread per physical core; SMT siblings are used only when more threads are
    asked for than there are cores;
  * ``distribute``: cores of every NUMA node, listed node by node;
  * ``isolate``: cores of the one node with the most free memory;
  * ``none``: cores in CPU order, no regard for nodes.

Why "listed node by node" matters: numba's ``prange`` hands iteration chunks out statically,
chunk ``t`` (a contiguous range, ``thread_row_ranges``) to worker ``t``, and ``apply`` pins
worker ``t`` to ``plan.cpus[t]``. So a kernel that runs ``prange`` over weight rows (or KV
blocks) reads rows ``node_row_ranges(...)[j]`` from the threads of node ``j`` only — and if
those rows were first-touched by node ``j`` (``first_touch``), Linux placed their pages in
node ``j``'s memory, so every read is local. That is the ``distribute`` policy.

Pinning (``apply``), measured on this project's machine with numba 0.68:
  * the process: every existing thread (``/proc/self/task/*``) gets the plan's CPUs as its
    affinity, so threads created later (numba's pool, BLAS pools) inherit it;
  * numba's workers: a parallel loop with one iteration per worker, whose body calls libc
    ``sched_setaffinity(0, ...)`` through ctypes, pins the calling worker to ``plan.cpus[t]``
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

import ctypes
import os
import platform
import threading
from dataclasses import dataclass

import numba
import numpy as np

from app.engine.topology import _STARTUP_CPUS, Topology, format_cpulist, parse_cpulist

NUMA_POLICIES = ("distribute", "isolate", "none")

# llama.cpp ggml.h enum ggml_numa_strategy.
GGML_NUMA_DISABLED = 0
GGML_NUMA_DISTRIBUTE = 1
GGML_NUMA_ISOLATE = 2
GGML_NUMA_NUMACTL = 3
GGML_NUMA_MIRROR = 4


# ---- libc ------------------------------------------------------------------

_libc = ctypes.CDLL(None, use_errno=True)
_sched_setaffinity = _libc.sched_setaffinity
_sched_setaffinity.argtypes = [ctypes.c_int, ctypes.c_size_t, ctypes.c_void_p]
_sched_setaffinity.restype = ctypes.c_int
_libc.syscall.restype = ctypes.c_long
# gettid as a one-argument syscall, callable from numba code (numba calls ctypes functions
# whose argtypes are fixed); a separate CDLL gives a function object of its own.
_SYS_GETTID = {"x86_64": 186, "aarch64": 178}.get(platform.machine(), 186)
_syscall1 = ctypes.CDLL(None).syscall
_syscall1.argtypes = [ctypes.c_long]
_syscall1.restype = ctypes.c_long


# ---- Plan ------------------------------------------------------------------


@dataclass(frozen=True)
class NodeShare:
    """The threads one NUMA node runs."""

    node: int
    cpus: tuple[int, ...]      # logical CPUs, in the plan's thread order


@dataclass(frozen=True)
class ThreadPlan:
    count: int
    cpus: tuple[int, ...]             # (count,) worker t runs on cpus[t]; listed node by node
    numa_policy: str                  # "distribute" | "isolate" | "none"
    per_node: tuple[NodeShare, ...]   # nodes that run threads, by node id
    machine_nodes: int                # NUMA nodes the machine has (llama.cpp's numa needs > 1)
    shared_cores: int                 # physical cores that run two or more threads (SMT)
    plan: str                         # one line for people: "8 threads, one per physical core, ..."

    @property
    def nodes(self) -> tuple[int, ...]:
        return tuple(share.node for share in self.per_node)


def _node_levels(topology: Topology, node_cpus: set[int], allowed: set[int]) -> list[list[int]]:
    """levels[k] = the k-th usable logical CPU of each core on the node (level 0: one per core)."""
    levels: list[list[int]] = []
    for core in topology.cores:
        usable = [c for c in core.cpus if c in node_cpus and c in allowed]
        for k, cpu in enumerate(usable):
            if len(levels) <= k:
                levels.append([])
            levels[k].append(cpu)
    return [sorted(level) for level in levels]


def plan_threads(topology: Topology, threads: int = 0, numa_policy: str = "distribute") -> ThreadPlan:
    """Decide how many threads run on which CPUs. ``threads=0``: one per physical core."""
    if numa_policy not in NUMA_POLICIES:
        raise ValueError(f"unknown NUMA policy {numa_policy!r}: use one of {', '.join(NUMA_POLICIES)}")
    if threads < 0:
        raise ValueError(f"threads must be 0 (one per physical core) or more, not {threads}")
    allowed = set(topology.allowed_cpus)
    levels_of = {node.id: _node_levels(topology, set(node.cpus), allowed) for node in topology.nodes}
    usable = [node for node in topology.nodes if levels_of[node.id]]
    if numa_policy == "isolate":
        # The node with the most free memory, so the model and KV cache fit in local memory.
        best = max(usable, key=lambda n: (n.mem_free_bytes, -n.id))
        usable = [best]

    # Level by level: one CPU of every core first (round-robin over the nodes, so a small
    # thread count still spreads over all of them), SMT siblings only after that.
    chosen: dict[int, list[int]] = {node.id: [] for node in usable}
    n_levels = max(len(levels_of[node.id]) for node in usable)
    physical = sum(len(levels_of[node.id][0]) for node in usable)
    capacity = sum(len(level) for node in usable for level in levels_of[node.id])
    count = min(threads or physical, capacity)
    order: list[int] = []     # the CPUs in the order they were taken
    for k in range(n_levels):
        queues = [list(levels_of[node.id][k]) if k < len(levels_of[node.id]) else [] for node in usable]
        if numa_policy == "none":
            order.extend(sorted(c for q in queues for c in q))
            continue
        while any(queues):
            for q in queues:
                if q:
                    order.append(q.pop(0))
    order = order[:count]

    node_of = {cpu: node.id for node in usable for cpu in node.cpus}
    for cpu in order:
        chosen[node_of[cpu]].append(cpu)
    per_node = tuple(NodeShare(node, tuple(sorted(cpus))) for node, cpus in sorted(chosen.items()) if cpus)
    if numa_policy == "none":
        cpus = tuple(sorted(order))
    else:
        cpus = tuple(c for share in per_node for c in share.cpus)
    threads_per_core = [sum(c in cpus for c in core.cpus) for core in topology.cores]
    shared = sum(1 for n in threads_per_core if n > 1)
    cores_used = sum(1 for n in threads_per_core if n > 0)
    head = f"{count} thread{'s' if count != 1 else ''}"
    if shared:
        head += f" on {cores_used} physical cores, {shared} of them running two threads on SMT siblings"
    elif count == physical:
        head += ", one per physical core"
    else:
        head += f" on {count} of {physical} physical cores"
    if threads > count:
        head += f" (asked for {threads}; there are {capacity} logical CPUs to use)"
    if len(topology.nodes) <= 1:
        text = f"{head}; {_cpus_text(cpus)} (one NUMA node)"
    else:
        text = f"{head}; NUMA {numa_policy}: " + "; ".join(
            f"node {s.node}: {_cpus_text(s.cpus)}" for s in per_node)
    return ThreadPlan(
        count=count, cpus=cpus, numa_policy=numa_policy, per_node=per_node,
        machine_nodes=len(topology.nodes), shared_cores=shared, plan=text,
    )


def _cpus_text(cpus) -> str:
    cpus = list(cpus)
    return f"CPU{'s' if len(cpus) != 1 else ''} {format_cpulist(cpus)}"


def llamacpp_kwargs(plan: ThreadPlan) -> dict:
    """The plan as llama-cpp-python ``Llama(...)`` arguments.

    llama.cpp's ``numa`` option (ggml_numa_strategy) only does something on a machine with
    more than one node; on one node it stays 0 (disabled). Call ``apply(plan)`` before
    creating the ``Llama`` object: ISOLATE keeps llama.cpp on the node its main thread is on.
    """
    numa = GGML_NUMA_DISABLED
    if plan.machine_nodes > 1:
        numa = {"distribute": GGML_NUMA_DISTRIBUTE, "isolate": GGML_NUMA_ISOLATE}.get(
            plan.numa_policy, GGML_NUMA_DISABLED)
    return {"n_threads": plan.count, "numa": numa}


# ---- NUMA placement --------------------------------------------------------


@dataclass(frozen=True)
class NodeRows:
    node: int
    start: int     # first row (along the split axis)
    stop: int      # one past the last row


def thread_row_ranges(n_rows: int, n_threads: int) -> tuple[tuple[int, int], ...]:
    """The contiguous chunk of ``range(n_rows)`` that each numba worker gets from a ``prange``.

    numba's static scheduler (gufunc_scheduler.cpp) splits evenly and gives the remainder to
    the first workers: 17 rows over 4 threads -> 5, 4, 4, 4. tests/engine/test_threads.py
    checks this against numba itself.
    """
    n_threads = max(1, n_threads)
    base, extra = divmod(n_rows, n_threads)
    ranges, start = [], 0
    for t in range(n_threads):
        stop = start + base + (1 if t < extra else 0)
        ranges.append((start, stop))
        start = stop
    return tuple(ranges)


def node_row_ranges(n_rows: int, plan: ThreadPlan) -> tuple[NodeRows, ...]:
    """Which rows each node's threads read in a ``prange`` over ``n_rows`` under this plan.

    Because ``plan.cpus`` lists node by node, each node gets one contiguous range.
    """
    node_of = {cpu: share.node for share in plan.per_node for cpu in share.cpus}
    out: list[NodeRows] = []
    for cpu, (start, stop) in zip(plan.cpus, thread_row_ranges(n_rows, plan.count), strict=True):
        node = node_of[cpu]
        if out and out[-1].node == node:
            out[-1] = NodeRows(node, out[-1].start, stop)
        else:
            out.append(NodeRows(node, start, stop))
    return tuple(out)


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


def current_plan() -> ThreadPlan | None:
    """The plan the calling thread last applied (``apply``), or None."""
    cached = getattr(_local, "applied", None)
    return cached[0] if cached is not None else None


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


# ---- Applying a plan -------------------------------------------------------

@numba.njit(parallel=True)
def _warm_up(n):
    out = np.zeros(n, np.int64)
    for i in numba.prange(n):
        out[i] = numba.get_thread_id()
    return out


@numba.njit(parallel=True)
def _pin_workers(masks, tids, rcs):
    """masks (n_threads, n_words) uint64: worker t -> its CPU's bit; tids, rcs (n_threads,) int64."""
    for _ in numba.prange(masks.shape[0]):
        t = numba.get_thread_id()
        rcs[t] = _sched_setaffinity(0, masks.shape[1] * 8, masks[t].ctypes)
        tids[t] = _syscall1(_SYS_GETTID)


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
    unknown = sorted(set(plan.cpus) - _STARTUP_CPUS)
    if unknown:
        raise ValueError(f"the thread plan uses CPUs {format_cpulist(unknown)}, which this process may not "
                         f"run on (allowed: {format_cpulist(_STARTUP_CPUS)}); was it made from another "
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
    _restrict_process(tuple(sorted(_STARTUP_CPUS)))
    if _blas_limiter is not None:
        _blas_limiter.restore_original_limits()
        _blas_limiter = None
    _generation += 1      # every thread's cached apply is stale: its threads are no longer pinned
    _pinned = False
