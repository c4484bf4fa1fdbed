"""Quantized weight matrices, kept in their GGUF block format.

INTERFACE CONTRACT (used by app/engine/model/transformer.py): a ``QMatrix`` wraps one 2-D GGUF tensor
without copying it to f32:

    QMatrix.from_tensor(ReaderTensor)       .name .raw .qtype .shape == (n_out, n_in) .nbytes
    .dequantize() -> (n_out, n_in) f32      tests only
    .rows(ids)    -> (len(ids), n_in) f32   embedding lookup
    .matvec(x (n_in,) f32)       -> (n_out,) f32          decode
    .matmul(X (n_tok, n_in) f32) -> (n_tok, n_out) f32    chunked prefill

At construction the blocks are repacked once into the row-group planes of
``quant/layout.py`` (same number of bytes as the GGUF tensor; see that module for why), and
every product runs in the multi-threaded numba kernels of ``quant/legacy.py`` (Q4_0, Q4_1, Q5_0,
Q5_1, Q8_0; their batches of LEGACY_BATCH_MIN tokens or more in ``quant/legacy_batch.py``),
``quant/kquants.py`` (Q4_K, Q5_K, Q6_K; on AVX2 machines Q4_K and Q6_K take
``quant/kquants_avx2.py`` instead: Q4_K in groups of 8 rows, Q6_K read from the file's own
blocks, both bit-identical to llama.cpp's x86 kernels), ``quant/kquants_low.py`` (Q2_K, Q3_K), ``quant/iquants.py``
(IQ4_NL, IQ4_XS) and ``quant/floats.py`` (F32, F16, BF16). The activations are
quantized the way llama.cpp's CPU backend quantizes them (``quant/activations.py``), so our products
equal llama.cpp's: bit for bit for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, and IQ4_NL batches (its AVX2 lane order,
see ``quant/legacy.py``;
tests/engine/test_quants.py checks against ggml_mul_mat itself), up to the order of float
additions for the others. ``rows``/``dequantize`` are bit-exact with ``gguf.quants.dequantize``.

Memory: ``from_tensor`` drops the file pages it read (``release_file_pages``), so a loaded
model holds about its file size (the planes). Wrapping the same tensor twice (tied
embeddings) makes two copies: reuse the QMatrix instead.

Threads: the kernels use numba's thread count, which app/engine's threading module owns; each
thread takes a contiguous run of 16-row groups.
"""
from __future__ import annotations

import ctypes
import mmap

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, quants
from gguf.gguf_reader import ReaderTensor

from ..ops.f16 import f16_plane_is_plain
from . import floats, iquants, kquants, kquants_avx2, kquants_low, legacy, legacy_batch, q4k_x8
from ..model.support import WEIGHT_TYPES
from ..ops.amx import HAS_AMX
from ..ops.simd_int import HAS_AVX2, HAS_VNNI
from .layout import GROUP, num_threads

Q = GGMLQuantizationType
# From this many tokens the 32-element block formats unpack each row group once for the
# batch (legacy_batch.py): at 4 tokens as fast as legacy.py's per-token kernels, 2.5x at 16.
LEGACY_BATCH_MIN = 4

SUPPORTED = tuple(sorted((Q[name] for name in WEIGHT_TYPES), key=int))   # model/support.py

_REPACK = {
    Q.Q4_0: legacy.repack_q4_0, Q.Q4_1: legacy.repack_q4_1, Q.Q8_0: legacy.repack_q8_0,
    Q.Q5_0: legacy.repack_q5_0, Q.Q5_1: legacy.repack_q5_1,
    Q.Q2_K: kquants_low.repack_q2_k, Q.Q3_K: kquants_low.repack_q3_k,
    Q.Q4_K: kquants.repack_q4_k, Q.Q5_K: kquants.repack_q5_k, Q.Q6_K: kquants.repack_q6_k,
    Q.IQ4_NL: iquants.repack_iq4_nl, Q.IQ4_XS: iquants.repack_iq4_xs,
    Q.F32: floats.repack_float, Q.F16: floats.repack_float, Q.BF16: floats.repack_float,
}
_F16_PLANES = {Q.Q4_0: ("d",), Q.Q4_1: ("d", "m"), Q.Q5_0: ("d",), Q.Q5_1: ("d", "m"), Q.Q8_0: ("d",),
               Q.Q4_K: ("d", "dmin"), Q.Q5_K: ("d", "dmin"), Q.Q6_K: ("d",), Q.Q2_K: ("d", "dmin"),
               Q.Q3_K: ("d",), Q.IQ4_NL: ("d",), Q.IQ4_XS: ("d",), Q.F16: ("w",)}
assert set(_REPACK) == set(SUPPORTED), "model/support.py WEIGHT_TYPES and the kernels disagree"
# On AVX2 machines Q4_K and Q6_K take llama.cpp's own x86 kernels (quant/kquants_avx2.py):
# Q4_K in groups of 8 rows, Q6_K on the GGUF blocks as they are (no copy of the file's bytes).
_AVX2_K = (Q.Q4_K, Q.Q6_K) if HAS_AVX2 else ()
if HAS_AVX2:
    _REPACK[Q.Q4_K] = q4k_x8.repack_q4_k_x8
    _REPACK[Q.Q6_K] = lambda raw, n_out, n_in: {"raw": np.asarray(raw, dtype=np.uint8).reshape(-1)}
    for _qt in _AVX2_K:
        _F16_PLANES.pop(_qt)      # vcvtph2ps converts every f16 exactly: no plain/general split
_NIBBLE_KIND = {Q.Q4_0: legacy.KIND_Q4_0, Q.Q4_1: legacy.KIND_Q4_1,
                Q.Q5_0: legacy.KIND_Q5_0, Q.Q5_1: legacy.KIND_Q5_1}
_FLOAT_KIND = {Q.F32: floats.KIND_F32, Q.F16: floats.KIND_F16, Q.BF16: floats.KIND_BF16}
_NO_BYTES = np.zeros(1, np.uint8)   # (1,) uint8 stand-in for planes a type does not have
_NO_U16 = np.zeros(1, np.uint16)    # (1,) uint16 likewise


class QMatrix:
    """A weight matrix W (n_out, n_in) in GGUF block format; y = W @ x."""

    def __init__(self, name: str, raw: np.ndarray, qtype: GGMLQuantizationType, n_out: int, n_in: int,
                 planes: dict[str, np.ndarray] | None = None):
        """planes: this matrix's planes as an earlier start repacked them (quant/planes_file.py),
        used instead of repacking."""
        qtype = GGMLQuantizationType(qtype)
        if qtype not in SUPPORTED:
            # the problem only: Model names the file and gives the advice (llama.cpp), once
            raise ValueError(f"tensor {name!r} has type {qtype.name}, which the ellm engine has no "
                             f"kernels for (it runs {', '.join(t.name for t in SUPPORTED)})")
        block, block_bytes = GGML_QUANT_SIZES[qtype]
        if n_in % block or raw.nbytes != n_out * (n_in // block) * block_bytes:
            raise ValueError(f"tensor {name!r}: {raw.nbytes} bytes of {qtype.name} do not make a "
                             f"({n_out}, {n_in}) matrix (rows must be whole blocks of {block}); "
                             f"the GGUF file may be truncated or corrupt")
        self.name = name
        self.raw = raw  # (n_out, bytes_per_row) uint8, or (n_out, n_in) for F32/F16 — a view of the mmap
        self.qtype = qtype
        self.shape = (n_out, n_in)
        self.planes = planes if planes is not None else _REPACK[qtype](raw, n_out, n_in)
        # name -> (n,) plane in row groups, same bytes
        # f16 scales (F16: the weights) that are all zeros or normal numbers convert faster
        self.plain_scales = f16_plane_is_plain(*(self.planes[k] for k in _F16_PLANES.get(qtype, ())))
        self._rows_kernel, self._rows_args, self._mm_kernel, self._mm_args = self._bind_kernels()
        self._batch_args = self._bind_batch()  # legacy_batch.matmul_legacy_batch's, or None
        self._n_groups = -(-n_out // GROUP)  # the kernels run one chunk of groups per thread

    def _bind_batch(self):
        """The leading arguments of legacy_batch.matmul_legacy_batch for the 32-element block
        formats (their batches of LEGACY_BATCH_MIN tokens or more go there), else None."""
        p, qt = self.planes, self.qtype
        if qt == Q.Q8_0:
            unpack = legacy_batch.UNPACK_Q8_0
        elif qt in _NIBBLE_KIND:
            unpack = _NIBBLE_KIND[qt]
        else:
            return None
        return p["qs"], p.get("qh", _NO_BYTES), p["d"], p.get("m", _NO_U16), unpack, self.plain_scales

    def _bind_kernels(self):
        """(rows kernel, its leading arguments, matmul kernel, its leading arguments), chosen
        once so a decode step pays for no lookups."""
        p, qt, n_out, plain = self.planes, self.qtype, self.shape[0], self.plain_scales
        if qt in _AVX2_K:
            if qt == Q.Q4_K:
                return (kquants_avx2.rows_q4_k_x8, (p["x8"], n_out), kquants_avx2.matmul_q4_k_x8,
                        (p["x8"], n_out, HAS_VNNI, HAS_AMX))
            return (kquants_avx2.rows_q6_k_rows, (p["raw"], n_out),
                    kquants_avx2.matmul_q6_k_rows, (p["raw"], n_out, HAS_AMX))
        if qt in _NIBBLE_KIND:
            kind = _NIBBLE_KIND[qt]
            m = p["m"] if kind & 1 else _NO_U16
            qh = p["qh"] if kind & 2 else _NO_BYTES
            mm = (legacy.matmul_nibbles, (p["qs"], qh, p["d"], m, kind, plain, n_out))
            if kind & 2:
                return (legacy.rows_q5, (p["qs"], qh, p["d"], m, kind == legacy.KIND_Q5_1, n_out)) + mm
            return (legacy.rows_q4, (p["qs"], p["d"], m, kind == legacy.KIND_Q4_1, n_out)) + mm
        if qt == Q.Q8_0:
            return (legacy.rows_q8_0, (p["qs"], p["d"], n_out),
                    legacy.matmul_q8_0, (p["qs"], p["d"], plain, n_out))
        if qt in (Q.Q4_K, Q.Q5_K):
            has_qh = qt == Q.Q5_K
            k_args = (p["d"], p["dmin"], p["scales"], p["qh"] if has_qh else _NO_BYTES, p["qs"], has_qh)
            return (kquants.rows_q45_k, k_args + (n_out,), kquants.matmul_q45_k, k_args + (plain, n_out))
        if qt == Q.Q6_K:
            k_args = (p["ql"], p["qh"], p["scales"], p["d"])
            return (kquants.rows_q6_k, k_args + (n_out,), kquants.matmul_q6_k, k_args + (plain, n_out))
        if qt == Q.Q2_K:
            k_args = (p["scales"], p["qs"], p["d"], p["dmin"])
            return (kquants_low.rows_q2_k, k_args + (n_out,), kquants_low.matmul_q2_k, k_args + (plain, n_out))
        if qt == Q.Q3_K:
            k_args = (p["hmask"], p["qs"], p["scales"], p["d"])
            return (kquants_low.rows_q3_k, k_args + (n_out,), kquants_low.matmul_q3_k, k_args + (plain, n_out))
        if qt == Q.IQ4_NL:
            return (iquants.rows_iq4_nl, (p["qs"], p["d"], n_out),
                    iquants.matmul_iq4_nl, (p["qs"], p["d"], plain, n_out))
        if qt == Q.IQ4_XS:
            k_args = (p["d"], p["scales_h"], p["scales_l"], p["qs"])
            return (iquants.rows_iq4_xs, k_args + (n_out,), iquants.matmul_iq4_xs, k_args + (plain, n_out))
        f_args = (p["w"], _FLOAT_KIND[qt])
        return floats.rows_float, f_args + (n_out,), floats.matmul_float, f_args + (plain, n_out)

    @classmethod
    def from_tensor(cls, t: ReaderTensor, release_source: bool = True, kept=None) -> "QMatrix":
        """Wrap a tensor of a GGUFReader (with its planes ``kept`` from an earlier start, a
        quant/planes_file.py Kept, if any).
        With release_source, the file pages read while repacking are dropped from this process
        (madvise), so the resident size of a loaded model stays that of its repacked planes;
        ``.raw`` remains valid and re-reads the file."""
        # GGUF lists dims fastest-first: shape [n_in, n_out].
        n_in, n_out = int(t.shape[0]), int(t.shape[1])
        qtype = GGMLQuantizationType(t.tensor_type)
        if kept is not None and (kept.qtype, kept.shape) != (int(qtype), (n_out, n_in)):
            kept = None       # kept for another tensor of that name: repack
        m = cls(t.name, t.data, qtype, n_out, n_in, kept.planes if kept is not None else None)
        if release_source and not m.reads_the_file:
            release_file_pages(t.data)
        return m

    @classmethod
    def from_array(cls, data: np.ndarray, qtype: GGMLQuantizationType, name: str = "") -> "QMatrix":
        """Wrap an in-memory 2-D array in GGUF layout: (n_out, bytes_per_row) uint8 for block
        types (what ``gguf.quants.quantize`` returns), (n_out, n_in) float32/float16 for F32/F16,
        uint16 bit patterns (or the bytes) for BF16."""
        qtype = GGMLQuantizationType(qtype)
        if data.dtype == np.uint8:
            n_out, n_in = quants.quant_shape_from_byte_shape(data.shape, qtype)
        else:
            n_out, n_in = data.shape
        return cls(name, data, qtype, int(n_out), int(n_in))

    @property
    def batches_fast(self) -> bool:
        """The integer kernels multiply long prefill chunks as fast as dequantizing to
        float32 for BLAS (quant/blas.py) does, so they keep llama.cpp's numbers there too:
        AVX2's Q4_K and Q6_K (measured on Qwen2.5-1.5B, 256-token chunks: ~35 tokens/s
        either way on 2 cores), and the 32-element block formats where the CPU has VNNI
        (legacy_batch.py: faster than sgemm at 512 tokens; without VNNI 1.3-1.5x its time,
        so there long chunks keep sgemm)."""
        return self.qtype in _AVX2_K or (self._batch_args is not None and HAS_VNNI)

    @property
    def reads_the_file(self) -> bool:
        """The kernels read the GGUF bytes where they lie (no repacked copy)."""
        return any(np.shares_memory(plane, self.raw) for plane in self.planes.values())

    @property
    def x8_planes(self) -> np.ndarray | None:
        """The repacked Q4_K planes (groups * nsb * 1152,) uint8 where the AVX2 kernels multiply
        this matrix (it can then be stacked with others of its kind: quant/stack.py), else None."""
        return self.planes["x8"] if self.qtype == Q.Q4_K and self.qtype in _AVX2_K else None

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    # ---- Public API

    def dequantize(self) -> np.ndarray:
        """(n_out, n_in) float32 — for tests and references only."""
        return self.rows(np.arange(self.shape[0]))

    def rows(self, ids) -> np.ndarray:
        """(len(ids), n_in) float32: dequantized rows, e.g. an embedding lookup."""
        ids = np.ascontiguousarray(ids, dtype=np.int64).reshape(-1)  # (n_ids,) int64
        n_out, n_in = self.shape
        if ids.size and (ids.min() < 0 or ids.max() >= n_out):
            raise IndexError(f"{self.name}: row ids must lie in [0, {n_out})")
        out = np.empty((ids.size, n_in), np.float32)  # (n_ids, n_in) float32
        self._rows_kernel(*self._rows_args, ids, out)
        return out

    @property
    def rows_kernel(self):
        """(serial rows kernel, its leading arguments): kernel(*args, ids, out) dequantizes
        rows ``ids`` into out; app/engine/quant/blas.py runs it on parts of the matrix."""
        return self._rows_kernel, self._rows_args

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """x (n_in,) float32 -> (n_out,) float32. The decode path: ~200 calls per token, so it
        skips what matmul checks generally (each numpy call here costs ~0.3 us)."""
        n_out, n_in = self.shape
        x = token_activations(x, n_in, self.name)
        out = np.empty((1, n_out), np.float32)          # (1, n_out) float32
        self._mm_kernel(*self._mm_args, min(self._n_groups, num_threads()), x.reshape(1, n_in), out)
        return out[0]

    def activations(self, x) -> np.ndarray:
        """x as (n_tok, n_in) contiguous float32 for a product with this matrix, or a
        ValueError naming the matrix and the shape it got."""
        x = np.ascontiguousarray(x, dtype=np.float32)  # (n_tok, n_in) float32
        if x.ndim != 2 or x.shape[1] != self.shape[1]:
            raise ValueError(f"{self.name}: expected activations (n_tok, {self.shape[1]}), got {x.shape}")
        return x

    def matmul(self, x: np.ndarray) -> np.ndarray:
        """x (n_tok, n_in) float32 -> (n_tok, n_out) float32."""
        x = self.activations(x)                        # (n_tok, n_in) float32
        n_out = self.shape[0]
        out = np.empty((x.shape[0], n_out), np.float32)  # (n_tok, n_out) float32
        if x.shape[0] == 0:
            return out
        if x.shape[0] >= LEGACY_BATCH_MIN and self._batch_args is not None:
            vnni = HAS_VNNI and x.shape[0] >= legacy_batch.VNNI_MIN_TOKENS
            legacy_batch.matmul_legacy_batch(*self._batch_args, vnni, self.shape[0], min(self._n_groups, num_threads()),
                                             x, out)
            return out
        self._mm_kernel(*self._mm_args, min(self._n_groups, num_threads()), x, out)
        return out

    def __repr__(self) -> str:
        return f"QMatrix({self.name!r}, {self.qtype.name}, shape={self.shape})"


def token_activations(x, n_in: int, what: str) -> np.ndarray:
    """One token's activations x as (n_in,) contiguous float32, or a ValueError naming ``what``
    (the matrix or matrices) and the shape it got. On the decode path: no more numpy calls
    than it needs."""
    if type(x) is not np.ndarray or x.dtype != np.float32 or not x.flags.c_contiguous:
        x = np.ascontiguousarray(x, dtype=np.float32)
    if x.shape != (n_in,):
        raise ValueError(f"{what}: expected activations ({n_in},), got {x.shape}")
    return x


# ---- resident memory

_MADV_DONTNEED = 4


def release_file_pages(arr: np.ndarray) -> bool:
    """Drop the pages of ``arr`` from this process if (and only if) it views a read-only
    shared file mapping (np.memmap mode 'r', as GGUFReader opens files). The page cache keeps
    them and a later read faults them back in; anonymous or copy-on-write memory would lose
    data under MADV_DONTNEED, so anything else is left alone. Returns True if released."""
    base = arr
    while base is not None and not isinstance(base, np.memmap):
        base = getattr(base, "base", None)
        if isinstance(base, mmap.mmap):
            return False  # a bare mmap: its access mode is not visible, so do nothing
    if base is None or getattr(base, "mode", None) != "r":
        return False
    page = mmap.PAGESIZE
    start = arr.ctypes.data
    lo = -(-start // page) * page                  # first whole page inside arr
    hi = (start + arr.nbytes) // page * page       # end of the last whole page
    if hi <= lo:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.madvise(ctypes.c_void_p(lo), ctypes.c_size_t(hi - lo), _MADV_DONTNEED) == 0
