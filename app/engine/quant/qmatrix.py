"""Quantized weight matrices, kept in their GGUF block format.

INTERFACE CONTRACT (used by app/engine/model/transformer.py): a ``QMatrix`` wraps one 2-D GGUF tensor
without copying it to f32:

    QMatrix.from_tensor(ReaderTensor)       .name .raw .qtype .shape == (n_out, n_in) .nbytes
    .dequantize() -> (n_out, n_in) f32      tests only
    .rows(ids)    -> (len(ids), n_in) f32   embedding lookup
    .matvec(x (n_in,) f32)       -> (n_out,) f32          decode
    .matmul(X (n_tok, n_in) f32) -> (n_tok, n_out) f32    chunked prefill

Each type's facts (its repacking, its f16 scale planes, its kernels) are one record of
``quant/formats.py``. At construction the blocks are repacked once into the row-group planes of
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
tests/engine/quant/test_quants.py checks against ggml_mul_mat itself), up to the order of float
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
from gguf import GGMLQuantizationType, quants
from gguf.gguf_reader import ReaderTensor

from ..cpu.threads import num_threads
from ..ops.f16 import f16_plane_is_plain
from ..ops.simd_int import HAS_VNNI
from . import legacy_batch
from .formats import FORMATS
from .layout import GROUP

# From this many tokens the 32-element block formats unpack each row group once for the
# batch (legacy_batch.py): from here on unpacking once for the batch costs no more than
# legacy.py's per-token kernels unpacking for every token, and saves more as the batch grows.
LEGACY_BATCH_MIN = 4


class QMatrix:
    """A weight matrix W (n_out, n_in) in GGUF block format; y = W @ x."""

    def __init__(self, name: str, raw: np.ndarray, qtype: GGMLQuantizationType, n_out: int, n_in: int,
                 planes: dict[str, np.ndarray] | None = None):
        """planes: this matrix's planes as an earlier start repacked them (quant/planes_file.py),
        used instead of repacking."""
        qtype = GGMLQuantizationType(qtype)
        if qtype not in FORMATS:
            # the problem only: Model names the file and gives the advice (llama.cpp), once
            runs = ", ".join(t.name for t in sorted(FORMATS, key=int))
            raise ValueError(f"tensor {name!r} has type {qtype.name}, which the ellm engine has no "
                             f"kernels for (it runs {runs})")
        self.format = fmt = FORMATS[qtype]
        block, block_bytes = fmt.block, fmt.block_bytes
        if n_in % block or raw.nbytes != n_out * (n_in // block) * block_bytes:
            raise ValueError(f"tensor {name!r}: {raw.nbytes} bytes of {qtype.name} do not make a "
                             f"({n_out}, {n_in}) matrix (rows must be whole blocks of {block}); "
                             f"the GGUF file may be truncated or corrupt")
        self.name = name
        self.raw = raw  # (n_out, bytes_per_row) uint8, or (n_out, n_in) for F32/F16 — a view of the mmap
        self.qtype = qtype
        self.shape = (n_out, n_in)
        self.planes = planes if planes is not None else fmt.repack(raw, n_out, n_in)
        # name -> (n,) plane in row groups, same bytes
        # f16 scales (F16: the weights) that are all zeros or normal numbers convert faster
        self.plain_scales = f16_plane_is_plain(*(self.planes[k] for k in fmt.f16_scales))
        # the kernels, bound once so a decode step pays for no lookups
        self._rows_kernel, self._rows_args, self._mm_kernel, self._mm_args = fmt.kernels(self.planes, n_out,
                                                                                         self.plain_scales)
        # legacy_batch.matmul_legacy_batch's leading arguments (its batches of LEGACY_BATCH_MIN tokens or more), or None
        self._batch_args = fmt.batch(self.planes, self.plain_scales) if fmt.batch else None
        self._n_groups = -(-n_out // GROUP)  # the kernels run one chunk of groups per thread

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
        AVX2's Q4_K and Q6_K, and the 32-element block formats where the CPU has VNNI
        (legacy_batch.py; without VNNI their unpacking makes them slower than sgemm, so there
        long chunks keep sgemm). docs/benchmarks.md has the figures."""
        return self.format.integer_batches

    @property
    def reads_the_file(self) -> bool:
        """The kernels read the GGUF bytes where they lie (no repacked copy)."""
        return any(np.shares_memory(plane, self.raw) for plane in self.planes.values())

    @property
    def x8_planes(self) -> np.ndarray | None:
        """The repacked Q4_K planes (groups * nsb * 1152,) uint8 where the AVX2 kernels multiply
        this matrix (it can then be stacked with others of its kind: quant/stack.py), else None."""
        return self.planes["x8"] if self.format.stacks else None

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
        skips what matmul checks generally (each numpy call's fixed cost is paid ~200 times a
        token)."""
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
