"""Sparse retrieval attention: dense when the budget covers, the right blocks, safe positions."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.engine.generate import prefill
from app.engine.kvformat import KVSpec
from app.engine.model import Model
from app.engine.sparse import SparseConfig, select
from app.engine.sparse_attend import attend_blocks

B = 16


def _cache(model, n_ctx=1024, kv="k8v4", **attn):
    return model.new_cache(n_ctx, KVSpec.parse(kv, block=B), SparseConfig(**attn))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tiny_model):
    return Model(tiny_model(request.param))


def test_sparse_equals_dense_when_the_budget_covers_the_context(model):
    tokens = np.random.default_rng(0).integers(3, 2000, 200).tolist()
    dense = _cache(model, mode="dense")
    sparse = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=64)
    want = prefill(model, dense, tokens, chunk=48, all_logits=True)
    got = prefill(model, sparse, tokens, chunk=48, all_logits=True)
    assert np.array_equal(got, want)
    for t in (7, 8, 9):
        assert np.array_equal(model.forward([t], sparse), model.forward([t], dense))


def test_a_small_budget_really_attends_less(model):
    tokens = np.random.default_rng(0).integers(3, 2000, 200).tolist()
    dense = _cache(model, mode="dense")
    sparse = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=1)
    prefill(model, dense, tokens, chunk=48)
    prefill(model, sparse, tokens, chunk=48)
    assert not np.array_equal(model.forward([7], sparse), model.forward([7], dense))


def _reference_attention(model, cache, layer, q, pos):
    """Plain numpy: keys decoded, rotated to their true positions, softmax, values."""
    c = model.config
    k, v = cache.dequantize(layer)                       # (KVH, n, HD), keys in block frame
    n = k.shape[1]
    cos, sin = model.rope.rows(0, n + 1)
    group = c.n_heads // c.n_kv_heads
    out = np.zeros((c.n_heads, c.head_dim), np.float64)
    half = c.head_dim // 2
    pairs = (np.arange(half), np.arange(half) + half) if model.neox else \
        (np.arange(0, c.head_dim, 2), np.arange(1, c.head_dim, 2))

    def rot(x, p):                                       # x (..., HD), rotate by position p
        y = x.astype(np.float64).copy()
        a, b = x[..., pairs[0]], x[..., pairs[1]]
        y[..., pairs[0]] = a * cos[p] - b * sin[p]
        y[..., pairs[1]] = a * sin[p] + b * cos[p]
        return y

    starts = (np.arange(n) // B) * B                     # each key's block start
    for h in range(c.n_heads):
        kh = np.stack([rot(k[h // group, j], starts[j]) for j in range(n)])   # true positions
        s = kh @ rot(q[h], pos) / math.sqrt(c.head_dim)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[h // group]
    return out


def test_dense_block_attention_matches_a_plain_numpy_reference(model):
    cache = _cache(model, mode="dense")
    prefill(model, cache, np.random.default_rng(1).integers(3, 2000, 100).tolist(), chunk=32)
    c = model.config
    rng = np.random.default_rng(2)
    q = rng.normal(0, 1, (1, c.n_heads, c.head_dim)).astype(np.float32)
    k = rng.normal(0, 1, (1, c.n_kv_heads * c.head_dim)).astype(np.float32)
    cache.update(0, 100, k, k)
    got = attend_blocks(q, cache, 0, 100, cache.attention, model.rope, model.neox)[0]
    cache.commit([1])
    want = _reference_attention(model, cache, 0, q[0], 100)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_selection_picks_the_block_whose_keys_match_the_query(model):
    c = model.config
    cache = _cache(model, n_ctx=2048, mode="sparse", sinks=B, window=2 * B, top_k=1)
    rng = np.random.default_rng(3)
    n = 28 * B          # inside the trained context (512): true distances
    keys = rng.normal(0, 1, (n, c.n_kv_heads * c.head_dim)).astype(np.float32)
    q = rng.normal(0, 1, (1, c.n_heads, c.head_dim)).astype(np.float32)
    planted = 11
    group = c.n_heads // c.n_kv_heads
    for h in range(c.n_kv_heads):
        # keys of the planted block point along the group's query (stored in the block frame,
        # so rotate the query back by each key's true distance: what attention will see)
        cos, sin = model.rope.rows(0, n + 1)
        for j in range(B):
            pos = planted * B + j
            rel = n - planted * B
            qh = q[0, h * group]
            from app.engine.sparse import rotate
            qr = rotate(qh[None, None, :], cos[[rel]], sin[[rel]], model.neox)[0, 0]
            keys[pos, h * c.head_dim:(h + 1) * c.head_dim] = 20.0 * qr / np.linalg.norm(qr)   # bound 20|q| vs ~1.8 sum|q| of random blocks
    for layer in range(c.n_layers):
        cache.update(layer, 0, keys, keys)
    cache.commit(range(n))
    cos, sin = model.rope.rows(0, n + 2)
    sel = select(cache, 0, q, n, cache.attention, cos, sin, model.neox)
    lo, hi = sel.retrieved
    assert hi - lo == 1
    assert (sel.blocks[:, lo] == planted).all()


def test_positions_stay_inside_the_trained_window_past_it(tiny_model):
    model = Model(tiny_model("llama", context_length=128))
    cfg = dict(mode="sparse", sinks=B, window=2 * B, top_k=2)
    cache = _cache(model, n_ctx=1200, **cfg)
    tokens = np.random.default_rng(4).integers(3, 2000, 1000).tolist()
    logits = prefill(model, cache, tokens, chunk=64, all_logits=True)
    assert np.isfinite(logits).all()
    q = np.zeros((1, model.config.n_heads, model.config.head_dim), np.float32)
    cos, sin = model.rope.rows(0, 1100)
    sel = select(cache, 0, q, 1000, cache.attention, cos, sin, model.neox)
    assert sel.compressed
    assert int(sel.qpos[0]) < 128 and int(sel.place.max()) + B <= 128
    # Keys placed one after another, the query last: what the model saw in training.
    assert (np.diff(sel.place, axis=1) == B).all()
    for t in range(5):
        out = model.forward([tokens[t]], cache)
        assert np.isfinite(out).all()
    # Stable: the logits past the window look like those inside it, not blown up.
    inside = np.abs(logits[:100]).max()
    assert np.abs(logits[-100:]).max() < 3 * inside


def test_decode_credits_attention_mass_to_retrieved_blocks_only(model):
    cache = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=2)
    prefill(model, cache, np.random.default_rng(5).integers(3, 2000, 300).tolist(), chunk=64)
    cache.reset_mass()
    model.forward([5], cache)
    credited = np.flatnonzero(cache.block_mass)
    assert 0 < len(credited) <= 2 * model.config.n_kv_heads * model.config.n_layers   # K per head and layer
    n_blocks = -(-301 // B)
    assert 0 not in credited and not (credited >= n_blocks - 3).any()
