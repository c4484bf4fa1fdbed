"""Advisory locks between eLLM processes (and threads) that share one data directory.

One lock file per purpose, ``<data dir>/locks/<purpose>.lock``, locked with
``fcntl.flock``. The kernel releases a flock when its process exits, however it
exits (SIGKILL included), so a crashed eLLM never leaves a lock held: a lock file
that nobody holds is only a file, and ``ellm doctor`` may remove it.

The store itself needs no lock of ours: SQLite's WAL mode and busy timeout make
concurrent readers and writers safe. These locks serialise *work* that should not
run twice at once, such as two ingestions of the same folders (the second then
finds every file unchanged instead of reading them all again).

Each open() makes a new open file description, so two threads of one process
that take the same lock exclude each other just as two processes do.
"""
from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

LOCK_DIR = "locks"
LOCK_SUFFIX = ".lock"
POLL_S = 0.1  # how often a waiting lock tries again

log = logging.getLogger("ellm.locking")


class LockTimeout(TimeoutError):
    """The lock stayed held by another eLLM for longer than the caller would wait."""


class LockWaitCancelled(Exception):
    """The caller's ``cancel`` said stop while we waited for the lock."""


def lock_path(root: str | os.PathLike, purpose: str) -> Path:
    return Path(root) / LOCK_DIR / f"{purpose}{LOCK_SUFFIX}"


def holder_of(path: str | os.PathLike) -> str:
    """What the lock file says about its holder ("pid 123, ingest, since ..."), "" if empty."""
    try:
        return Path(path).read_text(encoding="utf-8", errors="replace").strip()
    except OSError:
        return ""


def is_held(path: str | os.PathLike, shared_too: bool = False) -> bool:
    """True when some process holds the lock at ``path`` right now (``shared_too``: a shared
    hold counts too, as ``shared_locks`` takes them)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, (fcntl.LOCK_EX if shared_too else fcntl.LOCK_SH) | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases our probe
    return False


@contextmanager
def unless_held(path: str | os.PathLike) -> Iterator[bool]:
    """Whether nobody holds ``path`` (not even shared), keeping it so until the block ends: the
    block may then remove the file with no holder slipping in between. True for a missing file."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        yield True
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


@contextmanager
def shared_locks(paths: Iterable[str | os.PathLike]) -> Iterator[None]:
    """Shared locks on the files at ``paths`` (those that exist) until the block ends: many
    holders at once, each seen by ``is_held(path, shared_too=True)`` (a file in use)."""
    with ExitStack() as stack:
        for path in paths:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError:
                continue
            stack.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_SH)
        yield


def remove_if_unheld(path: str | os.PathLike) -> bool:
    """Remove a lock file nobody holds (``ellm doctor``); False when it is held.

    Safe against a process that opens the file just before we unlink it: after
    locking, ``file_lock`` checks that the file it locked is still the one at the
    path, and starts over otherwise.
    """
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return True
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        os.unlink(path)
        return True
    finally:
        os.close(fd)


@contextmanager
def file_lock(root: str | os.PathLike, purpose: str, timeout: float | None = None,
              on_wait: Callable[[str], None] | None = None,
              cancel: Callable[[], bool] | None = None) -> Iterator[Path]:
    """Hold the ``purpose`` lock of the data directory ``root`` for the ``with`` block.

    When another process holds it, ``on_wait`` (default: a warning on the
    ``ellm.locking`` logger, which reaches stderr) hears once what we wait for;
    then we wait, for at most ``timeout`` seconds (None: as long as it takes),
    asking ``cancel`` between tries (LockWaitCancelled when it says stop).
    """
    path = lock_path(root, purpose)
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    told = False
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if not told:
                        told = True
                        holder = holder_of(path) or "another eLLM"
                        message = (f"waiting for the {purpose} lock of {root} ({holder}) to be released; "
                                   "another eLLM is working on this data directory")
                        (on_wait or log.warning)(message)
                    if cancel is not None and cancel():
                        raise LockWaitCancelled(f"stopped waiting for the {purpose} lock of {root}")
                    if deadline is not None and time.monotonic() >= deadline:
                        raise LockTimeout(f"the {purpose} lock of {root} is still held ({holder_of(path)}) "
                                          f"after {timeout:.0f} s; try again when the other eLLM is done")
                    time.sleep(POLL_S)
            if not _still_at(fd, path):
                continue  # doctor removed the file between our open and our lock: lock the new one
            _write_holder(fd, purpose)
            try:
                yield path
            finally:
                _clear_holder(fd)
            return
        finally:
            os.close(fd)  # releases the flock


def _still_at(fd: int, path: Path) -> bool:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (st.st_dev, st.st_ino) == (own.st_dev, own.st_ino)


def _write_holder(fd: int, purpose: str) -> None:
    note = f"pid {os.getpid()}, {purpose}, since {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, note.encode(), 0)
    except OSError as e:  # a note for people; the flock is what excludes
        if e.errno not in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
            raise


def _clear_holder(fd: int) -> None:
    try:
        os.ftruncate(fd, 0)
    except OSError:
        pass
