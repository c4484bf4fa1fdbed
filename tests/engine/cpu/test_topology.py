"""Topology read from fake sysfs/proc trees (tests/engine/fake_sysfs.py) and from this machine."""
from __future__ import annotations

import os

from app.engine.cpu.topology import (
    Core,
    NumaNode,
    Topology,
    format_cpulist,
    parse_cpulist,
    read_topology,
    resolve_roots,
)
from tests.engine.fake_sysfs import (
    XEON,
    no_numa_machine,
    one_node_vm,
    two_socket_server,
)

GiB = 1 << 30


def test_parse_and_format_cpulist():
    assert parse_cpulist("0-3,8-11\n") == (0, 1, 2, 3, 8, 9, 10, 11)
    assert parse_cpulist("5") == (5,)
    assert parse_cpulist("") == ()
    assert parse_cpulist("3,1,2") == (1, 2, 3)
    assert format_cpulist((0, 1, 2, 3, 8, 9, 10, 11)) == "0-3,8-11"
    assert format_cpulist([4, 0, 2]) == "0,2,4"
    assert format_cpulist(()) == ""


def test_two_socket_server(tmp_path):
    topo = read_topology(two_socket_server(tmp_path) / "sys")
    assert topo == Topology(
        cpu_model=XEON,
        online_cpus=tuple(range(16)),
        allowed_cpus=tuple(range(16)),
        cores=(Core(0, 0, (0, 8)), Core(0, 1, (1, 9)), Core(0, 2, (2, 10)), Core(0, 3, (3, 11)),
               Core(1, 0, (4, 12)), Core(1, 1, (5, 13)), Core(1, 2, (6, 14)), Core(1, 3, (7, 15))),
        nodes=(NumaNode(0, (0, 1, 2, 3, 8, 9, 10, 11), 64 * GiB, 20 * GiB),
               NumaNode(1, (4, 5, 6, 7, 12, 13, 14, 15), 64 * GiB, 40 * GiB)),
        governor="powersave",
        mem_total_bytes=128 * GiB,
        mem_available_bytes=60 * GiB,
        sysfs_root=str(tmp_path / "sys"),
        proc_root=str(tmp_path / "proc"),
    )
    assert (topo.sockets, topo.physical_cores, topo.logical_cores, topo.smt) == (2, 8, 16, True)
    assert [topo.node_of(c) for c in (0, 4, 8, 15)] == [0, 1, 0, 1]
    assert topo.core_of(12) == Core(1, 0, (4, 12))
    assert not topo.is_live


def test_one_node_vm(tmp_path):
    topo = read_topology(one_node_vm(tmp_path) / "sys")
    assert topo == Topology(
        cpu_model="AMD EPYC Processor", online_cpus=(0, 1), allowed_cpus=(0, 1),
        cores=(Core(0, 0, (0,)), Core(0, 1, (1,))),
        nodes=(NumaNode(0, (0, 1), 8 * GiB, 5 * GiB),),
        governor=None, mem_total_bytes=8 * GiB, mem_available_bytes=6 * GiB,
        sysfs_root=str(tmp_path / "sys"), proc_root=str(tmp_path / "proc"),
    )
    assert (topo.sockets, topo.physical_cores, topo.logical_cores, topo.smt) == (1, 2, 2, False)


def test_machine_without_numa_directory_is_one_node_with_all_cpus(tmp_path):
    root = no_numa_machine(tmp_path)
    assert not (root / "sys" / "devices" / "system" / "node").exists()
    topo = read_topology(root / "sys")
    assert topo == Topology(
        cpu_model="unknown",          # cpuinfo without a model name
        online_cpus=(0, 1, 2, 3), allowed_cpus=(0, 1, 2, 3),
        # no core_id files: cores come from thread_siblings_list
        cores=(Core(0, 0, (0, 2)), Core(0, 1, (1, 3))),
        # one node: every CPU, and /proc/meminfo's MemTotal / MemAvailable
        nodes=(NumaNode(0, (0, 1, 2, 3), 16 * GiB, 12 * GiB),),
        governor="performance", mem_total_bytes=16 * GiB, mem_available_bytes=12 * GiB,
        sysfs_root=str(root / "sys"), proc_root=str(root / "proc"),
    )


def test_tree_root_holding_sys_and_proc_is_accepted(tmp_path):
    root = two_socket_server(tmp_path)
    assert resolve_roots(root) == (root / "sys", root / "proc")
    assert read_topology(root) == read_topology(root / "sys")
    assert read_topology(root / "sys", proc_root=root / "proc") == read_topology(root)


def test_missing_proc_tree_falls_back(tmp_path):
    root = two_socket_server(tmp_path)
    topo = read_topology(root / "sys", proc_root=tmp_path / "nowhere")
    assert topo.cpu_model == "unknown"
    # memory from the nodes' meminfo when /proc/meminfo is missing
    assert (topo.mem_total_bytes, topo.mem_available_bytes) == (128 * GiB, 60 * GiB)
    assert topo.allowed_cpus == tuple(range(16))


def test_cpus_allowed_list_restricts_allowed_cpus(tmp_path):
    root = two_socket_server(tmp_path, status="Name:\tellm\nCpus_allowed_list:\t0-3,8-11\n")
    assert read_topology(root).allowed_cpus == (0, 1, 2, 3, 8, 9, 10, 11)


def test_offline_cpus_are_left_out(tmp_path):
    root = two_socket_server(tmp_path)
    (root / "sys" / "devices" / "system" / "cpu" / "online").write_text("0-7\n")
    topo = read_topology(root)
    assert topo.online_cpus == tuple(range(8))
    assert [c.cpus for c in topo.cores] == [(c,) for c in range(8)]
    assert [n.cpus for n in topo.nodes] == [(0, 1, 2, 3), (4, 5, 6, 7)]
    assert not topo.smt


def test_this_machine():
    topo = read_topology()
    assert topo.is_live
    assert set(os.sched_getaffinity(0)) <= set(topo.online_cpus)
    assert topo.logical_cores == len(topo.online_cpus) >= topo.physical_cores >= 1
    assert sorted(c for core in topo.cores for c in core.cpus) == list(topo.online_cpus)
    assert sorted(c for node in topo.nodes for c in node.cpus) == list(topo.online_cpus)
    assert topo.mem_total_bytes >= topo.mem_available_bytes > 0
