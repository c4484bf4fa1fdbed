"""Fake sysfs + procfs trees for topology tests: TREE/sys and TREE/proc side by side.

Three machines:
  two_socket_server  2 sockets x 4 cores x 2 SMT threads = 16 logical CPUs, numbered as Linux
                     does (CPU N and N+8 are siblings): node 0 = CPUs 0-3,8-11, node 1 = 4-7,12-15;
                     governor powersave; node 1 has more free memory.
  one_node_vm        2 CPUs, no SMT, one node, no cpufreq.
  no_numa_machine    4 CPUs as 2 cores x 2 SMT given only by thread_siblings_list (no core_id),
                     and no devices/system/node directory at all.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

GiB_KB = 1024 * 1024      # kB in a GiB, the unit of meminfo


@dataclass(frozen=True)
class FakeCpu:
    cpu: int
    package: int
    core_id: int | None          # None: no core_id file
    siblings: str                # thread_siblings_list


@dataclass(frozen=True)
class FakeNode:
    id: int
    cpulist: str
    total_kb: int
    free_kb: int


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def build_tree(root: Path, *, cpus: list[FakeCpu], nodes: list[FakeNode] | None, governor: str | None,
               model: str | None, mem_total_kb: int, mem_available_kb: int,
               status: str | None = None, numa_maps: str | None = None) -> Path:
    """Write the tree under ``root`` and return ``root`` (holding sys/ and proc/)."""
    sys_cpu = root / "sys" / "devices" / "system" / "cpu"
    online = ",".join(str(c.cpu) for c in cpus)
    _write(sys_cpu / "online", online + "\n")
    for c in cpus:
        topo = sys_cpu / f"cpu{c.cpu}" / "topology"
        _write(topo / "physical_package_id", f"{c.package}\n")
        if c.core_id is not None:
            _write(topo / "core_id", f"{c.core_id}\n")
        _write(topo / "thread_siblings_list", c.siblings + "\n")
        if governor is not None:
            _write(sys_cpu / f"cpu{c.cpu}" / "cpufreq" / "scaling_governor", governor + "\n")
    for n in nodes or []:
        node_dir = root / "sys" / "devices" / "system" / "node" / f"node{n.id}"
        _write(node_dir / "cpulist", n.cpulist + "\n")
        _write(node_dir / "meminfo",
               f"Node {n.id} MemTotal:       {n.total_kb} kB\n"
               f"Node {n.id} MemFree:        {n.free_kb} kB\n"
               f"Node {n.id} MemUsed:        {n.total_kb - n.free_kb} kB\n")
    if nodes is None:
        (root / "sys" / "devices" / "system").mkdir(parents=True, exist_ok=True)
    proc = root / "proc"
    cpuinfo = "".join(
        f"processor\t: {c.cpu}\nvendor_id\t: GenuineIntel\n"
        + (f"model name\t: {model}\n" if model else "")
        + f"physical id\t: {c.package}\n\n" for c in cpus)
    _write(proc / "cpuinfo", cpuinfo)
    _write(proc / "meminfo",
           f"MemTotal:       {mem_total_kb} kB\nMemFree:        {mem_available_kb // 2} kB\n"
           f"MemAvailable:   {mem_available_kb} kB\nBuffers:          1024 kB\n")
    _write(proc / "self" / "status", status if status is not None else
           f"Name:\tellm\nCpus_allowed_list:\t{online}\nMems_allowed_list:\t"
           f"{','.join(str(n.id) for n in nodes or [FakeNode(0, '', 0, 0)])}\n")
    if numa_maps is not None:
        _write(proc / "self" / "numa_maps", numa_maps)
    return root


XEON = "Intel(R) Xeon(R) Gold 6130 CPU @ 2.10GHz"


def two_socket_server(root: Path, **overrides) -> Path:
    cpus = []
    for cpu in range(16):
        core = cpu % 8            # 0-7: first thread of each core, 8-15: their siblings
        cpus.append(FakeCpu(cpu=cpu, package=core // 4, core_id=core % 4, siblings=f"{core},{core + 8}"))
    kwargs = dict(
        cpus=cpus,
        nodes=[FakeNode(0, "0-3,8-11", 64 * GiB_KB, 20 * GiB_KB),
               FakeNode(1, "4-7,12-15", 64 * GiB_KB, 40 * GiB_KB)],
        governor="powersave", model=XEON,
        mem_total_kb=128 * GiB_KB, mem_available_kb=60 * GiB_KB,
    )
    kwargs.update(overrides)
    return build_tree(root, **kwargs)


def one_node_vm(root: Path, **overrides) -> Path:
    kwargs = dict(
        cpus=[FakeCpu(0, 0, 0, "0"), FakeCpu(1, 0, 1, "1")],
        nodes=[FakeNode(0, "0-1", 8 * GiB_KB, 5 * GiB_KB)],
        governor=None, model="AMD EPYC Processor",
        mem_total_kb=8 * GiB_KB, mem_available_kb=6 * GiB_KB,
    )
    kwargs.update(overrides)
    return build_tree(root, **kwargs)


def no_numa_machine(root: Path, **overrides) -> Path:
    kwargs = dict(
        cpus=[FakeCpu(0, 0, None, "0,2"), FakeCpu(1, 0, None, "1,3"),
              FakeCpu(2, 0, None, "0,2"), FakeCpu(3, 0, None, "1,3")],
        nodes=None, governor="performance", model=None,
        mem_total_kb=16 * GiB_KB, mem_available_kb=12 * GiB_KB,
    )
    kwargs.update(overrides)
    return build_tree(root, **kwargs)
