"""quant/formats.py: one record per weight format, for CPUs with and without AVX2, checked
against gguf's block sizes and dequantizer and against each other."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf import quants

from app.engine.header.support import WEIGHT_TYPES
from app.engine.ops.simd_int import HAS_AVX2
from app.engine.quant import qmatrix
from app.engine.quant.formats import FORMATS, weight_formats
from app.engine.quant.qmatrix import QMatrix
from tests.engine.quant.test_quants import make_acts, make_raw


@pytest.mark.parametrize("avx2", [True, False])
def test_every_type_the_engine_runs_has_one_record_with_gguf_block_sizes(avx2):
    table = weight_formats(avx2=avx2)
    assert {q.name for q in table} == set(WEIGHT_TYPES)
    for qtype, fmt in table.items():
        assert fmt.qtype == qtype and (fmt.block, fmt.block_bytes) == GGML_QUANT_SIZES[qtype]
    # only AVX2's Q4_K stacks, and every type without f16 scale planes is one whose kernels need no check
    assert {q for q, f in table.items() if f.stacks} == ({Q.Q4_K} if avx2 else set())
    assert not table[Q.F32].f16_scales and table[Q.F16].f16_scales == ("w",)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q6_K, Q.Q8_0, Q.IQ4_NL, Q.Q5_1])
def test_the_tables_for_both_cpus_dequantize_and_multiply_alike(qtype, monkeypatch):
    """The AVX2 table's Q4_K and Q6_K (llama.cpp's x86 kernels) and the portable one's give the
    rows gguf dequantizes, and products that agree to float rounding."""
    raw = make_raw(qtype, 64, 512)
    x = make_acts(3, 512)
    results = {}
    for avx2 in (True, False) if HAS_AVX2 else (False,):     # AVX2's kernels only where the CPU has it
        monkeypatch.setattr(qmatrix, "FORMATS", weight_formats(avx2=avx2))
        m = QMatrix.from_array(raw, qtype)
        assert m.format is qmatrix.FORMATS[qtype]
        assert np.array_equal(m.dequantize(), quants.dequantize(raw, qtype).reshape(64, 512))
        results[avx2] = m.matmul(x)
    if HAS_AVX2:
        np.testing.assert_allclose(results[True], results[False], rtol=2e-3, atol=2e-3)


def test_a_type_without_a_record_is_refused_naming_the_tensor():
    assert Q.Q8_1 not in FORMATS
    with pytest.raises(ValueError, match="tensor 'w' has type Q8_1, which the ellm engine has no kernels for"):
        QMatrix("w", np.zeros((1, 36), np.uint8), Q.Q8_1, 1, 32)
