"""The machine's CPU topology, read from sysfs and procfs.

Decode speed on a CPU is set by the memory system, so the engine needs to know which logical
CPUs share a physical core (SMT siblings), which NUMA node each core sits on and how much
memory each node holds. Everything here is read from files under a sysfs root (default
``/sys``) and a proc root (default ``/proc``) so tests can point it at fake trees:

  {sys}/devices/system/cpu/online                           "0-15"
  {sys}/devices/system/cpu/cpuN/topology/physical_package_id
  {sys}/devices/system/cpu/cpuN/topology/core_id            (or thread_siblings_list)
  {sys}/devices/system/cpu/cpu0/cpufreq/scaling_governor
  {sys}/devices/system/node/nodeN/cpulist, .../meminfo      (absent -> one node, all CPUs)
  {proc}/cpuinfo                                            "model name : ..."
  {proc}/meminfo                                            MemTotal, MemAvailable
  {proc}/self/status                                        Cpus_allowed_list (taskset, cpuset)

A tree given as ``--sysfs-root TREE`` may be the sysfs root itself (``TREE/devices/...``) or a
folder holding ``sys/`` and ``proc/`` side by side; the proc root defaults to the sibling
``proc`` folder of a non-default sysfs root, so a fake tree never mixes with this machine.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

DEFAULT_SYSFS_ROOT = "/sys"
DEFAULT_PROC_ROOT = "/proc"

# The CPUs this process was allowed when the engine was imported (taskset, cgroup cpuset).
# Read once: threads.apply() later narrows the affinity of every thread to the plan's CPUs,
# and a re-plan (say, from 4 to 8 threads) must still see the CPUs the person gave us.
STARTUP_CPUS: frozenset[int] = frozenset(os.sched_getaffinity(0))


# ---- Data ------------------------------------------------------------------


@dataclass(frozen=True)
class Core:
    """One physical core: the logical CPUs (SMT siblings) that share its execution units."""

    package: int               # socket (physical_package_id)
    core_id: int               # core_id within the package
    cpus: tuple[int, ...]      # logical CPU numbers, ascending; len > 1 means SMT


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpus: tuple[int, ...]      # online logical CPUs of this node, ascending
    mem_total_bytes: int
    mem_free_bytes: int


@dataclass(frozen=True)
class Topology:
    cpu_model: str
    online_cpus: tuple[int, ...]
    allowed_cpus: tuple[int, ...]      # online CPUs this process may run on
    cores: tuple[Core, ...]            # sorted by first CPU
    nodes: tuple[NumaNode, ...]        # sorted by id; never empty
    governor: str | None               # cpu0's cpufreq governor; None without cpufreq
    mem_total_bytes: int
    mem_available_bytes: int
    sysfs_root: str
    proc_root: str

    @property
    def sockets(self) -> int:
        return len({c.package for c in self.cores})

    @property
    def physical_cores(self) -> int:
        return len(self.cores)

    @property
    def logical_cores(self) -> int:
        return len(self.online_cpus)

    @property
    def smt(self) -> bool:
        return any(len(c.cpus) > 1 for c in self.cores)

    @property
    def is_live(self) -> bool:
        """True when this describes the machine the process runs on (not a fake tree)."""
        return (os.path.realpath(self.sysfs_root) == DEFAULT_SYSFS_ROOT
                and os.path.realpath(self.proc_root) == DEFAULT_PROC_ROOT)

    def core_of(self, cpu: int) -> Core:
        for core in self.cores:
            if cpu in core.cpus:
                return core
        raise KeyError(f"CPU {cpu} is not online on this machine")

    def node_of(self, cpu: int) -> int:
        for node in self.nodes:
            if cpu in node.cpus:
                return node.id
        return self.nodes[0].id   # a CPU sysfs lists on no node: count it with the first


# ---- Parsing helpers -------------------------------------------------------


def parse_cpulist(text: str) -> tuple[int, ...]:
    """'0-3,8-11' -> (0, 1, 2, 3, 8, 9, 10, 11). Empty text -> ()."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return tuple(sorted(cpus))


def format_cpulist(cpus) -> str:
    """(0, 1, 2, 3, 8) -> '0-3,8': the inverse of parse_cpulist."""
    cpus = sorted(set(cpus))
    parts: list[str] = []
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        parts.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(parts)


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except OSError:
        return None


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return int(text.strip()) if text is not None else None
    except ValueError:
        return None


def _meminfo_bytes(text: str | None, key: str) -> int | None:
    """'MemTotal:  123 kB' (or a node's 'Node 0 MemTotal:  123 kB') -> 123 * 1024."""
    if not text:
        return None
    m = re.search(rf"\b{key}:\s*(\d+)\s*kB", text)
    return int(m.group(1)) * 1024 if m else None


def resolve_roots(sysfs_root: str | os.PathLike | None = None,
                  proc_root: str | os.PathLike | None = None) -> tuple[Path, Path]:
    """The (sysfs, proc) roots to read. A non-default sysfs root brings its sibling proc."""
    sys_path = Path(sysfs_root or DEFAULT_SYSFS_ROOT)
    if not (sys_path / "devices").exists() and (sys_path / "sys" / "devices").exists():
        sys_path = sys_path / "sys"         # a tree holding sys/ and proc/ side by side
    if proc_root is not None:
        return sys_path, Path(proc_root)
    if os.path.realpath(sys_path) == DEFAULT_SYSFS_ROOT:
        return sys_path, Path(DEFAULT_PROC_ROOT)
    return sys_path, sys_path.parent / "proc"


# ---- Reading ---------------------------------------------------------------


def _cpu_model(proc: Path) -> str:
    text = _read(proc / "cpuinfo") or ""
    for key in ("model name", "Model Name", "cpu model", "Processor", "uarch"):
        m = re.search(rf"^{key}\s*:\s*(.+)$", text, re.MULTILINE)
        if m and m.group(1).strip():
            return m.group(1).strip()
    return "unknown"


def _online_cpus(cpu_dir: Path) -> tuple[int, ...]:
    text = _read(cpu_dir / "online")
    if text is not None and text.strip():
        return parse_cpulist(text)
    found = sorted(int(m.group(1)) for p in cpu_dir.glob("cpu[0-9]*")
                   if (m := re.fullmatch(r"cpu(\d+)", p.name)))
    return tuple(found) or (0,)


def _cores(cpu_dir: Path, online: tuple[int, ...]) -> tuple[Core, ...]:
    """Group online CPUs into physical cores by (package, core_id).

    Without core_id, thread_siblings_list groups them; without either (some VMs), every CPU
    is its own core on package 0.
    """
    groups: dict[tuple, list[int]] = {}
    package_of: dict[tuple, int] = {}
    for cpu in online:
        topo = cpu_dir / f"cpu{cpu}" / "topology"
        package = _read_int(topo / "physical_package_id")
        package = 0 if package is None or package < 0 else package
        core_id = _read_int(topo / "core_id")
        if core_id is not None:
            key: tuple = (package, "core", core_id)
        else:
            siblings = _read(topo / "thread_siblings_list")
            sib = tuple(c for c in parse_cpulist(siblings) if c in online) if siblings else ()
            key = (package, "siblings", sib or (cpu,))
        groups.setdefault(key, []).append(cpu)
        package_of[key] = package
    cores = []
    for key, cpus in groups.items():
        core_id = key[2] if key[1] == "core" else min(cpus)
        cores.append(Core(package=package_of[key], core_id=core_id, cpus=tuple(sorted(cpus))))
    return tuple(sorted(cores, key=lambda c: c.cpus[0]))


def _nodes(node_dir: Path, online: tuple[int, ...], mem_total: int, mem_free: int) -> tuple[NumaNode, ...]:
    nodes = []
    for path in node_dir.glob("node[0-9]*"):
        m = re.fullmatch(r"node(\d+)", path.name)
        if not m:
            continue
        cpus = tuple(c for c in parse_cpulist(_read(path / "cpulist") or "") if c in online)
        meminfo = _read(path / "meminfo")
        nodes.append(NumaNode(
            id=int(m.group(1)), cpus=cpus,
            mem_total_bytes=_meminfo_bytes(meminfo, "MemTotal") or 0,
            mem_free_bytes=_meminfo_bytes(meminfo, "MemFree") or 0,
        ))
    if not nodes:
        # No NUMA information at all (CONFIG_NUMA off, some containers): one node holding
        # every CPU and all of /proc/meminfo's memory.
        return (NumaNode(id=0, cpus=online, mem_total_bytes=mem_total, mem_free_bytes=mem_free),)
    return tuple(sorted(nodes, key=lambda n: n.id))


def _allowed_cpus(proc: Path, online: tuple[int, ...]) -> tuple[int, ...]:
    if os.path.realpath(proc) == DEFAULT_PROC_ROOT:
        allowed = STARTUP_CPUS
    else:
        status = _read(proc / "self" / "status") or ""
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.MULTILINE)
        allowed = frozenset(parse_cpulist(m.group(1))) if m else frozenset(online)
    return tuple(c for c in online if c in allowed) or online


def read_topology(sysfs_root: str | os.PathLike | None = None,
                  proc_root: str | os.PathLike | None = None) -> Topology:
    """Read the topology of this machine, or of the fake tree at ``sysfs_root``."""
    sys_path, proc = resolve_roots(sysfs_root, proc_root)
    cpu_dir = sys_path / "devices" / "system" / "cpu"
    online = _online_cpus(cpu_dir)
    meminfo = _read(proc / "meminfo")
    mem_total = _meminfo_bytes(meminfo, "MemTotal") or 0
    mem_available = _meminfo_bytes(meminfo, "MemAvailable")
    if mem_available is None:
        mem_available = _meminfo_bytes(meminfo, "MemFree") or 0
    nodes = _nodes(sys_path / "devices" / "system" / "node", online, mem_total, mem_available)
    if mem_total == 0:     # no /proc/meminfo in the tree: the nodes' memory is all we know
        mem_total = sum(n.mem_total_bytes for n in nodes)
        mem_available = sum(n.mem_free_bytes for n in nodes)
    governor = _read(cpu_dir / "cpu0" / "cpufreq" / "scaling_governor")
    return Topology(
        cpu_model=_cpu_model(proc),
        online_cpus=online,
        allowed_cpus=_allowed_cpus(proc, online),
        cores=_cores(cpu_dir, online),
        nodes=nodes,
        governor=(governor.strip() or None) if governor is not None else None,
        mem_total_bytes=mem_total,
        mem_available_bytes=mem_available,
        sysfs_root=str(sys_path),
        proc_root=str(proc),
    )
