"""The disk budget of document caches: what they take, what the budget allows, which go first.

A document's KV cache is large (about 29 KB a token in f16 on Qwen2.5-1.5B: 0.9 GB for a
32K-token manual), and a library of hundreds of documents would fill a disk. Every cache file
is registered in the store with its size and when it was last used (``kv_caches``); before a
new one is written, the least recently used are deleted until it fits the budget. A cache in
use is never deleted: a question or a read holds a shared ``flock`` on its file (``holding``;
the kernel releases it when the process ends, however it ends), and a cache whose file someone
holds is passed over. A cache larger than the whole budget is not written: the backend keeps it
in memory only and the document says so (``documents.cache_note``).

Reading ahead (documents nobody opened, asked about or summarized) never evicts and stops at a
share of the budget (``Settings.read_ahead_share``), so it cannot push out what a person used.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from collections.abc import Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from app.library.locking import is_held, shared_locks, unless_held
from app.settings import AUTO_BUDGET, Settings
from app.store import Store

log = logging.getLogger(__name__)

DISK_SHARE = 0.25   # the automatic budget: a quarter of the disk the caches are on ...
FREE_SHARE = 0.5    # ... and never more than half of what caches could have (free space + their own)
FILE_OVERHEAD = 1 << 16   # a cache file's header and alignment, on top of its tokens' bytes
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """Bytes from "0", "1500000", "512M", "2.5G", "1T" (powers of 1024), or "auto" (AUTO_BUDGET)."""
    t = str(text).strip().upper().removesuffix("IB").removesuffix("B")
    if t == "AUTO":
        return AUTO_BUDGET
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMGT]?)", t)
    if m is None:
        raise ValueError(f"not a size: {text!r} (bytes, or a number with K, M, G or T, or \"auto\")")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def format_size(n: int) -> str:
    """In the units ``parse_size`` reads (powers of 1024)."""
    for unit, scale in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.{1 if n < 100 * scale else 0}f} {unit}"
    return f"{n} bytes"


def automatic_budget(disk_total: int, disk_free: int, cached: int) -> int:
    """The default budget for a disk of ``disk_total`` bytes with ``disk_free`` free, caches
    taking ``cached`` of it now: a quarter of the disk, and no more than half of what the
    caches could have (so the rest of the disk keeps room for everything else)."""
    return max(0, int(min(disk_total * DISK_SHARE, (disk_free + cached) * FREE_SHARE)))


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def in_use(path: str | os.PathLike) -> bool:
    """True when a question or a read holds ``path`` (``holding``)."""
    return is_held(path, shared_too=True)


def holding(paths: Iterable[str | os.PathLike]) -> AbstractContextManager[None]:
    """Hold ``paths`` (those that exist) as in use until the block ends: no budget deletes them."""
    return shared_locks(paths)


@dataclass
class Room:
    """Whether a cache of ``need`` bytes may be written now; the caches deleted for it; when it
    may not, why (``note``) and whether it is larger than the whole budget (``too_large``)."""

    ok: bool
    need: int
    evicted: list[dict] = field(default_factory=list)
    note: str = ""
    too_large: bool = False


class CacheBudget:
    """The budget of one data directory's document caches (``cache_dir`` holds them)."""

    def __init__(self, store: Store, cache_dir: str | os.PathLike, settings: Settings | None = None):
        self.store, self.dir = store, Path(cache_dir)
        self.settings = settings or Settings.from_dict(store.settings())

    def local(self, registered: str | os.PathLike) -> Path:
        """The file of this data directory that a registered cache path names. The registry keeps
        whole paths, and a data directory may have been copied or moved: its files are the ones
        of the same name under its own cache directory, and another directory's are never
        deleted (nor held) on its behalf."""
        return self.dir / Path(registered).name

    def caches(self) -> list[dict]:
        """Every registered cache, least recently used first (``Store.kv_caches_by_use``), its
        ``path`` the file of this data directory (``local``)."""
        return [{**r, "path": str(self.local(r["path"]))} for r in self.store.kv_caches_by_use()]

    @property
    def budget(self) -> int:
        """The budget in bytes: the setting, or the automatic one for this disk."""
        if self.settings.cache_budget != AUTO_BUDGET:
            return self.settings.cache_budget
        usage = shutil.disk_usage(_existing(self.dir))
        return automatic_budget(usage.total, usage.free, self.total())

    def total(self) -> int:
        return self.store.kv_cache_bytes()

    def make_room(self, need: int, keep: Iterable[int] = (), ahead: bool = False, opened: bool = True) -> Room:
        """Room for a new cache of ``need`` bytes: the least recently used caches deleted until it
        fits (not those of the documents ``keep``, nor any in use). ``ahead``: for reading ahead,
        which for a document nobody opened (``opened`` False) deletes nothing and stops at its
        share of the budget, and for one a person opened deletes only caches of documents nobody
        opened (so reading ahead never reads back and forth what people use)."""
        budget = self.budget
        if need > budget:
            return Room(False, need, too_large=True,
                        note=f"kept in memory only: its cache ({format_size(need)}) is larger than the whole cache "
                             f"budget ({format_size(budget)})")
        total = self.total()
        if ahead and not opened:
            limit = int(budget * self.settings.read_ahead_share)
            if total + need <= limit:
                return Room(True, need)
            return Room(False, need, note=f"reading ahead stops at {self.settings.read_ahead_share:.0%} of the cache "
                                          f"budget ({format_size(limit)}) for documents nobody opened")
        keep = set(keep)
        evicted = []
        for row in self.caches():
            if total + need <= budget:
                break
            if row["doc_id"] in keep or (ahead and row["opened_at"]) or not self.delete(row):
                continue
            evicted.append(row)
            total -= row["bytes"]
        if evicted:
            log.info("cache budget %s: deleted %d least recently used caches (%s)", format_size(budget),
                     len(evicted), format_size(sum(r["bytes"] for r in evicted)))
        if total + need <= budget:
            return Room(True, need, evicted)
        why = "the caches of opened documents fill" if ahead else "the caches in use fill"
        return Room(False, need, evicted, note=f"not written: {why} the cache budget ({format_size(budget)})")

    def prune(self) -> list[dict]:
        """Delete the least recently used caches (none in use) until the total is within the budget."""
        return self.make_room(0).evicted

    def clear(self, doc_ids: Iterable[int] | None = None) -> tuple[list[dict], list[dict]]:
        """Delete the caches of ``doc_ids`` (None: all); (deleted, kept because in use)."""
        wanted = None if doc_ids is None else set(doc_ids)
        deleted, busy = [], []
        for row in self.caches():
            if wanted is None or row["doc_id"] in wanted:
                (deleted if self.delete(row) else busy).append(row)
        return deleted, busy

    def delete(self, row: dict) -> bool:
        """One registered cache (a row of ``caches``), unless it is in use (False): its registry row
        first (a question that finds no row computes anew), then its file, while no one can take
        it in between."""
        path = Path(row["path"])
        with unless_held(path) as free:
            if not free:
                return False
            self.store.remove_kv_cache(row["doc_id"], row["cache_key"])
            try:
                path.unlink(missing_ok=True)
            except OSError as e:     # the registry no longer counts it; a person may remove it by hand
                log.warning("could not delete the KV cache file %s: %s", path, e.strerror or e)
        return True


__all__ = ["CacheBudget", "Room", "automatic_budget", "format_size", "holding", "in_use", "parse_size"]
