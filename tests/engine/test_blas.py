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
from tests.engine.test_model import TOLERANCE, assert_logits_close
from tests.engine.test_quants import ALL_TYPES, make_acts, make_raw

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
    raw = make_raw(Q.Q4_1, N_OUT, N_IN)
    m = QMatrix.from_array(raw, Q.Q4_1)
    short, long = make_acts(blas.BLAS_MIN_TOKENS - 1, N_IN), make_acts(blas.BLAS_MIN_TOKENS, N_IN)
    assert np.array_equal(_linear(m, short), m.matmul(short))
    assert np.array_equal(_linear(m, long), blas.matmul(m, long))
    assert not np.array_equal(m.matmul(long), blas.matmul(m, long))   # the paths do differ


LONG_PROMPT = [(37 * i + 11) % 2000 + 3 for i in range(48)]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_long_prefill_matches_llamacpp_and_decoding(tiny_model, llama_cpp, arch):
    """A 48-token chunk goes through BLAS; its logits agree with llama.cpp's batched prefill
    and with our own token-by-token decode (the exact kernels), within the stated tolerance
    of 8-bit activations."""
    path = tiny_model(arch, Q.Q4_1)
    ref_prompt, _ = llama_logits(llama_cpp, path, LONG_PROMPT, [])
    model = Model(path)
    ours = prefill(model, model.new_cache(128), LONG_PROMPT, all_logits=True)     # (48, V)
    assert_logits_close(ours, ref_prompt, TOLERANCE[Q.Q4_1])
    cache = model.new_cache(128)
    one_by_one = np.stack([decode_one_token(model, cache, t) for t in LONG_PROMPT])
    assert_logits_close(ours, one_by_one, TOLERANCE[Q.Q4_1])
