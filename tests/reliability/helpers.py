"""What the reliability tests share: running `ellm` in a subprocess (with a time
limit, its peak memory, optionally as an unprivileged user), building hostile
files fast, and checking that a store is consistent."""
from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

HOOKS = Path(__file__).parent / "hooks"
MiB = 2**20
PR_CAPBSET_DROP = 24  # linux/prctl.h
CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 1, 2  # linux/capability.h: what lets root read any file


# ---- Running the CLI -----------------------------------------------------------------


@dataclass
class Run:
    rc: int
    out: str
    err: str
    peak_rss: int  # bytes: the largest resident set of the process (its own VmHWM, see hooks)
    seconds: float

    def lines(self) -> list[str]:
        return self.out.splitlines()


def cli_command(data_dir, *args: str) -> list[str]:
    return [sys.executable, "-m", "app", "--data-dir", str(data_dir), *args]


def cli_env(**extra: str) -> dict:
    """The environment of an `ellm` subprocess: our hooks on PYTHONPATH (each off
    unless its variable is set), no inherited data directory, offscreen Qt."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELLM_")}
    env["PYTHONPATH"] = str(HOOKS)
    env["QT_QPA_PLATFORM"] = "offscreen"
    env.update(extra)
    return env


def run_cli(data_dir, *args: str, timeout: float = 240, env: dict | None = None, cwd=None,
            honour_permissions: bool = False, prefix: list[str] | None = None) -> Run:
    """Run ``ellm --data-dir DATA ARGS`` to the end (killed after ``timeout`` seconds,
    which fails the test). The peak RSS comes from wait4 on this one child, so earlier
    children do not count. ``honour_permissions``: file permissions apply even when
    the tests run as root (see honouring_file_permissions). ``prefix``: a command that
    runs it (``unshare -n``)."""
    cmd = [*(prefix or []), *cli_command(data_dir, *args)]
    if honour_permissions:
        cmd = honouring_file_permissions(cmd)
    hwm = tempfile.NamedTemporaryFile(prefix="ellm-hwm-", delete=False)
    hwm.close()
    env = dict(env or cli_env(), ELLM_TEST_HWM_FILE=hwm.name)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.monotonic()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
        proc.returncode = rc = os.waitstatus_to_exitcode(status)
        seconds = time.monotonic() - started
        out.seek(0), err.seek(0)
        peak = Path(hwm.name).read_text().strip()
        os.unlink(hwm.name)
        # ru_maxrss only as a fallback (a process killed before its atexit ran).
        result = Run(rc, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                     int(peak) if peak else usage.ru_maxrss * 1024, seconds)
    if seconds >= timeout and rc == -9:
        raise AssertionError(f"`{' '.join(cmd)}` did not finish within {timeout} s\n{result.out}\n{result.err}")
    return result


_DROP_FILE_POWERS = f"""
import ctypes, os, sys
if os.geteuid() == 0:
    libc = ctypes.CDLL(None, use_errno=True)
    for cap in ({CAP_DAC_OVERRIDE}, {CAP_DAC_READ_SEARCH}):
        if libc.prctl({PR_CAPBSET_DROP}, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")
os.execv(sys.argv[1], sys.argv[1:])
"""


def honouring_file_permissions(cmd: list[str]) -> list[str]:
    """``cmd`` run so that file permissions apply to it even when the tests run as
    root: a small launcher drops the capabilities that let root read and search any
    file (from the bounding set, so they are gone after exec), then execs ``cmd``.
    A file with mode 000 is then unreadable to it as to anyone. (Running as "nobody"
    instead does not work here: the interpreter lives under /root, mode 700.)"""
    return [sys.executable, "-c", _DROP_FILE_POWERS, *cmd]


STARTED: list[subprocess.Popen] = []  # killed after each test by conftest.py if still running


def start_cli(data_dir, *args: str, env: dict | None = None) -> subprocess.Popen:
    """`ellm` running in the background, its stdout a pipe read line by line."""
    proc = subprocess.Popen(cli_command(data_dir, *args), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env or cli_env(), bufsize=0)
    STARTED.append(proc)
    return proc


def read_until(proc: subprocess.Popen, done, timeout: float, stream: str = "stdout") -> bytes:
    """Read ``proc``'s stdout (or stderr) until ``done(bytes so far)`` is true; fails
    the test, killing the process, if it ends first or ``timeout`` passes."""
    pipe = getattr(proc, stream)
    seen = b""
    result: dict = {}

    def reader():
        nonlocal seen
        while True:
            piece = os.read(pipe.fileno(), 4096)
            if not piece:
                result["eof"] = True
                return
            seen += piece
            if done(seen):
                result["done"] = True
                return

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    t.join(timeout)
    if not result.get("done"):
        proc.kill()
        out, err = proc.communicate(timeout=30)
        raise AssertionError(f"the process {'ended' if result.get('eof') else 'was still running'} before what "
                             f"the test waited for (rc {proc.returncode}); {stream} so far: {seen[-2000:]!r}; "
                             f"then stdout {out[-1000:]!r}, stderr {err[-2000:]!r}")
    return seen


def kill_hard(proc: subprocess.Popen) -> int:
    """SIGKILL: no handler, no cleanup, no flush, as a crash or a power cut leaves it."""
    proc.send_signal(signal.SIGKILL)
    return proc.wait(30)


# ---- Folders ---------------------------------------------------------------------------


def remove_tree(path: Path) -> None:
    """shutil.rmtree, after giving back permissions a test took away."""
    for p in [path, *path.rglob("*")]:
        if not p.is_symlink() and p.exists():
            try:
                p.chmod(0o755 if p.is_dir() else 0o644)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


# ---- Hostile files --------------------------------------------------------------------


def write_text_file(path: Path, size: int, line: bytes) -> Path:
    """``size`` bytes of ``line`` repeated, written 1 MiB at a time."""
    block = line * (MiB // len(line) + 1)
    with open(path, "wb") as f:
        left = size
        while left > 0:
            piece = block[: min(left, MiB)]
            f.write(piece)
            left -= len(piece)
    return path


def write_one_line(path: Path, size: int) -> Path:
    """One line of ``size`` bytes: words separated by spaces and no newline at all."""
    return write_text_file(path, size, b"lorem ipsum dolor sit amet consectetur ")


def write_zip_bomb(path: Path, expanded: int = 600 * MiB) -> Path:
    """An EPUB-named zip whose member expands to ``expanded`` bytes of zeros, in well
    under 1 MB. Written by hand in a second: deflating 600 MB with zipfile takes ~6 s.

    After Z_FULL_FLUSH a deflate stream carries no history, so the compressed form of
    each 1 MiB of zeros is the same bytes; the stream is that block repeated."""
    assert expanded % MiB == 0
    zeros = bytes(MiB)
    c = zlib.compressobj(9, zlib.DEFLATED, -15)
    block = c.compress(zeros) + c.flush(zlib.Z_FULL_FLUSH)
    tail = zlib.compressobj(9, zlib.DEFLATED, -15).flush(zlib.Z_FINISH)  # an empty final block
    count = expanded // MiB
    crc = 0
    for _ in range(count):
        crc = zlib.crc32(zeros, crc)
    compressed = len(block) * count + len(tail)

    members = []  # (name, method, crc, compressed, expanded, offset, zip64)
    with open(path, "wb") as f:
        def local(name: bytes, method: int, crc: int, csize: int, usize: int, zip64: bool) -> None:
            members.append((name, method, crc, csize, usize, f.tell(), zip64))
            extra = struct.pack("<HHQQ", 1, 16, usize, csize) if zip64 else b""
            sizes = (0xFFFFFFFF, 0xFFFFFFFF) if zip64 else (csize, usize)
            f.write(struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, method, 0, 0x21, crc, *sizes,
                                len(name), len(extra)) + name + extra)

        mimetype = b"application/epub+zip"
        local(b"mimetype", 0, zlib.crc32(mimetype), len(mimetype), len(mimetype), False)
        f.write(mimetype)
        local(b"OEBPS/chapter1.xhtml", 8, crc, compressed, expanded, True)
        for _ in range(count):
            f.write(block)
        f.write(tail)
        directory = f.tell()
        for name, method, crc_, csize, usize, offset, zip64 in members:
            extra = struct.pack("<HHQQ", 1, 16, usize, csize) if zip64 else b""
            sizes = (0xFFFFFFFF, 0xFFFFFFFF) if zip64 else (csize, usize)
            f.write(struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, method, 0, 0x21, crc_, *sizes,
                                len(name), len(extra), 0, 0, 0, 0o644 << 16, offset) + name + extra)
        size = f.tell() - directory
        f.write(struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, len(members), len(members), size, directory, 0))
    return path


def make_tree(root: Path, depth: int, name: str = "d") -> Path:
    """``depth`` nested folders under ``root``; returns the deepest. Made relative to
    an open folder, level by level: a full path each time costs O(depth) to resolve."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir(name, dir_fd=fd)
            fd, parent = os.open(name, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd), fd
            os.close(parent)
    finally:
        os.close(fd)
    return root.joinpath(*[name] * depth)


def remove_deep_tree(root: Path) -> None:
    """Remove a chain of folders too deep for shutil.rmtree (which recurses, in
    Python 3.11): down the chain with open folders, then up, removing as it goes."""
    fds = [os.open(root, os.O_RDONLY | os.O_DIRECTORY)]
    try:
        while True:
            names = os.listdir(fds[-1])
            sub = [n for n in names if stat.S_ISDIR(os.stat(n, dir_fd=fds[-1], follow_symlinks=False).st_mode)]
            for n in names:
                if n not in sub:
                    os.unlink(n, dir_fd=fds[-1])
            if not sub:
                break
            fds.append(os.open(sub[0], os.O_RDONLY | os.O_DIRECTORY, dir_fd=fds[-1]))
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir(os.listdir(fds[-1])[0], dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)
    root.rmdir()


# ---- Checking a store ------------------------------------------------------------------


def store_problems(db: Path) -> list[str]:
    """Everything that makes a store inconsistent; [] for a good one. Checked in a
    fresh connection, as a later process would find it (read-write: FTS5's
    integrity-check is written as an INSERT, though it changes nothing)."""
    conn = sqlite3.connect(db, timeout=30)
    problems = []
    try:
        rows = [r[0] for r in conn.execute("PRAGMA integrity_check")]
        if rows != ["ok"]:
            problems.append(f"integrity_check: {rows}")
        for table in ("chunks_fts", "answers_fts"):
            try:
                conn.execute(f"INSERT INTO {table}({table}, rank) VALUES('integrity-check', 1)")
            except sqlite3.DatabaseError as e:
                problems.append(f"{table}: {e}")
        for doc_id, path, pages, stored in conn.execute(
                "SELECT d.id, d.path, d.pages, (SELECT count(*) FROM pages p WHERE p.doc_id = d.id)"
                " FROM documents d WHERE d.status = 'ingested'"):
            if pages != stored:
                problems.append(f"{path}: {stored} of {pages} pages stored")
        for doc_id, path in conn.execute(
                "SELECT d.id, d.path FROM documents d WHERE d.status = 'ingested' AND d.pages > 0"
                " AND NOT EXISTS (SELECT 1 FROM chunks c WHERE c.doc_id = d.id)"):
            problems.append(f"{path}: ingested but has no passages")
        dupes = conn.execute("SELECT path, count(*) FROM documents GROUP BY path HAVING count(*) > 1").fetchall()
        problems += [f"{path}: {n} documents" for path, n in dupes]
        problems += [f"{n} orphaned {t}" for t in ("pages", "chunks")
                     for (n,) in conn.execute(f"SELECT count(*) FROM {t} WHERE doc_id NOT IN "
                                              "(SELECT id FROM documents)") if n]
    finally:
        conn.close()
    return problems


def query(db: Path, sql: str, args=()) -> list[tuple]:
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30)
    try:
        return conn.execute(sql, args).fetchall()
    finally:
        conn.close()
