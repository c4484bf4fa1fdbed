"""Sparse retrieval attention: dense when the budget covers, the right blocks, safe positions."""
from __future__ import annotations

import math

import numpy as np
import pytest

from app.engine.attention import votes as sparse_votes
from app.engine.attention.blocks import attend_blocks
from app.engine.attention.config import ANSWER_K_BEYOND, TOP_K, SparseConfig
from app.engine.attention.select import select
from app.engine.attention.state import AttentionState
from app.engine.generate import prefill
from app.engine.kv.formats import KVSpec
from app.engine.model.transformer import Model
from app.engine.ops.rope import rotate

B = 16


def _cache(model, n_ctx=1024, kv="k8v4", **attn):
    """A blocked cache and the attention state that reads it."""
    return model.new_cache(n_ctx, KVSpec.parse(kv, block=B)), AttentionState(SparseConfig(**attn))


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def model(request, tiny_model):
    return Model(tiny_model(request.param))


def test_sparse_equals_dense_when_the_budget_covers_the_context(model):
    tokens = np.random.default_rng(0).integers(3, 2000, 200).tolist()
    dense, dense_state = _cache(model, mode="dense")
    sparse, sparse_state = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=64)
    want = prefill(model, dense, tokens, chunk=48, all_logits=True, state=dense_state)
    got = prefill(model, sparse, tokens, chunk=48, all_logits=True, state=sparse_state)
    assert np.array_equal(got, want)
    for t in (7, 8, 9):
        assert np.array_equal(model.forward([t], sparse, state=sparse_state),
                              model.forward([t], dense, state=dense_state))


def test_a_small_budget_really_attends_less(model):
    tokens = np.random.default_rng(0).integers(3, 2000, 200).tolist()
    dense, dense_state = _cache(model, mode="dense")
    sparse, sparse_state = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=1)
    prefill(model, dense, tokens, chunk=48, state=dense_state)
    prefill(model, sparse, tokens, chunk=48, state=sparse_state)
    assert not np.array_equal(model.forward([7], sparse, state=sparse_state),
                              model.forward([7], dense, state=dense_state))


def _query_and_new_key(model, cache, layer, n, seed):
    """A random query (1, H, HD) float32, its key and value (random) written at position ``n`` of
    ``layer``, not yet committed: what one decode step holds when it attends."""
    c = model.config
    rng = np.random.default_rng(seed)
    q = rng.normal(0, 1, (1, c.n_heads, c.head_dim)).astype(np.float32)
    k = rng.normal(0, 1, (1, c.n_kv_heads * c.head_dim)).astype(np.float32)
    cache.update(layer, n, k, k)
    return q


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


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(4, 2, 0), (6, 1, 128), (7, 1, 64), (4, 2, 64),
                                                        (10, 2, 32)])
@pytest.mark.parametrize("kv", ["f16", "k8v4"])
@pytest.mark.parametrize("n", [100, 142])
def test_dense_block_attention_matches_a_plain_numpy_reference(tiny_model, arch, n_heads, n_kv_heads, head_dim,
                                                               kv, n):
    """Decoding over every block: plain loops for heads of 16 dimensions; where HD % 32 == 0,
    16-lane scores (four keys at a time, then one at a time: the last block holds 5 or 15
    tokens), exponentials 8 at a time and the rest one by one (15), values three query heads at
    a time and then one (groups of 6, 7, 2 and 5); the blocks in one run or split over two (10
    blocks), merged."""
    model = Model(tiny_model(arch, n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim))
    cache, state = _cache(model, kv=kv, mode="dense")
    prefill(model, cache, np.random.default_rng(1).integers(3, 2000, n).tolist(), chunk=32, state=state)
    q = _query_and_new_key(model, cache, 1, n, seed=2)
    got = attend_blocks(q, cache, 1, n, state, model.rope, model.neox)[0]
    cache.commit([1])
    want = _reference_attention(model, cache, 1, q[0], n)
    np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4)


def test_selection_picks_the_block_whose_keys_match_the_query(model):
    c = model.config
    cache, state = _cache(model, n_ctx=2048, mode="sparse", sinks=B, window=2 * B, top_k=1)
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
            qr = rotate(qh[None, None, :], cos[[rel]], sin[[rel]], model.neox)[0, 0]
            keys[pos, h * c.head_dim:(h + 1) * c.head_dim] = 20.0 * qr / np.linalg.norm(qr)   # bound 20|q| vs ~1.8 sum|q| of random blocks
    for layer in range(c.n_layers):
        cache.update(layer, 0, keys, keys)
    cache.commit(range(n))
    cos, sin = model.rope.rows(0, n + 2)
    sel = select(cache, 0, q, n, state, cos, sin, model.neox)
    lo, hi = sel.retrieved
    assert hi - lo == 1
    assert (sel.blocks[:, lo] == planted).all()


def test_positions_stay_inside_the_trained_window_past_it(tiny_model):
    model = Model(tiny_model("llama", context_length=128))
    cfg = dict(mode="sparse", sinks=B, window=2 * B, top_k=2)
    cache, state = _cache(model, n_ctx=1200, **cfg)
    tokens = np.random.default_rng(4).integers(3, 2000, 1000).tolist()
    logits = prefill(model, cache, tokens, chunk=64, all_logits=True, state=state)
    assert np.isfinite(logits).all()
    q = np.zeros((1, model.config.n_heads, model.config.head_dim), np.float32)
    cos, sin = model.rope.rows(0, 1100)
    sel = select(cache, 0, q, 1000, state, cos, sin, model.neox)
    assert sel.compressed
    assert int(sel.qpos[0]) < 128 and int(sel.place.max()) + B <= 128
    # Keys placed one after another, the query last: what the model saw in training.
    assert (np.diff(sel.place, axis=1) == B).all()
    # Told to read many more blocks, it reads only as many as keep the positions inside.
    state.focus = np.arange(10, 60, dtype=np.int64)
    told = select(cache, 0, q, 1000, state, cos, sin, model.neox)
    assert told.blocks.shape[1] > sel.blocks.shape[1] and set(told.blocks[0]) & {10, 11}
    assert int(told.qpos[0]) < 128 and int(told.place.max()) + B <= 128
    # What it read on top of K is what the bytes per token count (not the 50 it was told).
    assert state.focus_read == told.retrieved[1] - told.retrieved[0] - 2 < 50
    state.focus = np.zeros(0, np.int64)
    for t in range(5):
        out = model.forward([tokens[t]], cache, state=state)
        assert np.isfinite(out).all()
    # Stable: the logits past the window look like those inside it, not blown up.
    inside = np.abs(logits[:100]).max()
    assert np.abs(logits[-100:]).max() < 3 * inside


def _placed_attention(model, cache, layer, q, sel):
    """Plain numpy: each KV head's selected blocks, keys rotated to where ``sel`` places them,
    the query to ``sel.qpos``; softmax, values."""
    c = model.config
    k, v = cache.dequantize(layer)                       # (KVH, n, HD), keys in block frame
    n = k.shape[1]
    cos, sin = model.rope.rows(0, int(sel.place.max()) + B + 1)
    group = c.n_heads // c.n_kv_heads
    out = np.zeros((c.n_heads, c.head_dim), np.float64)
    qr = rotate(q[None].astype(np.float32), cos[sel.qpos], sin[sel.qpos], model.neox)[0]
    for h in range(c.n_heads):
        kv = h // group
        tok = np.concatenate([np.arange(b * B, min(b * B + B, n)) for b in sel.blocks[kv]])
        at = np.concatenate([np.full(min(B, n - b * B), p) for b, p in zip(sel.blocks[kv], sel.place[kv])])
        kh = rotate(k[kv, tok][:, None, :], cos[at], sin[at], model.neox)[:, 0].astype(np.float64)
        s = kh @ qr[h].astype(np.float64) / math.sqrt(c.head_dim)
        p = np.exp(s - s.max())
        out[h] = (p / p.sum()) @ v[kv, tok]
    return out


def test_past_the_trained_window_the_focus_sits_nearest_the_question(tiny_model):
    """Beyond the trained context the blocks a question was told to read are placed last among
    the retrieved ones, next to the local blocks (the model leans on what is nearest); the
    others keep their order, every slot is used once, and attention reads keys where placed."""
    model = Model(tiny_model("llama", context_length=256))
    cache, state = _cache(model, n_ctx=1200, mode="sparse", sinks=B, window=2 * B, top_k=2)
    n = 1000
    prefill(model, cache, np.random.default_rng(4).integers(3, 2000, n).tolist(), chunk=64, state=state)
    q = _query_and_new_key(model, cache, 0, n, seed=5)
    c = model.config
    cos, sin = model.rope.rows(0, n + 2)
    state.focus = np.array([40, 3], np.int64)            # best passage first, as qa/focus.py tells them
    sel = select(cache, 0, q, n, state, cos, sin, model.neox)
    lo, hi = sel.retrieved
    assert sel.compressed and hi - lo == 2 + 2
    assert int(sel.qpos[0]) == sel.place[0, -1] + n % B   # the query in its own block, last
    for h in range(c.n_kv_heads):
        row, at = list(sel.blocks[h]), list(sel.place[h] // B)
        assert sorted(at) == list(range(len(row)))      # one slot each
        assert at[:lo] == list(range(lo)) and at[hi:] == list(range(hi, len(row)))   # sinks, local: as before
        assert [row[at.index(i)] for i in (hi - 2, hi - 1)] == [3, 40]   # the focus last, in document order
        others = [b for b in row[lo:hi] if b not in (3, 40)]
        assert [row[at.index(i)] for i in range(lo, hi - 2)] == others
    got = attend_blocks(q, cache, 0, n, state, model.rope, model.neox)[0]
    cache.commit([0])
    np.testing.assert_allclose(got, _placed_attention(model, cache, 0, q[0], sel), rtol=2e-4, atol=2e-4)


def test_decode_credits_attention_mass_to_retrieved_blocks_only(model):
    cache, state = _cache(model, mode="sparse", sinks=B, window=2 * B, top_k=2)
    prefill(model, cache, np.random.default_rng(5).integers(3, 2000, 300).tolist(), chunk=64, state=state)
    state.reset_mass()
    model.forward([5], cache, state=state)
    credited = np.flatnonzero(state.block_mass)
    assert 0 < len(credited) <= 2 * model.config.n_kv_heads * model.config.n_layers   # K per head and layer
    n_blocks = -(-301 // B)
    assert 0 not in credited and not (credited >= n_blocks - 3).any()


# ---- Question-aware choice (attention/votes.py) ------------------------------------------------


def _rotated(model, q, rel):
    """q (HD,) turned by a distance rel: what a block-frame key must equal to score q . k."""
    from app.engine.ops.rope import rotate
    cos, sin = model.rope.rows(0, rel + 1)
    return rotate(q[None, None, :], cos[[rel]], sin[[rel]], model.neox)[0, 0]


def _planted_cache(model, n, mass_block, peak_block, cfg):
    """Random keys, plus per KV head a block whose 16 keys all score 3 with the group's first
    query (mass e^3 x 16) and a block with one key scoring 4.5 (a higher peak, less mass)."""
    c = model.config
    rng = np.random.default_rng(7)
    keys = rng.normal(0, 0.3, (n + 1, c.n_kv_heads * c.head_dim)).astype(np.float32)
    q = rng.normal(0, 1, (1, c.n_heads, c.head_dim)).astype(np.float32)
    group = c.n_heads // c.n_kv_heads
    q[0] = np.repeat(q[0, ::group], group, axis=0)      # every head of a group asks the same
    unit = math.sqrt(c.head_dim)                         # scores are q . k / sqrt(HD)
    for h in range(c.n_kv_heads):
        cols = slice(h * c.head_dim, (h + 1) * c.head_dim)
        qh = q[0, h * group]
        for block, score, tokens in ((mass_block, 3.0, range(B)), (peak_block, 4.5, [5])):
            qr = _rotated(model, qh, n - block * B)
            for j in tokens:
                keys[block * B + j, cols] = score * unit * qr / float(qr @ qr)
    cache, state = _cache(model, n_ctx=2048, kv="f16", **cfg)
    for layer in range(c.n_layers):
        cache.update(layer, 0, keys, keys)
    cache.commit(range(n + 1))
    return cache, state, q


def test_the_question_chooses_blocks_by_attention_mass_not_by_peak(model):
    n = 30 * B                      # inside the trained context: true distances
    mass_block, peak_block = 9, 17
    cfg = dict(mode="sparse", sinks=B, window=2 * B, top_k=1)
    cache, state, q = _planted_cache(model, n, mass_block, peak_block, cfg)
    cos, sin = model.rope.rows(0, n + 2)
    # The key bounds (Quest) rank the single high key first ...
    sel = select(cache, 0, q, n, state, cos, sin, model.neox)
    assert (sel.blocks[:, sel.retrieved[0]] == peak_block).all()
    # ... the observed question weighs whole blocks: it reads the block with the mass,
    state.observe = (n, n + 1)
    attend_blocks(q, cache, 0, n, state, model.rope, model.neox)
    votes = state.votes[0]                                # (KVH, candidate end)
    assert (votes.argmax(axis=1) == mass_block).all()
    # ... and decoding after it retrieves by those votes, with no ranking of its own.
    state.observe = None
    sel = select(cache, 0, q, n + 1, state, cos, sin, model.neox)
    assert (sel.blocks[:, sel.retrieved[0]] == mass_block).all()
    assert sel.blocks.shape[1] == 1 + 1 + (-(-(n + 2) // B) - votes.shape[1])   # sink, retrieved, the rest


def test_the_focus_is_read_besides_the_blocks_the_votes_choose(model):
    n = 30 * B
    mass_block, peak_block = 9, 17
    cache, state, q = _planted_cache(model, n, mass_block, peak_block,
                                     dict(mode="sparse", sinks=B, window=2 * B, top_k=2))
    cos, sin = model.rope.rows(0, n + 2)
    state.observe = (n, n + 1)
    attend_blocks(q, cache, 0, n, state, model.rope, model.neox)
    votes = state.votes[0]                                # (KVH, candidate end = first local block)
    state.observe = None
    # Two focus blocks, one of them the votes' own first choice; the sink and a local block
    # are read anyway and take no place in the budget.
    state.focus = np.array([0, 4, mass_block, votes.shape[1]], np.int64)
    sel = select(cache, 0, q, n + 1, state, cos, sin, model.neox)
    lo, hi = sel.retrieved
    assert hi - lo == 2 + 2                               # K, plus the focus among the candidates
    assert (sel.place == sel.blocks * B).all()            # inside the trained context: true positions
    ranked = np.argsort(-votes[:, 1:], axis=1) + 1        # candidates by votes, best first
    for h in range(model.config.n_kv_heads):
        others = [b for b in ranked[h] if b not in (4, mass_block)][:2]
        assert sorted(sel.blocks[h, lo:hi]) == sorted([4, mass_block] + others)
    # Told to read every candidate, it reads them all: nothing is ranked out.
    state.focus = np.arange(votes.shape[1], dtype=np.int64)
    state.vote_top.clear()
    sel = select(cache, 0, q, n + 1, state, cos, sin, model.neox)
    assert not sel.ranked and (sel.blocks == np.arange(sel.blocks.shape[1])).all()


@pytest.mark.parametrize("piece", [64, 3])
def test_votes_are_the_softmax_shares_of_exact_block_masses(model, monkeypatch, piece):
    """Differential: the votes equal plain numpy's log-sum-exp per block of the true scores
    (also when each thread's blocks take several pieces)."""
    monkeypatch.setattr(sparse_votes, "PIECE", piece)
    c = model.config
    n = 20 * B
    cfg = dict(mode="sparse", sinks=B, window=2 * B, top_k=2)
    cache, state, q = _planted_cache(model, n, 5, 12, cfg)
    q = np.random.default_rng(8).normal(0, 1, q.shape).astype(np.float32)
    state.observe = (n, n + 1)
    attend_blocks(q, cache, 0, n, state, model.rope, model.neox)
    votes = state.votes[0]
    end = votes.shape[1]
    assert end == (n + 1 - 2 * B) // B
    k, _ = cache.dequantize(0)                               # (KVH, n, HD) block frame
    group = c.n_heads // c.n_kv_heads
    want = np.zeros_like(votes)
    for h in range(c.n_heads):
        lse = []
        for b in range(1, end):                              # block 0 is the sink
            qr = _rotated(model, q[0, h], n - b * B).astype(np.float64)
            s = k[h // group, b * B:(b + 1) * B].astype(np.float64) @ qr / math.sqrt(c.head_dim)
            lse.append(np.log(np.exp(s - s.max()).sum()) + s.max())
        share = np.exp(np.array(lse) - max(lse))
        want[h // group, 1:] += share / share.sum()
    np.testing.assert_allclose(votes, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_obs", [12, 5])
def test_a_dense_question_votes_with_the_block_masses_of_its_own_scores(model, monkeypatch, n_obs):
    """"sparse-decode" inside the trained context: the question attends densely, and the block
    masses its observed tokens vote with come from that attention's scores (products.by_keys)
    instead of a second pass over the keys. Differential: the votes equal plain numpy's
    log-sum-exp per block at true distances and the separate pass's (votes._log_mass), and the
    attention is the same; observed tokens can start inside the chunk (n_obs < T)."""
    from app.engine.attention import blocks
    c = model.config
    n_q, n_total = 12, 30 * B                              # inside the tiny model's 512 tokens
    pos0 = n_total - n_q
    cfg = dict(mode="sparse-decode", sinks=B, window=2 * B, top_k=2)
    q = np.random.default_rng(9).normal(0, 1, (n_q, c.n_heads, c.head_dim)).astype(np.float32)
    runs = {}
    for fused in (True, False):
        monkeypatch.setattr(blocks, "VOTES_FROM_PREFILL", fused)
        if fused:     # the separate pass must not run
            monkeypatch.setattr(sparse_votes, "_log_mass", None)
        else:
            monkeypatch.undo()
            monkeypatch.setattr(blocks, "VOTES_FROM_PREFILL", False)
        cache, state, _ = _planted_cache(model, n_total - 1, 5, 12, cfg)
        assert sparse_votes.votes_from_own_scores(state.config, cache, n_total)
        state.observe = (n_total - n_obs, n_total)
        out = attend_blocks(q, cache, 0, pos0, state, model.rope, model.neox)
        runs[fused] = (out, state.votes[0])
    (out, votes), (out_old, votes_old) = runs[True], runs[False]
    end = votes.shape[1]
    assert end == (n_total - 2 * B) // B
    np.testing.assert_allclose(votes, votes_old, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(out, out_old, rtol=1e-4, atol=1e-5)
    k, _ = cache.dequantize(0)                               # (KVH, n, HD) block frame
    group = c.n_heads // c.n_kv_heads
    want = np.zeros_like(votes)
    for t in range(n_total - n_obs, n_total):
        for h in range(c.n_heads):
            lse = []
            for b in range(1, end):                          # block 0 is the sink
                qr = _rotated(model, q[t - pos0, h], t - b * B).astype(np.float64)
                s = k[h // group, b * B:(b + 1) * B].astype(np.float64) @ qr / math.sqrt(c.head_dim)
                lse.append(np.log(np.exp(s - s.max()).sum()) + s.max())
            share = np.exp(np.array(lse) - max(lse))
            want[h // group, 1:] += share / share.sum()
    np.testing.assert_allclose(votes, want, rtol=1e-4, atol=1e-5)


def test_a_question_after_a_document_keeps_its_checkpoint_and_votes_every_layer(tiny_model):
    from app.engine.backend import SamplingParams
    from app.engine.ellm_backend import EllmBackend

    b = EllmBackend(tiny_model("llama"), n_ctx=1024, kv="k8v4",
                    attention=SparseConfig(sinks=64, window=64, top_k=1, observe=8))
    doc = np.random.default_rng(9).integers(3, 2000, 640).tolist()
    assert b.ensure_prefix(doc).status == "miss"
    question = [11, 12, 13, 14, 15]
    first = list(b.generate(doc + question, SamplingParams.make_greedy(4)))
    assert b.stats.reused_prompt_tokens == len(doc)      # the question only: 5 < 8 observed
    assert b.state.observe == (len(doc), len(doc) + 5)
    assert sorted(b.state.votes) == list(range(b.model.config.n_layers))
    assert b.cache.checkpoint is not None and b.cache.checkpoint.n_tokens == len(doc)
    again = list(b.generate(doc + question, SamplingParams.make_greedy(4)))
    assert again == first and b.stats.reused_prompt_tokens == len(doc)


def test_sparse_decode_reads_the_prompt_as_dense_and_answers_from_the_voted_blocks(tiny_model):
    from app.engine.backend import SamplingParams
    from app.engine.ellm_backend import EllmBackend

    opts = dict(sinks=64, window=64, top_k=1, observe=8)
    doc = np.random.default_rng(9).integers(3, 2000, 640).tolist()
    question = [11, 12, 13, 14, 15]
    caches, answers, backends = {}, {}, {}
    for mode in ("dense", "sparse-decode", "sparse"):
        b = backends[mode] = EllmBackend(tiny_model("llama", context_length=2048), n_ctx=1024, kv="f16",
                                         documents=True,
                                         attention=SparseConfig(mode=mode, **opts))
        b.ensure_prefix(doc)
        caches[mode] = [a.copy() for a in b.cache.layer(b.model.config.n_layers - 1)[:10]]   # layer 0's: embeddings only
        answers[mode] = list(b.generate(doc + question, SamplingParams.make_greedy(6)))
    # The document and the question are read as dense attention reads them (one cache file) ...
    assert all(np.array_equal(x, y) for x, y in zip(caches["sparse-decode"], caches["dense"]))
    assert not all(np.array_equal(x, y) for x, y in zip(caches["sparse"], caches["dense"]))
    assert backends["sparse-decode"].cache_signature() == backends["dense"].cache_signature()
    # ... the question voted, and the answer read the voted blocks only: fewer bytes than dense.
    sd = backends["sparse-decode"]
    assert sorted(sd.state.votes) == list(range(sd.model.config.n_layers))
    assert sd.stats.kv_read_bytes_per_token < backends["dense"].stats.kv_read_bytes_per_token
    assert answers["sparse-decode"][0] == answers["dense"][0]     # the first token comes from the prompt


def test_the_backend_reads_the_focus_for_the_next_answer_only(tiny_model):
    from app.engine.backend import SamplingParams
    from app.engine.ellm_backend import EllmBackend

    b = EllmBackend(tiny_model("llama", context_length=2048), n_ctx=1024, kv="f16", documents=True,
                    attention=SparseConfig(mode="sparse-decode", sinks=64, window=64, top_k=1, observe=8))
    assert b.capabilities.focus
    doc = np.random.default_rng(9).integers(3, 2000, 640).tolist()
    prompt = doc + [11, 12, 13, 14, 15]
    b.ensure_prefix(doc)
    plain = list(b.generate(prompt, SamplingParams.make_greedy(4)))
    plain_bytes = b.stats.kv_read_bytes_per_token
    assert not (b.state.block_mass[[2, 3, 4]] > 0).all()
    b.focus([(200, 260), (130, 140), (0, 10)])            # blocks 3 to 4, 2, and the sink 0 (64 tokens each)
    focused = list(b.generate(prompt, SamplingParams.make_greedy(4)))
    assert b.state.focus.tolist() == [3, 4, 2, 0]         # best passage first
    assert (b.state.block_mass[[2, 3, 4]] > 0).all()      # the answer read them
    assert b.stats.kv_read_bytes_per_token == plain_bytes + 3 * 64 * b.kv_bytes_per_token()   # the sink was read anyway
    assert focused[0] == plain[0]                         # the first token comes from the prompt
    b.focus([(130, 140)])
    with pytest.raises(ValueError, match="context holds"):
        b.generate(list(range(3, 1100)), SamplingParams.make_greedy(4))
    list(b.generate(prompt, SamplingParams.make_greedy(4)))
    assert b.state.focus.size == 0                        # told for one answer, even one refused
    assert not EllmBackend(tiny_model("llama"), n_ctx=1024, kv="f16", documents=True,
                           attention="dense").capabilities.focus


def test_sparse_decode_reads_beyond_the_trained_context_as_sparse_does(tiny_model):
    model = Model(tiny_model("llama", context_length=256))
    tokens = np.random.default_rng(4).integers(3, 2000, 600).tolist()
    logits, dense = {}, SparseConfig(mode="dense")
    opts = dict(sinks=B, window=2 * B, top_k=2)
    for mode in ("dense", "sparse", "sparse-decode"):
        cfg = SparseConfig(mode=mode, **opts)
        assert cfg.for_context(256, 256) is cfg                  # inside the trained context: as it is
        cache, state = _cache(model, n_ctx=700, **vars(cfg.for_context(700, 256)))
        logits[mode] = prefill(model, cache, tokens, chunk=64, all_logits=True, state=state)
    # Past the trained 256 tokens sparse-decode reads its whole prompt as sparse does, one
    # cache file; with a K given, its answer reads that K too.
    assert np.array_equal(logits["sparse-decode"], logits["sparse"])
    assert not np.array_equal(logits["sparse"][:256], logits["dense"][:256])
    cfg = SparseConfig(mode="sparse-decode", **opts)
    assert cfg.prompt_config(256, 256) == dense
    assert cfg.prompt_config(700, 256) == SparseConfig(mode="sparse", **opts).prompt_config(700, 256)
    assert cfg.for_context(700, 256) == SparseConfig(mode="sparse", answer_k=2, **opts)
    assert SparseConfig(mode="dense", top_k=2).prompt_config(700, 256) == dense
    # Without a K: the prompt reads sparse's, the answer ANSWER_K_BEYOND voted blocks.
    auto = SparseConfig(mode="sparse-decode").for_context(700, 256)
    assert (auto.mode, auto.k, auto.k_for(64), auto.k_for(1)) == ("sparse", TOP_K["sparse"], 16, ANSWER_K_BEYOND)
    assert SparseConfig(mode="sparse-decode").prompt_config(700, 256) == SparseConfig(mode="sparse")


def test_the_backend_answers_past_the_trained_context_from_the_sparse_cache_file(tiny_model):
    from app.engine.ellm_backend import EllmBackend

    path = tiny_model("llama", context_length=256)
    past = EllmBackend(path, n_ctx=1024, kv="f16", documents=True, attention="sparse-decode")
    assert past.state.config == SparseConfig(mode="sparse", answer_k=ANSWER_K_BEYOND)
    assert past.cache_signature() == EllmBackend(path, n_ctx=1024, kv="f16", documents=True,
                                                 attention="sparse").cache_signature()
    inside = EllmBackend(path, n_ctx=256, kv="f16", documents=True, attention="sparse-decode")
    assert inside.state.config == SparseConfig(mode="sparse-decode")
    inside.ensure_prefix(list(range(3, 200)))
    dense_signature = inside.cache_signature()
    inside.reserve(1024)           # grown past the trained context: it reads as the other does,
    assert inside.state.config == past.state.config and inside.cache_signature() == past.cache_signature()
    assert inside.cache.n_tokens == 0 and dense_signature != past.cache_signature()   # and forgets the rest


def test_a_loaded_backend_serves_sparse_decode_on_its_side_of_the_trained_context(tiny_model, monkeypatch):
    from app.runtime.backends import Backends
    from app.runtime.plan import run_plan

    path = tiny_model("llama", context_length=256)
    backends = Backends()
    opened = [backends.get(run_plan("ellm", path, n_ctx=n, threads=1, attention="sparse-decode", documents=True))
              for n in (128, 256, 1024, 2048)]
    assert opened[0] is opened[1] and opened[2] is opened[3] and opened[1] is not opened[2]
    assert opened[3].n_ctx == 2048 and opened[1].state.config.mode == "sparse-decode"


def test_an_answer_k_is_read_by_single_queries_inside_the_trained_window(tiny_model):
    """answer_k: the prompt's chunks read K blocks, each answer token answer_k (and so does each
    token of a question's chunk, short enough to choose per query), and past the trained context
    only as many as keep every position inside it."""
    model = Model(tiny_model("llama", context_length=256))
    tokens = np.random.default_rng(4).integers(3, 2000, 640).tolist()
    opts = dict(mode="sparse", sinks=B, window=2 * B, top_k=2, observe=0)
    caches = {}
    for answer_k in (None, 6, 100):
        cache, state = caches[answer_k] = _cache(model, n_ctx=700, answer_k=answer_k, **opts)
        prefill(model, cache, tokens, chunk=64, state=state)
    for answer_k in (6, 100):   # the prompt read the same blocks
        assert all(np.array_equal(x, y) for x, y in zip(caches[answer_k][0].layer(1), caches[None][0].layer(1)))
    q = np.random.default_rng(5).standard_normal((1, model.config.n_heads, model.config.head_dim)).astype(np.float32)
    cos, sin = model.rope.rows(0, 700)
    read = {}
    for answer_k, (cache, state) in caches.items():
        sel = read[answer_k] = select(cache, 0, q, 640, state, cos, sin, model.neox)
        assert sel.compressed and int(sel.place.max()) + B <= 256 and int(sel.qpos[0]) < 256
    assert [read[k].retrieved[1] - read[k].retrieved[0] for k in (None, 6)] == [2, 6]
    assert read[100].blocks.shape[1] * B == 256 - B                 # as many as fit, not 100
    assert SparseConfig(answer_k=6, top_k=2).budget_tokens(B) == SparseConfig(top_k=6).budget_tokens(B)


def test_each_sparse_mode_has_its_own_k_unless_one_is_given():
    from dataclasses import replace

    assert (SparseConfig().k, SparseConfig(mode="sparse-decode").k) == (16, 64)
    assert replace(SparseConfig(), mode="sparse-decode").k == 64        # the mode's, not sparse's
    assert replace(SparseConfig(top_k=5), mode="sparse-decode").k == 5  # a given K stays
    assert SparseConfig(mode="sparse-decode").options()["top_k"] == 64
    assert SparseConfig(mode="sparse-decode").budget_tokens(64) == (1 + 64 + 4 + 1) * 64
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        SparseConfig(top_k=-1)


def test_a_config_in_another_mode_keeps_its_options_unless_dense():
    mine = SparseConfig(window=512, top_k=5)
    assert mine.in_mode("sparse-decode") == SparseConfig(mode="sparse-decode", window=512, top_k=5)
    assert mine.in_mode("dense") == SparseConfig(mode="dense")   # one dense, whatever was given
    with pytest.raises(ValueError, match="attention must be one of"):
        mine.in_mode("nearest")


@pytest.mark.parametrize("split", ["by_queries", "by_keys"])
@pytest.mark.parametrize("n_tok,group,n_keys", [(50, 3, 2600), (7, 2, 300), (130, 1, 1100), (3, 6, 5000)])
def test_prefill_products_equal_a_float64_masked_softmax(n_tok, group, n_keys, split):
    """The prefill's scores, causal softmax and values (BLAS products in numba's threads, the
    work shared by queries or by keys, several key tiles per thread) against float64 numpy:
    keys at positions after a query's get nothing, and a thread whose keys a query cannot see
    adds nothing to it."""
    from app.engine.attention import products
    rng = np.random.default_rng(n_keys)
    hd = 32
    qh = rng.standard_normal((n_tok * group, hd)).astype(np.float32)         # (T*G, HD)
    k = rng.standard_normal((n_keys, hd)).astype(np.float32)                 # (N, HD)
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    key_pos = np.sort(rng.choice(4 * n_keys, n_keys, replace=False)).astype(np.int64)   # (N,) ascending
    query_pos = np.sort(rng.choice(np.arange(key_pos[0], key_pos[-1] + 1), n_tok)).astype(np.int64)
    scale = np.float32(hd ** -0.5)
    out = np.empty_like(qh)
    getattr(products, split)(qh, k, v, key_pos, query_pos, group, scale, 2, out)
    s = (qh.astype(np.float64) @ k.T.astype(np.float64)) * float(scale)     # (T*G, N)
    seen = key_pos[None, :] <= np.repeat(query_pos, group)[:, None]
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("n_tok,group,n_keys,row0", [(130, 4, 5000, 300), (9, 3, 2600, 0)])
def test_prefill_split_by_keys_gives_the_block_masses_of_its_scores(n_tok, group, n_keys, row0):
    """by_keys' block masses (what a dense question votes with): log-sum-exp of each 64-key
    block's scaled scores for the rows asked, against float64 numpy, with several tiles per
    thread (runs and tiles start on block boundaries); the attention itself as before."""
    from app.engine.attention import products
    rng = np.random.default_rng(n_keys)
    hd, block = 32, 64
    qh = rng.standard_normal((n_tok * group, hd)).astype(np.float32)          # (T*G, HD)
    k = rng.standard_normal((n_keys, hd)).astype(np.float32)                  # (N, HD)
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    key_pos = np.arange(n_keys, dtype=np.int64)
    query_pos = n_keys - n_tok + np.arange(n_tok, dtype=np.int64)             # the chunk's own keys last
    n_blocks = (n_keys - n_tok) // block                                      # seen whole by every row
    scale = np.float32(hd ** -0.5)
    out, plain = np.empty_like(qh), np.empty_like(qh)
    mass = np.full((n_tok * group - row0, n_blocks), np.nan, np.float32)      # (R, NB)
    products.by_keys(qh, k, v, key_pos, query_pos, group, scale, 2, out, (row0, block, mass))
    products.by_keys(qh, k, v, key_pos, query_pos, group, scale, 2, plain)
    np.testing.assert_allclose(out, plain, rtol=1e-4, atol=1e-5)
    s = (qh[row0:].astype(np.float64) @ k[:n_blocks * block].T.astype(np.float64)) * float(scale)
    s = s.reshape(s.shape[0], n_blocks, block)
    want = np.log(np.exp(s - s.max(axis=2, keepdims=True)).sum(axis=2)) + s.max(axis=2)
    np.testing.assert_allclose(mass, want, rtol=1e-4, atol=1e-4)


def test_a_block_far_below_the_row_maximum_keeps_a_finite_mass():
    """A key scoring hundreds above the rest (an attention sink) makes the other blocks' exps
    underflow in its run: their masses must stay finite (their own highest score, at most
    log(block) below the true log-sum-exp), or a row of -inf would make NaN votes."""
    from app.engine.attention import products
    rng = np.random.default_rng(3)
    hd, block, n_keys, group = 32, 64, 1024, 2
    qh = rng.standard_normal((group, hd)).astype(np.float32)                  # (G, HD): one token
    k = rng.standard_normal((n_keys, hd)).astype(np.float32)
    k[3] = qh[0] * (600.0 / float(qh[0] @ qh[0])) * np.sqrt(hd)               # row 0 scores 600 there
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    out = np.empty_like(qh)
    mass = np.full((group, n_keys // block - 1), np.nan, np.float32)          # (R, NB)
    products.by_keys(qh, k, v, np.arange(n_keys, dtype=np.int64), np.array([n_keys], np.int64), group,
                     np.float32(hd ** -0.5), 2, out, (0, block, mass))
    s = (qh.astype(np.float64) @ k.T.astype(np.float64)) * hd ** -0.5
    s = s[:, :mass.shape[1] * block].reshape(group, -1, block)
    want = np.log(np.exp(s - s.max(axis=2, keepdims=True)).sum(axis=2)) + s.max(axis=2)
    assert np.isfinite(mass).all()
    assert (mass <= want + 1e-3).all() and (mass >= want - np.log(block) - 1e-3).all()
    assert mass[0, 0] == pytest.approx(want[0, 0], rel=1e-5)                   # the sink's block exactly


def _bf16_value(bits):
    return (bits.astype(np.uint32) << 16).view(np.float32)


def test_bfloat16_pairs_hold_f16_exactly_and_float32_to_17_bits():
    """products_amx's split: hi + lo is an f16 value exactly (11 significand bits) and any
    float32 within 2^-16 of itself, where one bfloat16 alone is off by up to 2^-7."""
    from app.engine.attention import products_amx
    rng = np.random.default_rng(4)
    x16 = (rng.standard_normal(4096) * 30).astype(np.float16).astype(np.float32)
    x32 = (rng.standard_normal(4096) * np.exp(rng.uniform(-20, 20, 4096))).astype(np.float32)
    for x, bound in ((x16, 0.0), (x32, 2.0 ** -16)):
        hi, lo = products_amx.pack_queries(x.reshape(-1, 32), 2)
        got = _bf16_value(hi) + _bf16_value(lo)
        assert np.all(np.abs(got - x) <= bound * np.abs(x))
    assert (np.abs(_bf16_value(hi) - x32) > 2.0 ** -10 * np.abs(x32)).any()


@pytest.mark.parametrize("hd", [64, 128])
@pytest.mark.parametrize("n_tok,group,n_keys,n_parts", [(50, 3, 2600, 2), (6, 6, 300, 2), (130, 1, 1100, 3),
                                                        (40, 6, 9000, 2), (33, 1, 70, 2)])
def test_amx_prefill_products_equal_a_float64_masked_softmax(n_tok, group, n_keys, n_parts, hd):
    """The prefill's products on AMX tiles (attention/products_amx.py: bfloat16 pairs, three
    tile products each) against float64 numpy, to the split's precision (1e-5 of the scale
    here; bfloat16 alone is a hundred times further off): query rows not a multiple of the
    32-row blocks, keys not a multiple of 32 and at scattered positions, runs of several
    256-key tiles, a thread whose keys some queries cannot see, blocks the causal mask skips."""
    from app.engine.attention import products_amx
    from app.engine.ops.amx import HAS_AMX_BF16
    if not HAS_AMX_BF16:
        pytest.skip("AMX-BF16 only")
    rng = np.random.default_rng(n_keys + hd)
    qh = (rng.standard_normal((n_tok * group, hd)) * 2).astype(np.float32)   # (T*G, HD)
    k = (rng.standard_normal((n_keys, hd)) * 2).astype(np.float32)           # (N, HD)
    v = rng.standard_normal((n_keys, hd)).astype(np.float32)
    key_pos = np.sort(rng.choice(4 * n_keys, n_keys, replace=False)).astype(np.int64)   # (N,) ascending
    query_pos = np.sort(rng.choice(np.arange(key_pos[0], key_pos[-1] + 1), n_tok)).astype(np.int64)
    scale = np.float32(hd ** -0.5)
    out = np.full_like(qh, np.nan)
    q_hi, q_lo = products_amx.pack_queries(qh, n_parts)
    kv = products_amx.pack_keys_values(k, v, n_parts)
    products_amx.attend(q_hi, q_lo, *kv, n_keys, key_pos, query_pos, n_tok * group, group, scale, n_parts, out)
    s = (qh.astype(np.float64) @ k.T.astype(np.float64)) * float(scale)     # (T*G, N)
    seen = key_pos[None, :] <= np.repeat(query_pos, group)[:, None]
    s = np.where(seen, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    want = (p / p.sum(axis=1, keepdims=True)) @ v.astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=0, atol=1e-3)
    assert np.abs(out - want).max() < 2e-4


@pytest.fixture(scope="module", params=["llama", "qwen2"])
def wide_model(request, tiny_model):
    """Heads of 64 dimensions: AMX tiles take the head's dimensions 32 at a time."""
    return Model(tiny_model(request.param, head_dim=64))


@pytest.mark.parametrize("kv", ["f16", "k8v4"])
def test_keys_and_values_gathered_into_amx_tiles_are_the_packed_float_ones(wide_model, kv):
    """_gather_packed writes each decoded, rotated key and value straight into products_amx's
    layouts: what pack_keys_values makes from _gather's float32 rows (to a float32 ulp), and zeros after
    the last key (a partial last block here: 200 tokens in blocks of 16, and 12 of them chosen)."""
    from app.engine.attention import blocks, products_amx
    model = wide_model
    cache, state = _cache(model, kv=kv, mode="dense")
    prefill(model, cache, np.random.default_rng(3).integers(3, 2000, 200).tolist(), chunk=48, state=state)
    n = 200
    chosen = np.array([0, 1, 2, 4, 5, 6, 7, 8, 9, 10, 11, n // B], np.int64)   # the last one partial
    place = chosen * B + 5                                                # placed elsewhere: rotated
    hd = model.config.head_dim
    cos, sin = model.rope.rows(0, n + 2 * B)
    args = (cache.layer(1), n, 1, chosen, place, cos, sin, model.neox)
    k = np.empty((len(chosen) * B, hd), np.float32)
    v = np.empty_like(k)
    t = np.empty(len(chosen) * B, np.int64)
    count = blocks._gather(*args, k, v, t)
    want = products_amx.pack_keys_values(k[:count], v[:count], 2)
    got = tuple(np.full(products_amx.packed_size(len(chosen) * B, hd), 7, np.uint16) for _ in range(4))
    t2 = np.empty_like(t)
    assert blocks._gather_packed(*args, *got, t2) == count == 11 * B + n % B
    # Both kernels are fastmath: LLVM may fuse the rotation's products into FMAs in one and not the
    # other (on AVX2, and on AVX-512 too, depending on what it inlined, which differs between a
    # kernel compiled in this process and one loaded from numba's cache), so a key may lie a
    # float32 ulp apart (a value too, where its decoding fuses), which the pair's 16 bits of
    # mantissa keep to 2^-15; a value or key in the wrong place would be off by far more, and the
    # padding after the last key (the buffers start as 7s) must be exactly zero (no atol).
    for hi, lo in ((0, 1), (2, 3)):
        assert got[hi].size == want[hi].size
        np.testing.assert_allclose(_bf16_sum(got[hi], got[lo]), _bf16_sum(want[hi], want[lo]), rtol=2 ** -15, atol=0)
    np.testing.assert_array_equal(t2[:count], t[:count])


def _bf16_sum(hi, lo):
    """The float32 values a packed (hi, lo) pair of bfloat16 bit arrays stands for."""
    as_f32 = lambda u: (u.astype(np.uint32) << 16).view(np.float32)
    return as_f32(hi) + as_f32(lo)


def test_the_blocked_prefill_on_amx_tiles_is_the_sgemm_one_to_bfloat16_pairs_precision(wide_model, monkeypatch):
    """A whole prefill through the blocked cache with the products on AMX tiles and on sgemms:
    logits within 1e-3 of each other (not equal: another rounding), the same greedy tokens."""
    from app.engine.attention import blocks
    from app.engine.ops.amx import HAS_AMX_BF16
    if not HAS_AMX_BF16:
        pytest.skip("AMX-BF16 only")
    model = wide_model
    tokens = np.random.default_rng(0).integers(3, 2000, 200).tolist()
    out = {}
    monkeypatch.setattr(blocks, "AMX_MIN_ROWS", 32)          # this model's chunks are 64 x 2 query rows
    for on in (False, True):
        monkeypatch.setattr(blocks, "AMX_ATTENTION", on)
        cache, state = _cache(model, kv="f16", mode="dense")
        out[on] = prefill(model, cache, tokens, chunk=64, all_logits=True, state=state)
    assert not np.array_equal(out[True], out[False])
    np.testing.assert_allclose(out[True], out[False], rtol=0, atol=1e-3 * np.abs(out[False]).max())
    assert np.array_equal(out[True].argmax(-1), out[False].argmax(-1))


@pytest.mark.parametrize("n_heads,n_kv_heads,head_dim", [(6, 1, 128), (4, 2, 64), (10, 2, 32), (4, 2, 0)])
@pytest.mark.parametrize("kv", ["f16", "k8v4"])
@pytest.mark.parametrize("mode", ["dense", "sparse"])
def test_f16_blocks_read_as_stored_give_the_bits_of_decoding_them_first(tiny_model, monkeypatch, tmp_path,
                                                                        n_heads, n_kv_heads, head_dim, kv, mode):
    """Decode reads f16 blocks (the f16 format's, and every format's tail) as stored, each row
    converted in registers, where HD % 32 == 0 (16 dims: decoded first as before): the logits
    of decode steps are those of decoding each block to float32 first, bit for bit, over
    memory-mapped blocks of a saved document, blocks of its own and the tail."""
    from app.engine.attention import blocks
    from app.engine.kv.files import load, save

    model = Model(tiny_model("qwen2", n_heads=n_heads, n_kv_heads=n_kv_heads, head_dim=head_dim))
    rng = np.random.default_rng(4)
    document, question = rng.integers(3, 2000, 90).tolist(), rng.integers(3, 2000, 25).tolist()
    attention = SparseConfig(mode=mode, sinks=16, window=32, top_k=2) if mode == "sparse" else SparseConfig()
    first, first_state = _cache(model, kv=kv)[0], AttentionState(attention)
    prefill(model, first, document, chunk=32, state=first_state)
    first.set_checkpoint()
    path = tmp_path / "doc.kv"
    save(first, path, {"kv": kv})

    def steps(as_stored: bool) -> np.ndarray:
        monkeypatch.setattr(blocks, "F16_AS_STORED", as_stored)
        cache, state = _cache(model, kv=kv)[0], AttentionState(attention)
        load(cache, path, {"kv": kv})
        assert cache.nb_base == 90 // B
        logits = [prefill(model, cache, question, chunk=32, state=state)]
        for t in (5, 6, 7, 8, 9):      # from 115 tokens into the eighth block: the tail, then a new one
            logits.append(model.forward([t], cache, state=state))
        return np.stack(logits)        # (6, V)

    assert np.array_equal(steps(True), steps(False))


@pytest.mark.parametrize("mode", ["sparse-decode", "dense"])
def test_a_view_reads_the_head_and_the_copies_and_nothing_else(model, mode):
    """AttentionState.view: a question after copies of some of the document's blocks reads the
    first blocks (the prompt's header) and the copies only, laid out from position 0: what the
    document holds elsewhere changes nothing (the copies' keys come before it), while without
    the view it does."""
    rng = np.random.default_rng(11)
    head, doc = rng.integers(3, 2000, 2 * B).tolist(), rng.integers(3, 2000, 8 * B).tolist()
    other = doc[:4 * B] + rng.integers(3, 2000, 4 * B).tolist()   # the same up to the copied block's end
    question = rng.integers(3, 2000, 5).tolist()

    def logits(document, view):
        cache, state = _cache(model, mode=mode, sinks=B, window=2 * B)
        prefill(model, cache, head + document, chunk=48, state=state)
        cache.copy_blocks([4, 3])                             # doc blocks 1 and 2, at blocks 10 and 11
        state.start_question(None, (), (2, 10) if view else None)
        got = prefill(model, cache, question, chunk=48, all_logits=True, state=state)   # (T, V)
        sel = select(cache, 0, np.zeros((1, model.config.n_heads, model.config.head_dim), np.float32),
                     cache.n_tokens - 1, state, *model.rope.rows(0, cache.n_tokens + 1), model.neox)
        return got, sel

    got, sel = logits(doc, view=True)
    assert (sel.blocks == [0, 1, 10, 11, 12]).all()               # header, copies, the question's block
    assert (sel.place == np.arange(5) * B).all()                 # one after another from 0
    assert sel.qpos[0] == 4 * B + (12 * B + 4) % B               # the last question token, in the last block
    assert np.array_equal(logits(other, view=True)[0], got)
    assert not np.allclose(logits(other, view=False)[0], logits(doc, view=False)[0])


def _backend_with_copies(tiny_model, context_length, top_k):
    """A sparse-decode backend small enough that copies beside a question lie past its sinks
    and begin before its window, with K = ``top_k`` blocks for the votes to rank."""
    from app.engine.ellm_backend import EllmBackend

    return EllmBackend(tiny_model("llama", context_length=context_length), n_ctx=1024, kv="k8v4", documents=True,
                       attention=SparseConfig(mode="sparse-decode", sinks=64, window=64, top_k=top_k, observe=8))


@pytest.mark.parametrize("context_length", [2048, 640])     # inside the trained context, and beyond it
def test_the_answer_reads_every_block_laid_beside_the_question(tiny_model, context_length):
    """Copies of passages laid beside the question (Backend.beside) are read by every token of
    the answer, whatever the votes: the votes rank the document's blocks only; without copies the
    votes reach the window again."""
    from app.engine.backend import SamplingParams

    b = _backend_with_copies(tiny_model, context_length, top_k=1)
    block = b.kv_spec.block
    doc = np.random.default_rng(9).integers(3, 2000, 12 * block).tolist()
    question = [11, 12, 13, 14, 15]
    b.ensure_prefix(doc)
    copied = b.beside([(2 * block, 3 * block), (6 * block + 3, 7 * block)], room=2 * block)
    assert len(copied) == 2 * block
    answer = list(b.generate(doc + copied + question, SamplingParams.make_greedy(3)))
    assert b.state.read_from == 12
    assert all(v.shape[1] <= 12 for v in b.state.votes.values())    # the copies take no votes
    assert b.state.block_mass[12] > 0 and b.state.block_mass[13] > 0    # read whole, yet credited
    copied_mass = {start: share for start, _, share in b.attended_blocks(64)}  # ... to the blocks they copy
    assert copied_mass.get(2 * block, 0) > 0 and copied_mass.get(6 * block, 0) > 0
    assert {12 * block, 13 * block}.isdisjoint(copied_mass)
    n_blocks = -(-(len(doc) + len(copied) + len(question)) // block)
    assert b.stats.kv_read_bytes_per_token == (1 + 1 + n_blocks - 12) * block * b.kv_bytes_per_token()  # sink, K, the rest
    q = np.zeros((1, b.model.config.n_heads, b.model.config.head_dim), np.float32)
    for layer in range(b.model.config.n_layers):
        sel = select(b.cache, layer, q, b.cache.n_tokens - 1, b.state, *b.model.rope.rows(0, b.cache.n_tokens + 1),
                     b.model.neox)
        assert sel.ranked and all({12, 13} <= set(heads.tolist()) for heads in sel.blocks)
    turn = doc + copied + question + answer + [21, 22, 23]       # a conversation's next turn keeps the
    b.question_at(len(turn) - 3)                                   # copies but is not told to read them
    list(b.generate(turn, SamplingParams.make_greedy(2)))
    assert b.stats.reused_prompt_tokens >= len(doc) + len(copied) and b.state.read_from is None
    list(b.generate(doc + question, SamplingParams.make_greedy(3)))    # no copies: the window's blocks only
    assert b.state.read_from is None
    assert max(v.shape[1] for v in b.state.votes.values()) > 12 - 2


def test_copies_beside_the_question_are_read_whole_where_nothing_votes(tiny_model):
    """A document too short for votes (no more candidates than K): the answer ranks the blocks
    by their key bounds, and the copies beside the question are still read, not ranked."""
    from app.engine.backend import SamplingParams

    b = _backend_with_copies(tiny_model, 2048, top_k=2)
    block = b.kv_spec.block
    doc = np.random.default_rng(4).integers(3, 2000, 3 * block).tolist()
    b.ensure_prefix(doc)
    copied = b.beside([(block, 3 * block)], room=2 * block)
    list(b.generate(doc + copied + [11, 12, 13, 14, 15], SamplingParams.make_greedy(3)))
    assert not b.state.votes and b.state.read_from == 3
    q = np.random.default_rng(1).standard_normal((1, b.model.config.n_heads, b.model.config.head_dim)).astype(np.float32)
    sel = select(b.cache, 0, q, b.cache.n_tokens - 1, b.state, *b.model.rope.rows(0, b.cache.n_tokens + 1), b.model.neox)
    assert not sel.ranked and all({3, 4} <= set(heads.tolist()) for heads in sel.blocks)
