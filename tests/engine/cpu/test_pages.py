"""cpu/pages.py: arrays whose memory arrives 4 KiB at a time as it is written."""
from __future__ import annotations

import os

import numpy as np
import pytest

from app.engine.cpu.pages import lazy_zeros


def test_lazy_zeros_is_a_writable_zero_array_of_the_shape_and_type():
    a = lazy_zeros((3, 5, 7), np.uint16)
    assert a.shape == (3, 5, 7) and a.dtype == np.uint16 and a.flags.writeable and a.flags.c_contiguous
    assert not a.any()
    a[1, 2, 3] = 9
    assert a.sum() == 9
    assert lazy_zeros((0, 4), np.float16).shape == (0, 4)


def _mapped(a: np.ndarray) -> dict[str, int]:
    """The kB fields of /proc/self/smaps summed over the mappings that hold ``a`` (the kernel
    may split one allocation into several)."""
    start = a.ctypes.data
    end = start + a.nbytes
    fields, inside = {}, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and ":" not in head:
                lo, hi = (int(x, 16) for x in head.split("-"))
                inside = lo < end and start < hi
            elif inside and line.split()[-1] == "kB":
                fields[head.rstrip(":")] = fields.get(head.rstrip(":"), 0) + int(line.split()[1])
    return fields


def _huge_pages_off() -> bool:
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            return "[never]" in f.read()
    except OSError:
        return True


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps") or _huge_pages_off(),
                    reason="needs Linux's /proc/self/smaps and transparent huge pages")
def test_one_new_block_in_every_layer_maps_only_the_pages_written():
    """The cache's layout: a new block lies in a different 2 MiB region for each layer, head and
    array; writing it must not bring in (and zero) a huge page per region (numpy's np.zeros
    does: 112 MB here). Rss is compared before and after, since the kernel may merge the
    mapping with a neighbouring one of the same kind (another cache's)."""
    a = lazy_zeros((28, 2, 512, 64, 128), np.uint16)          # a 1.5B model's keys, 470 MB
    before = _mapped(a)
    a[:, :, 300] = 1                                          # one 16 KiB block per (layer, head)
    after = _mapped(a)
    assert after.get("AnonHugePages", 0) == 0
    assert after["Rss"] - before["Rss"] <= 28 * 2 * 16 + 64   # kB: the blocks' own pages
    assert int(a.sum()) == 28 * 2 * 64 * 128
