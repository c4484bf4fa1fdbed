"""One record per weight format: everything the engine knows of a GGML tensor type, in one place.

A ``WeightFormat`` says how a type's blocks are repacked (into the row-group planes of
quant/layout.py, or kept as the file holds them), which of its planes are f16 scales (checked once
for the fast conversion, ops/f16.py), and which kernels multiply it: the rows kernel (dequantized
rows: embeddings, tests, BLAS's float32 copies) and the product kernel (one token or a batch),
with the arguments bound from the planes, and for the 32-element block formats the batch kernel of
quant/legacy_batch.py. The block size and bytes are gguf's (GGML_QUANT_SIZES). ``weight_formats``
builds the table for a CPU: on AVX2 machines Q4_K and Q6_K take llama.cpp's own x86 kernels
(quant/kquants_avx2.py: Q4_K in groups of 8 rows, Q6_K on the GGUF blocks as they are).
header/support.py's WEIGHT_TYPES lists the types the table must hold.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from ..header.support import WEIGHT_TYPES
from ..ops.amx import HAS_AMX
from ..ops.simd_int import HAS_AVX2, HAS_VNNI
from . import floats, iquants, kquants, kquants_avx2, kquants_low, legacy, legacy_batch, q4k_x8

Q = GGMLQuantizationType
NO_BYTES = np.zeros(1, np.uint8)   # (1,) uint8 stand-in for planes a type does not have
NO_U16 = np.zeros(1, np.uint16)    # (1,) uint16 likewise

Planes = dict[str, np.ndarray]
Kernels = tuple[Callable, tuple, Callable, tuple]   # (rows kernel, its leading args, product kernel, its leading args)


@dataclass(frozen=True)
class WeightFormat:
    """A GGML weight type as the engine runs it."""

    qtype: GGMLQuantizationType
    repack: Callable[[np.ndarray, int, int], Planes]      # (raw, n_out, n_in) -> planes, the same bytes
    kernels: Callable[[Planes, int, bool], Kernels]       # (planes, n_out, plain f16 scales) -> kernels
    f16_scales: tuple[str, ...] = ()                      # planes of f16 values (F16: the weights)
    batch: Callable[[Planes, bool], tuple] | None = None  # legacy_batch.matmul_legacy_batch's leading args
    integer_batches: bool = False   # its batch kernels keep up with sgemm (quant/blas.py leaves it long chunks)
    stacks: bool = False            # several matrices of it multiply one input in one call (quant/stack.py)

    @property
    def block(self) -> int:
        """Weights per block."""
        return GGML_QUANT_SIZES[self.qtype][0]

    @property
    def block_bytes(self) -> int:
        """Bytes per block in the file."""
        return GGML_QUANT_SIZES[self.qtype][1]


# ---- the kernels of each family, bound to a matrix's planes


def _nibbles(kind: int) -> Callable[[Planes, int, bool], Kernels]:
    """Q4_0, Q4_1, Q5_0, Q5_1: ``kind``'s bit 0 says a min plane, bit 1 a high-bit plane."""
    def bind(p: Planes, n_out: int, plain: bool) -> Kernels:
        m = p["m"] if kind & 1 else NO_U16
        qh = p["qh"] if kind & 2 else NO_BYTES
        product = (legacy.matmul_nibbles, (p["qs"], qh, p["d"], m, kind, plain, n_out))
        if kind & 2:
            return (legacy.rows_q5, (p["qs"], qh, p["d"], m, kind == legacy.KIND_Q5_1, n_out)) + product
        return (legacy.rows_q4, (p["qs"], p["d"], m, kind == legacy.KIND_Q4_1, n_out)) + product
    return bind


def _nibbles_batch(kind: int) -> Callable[[Planes, bool], tuple]:
    return lambda p, plain: (p["qs"], p.get("qh", NO_BYTES), p["d"], p.get("m", NO_U16), kind, plain)


def _q45_k(has_qh: bool) -> Callable[[Planes, int, bool], Kernels]:
    def bind(p: Planes, n_out: int, plain: bool) -> Kernels:
        args = (p["d"], p["dmin"], p["scales"], p["qh"] if has_qh else NO_BYTES, p["qs"], has_qh)
        return kquants.rows_q45_k, args + (n_out,), kquants.matmul_q45_k, args + (plain, n_out)
    return bind


def _planes_bound(rows, product, names: tuple[str, ...]) -> Callable[[Planes, int, bool], Kernels]:
    """Kernels whose leading arguments are the planes ``names`` in that order."""
    def bind(p: Planes, n_out: int, plain: bool) -> Kernels:
        args = tuple(p[n] for n in names)
        return rows, args + (n_out,), product, args + (plain, n_out)
    return bind


def _float(kind: int) -> Callable[[Planes, int, bool], Kernels]:
    def bind(p: Planes, n_out: int, plain: bool) -> Kernels:
        return floats.rows_float, (p["w"], kind, n_out), floats.matmul_float, (p["w"], kind, plain, n_out)
    return bind


def _q4_k_x8(p: Planes, n_out: int, plain: bool) -> Kernels:
    return (kquants_avx2.rows_q4_k_x8, (p["x8"], n_out), kquants_avx2.matmul_q4_k_x8,
            (p["x8"], n_out, HAS_VNNI, HAS_AMX))


def _q6_k_blocks(p: Planes, n_out: int, plain: bool) -> Kernels:
    return kquants_avx2.rows_q6_k_rows, (p["raw"], n_out), kquants_avx2.matmul_q6_k_rows, (p["raw"], n_out, HAS_AMX)


def _file_blocks(raw: np.ndarray, n_out: int, n_in: int) -> Planes:
    """The GGUF blocks as they are (no copy of the file's bytes)."""
    return {"raw": np.asarray(raw, dtype=np.uint8).reshape(-1)}


def weight_formats(avx2: bool = HAS_AVX2) -> dict[GGMLQuantizationType, WeightFormat]:
    """The table of every weight type the engine runs, for a CPU with (or without) AVX2 (VNNI and
    AMX are this CPU's: the kernels bind them)."""
    legacy_kinds = {Q.Q4_0: legacy.KIND_Q4_0, Q.Q4_1: legacy.KIND_Q4_1, Q.Q5_0: legacy.KIND_Q5_0,
                    Q.Q5_1: legacy.KIND_Q5_1}
    repacks = {Q.Q4_0: legacy.repack_q4_0, Q.Q4_1: legacy.repack_q4_1, Q.Q5_0: legacy.repack_q5_0,
               Q.Q5_1: legacy.repack_q5_1}
    table = [
        *(WeightFormat(qt, repacks[qt], _nibbles(kind), ("d", "m") if kind & 1 else ("d",),
                       batch=_nibbles_batch(kind), integer_batches=HAS_VNNI) for qt, kind in legacy_kinds.items()),
        WeightFormat(Q.Q8_0, legacy.repack_q8_0, _planes_bound(legacy.rows_q8_0, legacy.matmul_q8_0, ("qs", "d")),
                     ("d",), batch=_nibbles_batch(legacy_batch.UNPACK_Q8_0), integer_batches=HAS_VNNI),
        WeightFormat(Q.Q2_K, kquants_low.repack_q2_k,
                     _planes_bound(kquants_low.rows_q2_k, kquants_low.matmul_q2_k, ("scales", "qs", "d", "dmin")),
                     ("d", "dmin")),
        WeightFormat(Q.Q3_K, kquants_low.repack_q3_k,
                     _planes_bound(kquants_low.rows_q3_k, kquants_low.matmul_q3_k, ("hmask", "qs", "scales", "d")),
                     ("d",)),
        WeightFormat(Q.Q5_K, kquants.repack_q5_k, _q45_k(True), ("d", "dmin")),
        WeightFormat(Q.IQ4_NL, iquants.repack_iq4_nl,
                     _planes_bound(iquants.rows_iq4_nl, iquants.matmul_iq4_nl, ("qs", "d")), ("d",)),
        WeightFormat(Q.IQ4_XS, iquants.repack_iq4_xs,
                     _planes_bound(iquants.rows_iq4_xs, iquants.matmul_iq4_xs, ("d", "scales_h", "scales_l", "qs")),
                     ("d",)),
        WeightFormat(Q.F32, floats.repack_float, _float(floats.KIND_F32)),
        WeightFormat(Q.F16, floats.repack_float, _float(floats.KIND_F16), ("w",)),
        WeightFormat(Q.BF16, floats.repack_float, _float(floats.KIND_BF16)),
    ]
    if avx2:   # vcvtph2ps converts every f16 exactly: no plain/general split, no f16 planes to check
        table += [WeightFormat(Q.Q4_K, q4k_x8.repack_q4_k_x8, _q4_k_x8, integer_batches=True, stacks=True),
                  WeightFormat(Q.Q6_K, _file_blocks, _q6_k_blocks, integer_batches=True)]
    else:
        table += [WeightFormat(Q.Q4_K, kquants.repack_q4_k, _q45_k(False), ("d", "dmin")),
                  WeightFormat(Q.Q6_K, kquants.repack_q6_k,
                               _planes_bound(kquants.rows_q6_k, kquants.matmul_q6_k, ("ql", "qh", "scales", "d")),
                               ("d",))]
    formats = {f.qtype: f for f in table}
    assert {t.name for t in formats} == set(WEIGHT_TYPES), "header/support.py WEIGHT_TYPES and the kernels disagree"
    return formats


FORMATS = weight_formats()
"""This CPU's table: GGML type -> WeightFormat."""
