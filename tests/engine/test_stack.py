"""quant/stack.py: one input times several matrices in one call gives every row the bits of its
own product, whatever the stack holds."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from app.engine.ops.simd_int import HAS_AVX2
from app.engine.quant.qmatrix import QMatrix
from app.engine.quant.stack import ProductStack

from tests.engine.test_quants import make_acts, make_raw

N_IN = 512


def _matrix(name: str, qtype: Q, n_out: int, seed: int) -> QMatrix:
    return QMatrix(name, make_raw(qtype, n_out, N_IN, seed), qtype, n_out, N_IN)


@pytest.mark.parametrize("kinds", [
    ((Q.Q4_K, 96), (Q.Q4_K, 16), (Q.Q4_K, 16)),   # q, k, v of a Q4_K_M layer: all three in one call
    ((Q.Q4_K, 96), (Q.Q4_K, 16), (Q.Q6_K, 16)),   # v in Q6_K: q and k stacked, v alone
    ((Q.Q4_K, 200), (Q.Q4_K, 200)),                 # gate and up
    ((Q.Q4_K, 36), (Q.Q4_K, 20)),                   # rows that end inside an 8-row group
    ((Q.Q6_K, 32), (Q.Q8_0, 32)),                   # nothing to stack: each alone
])
def test_stacked_products_are_each_matrixs_own_bits(kinds):
    mats = [_matrix(f"m{i}", qt, n, seed=i) for i, (qt, n) in enumerate(kinds)]
    stack = ProductStack(mats)
    n_q4k = sum(qt == Q.Q4_K for qt, _ in kinds)   # Q4_K stacks where its AVX2 kernels run
    assert len(stack.stacked) == (n_q4k if n_q4k >= 2 and HAS_AVX2 else 0)
    for x in make_acts(3, N_IN):        # a zero block, an outlier channel, .5 ties
        got = stack.matvec(x)
        assert [g.shape for g in got] == [(n,) for _, n in kinds]
        for g, m in zip(got, mats):
            np.testing.assert_array_equal(g.view(np.uint32), m.matvec(x).view(np.uint32))


def test_a_stack_needs_one_input_width():
    a = _matrix("blk.0.ffn_gate.weight", Q.Q4_K, 16, 0)
    b = QMatrix("blk.0.ffn_up.weight", make_raw(Q.Q4_K, 16, 256, 1), Q.Q4_K, 16, 256)
    with pytest.raises(ValueError, match="one input width.*ffn_gate.*ffn_up"):
        ProductStack([a, b])
