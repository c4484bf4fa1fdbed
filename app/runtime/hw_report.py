"""What this machine can do for decoding, and what to change: the data behind `ellm hw`.

Shared by the CLI (``ellm hw [--json]``) and the GUI's hardware panel. Everything comes from
the engine's topology, threads, bandwidth and kv_sizes modules; this module only gathers it into
one JSON-ready dict and turns what looks wrong into warnings a person can act on.
"""
from __future__ import annotations

import os
import re
from pathlib import Path

from app.engine.kv import sizes as kv_sizes
from app.engine.cpu.plan import llamacpp_kwargs, plan_threads
from app.engine.cpu.topology import Topology, format_cpulist, parse_cpulist, read_topology

GiB = 1 << 30

# Remote memory is worth a warning once this share of the process's pages, and this much, is
# on nodes its threads do not run on.
REMOTE_SHARE_WARN = 0.25
REMOTE_BYTES_WARN = 64 << 20


# ---- Public API -------------------------------------------------------------


def hardware_report(sysfs_root=None, proc_root=None, model_path=None, kv: str = "f16",
                    doc_tokens=(), threads: int = 0, numa_policy: str = "distribute",
                    probe_bandwidth: bool = True, context: int | None = None) -> dict:
    """The machine, the thread plan, the KV budget and warnings, as a JSON-ready dict.

    ``sysfs_root``/``proc_root`` point at another tree (tests, ``--sysfs-root``); the
    bandwidth probe only runs on the live machine (a fake tree's figure would be this
    machine's). ``context``: the context length the person asked for; without it the
    warning about fit uses the documents' wanted context (95th percentile + 20%).
    """
    topo = read_topology(sysfs_root, proc_root)
    plan = plan_threads(topo, threads, numa_policy)
    report = {
        "cpu_model": topo.cpu_model,
        "sockets": topo.sockets,
        "physical_cores": topo.physical_cores,
        "logical_cores": topo.logical_cores,
        "smt": topo.smt,
        "numa_nodes": [{"id": n.id, "cpus": list(n.cpus), "mem_bytes": n.mem_total_bytes,
                        "free_bytes": n.mem_free_bytes} for n in topo.nodes],
        "governor": topo.governor,
        "mem_total_bytes": topo.mem_total_bytes,
        "mem_available_bytes": topo.mem_available_bytes,
        "bandwidth_gb_s": None,
        "bandwidth": None,
        "weight_stream_gb_s": None,
        "weight_stream": None,
        "threads": {
            "count": plan.count, "requested": threads, "cpus": list(plan.cpus), "numa_policy": plan.numa_policy,
            "plan": plan.plan,
            "per_node": [{"node": s.node, "cpus": list(s.cpus)} for s in plan.per_node],
            "llamacpp": llamacpp_kwargs(plan),
        },
        "kv": _kv_section(topo, model_path, kv, doc_tokens, context),
        "sysfs_root": topo.sysfs_root,
        "proc_root": topo.proc_root,
        "warnings": [],
    }
    if probe_bandwidth and topo.is_live:
        from app.engine.cpu.bandwidth import probe_read_bandwidth
        probe = probe_read_bandwidth()
        report["bandwidth_gb_s"] = round(probe.best_gb_s, 2)
        report["bandwidth"] = {"best_gb_s": round(probe.best_gb_s, 2), "median_gb_s": round(probe.median_gb_s, 2),
                               "bytes": probe.nbytes, "repeats": probe.repeats, "threads": probe.threads}
        report.update(_weight_stream(plan.count))
    report["warnings"] = _warnings(topo, plan, report["kv"], Path(topo.proc_root))
    if "weight_stream_problem" in report:
        report["warnings"].append(report.pop("weight_stream_problem"))
    return report


def _weight_stream(threads: int) -> dict:
    """The weight kernels' streaming rate on ``threads`` threads (engine/quant/stream_probe.py) as
    report keys; a probe that cannot run (no memory for its matrices) leaves them None, with a warning."""
    from app.engine.quant.stream_probe import probe_weight_stream

    try:
        stream = probe_weight_stream(threads)
    except (MemoryError, RuntimeError, ValueError) as e:
        return {"weight_stream_problem": f"the weight-streaming probe could not run: {e}"}
    return {"weight_stream_gb_s": round(stream.best_gb_s, 2),
            "weight_stream": {"best_gb_s": round(stream.best_gb_s, 2), "median_gb_s": round(stream.median_gb_s, 2),
                              "bytes": stream.nbytes, "repeats": stream.repeats, "threads": stream.threads}}


def format_report(report: dict) -> str:
    """The text `ellm hw` prints."""
    nodes = "\n".join(
        f"  node {n['id']}: CPUs {format_cpulist(n['cpus'])}, {_gib(n['mem_bytes'])} GiB"
        for n in report["numa_nodes"])
    if report["bandwidth_gb_s"] is not None:
        b = report["bandwidth"]
        bandwidth = (f"{report['bandwidth_gb_s']:.1f} GB/s read (best of {b['repeats']}, median "
                     f"{b['median_gb_s']:.1f}, {b['threads']} threads, {b['bytes'] >> 20} MiB)")
    else:
        bandwidth = "not measured"
    if report.get("weight_stream_gb_s") is not None:
        d = report["weight_stream"]
        decode = (f"{report['weight_stream_gb_s']:.1f} GB/s of weights through the engine's Q4_K/Q6_K products, "
                  f"one token (best of {d['repeats']}, median {d['median_gb_s']:.1f}, {d['threads']} threads, "
                  f"{d['bytes'] >> 20} MiB): a ceiling of decode, which reaches ~80 % of it")
    else:
        decode = "not measured"
    kv = report["kv"]
    if kv["bytes_per_token"] is None:
        kv_text = "no model given"
    else:
        kv_text = (f"{kv['bytes_per_token']:,} bytes/token ({kv['setting']}); "
                   f"max context in free RAM {kv['max_context']:,} tokens; "
                   f"recommended {kv['recommended_context']:,}"
                   + (f" (documents want {kv['wanted_context']:,})" if kv.get("wanted_context") else "")
                   + f"; model trained for {kv['model_context_length']:,}")
    lines = [
        f"CPU         {report['cpu_model']}",
        f"Sockets     {report['sockets']}",
        f"Cores       {report['physical_cores']} physical, {report['logical_cores']} logical"
        + (" (SMT)" if report.get("smt") else ""),
        f"Memory      {_gib(report['mem_available_bytes'])} GiB free of {_gib(report['mem_total_bytes'])} GiB",
        f"NUMA nodes  {len(report['numa_nodes'])}",
        nodes,
        f"Governor    {report['governor'] or 'unknown (no cpufreq)'}",
        f"Bandwidth   {bandwidth}",
        f"Weights     {decode}",
        f"Threads     {report['threads']['plan']}",
        f"KV cache    {kv_text}",
    ]
    if report["warnings"]:
        lines.append("Warnings")
        lines.extend(f"  ! {w}" for w in report["warnings"])
    else:
        lines.append("Warnings    none")
    return "\n".join(lines)


# ---- KV budget ---------------------------------------------------------------


def _kv_section(topo: Topology, model_path, kv: str, doc_tokens, context: int | None) -> dict:
    kv_sizes.kv_spec(kv)                   # an unknown setting fails here, with the choices
    section = {"setting": kv, "bytes_per_token": None, "max_context": None, "recommended_context": None,
               "wanted_context": kv_sizes.wanted_context(doc_tokens), "requested_context": context,
               "model_context_length": None, "model_bytes": None, "free_bytes": topo.mem_available_bytes,
               "bytes_per_token_by_setting": None}
    if model_path is None:
        return section
    shape = kv_sizes.KVShape.from_gguf(model_path)
    bpt = kv_sizes.kv_bytes_per_token(shape, kv)
    model_bytes = os.path.getsize(model_path)
    max_ctx = kv_sizes.max_context(bpt, topo.mem_available_bytes, model_bytes)
    section.update(
        bytes_per_token=bpt, max_context=max_ctx,
        recommended_context=kv_sizes.recommended_context(doc_tokens, max_ctx, shape.context_length),
        model_context_length=shape.context_length, model_bytes=model_bytes,
        bytes_per_token_by_setting={k: kv_sizes.kv_bytes_per_token(shape, k) for k in kv_sizes.KV_SETTINGS},
    )
    return section


# ---- Warnings ----------------------------------------------------------------


def _warnings(topo: Topology, plan, kv: dict, proc: Path) -> list[str]:
    warnings: list[str] = []
    if plan.shared_cores:
        warnings.append(
            f"SMT siblings in use: {plan.count} threads on {topo.physical_cores} physical cores puts two threads "
            f"on {plan.shared_cores} cores, which share one core's load units and slow decode; "
            f"use {topo.physical_cores} threads (--threads 0 = one per physical core)")
    else:
        warnings.extend(_pinned_siblings(topo, proc))
    if topo.governor == "powersave":
        warnings.append("the CPU frequency governor is powersave, which keeps clocks low; switch to performance: "
                        "sudo cpupower frequency-set -g performance")
    warnings.extend(_remote_memory(topo, plan, proc))
    fit = _context_fit(kv)
    if fit:
        warnings.append(fit)
    return warnings


def _task_cpus(proc: Path) -> dict[str, tuple[int, ...]]:
    """Cpus_allowed_list of each thread of the process described by ``proc``/self."""
    out = {}
    for status in sorted((proc / "self" / "task").glob("*/status")):
        try:
            m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status.read_text(), re.MULTILINE)
        except OSError:
            continue
        if m:
            out[status.parent.name] = parse_cpulist(m.group(1))
    return out


def _pinned_siblings(topo: Topology, proc: Path) -> list[str]:
    """Threads already pinned (one CPU each) to two SMT siblings of one core."""
    by_core: dict[tuple[int, int], list[tuple[str, int]]] = {}
    for tid, cpus in _task_cpus(proc).items():
        if len(cpus) == 1 and cpus[0] in topo.online_cpus:
            core = topo.core_of(cpus[0])
            by_core.setdefault((core.package, core.core_id), []).append((tid, cpus[0]))
    out = []
    for pinned in by_core.values():
        if len({cpu for _, cpu in pinned}) > 1:
            desc = ", ".join(f"thread {tid} on CPU {cpu}" for tid, cpu in pinned)
            out.append(f"SMT siblings in use: {desc} share one physical core; "
                       "re-apply the thread plan (one thread per physical core)")
    return out


def _numa_maps_bytes(proc: Path) -> dict[int, int]:
    """Bytes of this process's memory on each node, from /proc/self/numa_maps."""
    try:
        text = (proc / "self" / "numa_maps").read_text()
    except OSError:
        return {}
    per_node: dict[int, int] = {}
    for line in text.splitlines():
        page_kb = re.search(r"kernelpagesize_kB=(\d+)", line)
        size = int(page_kb.group(1)) * 1024 if page_kb else 4096
        for node, pages in re.findall(r"\bN(\d+)=(\d+)", line):
            per_node[int(node)] = per_node.get(int(node), 0) + int(pages) * size
    return per_node


def _remote_memory(topo: Topology, plan, proc: Path) -> list[str]:
    if len(topo.nodes) <= 1:
        return []
    out = []
    thread_nodes = set(plan.nodes)
    nodes_text = ",".join(str(n) for n in sorted(thread_nodes))
    try:
        status = (proc / "self" / "status").read_text()
    except OSError:
        status = ""
    m = re.search(r"^Mems_allowed_list:\s*(\S+)", status, re.MULTILINE)
    if m:
        mems = set(parse_cpulist(m.group(1)))
        if mems and not thread_nodes <= mems:
            out.append(
                f"memory on a remote node: this process may only allocate on node(s) {format_cpulist(mems)} "
                f"(numactl --membind?) but its threads run on node(s) {nodes_text}; start it with "
                f"numactl --cpunodebind={nodes_text} --membind={nodes_text}, or without --membind")
    per_node = _numa_maps_bytes(proc)
    total = sum(per_node.values())
    remote = sum(b for n, b in per_node.items() if n not in thread_nodes)
    if total and remote >= REMOTE_BYTES_WARN and remote / total >= REMOTE_SHARE_WARN:
        where = ",".join(str(n) for n in sorted(n for n in per_node if n not in thread_nodes and per_node[n]))
        out.append(
            f"memory on a remote node: {remote / GiB:.1f} GiB of this process's {total / GiB:.1f} GiB is on "
            f"node(s) {where}, but its threads run on node(s) {nodes_text}; use --numa distribute, or "
            f"start it with numactl --cpunodebind={nodes_text} --membind={nodes_text}")
    if plan.numa_policy == "none" and len(thread_nodes) > 1:
        out.append(
            f"threads span NUMA nodes {nodes_text} with NUMA policy none: memory lands wherever it is first "
            "touched, so many reads cross to the other node; use --numa distribute (or isolate)")
    return out


def _context_fit(kv: dict) -> str | None:
    """A warning when the context asked for (or the documents want) does not fit in free RAM."""
    target = kv["requested_context"] or kv["wanted_context"]
    if kv["bytes_per_token"] is None or not target or target <= kv["max_context"]:
        return None
    bpt, free, model = kv["bytes_per_token"], kv["free_bytes"], kv["model_bytes"]
    kv_bytes = bpt * target
    margin = kv_sizes.safety_margin(free)
    needed = kv_bytes + model + margin
    source = "asked for" if kv["requested_context"] else "the documents need (95th percentile + 20%)"
    advice = f"use at most {kv['max_context']:,} tokens"
    smaller = [name for name, b in kv["bytes_per_token_by_setting"].items()
               if b < bpt and target <= kv_sizes.max_context(b, free, model)]
    if smaller:
        advice += f", or KV setting {smaller[0]} which fits {target:,} tokens"
    advice += ", or free memory by closing other programs"
    return (f"context will not fit in free RAM: the {target:,}-token context {source} needs "
            f"{_gib(needed)} GiB ({_gib(kv_bytes)} GiB KV cache at {bpt:,} bytes/token ({kv['setting']}) "
            f"+ {_gib(model)} GiB model + {_gib(margin)} GiB margin), but only {_gib(free)} GiB is free; {advice}")


def _gib(n: int | None) -> str:
    return "?" if n is None else f"{n / GiB:.1f}"
