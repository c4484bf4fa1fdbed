"""CPU slots: several batch workers on one machine, each on physical cores of its own.

Each worker plans its threads as the engine always does (app/engine/cpu/plan.py: one thread
per physical core of the CPUs the process may use) and eLLM's engine pins them. Two workers
on one machine would both plan, and pin to, the same first cores. So before its engine is
imported a worker claims a slot on its machine (an exclusive lock on a file; the lock goes
with the process, so a killed worker frees its slot for the one Ray restarts) and narrows
its own CPU affinity to the slot's cores: the engine's topology then sees only those
(topology.STARTUP_CPUS is read when the engine is imported, which is why this module reads
/sys itself instead of through app/engine/cpu).
"""
from __future__ import annotations

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

MAX_SLOTS = 1024


@dataclass
class Slot:
    index: int
    cpus: tuple[int, ...]      # the slot's logical CPUs; () when the machine has no cores left for it
    fd: int                    # the held lock: closed (or the process gone), the slot is free

    def release(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


def parse_cpulist(text: str) -> list[int]:
    """"0-3,8,10-11" -> [0, 1, 2, 3, 8, 10, 11] (the kernel's cpulist format)."""
    out: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def physical_cores(sysfs_root: str = "/sys") -> list[tuple[int, ...]]:
    """The physical cores this process may use, each as its allowed SMT siblings, in CPU order."""
    allowed = sorted(os.sched_getaffinity(0))
    cores: list[tuple[int, ...]] = []
    for cpu in allowed:
        path = Path(sysfs_root) / "devices" / "system" / "cpu" / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            siblings = tuple(c for c in parse_cpulist(path.read_text()) if c in allowed) or (cpu,)
        except (OSError, ValueError):
            siblings = (cpu,)
        if siblings not in cores:
            cores.append(siblings)
    return cores


def claim_slot(threads: int, lock_dir: str | os.PathLike | None = None,
               cores: list[tuple[int, ...]] | None = None) -> Slot:
    """The first free slot of this machine: slot i owns physical cores [i*threads, (i+1)*threads)."""
    folder = Path(lock_dir or Path(tempfile.gettempdir()) / f"ellm-batch-slots-{os.getuid()}")
    folder.mkdir(parents=True, exist_ok=True)
    cores = physical_cores() if cores is None else cores
    threads = max(1, threads)
    for index in range(MAX_SLOTS):
        fd = os.open(folder / f"slot-{index}.lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        mine = cores[index * threads:(index + 1) * threads]
        return Slot(index, tuple(c for core in mine for c in core), fd)
    raise RuntimeError(f"{folder}: all {MAX_SLOTS} worker slots are taken")


def enter_slot(slot: Slot) -> None:
    """Run this process on the slot's CPUs (a slot beyond the machine's cores changes nothing)."""
    if slot.cpus:
        os.sched_setaffinity(0, slot.cpus)
