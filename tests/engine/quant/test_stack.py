"""quant/stack.py: one input times several matrices in one call gives every row the bits of its
own product, whatever the stack holds."""
from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from app.engine.ops.simd_int import HAS_AVX2
from app.engine.quant.qmatrix import QMatrix
from app.engine.quant.stack import ProductStack

from tests.engine.quant.test_quants import make_acts, make_raw

N_IN = 512


def _matrix(name: str, qtype: Q, n_out: int, seed: int) -> QMatrix:
    return QMatrix(name, make_raw(qtype, n_out, N_IN, seed), qtype, n_out, N_IN)


@pytest.mark.parametrize("kinds", [
    ((Q.Q4_K, 96), (Q.Q4_K, 16), (Q.Q4_K, 16)),   # q, k, v of a Q4_K_M layer: all three in one call
    ((Q.Q4_K, 96), (Q.Q4_K, 16), (Q.Q6_K, 16)),   # v in Q6_K: q and k stacked, v alone
    ((Q.Q4_K, 200), (Q.Q4_K, 200)),                 # gate and up
    ((Q.Q4_K, 36), (Q.Q4_K, 20), (Q.Q4_K, 12)),   # rows that end inside an 8-row group, in each
    ((Q.Q6_K, 32), (Q.Q8_0, 32)),                   # nothing to stack: each alone
])
def test_stacked_products_are_each_matrixs_own_bits(kinds):
    mats = [_matrix(f"m{i}", qt, n, seed=i) for i, (qt, n) in enumerate(kinds)]
    stack = ProductStack(mats)
    n_q4k = sum(qt == Q.Q4_K for qt, _ in kinds)   # Q4_K stacks where its AVX2 kernels run
    assert len(stack.stacked) == (n_q4k if n_q4k >= 2 and HAS_AVX2 else 0)
    x_all = make_acts(3, N_IN)          # an outlier channel, a zero 32-block, .5 ties
    x_all[1, 256:] = 0                  # and a zero super-block: d = 0
    for x in x_all:
        got = stack.matvec(x)
        assert [g.shape for g in got] == [(n,) for _, n in kinds]
        for g, m in zip(got, mats):
            np.testing.assert_array_equal(g.view(np.uint32), m.matvec(x).view(np.uint32))


@pytest.mark.skipif(not HAS_AVX2, reason="the stacked kernel is the AVX2 Q4_K one")
def test_every_split_of_the_groups_over_threads_gives_the_same_rows():
    """The threads' runs of groups cross from one matrix to the next anywhere: 1 to all 15 chunks
    (the number of threads decides it in use)."""
    from app.engine.quant import kquants_avx2
    a, b, c = (_matrix(f"m{i}", Q.Q4_K, n, seed=i) for i, n in enumerate((52, 36, 28)))   # 7 + 5 + 4 groups
    x = make_acts(1, N_IN)
    want = [m.matvec(x[0]) for m in (a, b, c)]
    for n_chunks in range(1, 16):
        outs = [np.full((1, m.shape[0]), np.nan, np.float32) for m in (a, b, c)]
        kquants_avx2.matvec_q4_k_x8_stack(a.x8_planes, 52, b.x8_planes, 36, c.x8_planes, 28, n_chunks, x, *outs)
        for o, w in zip(outs, want):
            np.testing.assert_array_equal(o[0].view(np.uint32), w.view(np.uint32))


def test_decode_steps_with_stacks_are_those_without(tiny_model, monkeypatch):
    """A tiny Q4_K model's decode steps (q, k, v and gate, up stacked) give the logits that one
    product at a time gives, bit for bit."""
    from app.engine.model.transformer import Model
    model = Model(tiny_model("qwen2", Q.Q4_K, dim=256, ffn_dim=512))

    def steps():
        cache = model.new_cache(32)
        model.forward([1, 2, 3, 4, 5], cache)
        return np.stack([model.forward([t], cache) for t in (6, 7, 8)])   # (3, V) float32

    stacked = steps()
    assert HAS_AVX2 is False or len(model.layers[0].qkv.stacked) == 3
    monkeypatch.setattr(ProductStack, "matvec", lambda self, x: [m.matvec(x) for m in self.mats])
    np.testing.assert_array_equal(stacked.view(np.uint32), steps().view(np.uint32))


def test_a_stack_names_its_matrices_when_the_input_is_wrong():
    stack = ProductStack([_matrix("blk.0.ffn_gate.weight", Q.Q4_K, 16, 0), _matrix("blk.0.ffn_up.weight", Q.Q4_K, 16, 1)])
    with pytest.raises(ValueError, match=r"ffn_gate.*ffn_up.*expected activations \(512,\), got \(1, 512\)"):
        stack.matvec(np.zeros((1, N_IN), np.float32))


def test_a_stack_needs_one_input_width():
    a = _matrix("blk.0.ffn_gate.weight", Q.Q4_K, 16, 0)
    b = QMatrix("blk.0.ffn_up.weight", make_raw(Q.Q4_K, 16, 256, 1), Q.Q4_K, 16, 256)
    with pytest.raises(ValueError, match="one input width.*ffn_gate.*ffn_up"):
        ProductStack([a, b])
