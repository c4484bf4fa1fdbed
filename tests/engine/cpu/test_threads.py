"""Thread plans against fake topologies; pinning proven on this machine in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numba
import numpy as np
import pytest

from app.engine.cpu.numa import empty_first_touched, first_touch, page_nodes
from app.engine.cpu.pinning import apply
from app.engine.cpu.plan import (
    NodeRows,
    NodeShare,
    ThreadPlan,
    llamacpp_kwargs,
    node_row_ranges,
    plan_threads,
    thread_row_ranges,
)
from app.engine.cpu.topology import read_topology
from tests.engine.fake_sysfs import (
    FakeNode,
    GiB_KB,
    no_numa_machine,
    one_node_vm,
    two_socket_server,
)

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def server(tmp_path):
    return read_topology(two_socket_server(tmp_path))


# ---- Plans -------------------------------------------------------------------


def test_default_plan_is_one_thread_per_physical_core_on_both_nodes(server):
    assert plan_threads(server) == ThreadPlan(
        count=8, cpus=(0, 1, 2, 3, 4, 5, 6, 7), numa_policy="distribute",
        per_node=(NodeShare(0, (0, 1, 2, 3)), NodeShare(1, (4, 5, 6, 7))),
        machine_nodes=2, shared_cores=0,
        plan="8 threads, one per physical core; NUMA distribute: node 0: CPUs 0-3; node 1: CPUs 4-7",
    )
    # one CPU of each core: no two threads are SMT siblings
    plan = plan_threads(server)
    assert sorted(server.core_of(c).cpus for c in plan.cpus) == sorted(c.cpus for c in server.cores)


def test_distribute_spreads_few_threads_over_all_nodes(server):
    plan = plan_threads(server, threads=3)
    assert (plan.cpus, plan.per_node) == ((0, 1, 4), (NodeShare(0, (0, 1)), NodeShare(1, (4,))))
    assert plan.plan == "3 threads on 3 of 8 physical cores; NUMA distribute: node 0: CPUs 0-1; node 1: CPU 4"


def test_isolate_uses_the_cores_of_the_node_with_most_free_memory(server, tmp_path):
    plan = plan_threads(server, numa_policy="isolate")
    assert (plan.count, plan.cpus, plan.per_node) == (4, (4, 5, 6, 7), (NodeShare(1, (4, 5, 6, 7)),))
    assert plan.plan == "4 threads, one per physical core; NUMA isolate: node 1: CPUs 4-7"
    more_on_node0 = read_topology(two_socket_server(
        tmp_path / "b", nodes=[FakeNode(0, "0-3,8-11", 64 * GiB_KB, 50 * GiB_KB),
                               FakeNode(1, "4-7,12-15", 64 * GiB_KB, 10 * GiB_KB)]))
    assert plan_threads(more_on_node0, numa_policy="isolate").cpus == (0, 1, 2, 3)


def test_more_threads_than_cores_use_smt_siblings_last(server):
    plan = plan_threads(server, threads=16)
    assert plan.cpus == (0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15)
    assert plan.shared_cores == 8
    assert plan.plan == ("16 threads on 8 physical cores, 8 of them running two threads on SMT siblings; "
                         "NUMA distribute: node 0: CPUs 0-3,8-11; node 1: CPUs 4-7,12-15")
    ten = plan_threads(server, threads=10)
    assert (ten.cpus, ten.shared_cores) == ((0, 1, 2, 3, 8, 4, 5, 6, 7, 12), 2)
    # isolate never leaves its node: 32 threads are capped at the node's 8 logical CPUs
    iso = plan_threads(server, threads=32, numa_policy="isolate")
    assert (iso.count, iso.cpus) == (8, (4, 5, 6, 7, 12, 13, 14, 15))
    assert "asked for 32; there are 8 logical CPUs to use" in iso.plan


def test_policy_none_takes_cores_in_cpu_order(server):
    assert plan_threads(server, threads=3, numa_policy="none").cpus == (0, 1, 2)
    assert plan_threads(server, numa_policy="none").cpus == tuple(range(8))


def test_plans_on_one_node(tmp_path):
    vm = read_topology(one_node_vm(tmp_path / "vm"))
    assert plan_threads(vm) == ThreadPlan(
        count=2, cpus=(0, 1), numa_policy="distribute", per_node=(NodeShare(0, (0, 1)),),
        machine_nodes=1, shared_cores=0, plan="2 threads, one per physical core; CPUs 0-1 (one NUMA node)")
    bare = read_topology(no_numa_machine(tmp_path / "bare"))
    assert plan_threads(bare).cpus == (0, 1)                 # one CPU of each of the 2 cores
    assert plan_threads(bare, numa_policy="isolate").cpus == (0, 1)
    assert plan_threads(bare, threads=4).shared_cores == 2


def test_plan_honours_the_allowed_cpus(tmp_path):
    topo = read_topology(two_socket_server(tmp_path, status="Cpus_allowed_list:\t2-5,10-13\n"))
    plan = plan_threads(topo)
    assert (plan.cpus, plan.per_node) == ((2, 3, 4, 5), (NodeShare(0, (2, 3)), NodeShare(1, (4, 5))))


def test_bad_arguments(server):
    with pytest.raises(ValueError, match="unknown NUMA policy 'spread'"):
        plan_threads(server, numa_policy="spread")
    with pytest.raises(ValueError, match="threads must be 0"):
        plan_threads(server, threads=-1)


def test_llamacpp_kwargs(server, tmp_path):
    assert llamacpp_kwargs(plan_threads(server)) == {"n_threads": 8, "numa": 1}
    assert llamacpp_kwargs(plan_threads(server, numa_policy="isolate")) == {"n_threads": 4, "numa": 2}
    assert llamacpp_kwargs(plan_threads(server, 6, "none")) == {"n_threads": 6, "numa": 0}
    vm = read_topology(one_node_vm(tmp_path / "vm"))
    assert llamacpp_kwargs(plan_threads(vm)) == {"n_threads": 2, "numa": 0}   # one node: nothing to do


# ---- NUMA placement arithmetic ----------------------------------------------


def test_thread_row_ranges_match_numbas_schedule():
    @numba.njit(parallel=True)
    def owner(n):
        out = np.empty(n, np.int64)
        for i in numba.prange(n):
            out[i] = numba.get_thread_id()
        return out

    n_threads = numba.get_num_threads()
    for n in (1, 2, 7, 17, 100, 1001):
        got = owner(n)
        expected = np.empty(n, np.int64)
        for t, (start, stop) in enumerate(thread_row_ranges(n, n_threads)):
            expected[start:stop] = t
        assert got.tolist() == expected.tolist(), n
    assert thread_row_ranges(17, 4) == ((0, 5), (5, 9), (9, 13), (13, 17))
    assert thread_row_ranges(3, 4) == ((0, 1), (1, 2), (2, 3), (3, 3))


def test_node_row_ranges_split_rows_between_nodes(server):
    assert node_row_ranges(1000, plan_threads(server)) == (NodeRows(0, 0, 500), NodeRows(1, 500, 1000))
    # 1001 rows over 8 threads: 126 + 7 x 125; node 0 has threads 0-3
    assert node_row_ranges(1001, plan_threads(server)) == (NodeRows(0, 0, 501), NodeRows(1, 501, 1001))
    # 3 threads, two on node 0: rows 4 + 3 on node 0, 3 on node 1
    assert node_row_ranges(10, plan_threads(server, threads=3)) == (NodeRows(0, 0, 7), NodeRows(1, 7, 10))
    # KV blocks: 6 blocks over 8 threads leave threads 6, 7 (node 1) without a block
    assert node_row_ranges(6, plan_threads(server)) == (NodeRows(0, 0, 4), NodeRows(1, 4, 6))
    # policy none with SMT: CPUs in number order alternate nodes every four threads
    assert node_row_ranges(16, plan_threads(server, 16, "none")) == (
        NodeRows(0, 0, 4), NodeRows(1, 4, 8), NodeRows(0, 8, 12), NodeRows(1, 12, 16))


def test_first_touch_is_a_no_op_on_one_node_and_zeroes_when_forced():
    plan = plan_threads(read_topology())
    a = np.full((64, 4096), 7, np.uint8)          # (rows, bytes) one page per row
    if len(plan.per_node) == 1:
        assert first_touch(a, plan) is a and int(a.min()) == 7
    assert first_touch(a, plan, force=True) is a
    assert not a.any()
    b = empty_first_touched((10, 3), np.float32, plan, axis=1)
    assert b.shape == (10, 3) and not b.any()


def test_first_touched_pages_are_on_a_node_that_runs_threads():
    plan = plan_threads(read_topology())
    a = np.empty((256, 4096), np.uint8)
    try:
        nodes = page_nodes(first_touch(a, plan, force=True))
    except OSError as e:                    # a kernel without NUMA support
        pytest.skip(str(e))
    assert set(nodes.tolist()) <= set(plan.nodes)


def test_apply_refuses_a_plan_from_another_machine(server):
    if set(range(8)) <= set(os.sched_getaffinity(0)):
        pytest.skip("this machine has CPUs 0-7")
    with pytest.raises(ValueError, match="made from another machine's topology"):
        apply(plan_threads(server))


# ---- Pinning, in a subprocess so this process stays unpinned -----------------

PIN_SCRIPT = textwrap.dedent("""
    import ctypes, glob, json, os, sys
    # A child inherits its parent's affinity: the test process may have been pinned by an
    # engine test that ran before. Start from every online CPU, as a fresh `ellm` would.
    os.sched_setaffinity(0, range(os.cpu_count()))
    import threading
    import numba, numpy as np
    from app.engine.cpu.pinning import apply, current_plan, unpin
    from app.engine.cpu.plan import plan_threads
    from app.engine.cpu.topology import parse_cpulist, read_topology

    sched_getcpu = ctypes.CDLL(None).sched_getcpu
    sched_getcpu.argtypes = []
    sched_getcpu.restype = ctypes.c_int

    @numba.njit(parallel=True)
    def where(n_threads):
        # (n_threads,) the CPU each worker ran its chunk on
        out = np.full(n_threads, -1, np.int64)
        for i in numba.prange(n_threads):
            out[numba.get_thread_id()] = sched_getcpu()
        return out

    def tasks():
        out = {}
        for status in glob.glob("/proc/self/task/*/status"):
            for line in open(status):
                if line.startswith("Cpus_allowed_list:"):
                    out[status.split("/")[4]] = list(parse_cpulist(line.split(":", 1)[1]))
        return out

    # each argument: a thread count to plan and apply, or "unpin" (undo the last apply)
    results, plan = [], None
    for step in sys.argv[1:]:
        if step == "unpin":
            unpin(plan.count)
            results.append({"numba_threads": numba.get_num_threads(), "tasks": tasks(),
                            "plan_forgotten": current_plan() is None})
            continue
        plan = plan_threads(read_topology(), threads=int(step))
        applied = apply(plan)
        results.append({"plan": list(plan.cpus), "numba_threads": numba.get_num_threads(),
                         "layer": applied.threading_layer, "pinned": applied.pinned,
                         "notes": list(applied.notes), "tasks": tasks(),
                         "caller": threading.get_native_id(),
                         "ran_on": [where(plan.count).tolist() for _ in range(5)]})
    print(json.dumps(results))
""")


def run_pin_script(*steps: int | str, env_extra=None) -> list[dict]:
    env = dict(os.environ, **(env_extra or {}))
    proc = subprocess.run([sys.executable, "-c", PIN_SCRIPT, *map(str, steps)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_apply_restricts_every_thread_and_pins_each_worker():
    if len(plan_threads(read_topology()).cpus) < 2:
        pytest.skip("needs two physical cores")
    # one thread first: the whole process is held on one CPU; then the default plan
    one, full = run_pin_script(1, 0)
    cpu = one["plan"][0]
    assert one["numba_threads"] == 1
    assert set(map(tuple, one["tasks"].values())) == {(cpu,)}, one["tasks"]
    assert one["ran_on"] == [[cpu]] * 5

    plan = full["plan"]
    assert full["numba_threads"] == len(plan) >= 2
    assert full["notes"] == []
    assert [c for _, c in full["pinned"]] == plan
    pinned_tids = {str(tid): c for tid, c in full["pinned"]}
    assert len(pinned_tids) == len(plan)                    # one thread per worker
    for tid, cpus in full["tasks"].items():
        if tid in pinned_tids:
            assert cpus == [pinned_tids[tid]]               # each worker on its own CPU
        else:
            assert set(cpus) <= set(plan)                   # every other thread inside the plan
    # and the work of worker t really runs on plan.cpus[t], every time
    assert full["ran_on"] == [plan] * 5


def test_the_caller_is_worker_0_on_its_own_cpu():
    """With the omp layer the thread that calls a kernel runs chunk 0 itself: it must be
    pinned like any worker, to plan.cpus[0], and no other pinned worker may share its CPU
    (two busy threads on one core while another idles halves the speed)."""
    if len(plan_threads(read_topology()).cpus) < 2:
        pytest.skip("needs two physical cores")
    (result,) = run_pin_script(0)
    if result["layer"] != "omp":
        pytest.skip(f"numba's {result['layer']} layer runs kernels on its own pool, not in the caller")
    plan, caller = result["plan"], str(result["caller"])
    pinned = {str(tid): cpu for tid, cpu in result["pinned"]}
    assert pinned.get(caller) == plan[0], (caller, result["pinned"], result["notes"])
    assert result["tasks"][caller] == [plan[0]]
    assert sorted(pinned.values()) == sorted(plan)          # one CPU each, all distinct


def test_unpin_gives_every_thread_its_cpus_back_and_apply_pins_again():
    """A pinned run leaves its caller on one CPU; an unpinned run after it in the same process
    (ellm bench --pin on,off) must really run unpinned, and a pinned one after that pinned."""
    if len(plan_threads(read_topology()).cpus) < 2:
        pytest.skip("needs two physical cores")
    pinned, unpinned, again = run_pin_script(0, "unpin", 0)
    everywhere = list(range(os.cpu_count()))                # the script starts on every CPU
    assert len(pinned["pinned"]) == len(pinned["plan"]) >= 2
    assert unpinned["numba_threads"] == len(pinned["plan"])
    assert unpinned["plan_forgotten"]
    assert set(unpinned["tasks"]) >= {str(tid) for tid, _ in pinned["pinned"]}
    assert all(cpus == everywhere for cpus in unpinned["tasks"].values()), unpinned["tasks"]
    # the same plan again in the same thread: pinned afresh, not answered from the cache
    assert again["notes"] == []
    assert [c for _, c in again["pinned"]] == again["plan"] == pinned["plan"]
    assert all(again["tasks"][str(tid)] == [cpu] for tid, cpu in again["pinned"]), again["tasks"]
    assert again["ran_on"] == [again["plan"]] * 5


def test_apply_pins_with_the_workqueue_layer_too():
    if len(plan_threads(read_topology()).cpus) < 2:
        pytest.skip("needs two physical cores")
    (result,) = run_pin_script(0, env_extra={"NUMBA_THREADING_LAYER": "workqueue"})
    assert result["layer"] == "workqueue"
    assert [c for _, c in result["pinned"]] == result["plan"]
    assert result["ran_on"] == [result["plan"]] * 5


COMPILE_AFTER_PIN = textwrap.dedent("""
    import os
    os.sched_setaffinity(0, range(os.cpu_count()))
    import numba, numpy as np          # before the engine, which then sets NUMBA_CACHE_DIR
    from app.engine.cpu.pinning import apply
    from app.engine.cpu.plan import plan_threads
    from app.engine.cpu.topology import read_topology

    apply(plan_threads(read_topology(), threads=1))

    @numba.njit(parallel=True)
    def numbered(n):                   # compiled now, after pinning, with numba's pool running
        out = np.zeros(n, np.int64)
        for i in numba.prange(n):
            out[i] = i
        return out

    print(int(numbered(8).sum()), numba.config.NUMBA_NUM_THREADS)
""")


def test_a_kernel_compiles_after_a_plan_narrowed_the_cpus():
    """numba re-reads its settings when a NUMBA_ variable changed, counting the CPUs the process
    may use: after a one-CPU plan it wanted one thread and refused to compile next to its running
    pool of two."""
    if len(plan_threads(read_topology()).cpus) < 2:
        pytest.skip("needs two physical cores")
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", "NUMBA_NUM_THREADS")}
    proc = subprocess.run([sys.executable, "-c", COMPILE_AFTER_PIN], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    total, threads = map(int, proc.stdout.split())
    assert total == 28 and threads == os.cpu_count()


def test_placed_empty_first_touches_each_nodes_rows_on_a_multi_node_plan(monkeypatch):
    import dataclasses

    from app.engine.cpu import numa

    plan = plan_threads(read_topology())
    assert numa.placed_empty(10, np.uint8, plan).shape == (10,)  # one node: plain np.empty
    touched = []
    monkeypatch.setattr(numa, "first_touch", lambda a, p, axis=0: touched.append((a.shape, p, axis)) or a)
    two_nodes = dataclasses.replace(plan, per_node=plan.per_node * 2)
    out = numa.placed_empty((64, 3), np.int8, two_nodes)
    assert out.shape == (64, 3) and touched == [((64, 3), two_nodes, 0)]


def test_repacked_weights_are_allocated_through_the_placement_hook(monkeypatch):
    from app.engine.quant import layout

    calls = []
    real = layout.placed_empty
    monkeypatch.setattr(layout, "placed_empty", lambda shape, dtype: calls.append(shape) or real(shape, dtype))
    plane = np.arange(40 * 6, dtype=np.uint8).reshape(40, 6)  # (n_out, k)
    flat = layout.tile_plane(plane)
    assert calls == [240]
    assert np.array_equal(layout.untile_plane(flat, 40, 6), plane)
