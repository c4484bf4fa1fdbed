"""`ellm hw` on fake sysfs trees and on this machine."""
from __future__ import annotations

from tests.engine.fake_sysfs import no_numa_machine, one_node_vm, two_socket_server


def test_two_socket_server_plan(cli, tmp_path):
    tree = two_socket_server(tmp_path / "server")
    rc, r, _ = cli("--sysfs-root", str(tree), "hw", "--json", json_out=True)
    assert rc == 0
    assert (r["physical_cores"], r["logical_cores"], r["sockets"]) == (8, 16, 2)
    assert [n["id"] for n in r["numa_nodes"]] == [0, 1]
    t = r["threads"]
    assert t["count"] == 8 and t["numa_policy"] == "distribute"
    assert sorted(t["cpus"]) == list(range(8)), "one CPU of each core, never an SMT sibling (8-15)"
    node_cpus = {n["id"]: set(n["cpus"]) for n in r["numa_nodes"]}
    assert set(t["cpus"]) & node_cpus[0] and set(t["cpus"]) & node_cpus[1], "distribute covers both nodes"
    assert r["kv"]["bytes_per_token"] == 2 * 30 * 3 * 64 * 2
    assert r["bandwidth_gb_s"] is None and r["weight_stream_gb_s"] is None  # never probed on a fake tree
    assert any("powersave" in w for w in r["warnings"])


def test_environment_variable_and_other_trees(cli, tmp_path, monkeypatch):
    monkeypatch.setenv("ELLM_SYSFS_ROOT", str(one_node_vm(tmp_path / "vm")))
    rc, r, _ = cli("hw", "--json", json_out=True)
    assert rc == 0 and len(r["numa_nodes"]) == 1 and r["threads"]["count"] == r["physical_cores"]
    monkeypatch.setenv("ELLM_SYSFS_ROOT", str(no_numa_machine(tmp_path / "flat")))
    rc, r, _ = cli("hw", "--json", json_out=True)
    assert rc == 0 and len(r["numa_nodes"]) == 1 and r["numa_nodes"][0]["cpus"]


def test_smt_request_warns_and_text_output(cli, tmp_path):
    tree = two_socket_server(tmp_path / "server")
    rc, out, _ = cli("--sysfs-root", str(tree), "hw", "--threads", "16")
    assert rc == 0 and "Threads" in out and "SMT" in out


def test_missing_tree_is_an_error(cli, tmp_path):
    rc, _, err = cli("--sysfs-root", str(tmp_path / "nope"), "hw", "--json")
    assert rc == 1 and "no such sysfs folder" in err


def test_this_machine(cli):
    rc, r, _ = cli("hw", "--json", "--no-probe", json_out=True)
    assert rc == 0
    assert {"cpu_model", "sockets", "physical_cores", "logical_cores", "numa_nodes", "governor", "bandwidth_gb_s",
            "weight_stream_gb_s", "threads", "kv", "warnings"} <= set(r)
    assert {"count", "cpus", "numa_policy", "plan"} <= set(r["threads"])
    assert {"bytes_per_token", "max_context", "recommended_context"} <= set(r["kv"])
