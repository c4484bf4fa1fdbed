"""Persisted KV caches: a document prefix's blocked cache, written once, memory-mapped later.

File layout (little-endian):

  bytes 0-7    magic b"ELLMKV\\x00\\x01"
  bytes 8-11   header length H (uint32)
  bytes 12..   header: UTF-8 JSON {"version", "meta" (model hash and cache settings, chosen
               by the caller), "n_tokens", "block", "k_bits", "v_bits", "n_layers",
               "n_kv_heads", "head_dim", "n_full", "arrays": {name: [offset, shape, dtype]},
               "data_bytes", "crc32"}
  padding to a 4096-byte boundary, then the arrays, each 64-byte aligned:
  kc, kb, vc, vs (blocks [0, n_full), layout [layer][kv_head][block][token][...]),
  tail_k, tail_v (the f16 partial block), tokens (int32).

The file is written under a temporary name, flushed and renamed, so a reader sees the old
file or the whole new one. On load the size and a CRC-32 of the data are checked before
anything is mapped; a mismatch raises KVFileError and the caller rebuilds the cache.
"""
from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from .blocked import BlockKVCache
from .formats import CacheFileError

MAGIC = b"ELLMKV\x00\x01"
VERSION = 1
_ALIGN = 64
_DATA_START_ALIGN = 4096
_CRC_CHUNK = 16 << 20


class KVFileError(CacheFileError):
    """A persisted KV cache that cannot be used (names the file and the problem)."""


def _aligned(n: int, a: int) -> int:
    return -(-n // a) * a


def _sections(cache: BlockKVCache) -> list[tuple[str, tuple, np.dtype]]:
    n_full = cache.n_tokens // cache.block
    out = [(name, (a.shape[0], a.shape[1], n_full) + a.shape[3:], a.dtype) for name, a in cache.own.items()]
    out += [("tail_k", cache.tail_k.shape, cache.tail_k.dtype), ("tail_v", cache.tail_v.shape, cache.tail_v.dtype),
            ("tokens", (cache.n_tokens,), np.dtype(np.int32))]
    return out


def _pieces(cache: BlockKVCache, name: str):
    """The bytes of one section, in file order, as contiguous arrays."""
    if name == "tokens":
        yield np.asarray(cache.tokens, dtype=np.int32)
        return
    if name in ("tail_k", "tail_v"):
        yield np.ascontiguousarray(getattr(cache, name))
        return
    n_full = cache.n_tokens // cache.block
    base, own = cache.base[name], cache.own[name]
    nb = min(cache.nb_base, n_full)
    for layer in range(own.shape[0]):
        for head in range(own.shape[1]):
            if nb:
                yield np.ascontiguousarray(base[layer, head, :nb])
            if n_full > nb:
                yield own[layer, head, nb:n_full]


def save(cache: BlockKVCache, path: str | os.PathLike, meta: dict) -> int:
    """Write ``cache`` (all its tokens) to ``path`` atomically; returns the file size."""
    path = Path(path)
    spec = cache.spec
    c = cache.config
    arrays, offset = {}, 0
    for name, shape, dtype in _sections(cache):
        arrays[name] = [offset, list(shape), np.dtype(dtype).str]
        offset = _aligned(offset + int(np.prod(shape)) * np.dtype(dtype).itemsize, _ALIGN)
    header = {"version": VERSION, "meta": meta, "n_tokens": cache.n_tokens, "block": spec.block,
              "k_bits": spec.k_bits, "v_bits": spec.v_bits, "n_layers": c.n_layers,
              "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim, "n_full": cache.n_tokens // spec.block,
              "arrays": arrays, "data_bytes": offset}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with open(tmp, "wb") as f:
            f.write(b"\0" * _DATA_START_ALIGN)   # header slot, filled once the CRC is known
            crc, written = 0, 0
            for name, _, _ in _sections(cache):
                start = arrays[name][0]
                if written < start:
                    pad = b"\0" * (start - written)
                    crc = zlib.crc32(pad, crc)
                    f.write(pad)
                    written = start
                for piece in _pieces(cache, name):
                    view = memoryview(piece).cast("B")
                    crc = zlib.crc32(view, crc)
                    f.write(view)
                    written += view.nbytes
            if written < offset:
                pad = b"\0" * (offset - written)
                crc = zlib.crc32(pad, crc)
                f.write(pad)
            header["crc32"] = crc
            blob = json.dumps(header, sort_keys=True).encode("utf-8")
            data_start = _aligned(12 + len(blob), _DATA_START_ALIGN)
            if data_start != _DATA_START_ALIGN:
                raise KVFileError(f"{path}: KV cache header too large ({len(blob)} bytes)")
            f.seek(0)
            f.write(MAGIC + struct.pack("<I", len(blob)) + blob)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return _DATA_START_ALIGN + offset


def read_header(path: str | os.PathLike) -> dict:
    path = Path(path)
    try:
        with open(path, "rb") as f:
            head = f.read(_DATA_START_ALIGN)
    except OSError as e:
        raise KVFileError(f"{path}: cannot read the KV cache file ({e.strerror or e})") from e
    if len(head) < 12 or head[:8] != MAGIC:
        raise KVFileError(f"{path}: not an eLLM KV cache file (bad magic)")
    (n,) = struct.unpack("<I", head[8:12])
    if 12 + n > len(head):
        raise KVFileError(f"{path}: the KV cache header is truncated")
    try:
        header = json.loads(head[12:12 + n].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise KVFileError(f"{path}: the KV cache header is corrupt ({e})") from e
    if header.get("version") != VERSION:
        raise KVFileError(f"{path}: KV cache format version {header.get('version')} (this eLLM reads {VERSION})")
    return header


def load(cache: BlockKVCache, path: str | os.PathLike, meta: dict) -> None:
    """Replace ``cache``'s contents with the file's; its blocks stay memory-mapped (never
    written, never copied). Raises KVFileError if the file is not exactly what ``meta`` and the cache's
    shape describe, is truncated, or fails its checksum."""
    path = Path(path)
    h = read_header(path)
    spec, c = cache.spec, cache.config
    if h.get("meta") != meta:
        raise KVFileError(f"{path}: the KV cache was made with other settings or another model")
    want = {"block": spec.block, "k_bits": spec.k_bits, "v_bits": spec.v_bits, "n_layers": c.n_layers,
            "n_kv_heads": c.n_kv_heads, "head_dim": c.head_dim}
    for k, v in want.items():
        if h.get(k) != v:
            raise KVFileError(f"{path}: KV cache {k} is {h.get(k)}, expected {v}")
    n_tokens = int(h["n_tokens"])
    if n_tokens > cache.n_ctx:
        raise KVFileError(f"{path}: the KV cache holds {n_tokens} tokens, more than the context ({cache.n_ctx})")
    size = path.stat().st_size
    if size != _DATA_START_ALIGN + int(h["data_bytes"]):
        raise KVFileError(f"{path}: the KV cache file is truncated or has extra bytes "
                          f"({size} bytes, expected {_DATA_START_ALIGN + int(h['data_bytes'])})")
    crc = 0
    with open(path, "rb") as f:
        f.seek(_DATA_START_ALIGN)
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    if crc != h.get("crc32"):
        raise KVFileError(f"{path}: the KV cache file is corrupt (checksum mismatch)")

    def mapped(name):
        offset, shape, dtype = h["arrays"][name]
        if int(np.prod(shape)) == 0:
            return np.zeros(shape, dtype)
        # Copy-on-write ("c") rather than read-only: nothing ever writes to these pages, but
        # numba then sees the same array type as the cache's own blocks, so one compiled
        # kernel (same vectorisation, same rounding) serves both.
        return np.memmap(path, dtype=np.dtype(dtype), mode="c", offset=_DATA_START_ALIGN + offset,
                         shape=tuple(shape))

    tokens = np.array(mapped("tokens"), dtype=np.int64)
    cache.clear()
    cache.base = {name: mapped(name) for name in cache.own}
    cache.nb_base = int(h["n_full"])
    cache.tail_k[...] = mapped("tail_k")
    cache.tail_v[...] = mapped("tail_v")
    cache.tokens = tokens.tolist()
    cache.set_checkpoint()


def append(cache: BlockKVCache, path: str | os.PathLike, meta: dict, skip: int = 0) -> int:
    """Copy a persisted prefix, less its first ``skip`` tokens (whole blocks: a header the
    cache already holds), after what ``cache`` holds (which must end on a block boundary):
    several documents' caches side by side in one context. The cache grows as needed.
    Returns the number of tokens appended. Raises KVFileError as load() does."""
    path = Path(path)
    h = read_header(path)
    n_tokens, B = int(h["n_tokens"]), cache.block
    if cache.n_tokens % B or n_tokens % B or skip % B:
        raise KVFileError(f"{path}: only whole blocks can be placed side by side "
                          f"({cache.n_tokens} + {n_tokens} tokens, block {B})")
    probe = BlockKVCache(cache.config, max(n_tokens, B), cache.spec)
    load(probe, path, meta)                       # every check of load(), nothing copied yet
    start = cache.n_tokens // B
    first, n_full = skip // B, n_tokens // B
    cache.reserve(cache.n_tokens + n_tokens - skip + B)
    for name, src in probe.base.items():
        cache.own[name][:, :, start:start + n_full - first] = src[:, :, first:n_full]
    cache.tokens.extend(probe.tokens[skip:])
    cache.generation += 1
    return n_tokens - skip
