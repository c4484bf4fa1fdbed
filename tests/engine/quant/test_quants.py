"""QMatrix and its numba kernels, tested differentially (against gguf, numpy and llama.cpp):

* rows()/dequantize() bit-exact against gguf.quants.dequantize, for every supported type;
* activation quantization exactly as llama.cpp's x86 CPU backend does it, against an
  independent numpy transcription of arch/x86/quants.c and ggml-quants.c;
* matvec/matmul against a plain-numpy product that uses the same quantized activations
  (tight tolerance), against llama.cpp's own ggml_mul_mat on the CPU (the libggml that
  llama-cpp-python ships; skipped without it), and against the dense f32 product (looser,
  stated per type);
* matvec agrees with matmul row by row; the repacked layout keeps the byte count.

Shapes are small so the file runs in seconds once numba's cache is warm.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from app.engine.cpu import threads
from app.engine.ops import f16
from app.engine.quant import activations, layout
from app.engine.quant.qmatrix import QMatrix, release_file_pages
from tests.engine.random_blocks import LAYOUT, f16_bytes, random_blocks

F32 = np.float32
N_OUT, N_IN, N_TOK = 200, 512, 3          # 200 rows: 12 groups of 16 plus a narrower one of 8
ALL_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.IQ4_NL, Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K,
             Q.IQ4_XS, Q.F32, Q.F16, Q.BF16]

# ||ours - dense f32|| / ||dense|| for gaussian activations: the error of quantizing them to
# int8 (~0.55 % measured), f16 (~0.02 %) or bf16 (~0.16 %); the weights are the same
# dequantized values on both sides. (Outliers widen the int8 error, most for Q8_K's blocks of
# 256, exactly as in llama.cpp; test_matmul_matches_llama_cpp_formula covers those.)
DENSE_TOL = {Q.Q4_0: 1e-2, Q.Q4_1: 1e-2, Q.Q5_0: 1e-2, Q.Q5_1: 1e-2, Q.Q8_0: 1e-2, Q.IQ4_NL: 1e-2,
             Q.Q2_K: 1e-2, Q.Q3_K: 1e-2, Q.IQ4_XS: 1e-2, Q.Q4_K: 1e-2, Q.Q5_K: 1e-2, Q.Q6_K: 1.2e-2,
             Q.F32: 1e-5, Q.F16: 5e-4, Q.BF16: 4e-3}
REF_RTOL = 1e-5  # same integer sums and scales; only float additions may be ordered differently
LANE_EXACT = (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0)  # products bit-identical to llama.cpp's AVX2 kernels
# Q6_K on AVX2: vec_dot's lanes below 8 tokens, the tiled kernel's order from 8 (quant/kquants_avx2.py).
# Q4_K on AVX2 follows llama.cpp's repacked kernels, which a bare ggml_mul_mat does not take.
# IQ4_NL: bit-identical to llama.cpp's batches (tinyBLAS: Q4_0's lanes and order) and to the
# numpy formula; its one-token vec_dot adds even and odd blocks in two accumulators.
BATCH_EXACT = (Q.IQ4_NL,)


# ---- test data

def make_raw(qtype, n_out: int, n_in: int, seed: int = 0) -> np.ndarray:
    """GGUF-layout data of one matrix: gguf's own quantizer where it has one, else random
    valid blocks whose f16 scales are finite (K-quants, IQ4_NL, IQ4_XS)."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((n_out, n_in)).astype(F32)            # (n_out, n_in) float32
    w *= rng.uniform(0.1, 3.0, (n_out, 1)).astype(F32)            # rows of different scale
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16):
        return quants.quantize(w, qtype)                          # (n_out, bytes_per_row) uint8
    if qtype == Q.F32:
        return w
    if qtype == Q.F16:
        w[np.abs(w) < 1e-3] = 1e-3        # no f16 subnormals: the fast conversion (see below)
        return w.astype(np.float16)
    return random_blocks(qtype, n_out, n_in, rng)                 # (n_out, bytes_per_row) uint8


def make_acts(n_tok: int, n_in: int, seed: int = 1) -> np.ndarray:
    """(n_tok, n_in) float32 activations with outliers, a zero block and exact .5 ties."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n_tok, n_in)).astype(F32)
    x[:, 5] *= 40                       # an outlier channel, as real residual streams have
    x[0, 32:64] = 0                     # a zero Q8_0 block: d = 0, q = 0
    x[-1, 96:128] = 0.5                 # with x = 127 in the block, id = 127 / 127 = 1, so
    x[-1, 127] = 127.0                  # q = rint(0.5) = 0 and rint(-2.5) = -2 (ties to even);
    x[-1, 100] = -2.5                   # the _ref quantizer's roundf would give 1 and -3
    return x


@pytest.fixture(scope="module", params=ALL_TYPES, ids=lambda t: t.name)
def case(request):
    qtype = request.param
    raw = make_raw(qtype, N_OUT, N_IN)
    return qtype, raw, QMatrix.from_array(raw, qtype, name=f"test.{qtype.name}")


# ---- independent numpy references (transcribed from llama.cpp, not from our kernels)

def ref_acts_q8(x: np.ndarray):
    """arch/x86/quants.c quantize_row_q8_0 / _q8_1 (AVX2): -> q (n_tok, nb, 32) int64,
    d (n_tok, nb) f16-valued float32, s (n_tok, nb) f16-valued float32 (Q8_1), qsum int64."""
    n_tok, n_in = x.shape
    xb = x.reshape(n_tok, n_in // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    d = amax / F32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, F32(127) / amax, F32(0)).astype(F32)
    q = np.rint(xb * inv[..., None]).astype(np.int64)           # _MM_ROUND_NEAREST: ties to even
    qsum = q.sum(axis=-1)
    s = (d * qsum.astype(F32)).astype(np.float16).astype(F32)   # with the unrounded d
    return q, d.astype(np.float16).astype(F32), s, qsum


def ref_acts_q8_k(x: np.ndarray):
    """ggml-quants.c quantize_row_q8_K_ref: -> q (n_tok, nsb, 256) int64, d (n_tok, nsb)
    float32, bsums (n_tok, nsb, 16) int64."""
    n_tok, n_in = x.shape
    xb = x.reshape(n_tok, n_in // 256, 256)
    imax = np.abs(xb).argmax(axis=-1)                           # first of equal |x|, as `>` does
    vmax = np.take_along_axis(xb, imax[..., None], axis=-1)[..., 0]
    with np.errstate(divide="ignore", invalid="ignore"):
        iscale = (F32(-127) / vmax).astype(F32)
        q = np.minimum(127, np.rint(iscale[..., None] * xb)).astype(np.int64)
        d = (F32(1) / iscale).astype(F32)
    zero = vmax == 0
    q[zero] = 0
    d[zero] = 0
    return q, d, q.reshape(n_tok, n_in // 256, 16, 16).sum(axis=-1)


def ref_lanes(wq, dw, mw, q, dx, sx) -> np.ndarray:
    """llama.cpp's AVX2 vec_dot for 32-blocks, float order included: lane l holds the integer
    sum of elements 4l..4l+3 (vpmaddubsw + vpmaddwd), fma(d_w * d_x, lane, acc[l]) per block,
    then hsum_float_8 and (Q4_1) the sum of m_w * s_x.

    wq (n_out, nb, 32) int64;  dw, mw (n_out, nb) float32;  q (n_tok, nb, 32) int64;
    dx, sx (n_tok, nb) float32  ->  (n_tok, n_out) float32
    """
    n_out, nb, _ = wq.shape
    lanes = np.einsum("rbld,kbld->krbl", wq.reshape(n_out, nb, 8, 4), q.reshape(-1, nb, 8, 4))
    acc = np.zeros((q.shape[0], n_out, 8), F32)                  # (n_tok, n_out, 8) float32
    summs = np.zeros((q.shape[0], n_out), F32)                   # (n_tok, n_out) float32
    for b in range(nb):
        dd = dw[None, :, b] * dx[:, b:b + 1]                     # f16 x f16: exact in float32
        # fma: the product is exact in float64, so one more rounding to float32 is fma's
        acc = (dd[..., None].astype(np.float64) * lanes[:, :, b] + acc).astype(F32)
        summs = summs + mw[None, :, b] * sx[:, b:b + 1]           # exact product
    a = [acc[..., lane] for lane in range(8)]
    return (((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))) + summs


def _f16_field(blocks: np.ndarray, off: int) -> np.ndarray:
    """(n_out, nb, size) uint8 -> (n_out, nb) float32 of the f16 at byte off."""
    return np.ascontiguousarray(blocks[:, :, off:off + 2]).view(np.float16)[..., 0].astype(F32)


def ref_matmul(qtype, raw: np.ndarray, x: np.ndarray) -> np.ndarray:
    """(n_tok, n_out) float32: llama.cpp's dot product formulas (arch/x86/quants.c
    ggml_vec_dot_*), integer sums exact. Q4_0/Q4_1/Q8_0 in llama.cpp's float order too (its
    8 AVX2 lanes, see ref_lanes); the other types add their float terms block after block."""
    n_out, n_in = N_OUT, x.shape[1]
    if qtype in (Q.F32, Q.F16, Q.BF16):
        w = quants.dequantize(raw, qtype).reshape(n_out, n_in).astype(F32)
        if qtype == Q.F16:
            xr = x.astype(np.float16).astype(F32)
        elif qtype == Q.BF16:
            xr = quants.dequantize(quants.quantize(x, Q.BF16), Q.BF16).reshape(x.shape)
        else:
            xr = x
        acc = np.zeros((x.shape[0], n_out), F32)
        for j in range(n_in):
            acc = acc + xr[:, j:j + 1] * w[None, :, j]
        return acc
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.IQ4_NL):
        size = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34, Q.IQ4_NL: 18}[qtype]
        blocks = raw.reshape(n_out, n_in // 32, size)
        q, dx, sx, _ = ref_acts_q8(x)
        dw = _f16_field(blocks, 0)
        if qtype == Q.Q8_0:
            wq = blocks[:, :, 2:].view(np.int8).astype(np.int64)
        elif qtype == Q.IQ4_NL:
            qs = blocks[:, :, 2:]
            wq = IQ4NL_LEVELS[np.concatenate([qs & 15, qs >> 4], axis=-1)]
        else:
            qs = blocks[:, :, size - 16:]
            wq = np.concatenate([qs & 15, qs >> 4], axis=-1).astype(np.int64)
            if qtype in (Q.Q5_0, Q.Q5_1):      # fifth bit e: bit e of qh as a little-endian uint32
                qh = np.ascontiguousarray(blocks[:, :, size - 20:size - 16]).view("<u4")[..., 0]
                wq |= ((qh[..., None].astype(np.int64) >> np.arange(32)) & 1) << 4
            wq -= {Q.Q4_0: 8, Q.Q5_0: 16}.get(qtype, 0)
        mw = _f16_field(blocks, 2) if qtype in (Q.Q4_1, Q.Q5_1) else np.zeros_like(dw)
        return ref_lanes(wq, dw, mw, q, dx, sx)
    q, dk, bsums = ref_acts_q8_k(x)
    nsb = n_in // 256
    if qtype in (Q.Q2_K, Q.Q3_K, Q.IQ4_XS):
        _, size, (d_off, *_) = LAYOUT[qtype]
        blocks = raw.reshape(n_out, nsb, size)
        wq = np.rint(quants.dequantize(_with_unit_scales(blocks, qtype), qtype))   # the levels
        sc = _sub_block_scales(blocks, qtype)                                       # (n_out, nsb, S)
        wq = (wq.astype(np.int64).reshape(n_out, nsb, sc.shape[-1], -1) * sc[..., None]).reshape(n_out, nsb, 256)
        sumi = np.einsum("rbj,kbj->kbr", wq, q).astype(F32)
        dw = _f16_field(blocks, d_off)
        terms = [(dw[None, :, b] * dk[:, b:b + 1]) * sumi[:, b] for b in range(nsb)]
        if qtype == Q.Q2_K:   # - dmin * sum_s m_s * bsums[s]
            summ = np.einsum("rbs,kbs->kbr", (blocks[:, :, 0:16] >> 4).astype(np.int64), bsums).astype(F32)
            mw = _f16_field(blocks, 82)
            terms = [t - (mw[None, :, b] * dk[:, b:b + 1]) * summ[:, b] for b, t in enumerate(terms)]
    elif qtype == Q.Q6_K:
        blocks = raw.reshape(n_out, nsb, 210)
        wq = np.rint(quants.dequantize(_with_unit_scales(blocks, qtype), qtype))  # q - 32
        sc = blocks[:, :, 192:208].view(np.int8).astype(np.int64)               # (n_out, nsb, 16)
        wq = (wq.astype(np.int64).reshape(n_out, nsb, 16, 16) * sc[..., None]).reshape(n_out, nsb, 256)
        dw = _f16_field(blocks, 208)
        isum = np.einsum("rbj,kbj->kbr", wq, q).astype(F32)
        terms = [(dw[None, :, b] * dk[:, b:b + 1]) * isum[:, b] for b in range(nsb)]
    else:
        size = 144 if qtype == Q.Q4_K else 176
        blocks = raw.reshape(n_out, nsb, size)
        sc, mn = quants.Q4_K.get_scale_min(blocks[:, :, 4:16].reshape(-1, 12))
        sc = sc.reshape(n_out, nsb, 8).astype(np.int64)
        mn = mn.reshape(n_out, nsb, 8).astype(np.int64)
        wq = np.rint(quants.dequantize(_with_unit_scales(blocks, qtype), qtype))  # the raw q
        wq = wq.astype(np.int64).reshape(n_out, nsb, 8, 32) * sc[..., None]
        sumi = np.einsum("rbj,kbj->kbr", wq.reshape(n_out, nsb, 256), q)
        summ = np.einsum("rbs,kbs->kbr", mn, bsums.reshape(-1, nsb, 8, 2).sum(axis=-1))
        dw, mw = _f16_field(blocks, 0), _f16_field(blocks, 2)
        terms = [(dw[None, :, b] * dk[:, b:b + 1]) * sumi[:, b].astype(F32)
                 - (mw[None, :, b] * dk[:, b:b + 1]) * summ[:, b].astype(F32) for b in range(nsb)]
    acc = np.zeros((x.shape[0], n_out), F32)   # per block: (n_tok, n_out) float32 terms, in order
    for t in terms:
        acc = acc + t
    return acc


IQ4NL_LEVELS = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113])
"""kvalues_iq4nl of ggml-common.h: the level each 4-bit index of IQ4_NL / IQ4_XS stands for."""


def _sub_block_scales(blocks: np.ndarray, qtype) -> np.ndarray:
    """(n_out, nsb, size) uint8 -> (n_out, nsb, S) int64: the integer scale of each sub-block
    (ggml-common.h layouts): Q2_K its 4-bit scale (S = 16), Q3_K its 6-bit scale - 32 (S = 16),
    IQ4_XS its 6-bit scale - 32 (S = 8)."""
    b = blocks.astype(np.int64)
    if qtype == Q.Q2_K:
        return b[:, :, 0:16] & 15
    if qtype == Q.Q3_K:
        s = np.arange(16)
        lo = (b[:, :, 96 + s % 8] >> (4 * (s // 8))) & 15
        hi = (b[:, :, 104 + s % 4] >> (2 * (s // 4))) & 3
        return (lo | (hi << 4)) - 32
    ib = np.arange(8)
    sh = b[:, :, 2:3] | (b[:, :, 3:4] << 8)
    lo = (b[:, :, 4 + ib // 2] >> (4 * (ib % 2))) & 15
    return (lo | (((sh >> (2 * ib)) & 3) << 4)) - 32


def _with_unit_scales(blocks: np.ndarray, qtype) -> np.ndarray:
    """Copy of K-quant blocks with d = 1, dmin = 0 and every sub-block scale = 1 (Q2_K no min;
    Q3_K / IQ4_XS a 6-bit 33), so gguf's dequantizer yields the integer quants (IQ4_XS: their
    levels) themselves."""
    b = blocks.copy()
    one, zero = f16_bytes(np.ones(1))[0], f16_bytes(np.zeros(1))[0]
    if qtype == Q.Q2_K:
        b[:, :, 0:16] = 0x01                  # sc = 1, m = 0
        b[:, :, 80:82], b[:, :, 82:84] = one, zero
        return b.reshape(b.shape[0], -1)
    if qtype == Q.Q3_K:
        b[:, :, 96:104] = 0x11                # low 4 bits of every scale: 1
        b[:, :, 104:108] = 0xAA               # high 2 bits: 2, so 33 - 32 = 1
        b[:, :, 108:110] = one
        return b.reshape(b.shape[0], -1)
    if qtype == Q.IQ4_XS:
        b[:, :, 0:2] = one
        b[:, :, 2:4] = 0xAA                   # scales_h: high 2 bits 2 ...
        b[:, :, 4:8] = 0x11                   # ... scales_l: low 4 bits 1: 33 - 32 = 1
        return b.reshape(b.shape[0], -1)
    if qtype == Q.Q6_K:
        b[:, :, 192:208] = 1
        b[:, :, 208:210] = one
        return b.reshape(b.shape[0], -1)
    b[:, :, 0:2], b[:, :, 2:4] = one, zero
    b[:, :, 4:8] = 1            # sc 0..3 = 1, mins 0..3 = 0, high bits of 4..7 = 0
    b[:, :, 8:12] = 0
    b[:, :, 12:16] = 0x01       # sc 4..7 = 1, mins 4..7 = 0
    return b.reshape(b.shape[0], -1)


# ---- dequantization: bit-exact with gguf

def test_dequantize_is_bit_exact(case):
    qtype, raw, m = case
    expected = quants.dequantize(raw, qtype).reshape(N_OUT, N_IN).astype(F32)
    got = m.dequantize()
    assert got.dtype == F32 and got.shape == (N_OUT, N_IN)
    assert np.array_equal(got.view(np.uint32), expected.view(np.uint32))


def test_rows_is_bit_exact_across_group_edges(case):
    qtype, raw, m = case
    ids = [0, 15, 16, 191, 192, 199, 5, 16]             # group starts/ends, the narrow group, repeats
    expected = quants.dequantize(raw[ids], qtype).reshape(len(ids), N_IN).astype(F32)
    assert np.array_equal(m.rows(ids).view(np.uint32), expected.view(np.uint32))


def test_rows_rejects_out_of_range_ids(case):
    with pytest.raises(IndexError):
        case[2].rows([N_OUT])


def test_repacked_planes_keep_the_byte_count(case):
    qtype, raw, m = case
    assert m.nbytes == raw.nbytes
    assert sum(p.nbytes for p in m.planes.values()) == raw.nbytes
    assert not any(p.dtype == F32 for p in m.planes.values()) or qtype == Q.F32


# ---- products

def test_matmul_matches_llama_cpp_formula(case):
    qtype, raw, m = case
    x = make_acts(N_TOK, N_IN)
    expected = ref_matmul(qtype, raw, x)
    got = m.matmul(x)
    assert got.shape == (N_TOK, N_OUT) and got.dtype == F32
    if qtype in LANE_EXACT + BATCH_EXACT:   # IEEE arithmetic in a fixed order: the same bits anywhere
        assert np.array_equal(got, expected), f"{int((got != expected).sum())} outputs differ"
    else:
        scale = float(np.sqrt(np.mean(expected.astype(np.float64) ** 2)))
        np.testing.assert_allclose(got, expected, rtol=REF_RTOL, atol=REF_RTOL * scale)


# ---- llama.cpp itself: one ggml_mul_mat through ctypes

class _GgmlInitParams(ctypes.Structure):
    _fields_ = [("mem_size", ctypes.c_size_t), ("mem_buffer", ctypes.c_void_p), ("no_alloc", ctypes.c_bool)]


@pytest.fixture(scope="module")
def ggml_mul_mat():
    """(raw, qtype, n_out, n_in, x (n_tok, n_in) f32) -> (n_tok, n_out) f32 computed by
    ggml_mul_mat on llama.cpp's CPU backend (ggml.h / ggml-cpu.h C API)."""
    try:
        import llama_cpp
        lib = os.path.join(os.path.dirname(llama_cpp.__file__), "lib")
        base = ctypes.CDLL(os.path.join(lib, "libggml-base.so"), mode=ctypes.RTLD_GLOBAL)
        cpu = ctypes.CDLL(os.path.join(lib, "libggml-cpu.so"), mode=ctypes.RTLD_GLOBAL)
        p = ctypes.c_void_p
        base.ggml_init.restype, base.ggml_init.argtypes = p, [_GgmlInitParams]
        base.ggml_new_tensor_2d.restype = p
        base.ggml_new_tensor_2d.argtypes = [p, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        base.ggml_mul_mat.restype, base.ggml_mul_mat.argtypes = p, [p, p, p]
        base.ggml_new_graph.restype, base.ggml_new_graph.argtypes = p, [p]
        base.ggml_build_forward_expand.argtypes = [p, p]
        base.ggml_get_data.restype, base.ggml_get_data.argtypes = p, [p]
        base.ggml_nbytes.restype, base.ggml_nbytes.argtypes = ctypes.c_size_t, [p]
        base.ggml_free.argtypes = [p]
        cpu.ggml_graph_compute_with_ctx.restype = ctypes.c_int
        cpu.ggml_graph_compute_with_ctx.argtypes = [p, p, ctypes.c_int]
    except (ImportError, OSError, AttributeError) as e:
        pytest.skip(f"llama.cpp's libggml is not available: {e}")

    def mul_mat(raw, qtype, n_out, n_in, x):
        raw = np.ascontiguousarray(raw)
        x = np.ascontiguousarray(x, dtype=F32)                       # (n_tok, n_in) float32
        out = np.empty((x.shape[0], n_out), F32)                     # (n_tok, n_out) float32
        ctx = base.ggml_init(_GgmlInitParams(raw.nbytes + x.nbytes + out.nbytes + (16 << 20), None, False))
        try:
            w = base.ggml_new_tensor_2d(ctx, int(qtype), n_in, n_out)  # ggml dims are fastest-first
            a = base.ggml_new_tensor_2d(ctx, int(Q.F32), n_in, x.shape[0])
            assert base.ggml_nbytes(w) == raw.nbytes
            ctypes.memmove(base.ggml_get_data(w), raw.ctypes.data, raw.nbytes)
            ctypes.memmove(base.ggml_get_data(a), x.ctypes.data, x.nbytes)
            y = base.ggml_mul_mat(ctx, w, a)
            graph = base.ggml_new_graph(ctx)
            base.ggml_build_forward_expand(graph, y)
            assert cpu.ggml_graph_compute_with_ctx(ctx, graph, 2) == 0
            ctypes.memmove(out.ctypes.data, base.ggml_get_data(y), out.nbytes)
        finally:
            base.ggml_free(ctx)
        return out

    return mul_mat


def _x86_avx2_fma() -> bool:
    """llama.cpp's CPU backend takes the AVX2 + FMA kernels that QMatrix reproduces bit for bit."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return False
    return {"avx2", "fma", "f16c"} <= set(flags)


@pytest.mark.parametrize("n_tok", [1, 3, 16, 42])
def test_matmul_matches_llama_cpp_ggml_mul_mat(case, ggml_mul_mat, n_tok):
    """The real thing: the same activation quantization and dot products as llama.cpp's CPU
    backend (vec_dot for 1 token, tinyBLAS for more). Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 bit for bit on
    an AVX2 machine, IQ4_NL for 2+ tokens; otherwise (the K-quants, IQ4_XS, one IQ4_NL token)
    up to the order of float additions (measured <= 1.2e-6 of the largest output here).
    Every type the engine runs is compared: none is left to the numpy reference alone."""
    qtype, raw, m = case
    x = make_acts(n_tok, N_IN, seed=n_tok)
    expected = ggml_mul_mat(raw, qtype, N_OUT, N_IN, x)
    got = m.matmul(x)
    from app.engine.ops.simd_int import HAS_AVX2
    exact = qtype in LANE_EXACT or (qtype in BATCH_EXACT and n_tok > 1) or (qtype == Q.Q6_K and HAS_AVX2)
    if exact and _x86_avx2_fma():
        assert np.array_equal(got, expected), f"{int((got != expected).sum())} outputs differ from llama.cpp"
    else:
        scale = float(np.sqrt(np.mean(expected.astype(np.float64) ** 2)))
        np.testing.assert_allclose(got, expected, rtol=REF_RTOL, atol=REF_RTOL * scale)


def test_matmul_is_close_to_dense_f32(case):
    qtype, raw, m = case
    x = np.random.default_rng(5).standard_normal((N_TOK, N_IN)).astype(F32)
    dense = x @ quants.dequantize(raw, qtype).reshape(N_OUT, N_IN).astype(F32).T
    err = np.linalg.norm(m.matmul(x) - dense) / np.linalg.norm(dense)
    assert err < DENSE_TOL[qtype]


def test_matvec_agrees_with_matmul_row_by_row(case):
    """Up to 3 tokens every type takes its one-token kernel for each token (llama.cpp too:
    its repacked Q4_K takes gemm only for fours of tokens, its Q6_K the tiled path only from
    8 tokens; see test_k_quant_batches_take_llamacpps_chains)."""
    _, _, m = case
    x = make_acts(3, N_IN, seed=7)
    y = m.matmul(x)
    for k in range(3):
        v = m.matvec(x[k])
        assert v.shape == (N_OUT,)
        assert np.array_equal(v, y[k])


BLOCK_BYTES = {Q.Q4_0: 18, Q.Q4_1: 20, Q.Q5_0: 22, Q.Q5_1: 24, Q.Q8_0: 34}


@pytest.mark.parametrize("qtype", LANE_EXACT, ids=lambda t: t.name)
def test_block_format_batches_keep_each_tokens_numbers(qtype):
    """From LEGACY_BATCH_MIN tokens the 32-element block formats take legacy_batch.py (each
    row group unpacked once, tokens in fours, the lane sums by float FMAs or by VNNI): every
    token's outputs must be its one-token kernel's to the bit, in both forms (VNNI's emulated
    where the CPU lacks it), in the tiles of four, in the single tokens after them and in the
    last, narrower row group; for a token of zeros, for tokens whose every 8-bit activation is
    +-127, and for weights gguf's quantizer never writes: Q8_0 quants of -128 (VNNI's byte
    offset), subnormal, zero and inf scales (the general f16 conversion)."""
    from app.engine.quant import legacy_batch
    from app.engine.quant.qmatrix import LEGACY_BATCH_MIN
    rng = np.random.default_rng(int(qtype))
    raw = make_raw(qtype, N_OUT, N_IN).copy()
    blocks = raw.reshape(N_OUT, -1, BLOCK_BYTES[qtype])                  # (N_OUT, nb, bytes) uint8 view
    blocks[3, 1, 0:2] = [0x05, 0x00]                                    # d = 5 * 2**-24, subnormal
    blocks[17, 0, 0:2] = [0x00, 0x00]                                   # d = 0
    blocks[196, 2, 0:2] = [0x00, 0x7C]                                  # d = inf (the narrow group)
    if qtype == Q.Q8_0:
        blocks[5:9, :, 2:34] = 0x80                                     # every quant -128
    m = QMatrix.from_array(raw, qtype)
    assert not m.plain_scales
    x = make_acts(LEGACY_BATCH_MIN + 7, N_IN, seed=13)        # (11, N_IN): tiles of 4, then 3 single tokens
    x[2] = 0.0                                              # d_x = 0: a token of zeros
    x[3, ::32] = 1e4                                        # every block's largest |q| is 127
    x[5] = np.where(rng.random(N_IN) < 0.5, -1.0, 1.0) * 1e-3   # all |q| == 127
    with np.errstate(invalid="ignore", over="ignore"):
        one_by_one = np.stack([m.matvec(row) for row in x])        # (11, N_OUT) float32
        assert np.isnan(one_by_one[:, 196]).any() and np.isfinite(one_by_one[:, :196]).all()
        outs = {"matmul": m.matmul(x)}                             # (11, N_OUT) float32 each
        for vnni in (False, True):
            outs[f"vnni={vnni}"] = np.empty((x.shape[0], N_OUT), F32)
            legacy_batch.matmul_legacy_batch(*m._batch_args, vnni, N_OUT, 2, x, outs[f"vnni={vnni}"])
    for name, out in outs.items():
        np.testing.assert_array_equal(out, one_by_one, err_msg=name)
        assert np.array_equal(out[:, :196].view(np.uint32), one_by_one[:, :196].view(np.uint32)), name


def test_k_quant_batches_take_llamacpps_chains():
    """On AVX2, Q4_K multiplies a batch as llama.cpp's repacked kernels do: tokens in fours
    through ggml_gemm_q4_K_8x8_q8_K (a float sum per 64 elements), the last n % 4 through
    ggml_gemv_q4_K_8x8_q8_K (a float sum per super-block), so a token's outputs depend on its
    place in the batch exactly as llama.cpp's do. (That these chains are llama.cpp's own is
    checked on whole models: test_model.py test_k_quant_logits_are_bit_exact_with_llamacpp.)"""
    from app.engine.ops.simd_int import HAS_AVX2
    if not HAS_AVX2:
        pytest.skip("the AVX2 kernels only")
    raw = make_raw(Q.Q4_K, N_OUT, N_IN)
    m = QMatrix.from_array(raw, Q.Q4_K)
    x = make_acts(5, N_IN, seed=11)
    y5, y4 = m.matmul(x), m.matmul(x[:4])
    np.testing.assert_array_equal(y5[:4], y4)              # the first four: one gemm
    np.testing.assert_array_equal(y5[4], m.matvec(x[4]))   # the fifth: gemv
    gemv_rows = np.stack([m.matvec(x[k]) for k in range(4)])
    assert not np.array_equal(gemv_rows, y4), "gemm and gemv add in different orders"
    np.testing.assert_allclose(gemv_rows, y4, rtol=1e-5, atol=1e-5 * float(np.abs(y4).max()))


def test_q4_k_batches_in_token_tiles_keep_each_tokens_chain():
    """A wide input (8960: Qwen2.5-1.5B's FFN) makes the AVX2 Q4_K kernel take tokens in tiles
    of 28 (their activations stay in L2), four at a time inside a tile; a token's outputs must
    still be those of its four (gemm) or its own gemv, across the tiles' edges."""
    from app.engine.ops.simd_int import HAS_AVX2
    if not HAS_AVX2:
        pytest.skip("the AVX2 kernels only")
    from app.engine.quant import kquants_avx2
    n_in = 8960
    assert kquants_avx2.Q4K_TILE_BYTES // n_in == 29        # tiles of 28 tokens
    m = QMatrix.from_array(make_raw(Q.Q4_K, 16, n_in), Q.Q4_K)
    x = make_acts(42, n_in, seed=3)
    y = np.empty((42, 16), F32)                             # tiles [0, 28) and [28, 42); gemv from 40
    kquants_avx2.matmul_q4_k_x8(m.planes["x8"], 16, False, False, 2, x, y)     # not AMX's (tiles of 16)
    for t0 in (0, 24, 28, 36):
        np.testing.assert_array_equal(y[t0:t0 + 4], m.matmul(x[t0:t0 + 4]))
    np.testing.assert_array_equal(y[40], m.matvec(x[40]))
    np.testing.assert_array_equal(y[41], m.matvec(x[41]))


def test_vnni_byte_products_are_the_integers_of_the_widened_form():
    """dpbusd (vpdpbusd where the CPU has VNNI) and dpbusd_widened (32-bit multiplies, any
    CPU): acc + the sums of 4 adjacent unsigned x signed byte products, wrapping in int32,
    at the extremes of both byte ranges."""
    from numba import njit

    from app.engine.ops.simd_int import HAS_AVX2, dpbusd, dpbusd_widened, hsum32, load256, vand
    if not HAS_AVX2:
        pytest.skip("x86 vectors only")

    @njit
    def both(acc, a, b, native, widened):
        c, x, y = load256(acc, 0), load256(a, 0), load256(b, 0)
        one = np.zeros(8, np.int32)          # (8,) int32: all ones in lane i picks lane i
        for i in range(8):
            one[:] = 0
            one[i] = -1
            native[i] = hsum32(vand(dpbusd(c, x, y), load256(one, 0)))
            widened[i] = hsum32(vand(dpbusd_widened(c, x, y), load256(one, 0)))

    rng = np.random.default_rng(3)
    for trial in range(20):
        a = rng.integers(0, 256, 32).astype(np.uint8)
        b = rng.integers(-128, 128, 32).astype(np.int8)
        if trial == 0:
            a[:], b[:] = 255, -128                        # the largest magnitude of a product
        acc = rng.integers(-2**31, 2**31, 8, dtype=np.int64).astype(np.int32)
        acc[0] = 2**31 - 1                                # wraps past the top
        native, widened = np.empty(8, np.int32), np.empty(8, np.int32)
        both(acc, a, b, native, widened)
        expected = (acc.astype(np.int64) + (a.astype(np.int64) * b).reshape(8, 4).sum(axis=1))
        expected = ((expected + 2**31) % 2**32 - 2**31).astype(np.int32)
        np.testing.assert_array_equal(native, expected)
        np.testing.assert_array_equal(widened, expected)


def _extreme_q4_k(n_out: int, n_in: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_K rows of nibbles 15 with scales and mins 63, and activations that Q8_K makes all
    -127 (token 0) or all 127 but one (token 1): the largest sub-block sums, |S| = 60,960,
    and super-block integers near 31 M, beyond float32's exact integers (2**24), which the
    AMX path forms in int32 (C_l + 8 C_h) before they are rounded."""
    raw = make_raw(Q.Q4_K, n_out, n_in).reshape(n_out, n_in // 256, 144)
    raw[:, :, 4:] = 0xFF                                  # 12 scale bytes, then 128 bytes of nibbles
    x = np.ones((6, n_in), F32)
    x[1] = 1.0
    x[1, ::256] = -1.0                                    # first of the largest |x|: q = -127 here, +127 elsewhere
    x[2:] = make_acts(4, n_in, seed=9)
    return raw.reshape(n_out, -1), x


@pytest.mark.parametrize("n_tok, n_in", [(4, 512), (7, 512), (37, 512), (42, 8960), (261, 512), (-1, 512)])
@pytest.mark.parametrize("mode", ["vnni", "amx"])
def test_q4_k_batches_on_vnni_and_amx_keep_their_chains(n_tok, n_in, mode):
    """Q4_K's fours of tokens with vnni sum each sub-block in int32 lanes (vpdpbusd) and scale
    them with vpmulld instead of vpmaddubsw's int16 pairs and vpmaddwd: the same integers and
    float ops, so every output is the same float, in fours and in the n % 4 rest. With amx,
    batches of 16 tokens or more go through AMX tiles, 16 tokens by 16 rows (two groups), the
    scales inside the weights (nibble x the low and the high 3 bits of the scale) and the mins
    as a third product, so each super-block's integers come whole and take llama.cpp's gemv
    float steps: every token gets the bits it gets alone (matmul of one token, the gemv), in
    tiles of 16 and their partial last one, across the token tiles of a wide input and of a long
    batch (261: passes of 256 tokens, then 5), in a thread's last group alone and a last group
    of 4 rows (44 rows: alone, or second in a pair) and at the largest sums
    (n_tok -1: _extreme_q4_k). QMatrix takes them where the CPU has them."""
    from app.engine.ops.amx import HAS_AMX
    from app.engine.ops.simd_int import HAS_AVX2
    from app.engine.quant import kquants_avx2
    if not HAS_AVX2 or (mode == "amx" and not HAS_AMX):
        pytest.skip(f"the AVX2 kernels only, {mode} where the CPU has it")
    if n_tok < 0:
        raw, x = _extreme_q4_k(44, n_in)
        x = np.concatenate([x] * 4)                       # 24 tokens: one AMX tile and a part
        n_tok = x.shape[0]
    else:
        raw, x = make_raw(Q.Q4_K, 44, n_in, seed=n_tok), make_acts(n_tok, n_in, seed=n_tok)
    m = QMatrix.from_array(raw, Q.Q4_K)
    avx2 = np.empty((n_tok, 44), F32)
    kquants_avx2.matmul_q4_k_x8(m.planes["x8"], 44, False, False, 2, x, avx2)
    alone = np.empty((n_tok, 44), F32)                    # each token alone: the gemv chain
    for t in range(n_tok):
        kquants_avx2.matmul_q4_k_x8(m.planes["x8"], 44, False, False, 2, x[t:t + 1], alone[t:t + 1])
    on_amx = n_tok >= kquants_avx2.AMX_TOKENS
    for n_chunks in (1, 2):       # 1: the 4-row last group is the second of a pair; 2: alone
        got = np.empty((n_tok, 44), F32)
        kquants_avx2.matmul_q4_k_x8(m.planes["x8"], 44, True, mode == "amx", n_chunks, x, got)
        np.testing.assert_array_equal(got, alone if mode == "amx" and on_amx else avx2)
    np.testing.assert_array_equal(m.matmul(x), alone if HAS_AMX and on_amx else avx2)


@pytest.mark.parametrize("n_tok, n_in", [(16, 512), (37, 512), (40, 8960), (530, 256), (-1, 512)])
def test_q6_k_batches_on_amx_equal_the_avx2_kernel(n_tok, n_in):
    """With amx, a batch's whole tiles of 16 tokens multiply 16 rows' weights, each sub-block's
    scale folded in through its three balanced base-7 digits (three signed tiles), by the
    tokens' packed activations (tdpbssd): the same per-block integers as llama.cpp's tiled
    kernel, so the same floats; the tokens past the last whole tile take the AVX2 path. Every
    scale byte occurs (rows 20..39); 40 rows in 2 chunks: a last group of 4 rows; 530 tokens:
    a pass of 512 tokens, one of 16 and 2 on AVX2. n_tok -1: the
    largest sums (weights 0, i.e. q - 32 = -32, scales -128, activations all -127)."""
    from app.engine.ops.amx import HAS_AMX
    from app.engine.ops.simd_int import HAS_AVX2
    from app.engine.quant import kquants_avx2
    if not (HAS_AVX2 and HAS_AMX):
        pytest.skip("AMX only")
    raw = make_raw(Q.Q6_K, 40, n_in, seed=abs(n_tok))
    blocks = raw.reshape(40, n_in // 256, 210)
    blocks[20:, 0, 192:208] = np.arange(256, dtype=np.uint8).reshape(16, 16)[np.arange(20) % 16]
    if n_tok < 0:
        blocks[:20, :, :192] = 0                          # ql, qh: every q = 0
        blocks[:20, :, 192:208] = 0x80                    # every scale -128
        x = np.concatenate([np.ones((16, n_in), F32), make_acts(8, n_in, seed=2)])
        n_tok = x.shape[0]
    else:
        x = make_acts(n_tok, n_in, seed=n_tok)
    m = QMatrix.from_array(raw, Q.Q6_K)
    out = {}
    for amx in (False, True):
        out[amx] = np.empty((n_tok, 40), F32)
        kquants_avx2.matmul_q6_k_rows(m.planes["raw"], 40, amx, 2, x, out[amx])
    np.testing.assert_array_equal(out[True], out[False])
    np.testing.assert_array_equal(m.matmul(x), out[False])


def test_batch_activations_quantized_by_all_threads_equal_the_serial_ones():
    """From PARALLEL_ACTS tokens, q8_k_acts quantizes runs of tokens in parallel: every byte,
    scale and block sum is the one quantize_acts gives serially (37 tokens: uneven runs)."""
    from app.engine.quant import kquants_avx2
    x = make_acts(37, 512, seed=5)
    assert x.shape[0] >= kquants_avx2.PARALLEL_ACTS
    got = kquants_avx2.q8_k_acts(x)
    serial = [np.empty_like(a) for a in got]
    kquants_avx2.quantize_acts(x, *serial)
    n = x.size                               # xq: then 16 rows of zeros for a last partial AMX tile
    np.testing.assert_array_equal(got[0][:n], serial[0][:n])
    assert got[0].size == n + 16 * x.shape[1] and not got[0][n:].any()
    step = kquants_avx2.q8_k_acts(x[:1])     # a decode step: no padding (it never goes to AMX)
    assert step[0].size == x.shape[1]
    for a, b in zip(got[1:], serial[1:]):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("signed_a", [False, True], ids=["tdpbusd", "tdpbssd"])
def test_amx_tile_product_is_the_integer_matrix_product(signed_a):
    """tile_dpbusd / tile_dpbssd: C (16 x 16 int32) += A (16 x 32 unsigned / signed bytes) .
    B (32 x 16 signed bytes, packed 4 rows to a row of 64 bytes), exactly, at the extremes of
    both byte ranges."""
    from numba import njit

    from app.engine.ops.amx import (HAS_AMX, tile_config, tile_dpbssd, tile_dpbusd, tile_load, tile_release,
                                    tile_shapes, tile_store, tile_zero)
    if not HAS_AMX:
        pytest.skip("AMX only")

    @njit
    def product(cfg, a, b, c, signed):
        tile_config(cfg)
        tile_zero(0)
        tile_load(1, a, 0, 32)
        tile_load(2, b, 0, 64)
        if signed:
            tile_dpbssd(0, 1, 2)
        else:
            tile_dpbusd(0, 1, 2)
        tile_store(0, c, 0, 64)
        tile_release()

    rng = np.random.default_rng(4)
    a = rng.integers(-128, 128, (16, 32)).astype(np.int8) if signed_a else rng.integers(0, 256, (16, 32)).astype(np.uint8)
    b = rng.integers(-128, 128, (32, 16)).astype(np.int8)
    a[0], b[:, 0] = (-128 if signed_a else 255), -128
    packed = b.reshape(8, 4, 16).transpose(0, 2, 1).reshape(8, 64).copy()
    c = np.zeros((16, 16), np.int32)
    product(tile_shapes(np.array([[16, 64], [16, 32], [8, 64]], np.int64)), a.reshape(-1), packed.reshape(-1),
            c.reshape(-1), signed_a)
    np.testing.assert_array_equal(c, a.astype(np.int32) @ b.astype(np.int32))


def test_q6_k_scales_in_balanced_base_7_give_back_every_scale():
    """scale_digits: each of the 256 int8 scales is s0 + 7 s1 + 49 s2 with digits in -3..3, so
    a digit times q - 32 (-32..31) stays a signed byte, as the AMX kernel's weight tiles need."""
    from numba import njit

    from app.engine.ops.simd_int import HAS_AVX2, store256
    from app.engine.quant.q6k_blocks import Q6K_BYTES, scale_digits
    if not HAS_AVX2:
        pytest.skip("AVX2 only")

    @njit
    def digits(raw, out):
        for i in range(16):
            d = scale_digits(raw, i * Q6K_BYTES)
            for k in range(3):
                store256(d[k], out, (3 * i + k) * 8)

    raw = np.zeros((16, Q6K_BYTES), np.uint8)
    raw[:, 192:208] = np.arange(256, dtype=np.uint8).reshape(16, 16)     # every scale byte once
    out = np.empty(16 * 3 * 8, np.int32)                 # 16 int16 lanes a vector
    digits(raw.reshape(-1), out)
    d = out.view(np.int16).reshape(16, 3, 16).transpose(1, 0, 2).reshape(3, 256).astype(np.int32)    # (digit, scale)
    assert np.abs(d).max() <= 3
    np.testing.assert_array_equal(d[0] + 7 * d[1] + 49 * d[2], np.arange(256, dtype=np.uint8).view(np.int8))


def test_real_shapes_of_smollm2():
    """n_in = 576 is 18 blocks of 32 (not a power of two), as in SmolLM2-135M."""
    for qtype in (Q.Q4_1, Q.Q8_0):
        raw = make_raw(qtype, 192, 576)
        m = QMatrix.from_array(raw, qtype)
        x = make_acts(2, 576)
        dense = x @ quants.dequantize(raw, qtype).reshape(192, 576).T
        assert np.linalg.norm(m.matmul(x) - dense) / np.linalg.norm(dense) < 3e-2  # with outliers


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0, Q.Q4_K, Q.F16], ids=lambda t: t.name)
def test_subnormal_and_inf_scales_take_the_exact_conversion(qtype):
    """Planes of zeros and normal f16 convert with a shift and a multiply; a subnormal or inf
    scale must switch the matrix to the general conversion and still give the same results
    (the shortcut would turn inf into 2**16 and, with DAZ set, subnormals into 0). The AVX2
    Q4_K kernels have no shortcut (vcvtph2ps converts every f16 exactly): same results."""
    from app.engine.ops.simd_int import HAS_AVX2
    split = not (qtype == Q.Q4_K and HAS_AVX2)
    raw = make_raw(qtype, N_OUT, N_IN).copy()
    assert QMatrix.from_array(raw, qtype).plain_scales
    if qtype == Q.F16:                          # the weights themselves are f16
        bits = raw.view(np.uint16)
        bits[3, 40], bits[17, 0], bits[33, 300], bits[40, 7] = 0x0005, 0x0000, 0x7C00, 0x8003
    else:
        size = {Q.Q4_1: 20, Q.Q8_0: 34, Q.Q4_K: 144}[qtype]
        blocks = raw.reshape(N_OUT, -1, size)
        blocks[3, 1, 0:2] = [0x05, 0x00]        # d = 5 * 2**-24, subnormal
        blocks[17, 0, 0:2] = [0x00, 0x00]       # d = 0
        blocks[33, 1, 0:2] = [0x00, 0x7C]       # d = inf: that row's outputs are inf / nan
        if qtype != Q.Q8_0:
            blocks[40, 0, 2:4] = [0x03, 0x80]   # m / dmin = -3 * 2**-24
    m = QMatrix.from_array(raw, qtype)
    assert m.plain_scales != split
    with np.errstate(invalid="ignore"):                   # inf * 0 in the row with d = inf
        expected = quants.dequantize(raw, qtype).reshape(N_OUT, N_IN).astype(F32)
    assert np.array_equal(m.dequantize().view(np.uint32), expected.view(np.uint32))
    x = make_acts(N_TOK, N_IN)
    with np.errstate(invalid="ignore", over="ignore"):
        ref = ref_matmul(qtype, raw, x)
    finite = np.isfinite(ref)
    assert not finite[:, 33].any() and finite.sum() == ref.size - N_TOK
    got = m.matmul(x)
    assert np.array_equal(np.isfinite(got), finite)
    scale = float(np.sqrt(np.mean(ref[finite].astype(np.float64) ** 2)))
    np.testing.assert_allclose(got[finite], ref[finite], rtol=REF_RTOL, atol=REF_RTOL * scale)


def test_data_that_does_not_fit_the_shape_is_refused():
    raw = make_raw(Q.Q4_1, N_OUT, N_IN)
    with pytest.raises(ValueError, match="truncated or corrupt"):
        QMatrix("blk.0.attn_q.weight", raw[:, :-20], Q.Q4_1, N_OUT, N_IN)   # one block short a row
    with pytest.raises(ValueError, match="whole blocks"):
        QMatrix("blk.0.attn_q.weight", raw, Q.Q4_1, N_OUT, N_IN + 16)


def test_unsupported_type_is_refused_naming_the_tensor_and_the_types_that_run():
    """The advice (llama.cpp) is Model's to give, once, with the file: see test_model.py."""
    raw = quants.quantize(np.zeros((4, 256), F32), Q.TQ2_0)     # ternary: no kernels of ours
    with pytest.raises(ValueError, match="no kernels") as e:
        QMatrix.from_array(raw, Q.TQ2_0, name="blk.0.ffn_up.weight")
    message = str(e.value)
    assert "'blk.0.ffn_up.weight'" in message and "TQ2_0" in message and "Q5_0" in message
    assert "llama.cpp" not in message


# ---- activation quantization: exactly llama.cpp's

def test_q8_0_and_q8_1_activations_match_x86_quantize_row():
    x = make_acts(N_TOK, N_IN)
    q, d, s, qsum = ref_acts_q8(x)
    xq = np.empty(x.shape, np.int16)
    dx = np.empty(d.shape, F32)
    qs = np.empty(d.shape, np.int32)
    activations.quantize_q8_0(x, xq, dx, qs)
    assert np.array_equal(xq.reshape(q.shape), q)
    assert np.array_equal(dx, d) and np.array_equal(qs, qsum)
    sx = np.empty(d.shape, F32)
    activations.quantize_q8_1(x, xq, dx, sx)
    assert np.array_equal(dx, d) and np.array_equal(sx, s)
    # the ties of make_acts: ties to even as _mm256_round_ps, not roundf's away from zero
    assert xq[-1, 96] == 0 and xq[-1, 100] == -2


def _block_where_inverse_matters() -> np.ndarray:
    """(32,) float32 Q8_0 block on which id = 127/amax (AVX2 quantize_row_q8_0) and
    id = 1/d (quantize_row_q8_0_ref) round some element differently."""
    rng = np.random.default_rng(11)
    for amax in rng.uniform(0.5, 50, 2000).astype(F32):
        inv_avx, inv_ref = F32(127) / amax, F32(1) / (amax / F32(127))
        if inv_avx == inv_ref:
            continue
        for k in range(126):
            x = F32((k + 0.5) / float(inv_avx))
            for _ in range(8):                               # walk a few ulps around the tie
                if np.rint(x * inv_avx) != np.rint(x * inv_ref) and abs(x) < amax:
                    block = rng.uniform(-1, 1, 32).astype(F32) * amax * F32(0.9)
                    block[0], block[1] = amax, x
                    return block
                x = np.nextafter(x, F32(np.inf))
    raise AssertionError("no such block found")


def test_q8_0_uses_127_over_amax_not_one_over_d():
    x = np.tile(_block_where_inverse_matters(), 2).reshape(1, 64)
    q, d, _, _ = ref_acts_q8(x)
    xq = np.empty(x.shape, np.int16)
    dx = np.empty(d.shape, F32)
    qs = np.empty(d.shape, np.int32)
    activations.quantize_q8_0(x, xq, dx, qs)
    assert np.array_equal(xq.reshape(q.shape), q)


def test_q8_k_activations_match_quantize_row_q8_k_ref():
    x = make_acts(N_TOK, N_IN)
    x[1, 256:512] = 0                                    # an all-zero super-block
    x[2, 10], x[2, 11] = -500.0, 500.0                   # equal |x|: the first one sets the sign
    q, d, bsums = ref_acts_q8_k(x)
    xq = np.empty(x.shape, np.int16)
    dk = np.empty(d.shape, F32)
    bs = np.empty((N_TOK, N_IN // 16), np.int32)
    activations.quantize_q8_k(x, xq, dk, bs)
    assert np.array_equal(xq.reshape(q.shape), q)
    assert np.array_equal(dk, d)
    assert np.array_equal(bs.reshape(bsums.shape), bsums)
    assert xq[2, 10] == -127 and xq[2, 11] == 127


# ---- f16 / bf16 helpers

def test_f16_to_f32_is_exact_for_every_bit_pattern():
    bits = np.arange(65536, dtype=np.uint16)
    out = np.empty(65536, F32)
    f16.decode_f16(bits, out)
    expected = bits.view(np.float16).astype(F32)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(out), nan)
    assert np.array_equal(out[~nan].view(np.uint32), expected[~nan].view(np.uint32))


def test_round_to_f16_and_bf16_match_numpy_and_gguf():
    rng = np.random.default_rng(3)
    v = np.concatenate([
        rng.standard_normal(4000).astype(F32) * F32(10.0) ** rng.integers(-9, 6, 4000).astype(F32),
        np.array([0.0, -0.0, 65504, 65519.99, 65520, 1e9, -1e9, 2.0 ** -24, 2.0 ** -25,
                  3 * 2.0 ** -26, 2.0 ** -14, 2.0 ** -14 * (1 - 2.0 ** -11), 1 + 2.0 ** -11,
                  1 + 3 * 2.0 ** -11, np.inf, -np.inf], F32)])
    r16 = v.copy()
    f16.round_f16_in_place(r16)
    with np.errstate(over="ignore"):                    # 1e9 -> inf is the point
        expected = v.astype(np.float16).astype(F32)
    assert np.array_equal(r16.view(np.uint32), expected.view(np.uint32))
    rb = v.copy()
    f16.round_bf16_in_place(rb)
    expected = quants.dequantize(quants.quantize(v, Q.BF16), Q.BF16)
    assert np.array_equal(rb.view(np.uint32), expected.view(np.uint32))


# ---- layout and loading

def test_tile_plane_roundtrip_and_addressing():
    plane = np.arange(200 * 7, dtype=np.int32).reshape(200, 7)
    flat = layout.tile_plane(plane)
    assert np.array_equal(layout.untile_plane(flat, 200, 7), plane)
    r, c = 130, 5                     # group 8 (r0 = 128, w = 16), row 2 of it
    assert flat[128 * 7 + c * 16 + (r - 128)] == plane[r, c]
    r = 197                           # the narrow last group: r0 = 192, w = 8
    assert flat[192 * 7 + c * 8 + (r - 192)] == plane[r, c]


def test_threads_take_balanced_runs_of_groups():
    runs = [threads.chunk_groups(c, 2, 36) for c in range(2)]      # 576 rows on 2 threads
    assert runs == [(0, 18), (18, 36)]
    runs = [threads.chunk_groups(c, 3, 13) for c in range(3)]
    assert runs[0][0] == 0 and runs[-1][1] == 13 and all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert max(g1 - g0 for g0, g1 in runs) - min(g1 - g0 for g0, g1 in runs) <= 1


def test_from_tensor_reads_a_gguf_file_and_releases_only_file_pages(tmp_path):
    import gguf
    w = make_raw(Q.Q8_0, 256, 64)                       # 17 KB: several whole pages
    path = tmp_path / "q.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", w, raw_dtype=Q.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    reader = gguf.GGUFReader(str(path))
    m = QMatrix.from_tensor(reader.tensors[0])
    assert m.shape == (256, 64) and m.qtype == Q.Q8_0 and m.name == "token_embd.weight"
    expected = quants.dequantize(w, Q.Q8_0).reshape(256, 64)
    assert np.array_equal(m.rows(np.arange(256)), expected)
    assert release_file_pages(reader.tensors[0].data) is True        # a read-only file mapping
    assert np.array_equal(np.asarray(m.raw).reshape(w.shape), w)      # raw still reads the file
    heap = w.copy()
    assert release_file_pages(heap) is False                          # never madvise heap memory
    assert np.array_equal(heap, w)
