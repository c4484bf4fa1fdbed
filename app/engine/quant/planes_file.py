"""Repacked weight planes kept in a file, memory-mapped by later starts.

Every start repacks the GGUF blocks into the kernels' layouts (quant/layout.py, Q4_K's groups of
8 rows in quant/kquants_avx2.py): on Qwen2.5-1.5B that is ~0.9 GB read from the model file and
written to fresh memory, seconds of each start. The first start writes the planes to one file;
later starts map it read-only (``np.memmap``), so loading costs a header check and the pages come
in from the page cache as the first products read them. The pages are the file's, shared and
evictable, not anonymous memory: two processes on one model share them.

The file's name holds the model's fingerprint (a hash of its size and its first and last 4 MiB,
header/gguf_file.py, as the KV caches' key), ``LAYOUT_VERSION``, which changes whenever a repack
layout changes (a test pins it to digests of every layout), and the machine's layout variant
(AVX2 or generic), so a changed model or layout finds no file and writes a new one.

    magic "ELLMPLN1" | u64 header length | header JSON | zero padding | planes, each at a 4 KiB
    boundary

The header lists every tensor's planes (dtype, offset, elements) and a CRC-32 of the first and
last 4 KiB of each plane; it carries its own CRC-32. Before use the magic, version, fingerprint,
header checksum, file size and every plane's samples are checked; a file that fails is deleted and
rebuilt, never used (a sample check: reading the whole file to check it would cost what the file
saves). Written to a temporary name and renamed, so a crash or a second process never leaves half
a file under the real name.
"""
from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..ops.simd_int import HAS_AVX2

log = logging.getLogger(__name__)

LAYOUT_VERSION = 1   # bump with any change to a repack layout (quant/*.py ``repack_*``)
# AVX2 machines lay Q4_K out in llama.cpp's groups of 8 rows (quant/qmatrix.py): a file written on
# one kind of machine is not the layout of the other.
VARIANT = "avx2" if HAS_AVX2 else "generic"
MAGIC = b"ELLMPLN1"
ALIGN = 4096
SAMPLE = 4096        # bytes checked at each end of each plane
SUFFIX = ".planes"



@dataclass(frozen=True)
class Kept:
    """One matrix's planes as a file keeps them: its GGML type and (n_out, n_in), and the planes
    (plane name -> (n,) array mapped from the file)."""

    qtype: int
    shape: tuple[int, int]
    planes: dict[str, np.ndarray]


Planes = dict[str, Kept]   # tensor name -> its kept planes


class PlanesFileError(ValueError):
    """A planes file that fails its checks; the message says which and why."""


def _sample_crc(plane: np.ndarray) -> int:
    raw = plane.reshape(-1).view(np.uint8)
    return zlib.crc32(raw[-SAMPLE:], zlib.crc32(raw[:SAMPLE]))


def file_name(model_path: str | os.PathLike, fingerprint: str) -> str:
    stem = Path(model_path).stem[:60]
    return f"{stem}-{fingerprint[:16]}-v{LAYOUT_VERSION}-{VARIANT}{SUFFIX}"


def write(path: Path, model_path: str, fingerprint: str, matrices: dict) -> int:
    """Write the planes of ``matrices`` (tensor name -> QMatrix) to ``path`` (through a
    temporary file); the bytes written. Files of an earlier version or fingerprint of the same
    model in that folder are removed."""
    tensors, layout, offset = {}, [], 0      # layout: (plane, its offset in the data)
    for name, m in matrices.items():
        entry = {}
        for pname, plane in m.planes.items():
            offset = -(-offset // ALIGN) * ALIGN
            entry[pname] = {"dtype": plane.dtype.str, "offset": offset, "n": int(plane.size),
                            "crc": _sample_crc(plane)}
            layout.append((plane, offset))
            offset += plane.nbytes
        tensors[name] = {"qtype": int(m.qtype), "shape": list(m.shape), "planes": entry}
    header = {"version": LAYOUT_VERSION, "variant": VARIANT, "model": os.path.realpath(model_path), "fingerprint": fingerprint,
              "data_bytes": offset, "tensors": tensors}
    body = json.dumps(header, sort_keys=True).encode()
    head = MAGIC + struct.pack("<QI", len(body), zlib.crc32(body)) + body
    start = -(-len(head) // ALIGN) * ALIGN
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(head + bytes(start - len(head)))
            for plane, at in layout:
                f.seek(start + at)
                f.write(memoryview(np.ascontiguousarray(plane).reshape(-1).view(np.uint8)))
            f.truncate(start + offset)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    _remove_stale(path, header["model"])
    return start + offset


def read(path: Path, fingerprint: str) -> Planes:
    """The planes of ``path``, mapped read-only, after the checks above; PlanesFileError if it
    fails one (the caller deletes and rebuilds it)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        lead = f.read(len(MAGIC) + 12)
        if len(lead) < len(MAGIC) + 12 or lead[:len(MAGIC)] != MAGIC:
            raise PlanesFileError(f"{path}: not a planes file (bad magic)")
        n, crc = struct.unpack("<QI", lead[len(MAGIC):])
        if n > size:
            raise PlanesFileError(f"{path}: header of {n} bytes in a file of {size}")
        body = f.read(n)
    if len(body) != n or zlib.crc32(body) != crc:
        raise PlanesFileError(f"{path}: header checksum mismatch")
    header = json.loads(body)
    if (header.get("version"), header.get("variant"), header.get("fingerprint")) != (LAYOUT_VERSION, VARIANT,
                                                                                     fingerprint):
        raise PlanesFileError(f"{path}: made for another layout or model file")
    start = -(-(len(MAGIC) + 12 + n) // ALIGN) * ALIGN
    if size != start + header["data_bytes"]:
        raise PlanesFileError(f"{path}: {size} bytes, expected {start + header['data_bytes']} (truncated?)")
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=start, shape=(header["data_bytes"],))
    planes: Planes = {}
    for name, t in header["tensors"].items():
        mine = {}
        for pname, e in t["planes"].items():
            dtype = np.dtype(e["dtype"])
            if e["offset"] + e["n"] * dtype.itemsize > header["data_bytes"]:
                raise PlanesFileError(f"{path}: plane {pname} of {name} lies past the end")
            plane = data[e["offset"]:e["offset"] + e["n"] * dtype.itemsize].view(dtype)   # (n,) dtype
            if _sample_crc(plane) != e["crc"]:
                raise PlanesFileError(f"{path}: plane {pname} of {name} fails its checksum")
            mine[pname] = plane
        planes[name] = Kept(int(t["qtype"]), tuple(t["shape"]), mine)
    return planes


def _remove_stale(kept: Path, model: str) -> None:
    for other in kept.parent.glob(f"*{SUFFIX}"):
        if other == kept:
            continue
        try:
            with open(other, "rb") as f:
                lead = f.read(len(MAGIC) + 12)
                n = struct.unpack("<Q", lead[len(MAGIC):len(MAGIC) + 8])[0] if lead[:len(MAGIC)] == MAGIC else 0
                same = n < (1 << 24) and json.loads(f.read(n) or b"{}").get("model") == model
        except (OSError, ValueError, struct.error):
            continue
        if same:
            other.unlink(missing_ok=True)


class PlanesFile:
    """The planes file of one model in ``folder``: ``load()`` them or None, ``save()`` them."""

    def __init__(self, folder: str | os.PathLike, model_path: str | os.PathLike, fingerprint: str):
        self.model_path = str(model_path)
        self.fingerprint = fingerprint
        self.path = Path(folder) / file_name(model_path, fingerprint)

    def load(self) -> Planes | None:
        if not self.path.exists():
            return None
        try:
            return read(self.path, self.fingerprint)
        except (PlanesFileError, OSError, ValueError, KeyError) as e:
            log.warning("rebuilding the repacked weights: %s", e)
            self.path.unlink(missing_ok=True)
            return None

    def save(self, matrices: dict) -> None:
        """Write the planes of ``matrices`` (tensor name -> QMatrix); a full disk or a read-only
        folder costs the next start its repack, nothing else."""
        try:
            write(self.path, self.model_path, self.fingerprint, matrices)
        except OSError as e:
            log.warning("could not keep the repacked weights in %s: %s", self.path, e)


__all__ = ["LAYOUT_VERSION", "Kept", "PlanesFile", "PlanesFileError", "read", "write"]
