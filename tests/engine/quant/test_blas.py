"""Prefill's BLAS path (app/engine/quant/blas.py): weights dequantized to float32, products by a
one-thread sgemm on each of numba's threads."""
from __future__ import annotations

import numba
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import quants

from app.engine.generate import decode_one_token, prefill
from app.engine.model.transformer import Model, _linear
from app.engine.quant import blas
from app.engine.quant.qmatrix import QMatrix
from tests.engine.conftest import llama_logits
from tests.engine.model.test_model import TOLERANCE, assert_logits_close
from tests.engine.quant.test_quants import ALL_TYPES, make_acts, make_raw

N_OUT, N_IN = 200, 512   # 12 groups of 16 rows and a narrower one of 8


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("n_out", [N_OUT, 1])
def test_products_equal_the_dequantized_float_product(qtype, threads, n_out):
    raw = make_raw(qtype, n_out, N_IN)
    m = QMatrix.from_array(raw, qtype)
    x = make_acts(40, N_IN)                                                   # (40, N_IN)
    w = quants.dequantize(raw, qtype).reshape(n_out, N_IN).astype(np.float64)
    ref = x.astype(np.float64) @ w.T                                          # (40, N_OUT)
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        ours = blas.matmul(m, x)
    finally:
        numba.set_num_threads(before)
    assert ours.shape == (40, n_out) and ours.dtype == np.float32
    # float32 sums of 512 products: a few ulps of the row's magnitude, nothing like the
    # ~0.5 % of the 8-bit activations the exact kernels reproduce
    assert np.abs(ours - ref).max() <= 1e-5 * np.abs(ref).max()


def test_long_chunks_take_blas_and_short_ones_the_exact_kernels():
    raw = make_raw(Q.Q5_K, N_OUT, N_IN)
    m = QMatrix.from_array(raw, Q.Q5_K)
    short, long = make_acts(blas.BLAS_MIN_TOKENS - 1, N_IN), make_acts(blas.BLAS_MIN_TOKENS, N_IN)
    assert np.array_equal(_linear(m, short), m.matmul(short))
    assert np.array_equal(_linear(m, long), blas.matmul(m, long))
    assert not np.array_equal(m.matmul(long), blas.matmul(m, long))   # the paths do differ


def test_block_formats_keep_their_exact_kernels_for_long_chunks():
    """Q4_0 ... Q8_0 batches run on legacy_batch.py at about sgemm's speed where the CPU has VNNI,
    so long chunks stay on llama.cpp's numbers: every token's outputs are its one-token kernel's.
    Without VNNI those kernels are slower than sgemm, and long chunks take BLAS."""
    from app.engine.ops.simd_int import HAS_VNNI

    m = QMatrix.from_array(make_raw(Q.Q4_1, N_OUT, N_IN), Q.Q4_1)
    long = make_acts(blas.BLAS_MIN_TOKENS + 3, N_IN)
    assert m.batches_fast == HAS_VNNI
    ours = _linear(m, long)
    if not HAS_VNNI:
        assert np.array_equal(ours, blas.matmul(m, long))
        return
    assert not np.array_equal(ours, blas.matmul(m, long))
    for k in (0, blas.BLAS_MIN_TOKENS + 2):
        assert np.array_equal(ours[k], m.matvec(long[k]))


LONG_PROMPT = [(37 * i + 11) % 2000 + 3 for i in range(48)]
EIGHT_BIT = TOLERANCE[Q.Q4_1]   # what 8-bit activations move the logits by (test_model.py)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_long_prefill_matches_llamacpp_and_decoding(tiny_model, llama_cpp, arch):
    """A 48-token chunk of a Q5_K model goes through BLAS; its logits agree with llama.cpp's
    batched prefill and with our own token-by-token decode (the exact kernels), within the
    stated tolerance of 8-bit activations."""
    path = tiny_model(arch, Q.Q5_K, dim=256, ffn_dim=512)
    ref_prompt, _ = llama_logits(llama_cpp, path, LONG_PROMPT, [])
    model = Model(path)
    assert not model.layers[0].w_up.batches_fast
    ours = prefill(model, model.new_cache(128), LONG_PROMPT, all_logits=True)     # (48, V)
    assert_logits_close(ours, ref_prompt, EIGHT_BIT)
    cache = model.new_cache(128)
    one_by_one = np.stack([decode_one_token(model, cache, t) for t in LONG_PROMPT])    # (48, V)
    assert_logits_close(ours, one_by_one, EIGHT_BIT)


@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0], ids=lambda t: t.name)
def test_a_long_prefill_of_block_formats_is_llamacpps(tiny_model, llama_cpp, qtype):
    """A 48-token chunk of Q4_1 / Q5_0 / Q5_1 / Q8_0 weights (legacy_batch.py where the CPU has
    VNNI) gives llama.cpp's logits bit for bit where llama.cpp is built for this CPU (through
    sgemm, as without VNNI, they are 8-bit activations apart); against another build, within
    that tolerance. (Q4_0: llama.cpp repacks it, see conftest.llamacpp_built_for_this_cpu.)"""
    from app.engine.ops.amx import HAS_AMX
    from app.engine.ops.simd_int import HAS_AVX2
    from tests.engine.conftest import llamacpp_built_for_this_cpu

    path = tiny_model("qwen2", qtype, dim=256, ffn_dim=512)
    ref_prompt, _ = llama_logits(llama_cpp, path, LONG_PROMPT, [])
    model = Model(path)
    assert model.layers[0].w_up.qtype == qtype
    ours = prefill(model, model.new_cache(128), LONG_PROMPT, all_logits=True)     # (48, V)
    exact = model.layers[0].w_up.batches_fast    # without VNNI the chunk takes BLAS (8-bit apart)
    if exact and HAS_AVX2 and not HAS_AMX and llamacpp_built_for_this_cpu(llama_cpp):
        np.testing.assert_array_equal(ours, ref_prompt)
    else:
        assert_logits_close(ours, ref_prompt, EIGHT_BIT)
