"""The thread plan: how many threads run on which CPUs, and which rows each NUMA node reads.

Pure arithmetic over a ``Topology`` (cpu/topology.py), light on purpose (no numba): the
settings and the hardware report read it. ``cpu/pinning.py`` applies a plan, ``cpu/numa.py``
places memory by it.

  * default: one thread per physical core; SMT siblings are used only when more threads are
    asked for than there are cores;
  * ``distribute``: cores of every NUMA node, listed node by node;
  * ``isolate``: cores of the one node with the most free memory;
  * ``none``: cores in CPU order, no regard for nodes.

Why "listed node by node" matters: numba's ``prange`` hands iteration chunks out statically,
chunk ``t`` (a contiguous range, ``thread_row_ranges``) to worker ``t``, and ``apply`` pins
worker ``t`` to ``plan.cpus[t]``. So a kernel that runs ``prange`` over weight rows (or KV
blocks) reads rows ``node_row_ranges(...)[j]`` from the threads of node ``j`` only — and if
those rows were first-touched by node ``j`` (``numa.first_touch``), Linux placed their pages
in node ``j``'s memory, so every read is local. That is the ``distribute`` policy.
"""
from __future__ import annotations

from dataclasses import dataclass

from .topology import Topology, format_cpulist

NUMA_POLICIES = ("distribute", "isolate", "none")

# llama.cpp ggml.h enum ggml_numa_strategy.


GGML_NUMA_DISABLED = 0
GGML_NUMA_DISTRIBUTE = 1
GGML_NUMA_ISOLATE = 2
GGML_NUMA_NUMACTL = 3
GGML_NUMA_MIRROR = 4


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


@dataclass(frozen=True)
class NodeRows:
    node: int
    start: int     # first row (along the split axis)
    stop: int      # one past the last row


def thread_row_ranges(n_rows: int, n_threads: int) -> tuple[tuple[int, int], ...]:
    """The contiguous chunk of ``range(n_rows)`` that each numba worker gets from a ``prange``.

    numba's static scheduler (gufunc_scheduler.cpp) splits evenly and gives the remainder to
    the first workers: 17 rows over 4 threads -> 5, 4, 4, 4. tests/engine/cpu/test_threads.py
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
