"""Question-aware block choice: the end of the prompt chooses what decoding reads.

Ranking blocks by their exact attention mass (the log-sum-exp of their tokens' scores) finds
pass keys about as often as dense attention does; ranking them by an upper bound of the
query's score (Quest), by the best single token's exact score or by the block's mean key
misses most of them (docs/benchmarks.md). What makes the needle's block matter is many moderately
attended tokens, not one peak, and a per-block summary (bounds, mean, diagonal Gaussian,
means of 8- or 16-token pieces) does not predict that mass.

So the mass is computed exactly, but only for the last ``observe`` tokens of the prompt (the
question and the template around it), as SnapKV does (Li et al. 2024, "SnapKV: LLM Knows
What You are Looking for Before Generation", section 4: an observation window at the end of
the prompt votes for the positions each head keeps). Each observed query scores every
candidate block's keys (sgemm over keys decoded to float32, piece by piece), attends
to its own top-K blocks by mass, and votes: per KV head, the softmax over candidate blocks
of the block masses, summed over the observed queries and the group's heads. Decoding then
reads the sinks, the top-K blocks by votes and every block after the voted ones (the
question and the answer so far), with no per-step ranking at all.

Cost: the observed queries' scores against the whole context, about observe x n x H x HD
multiply-adds per layer, once per question, plus an exp per score. Where the question attends
densely at true positions anyway ("sparse-decode" inside the trained context,
``votes_from_own_scores``), its own attention's scores give the masses (products.by_keys, called
from attention/blocks.py) and this pass is not made: it was a quarter of a follow-up's wait. One numba kernel does it,
each thread a run of blocks in pieces (decode keys, one-thread sgemm, log-sum-exp with ggml's
vectorising exp), rather than one BLAS product over all keys per head and libm's exp: the
pieces' scores stay in cache between the product and the exp, and ggml's exp vectorises where
libm's does not.
Positions: inside the trained context blocks are scored at their true distance; beyond it
every block is scored at the one nominal distance select() ranks with (attention/select.py).
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange

from ..kv.blocked import BlockKVCache, decode_keys
from ..ops.expf import ggml_expf
from ..ops.rope import rotate, rotate_vec
from ..quant import blas  # noqa: F401  (scipy's cython BLAS, which numba's np.dot needs)
from ..cpu.threads import chunk_groups, num_threads
from .config import SparseConfig
from .state import AttentionState
from .select import nominal_distance, select

_NEG_INF = np.float32(-np.inf)


def observing(state: AttentionState, pos0: int, n_tok: int) -> int | None:
    """Index of the first query of the chunk [pos0, pos0 + n_tok) that votes, or None."""
    obs, cfg = state.observe, state.config
    if obs is None or not cfg.sparse or cfg.observe == 0:
        return None
    start, end = obs
    if pos0 + n_tok <= start or pos0 >= end:
        return None
    return max(start, pos0) - pos0


def candidate_end(cache: BlockKVCache, cfg: SparseConfig, n: int, pos0: int) -> int:
    """Blocks [0, end) a query chunk starting at pos0 (n tokens stored) may retrieve: before
    the last query's window and wholly before the first query (causal)."""
    return max(0, min((n - cfg.window) // cache.block, pos0 // cache.block))


def vote_blocks(cache: BlockKVCache, cfg: SparseConfig, layer: int, pos0: int, n: int,
                read_from: int | None = None) -> tuple[int, int] | None:
    """The candidate blocks [n_sink, end) the observed queries from pos0 on vote for (the cache
    holding ``n`` tokens), or None when there is nothing to rank: a dense layer inside the
    trained context, or no more candidates than an answer token reads anyway. Blocks from
    ``read_from`` on (AttentionState.read_from) are read whatever the votes say: never candidates."""
    n_train = cache.config.context_length or n
    if layer < cfg.dense_layers and n <= n_train:
        return None
    end = candidate_end(cache, cfg, n, pos0)
    if read_from is not None:
        end = min(end, read_from)
    n_sink = min(-(-cfg.sinks // cache.block), end)
    if end - n_sink <= cfg.k_for(1):    # each observed query chooses as an answer token does
        return None
    return n_sink, end


def votes_from_own_scores(cfg: SparseConfig, cache: BlockKVCache, n: int) -> bool:
    """Whether the observed queries of a context of ``n`` tokens attend densely at their true
    positions ("sparse-decode" inside the trained context), so that the scores of their own
    attention are the ones they vote with (attention/blocks.py takes the masses from them)."""
    return cfg.dense_prompt and n <= (cache.config.context_length or n)


def observed_attention(q: np.ndarray, cache: BlockKVCache, layer: int, pos0: int, state: AttentionState,
                       cos: np.ndarray, sin: np.ndarray, neox: bool, attend_one) -> np.ndarray | None:
    """Attention of the observed queries q (T, H, HD) float32 at pos0.. (before RoPE), each
    over its own top-K blocks by exact mass; adds their votes to ``state.votes[layer]``.
    Returns (T, H, HD) float32, or None when there is nothing to rank (everything fits) or the
    queries attend densely ("sparse-decode" inside the trained context: they only vote).

    attend_one(q_t (1, H, HD), n_limit, selection) -> (1, H, HD): the decode kernel.
    """
    cfg = state.config
    n_tok, n_heads, head_dim = q.shape
    B = cache.block
    n = pos0 + n_tok
    kvh = cache.config.n_kv_heads
    group = n_heads // kvh
    compressed = n > (cache.config.context_length or n)
    span = vote_blocks(cache, cfg, layer, pos0, n, state.read_from)
    if span is None:
        return None
    n_sink, end = span
    n_cand = end - n_sink
    cand = np.arange(n_sink, end, dtype=np.int64)                            # (NC,)
    if compressed:   # every block at one nominal distance: the query turns, the keys stay
        place = np.zeros(n_cand, np.int64)
        nominal = nominal_distance(cfg, B, 1)
        qrot = rotate(q, np.repeat(cos[nominal:nominal + 1], n_tok, 0),
                      np.repeat(sin[nominal:nominal + 1], n_tok, 0), neox)   # (T, H, HD)
    else:            # true positions: keys turned to their own, queries to theirs
        place = cand * B
        qpos = pos0 + np.arange(n_tok)
        qrot = rotate(q, cos[qpos], sin[qpos], neox)                         # (T, H, HD)
    scale = np.float32(1.0 / np.sqrt(np.float32(head_dim)))
    kv = cache.layer(layer)
    mass = np.empty((kvh, n_tok * group, n_cand), np.float32)               # (KVH, T*G, NC) log-mass
    n_parts = min(num_threads(), n_cand)
    for h in range(kvh):      # the caller holds BLAS to one thread (attention/blocks.py)
        qh = np.ascontiguousarray(qrot[:, h * group:(h + 1) * group]).reshape(n_tok * group, head_dim)
        _log_mass(kv, h, cand, place, cos, sin, neox, qh, scale, PIECE, n_parts, mass[h])
    add_votes(state, layer, mass, n_sink, end)
    if votes_from_own_scores(cfg, cache, n):
        return None      # "sparse-decode": the question itself attends densely; it only votes
    out = np.empty(q.shape, np.float32)                                      # (T, H, HD)
    per_query = mass.reshape(kvh, n_tok, group, n_cand).max(axis=2)          # (KVH, T, NC)
    for t in range(n_tok):
        p = pos0 + t
        first_local = min(end, max(0, (p + 1 - cfg.window) // B))
        sel = select(cache, layer, q[t:t + 1], p, state, cos, sin, neox,
                     scores=per_query[:, t], first_local=first_local)
        out[t] = attend_one(q[t:t + 1], p + 1, sel)[0]
    return out


def add_votes(state: AttentionState, layer: int, mass: np.ndarray, n_sink: int, end: int) -> None:
    """votes[layer][h, b] += sum over the observed query heads of h of the share of block b in
    their softmax over the candidate blocks. mass  # (KVH, T*G, NC) float32 log-masses."""
    share = np.exp(mass - mass.max(axis=2, keepdims=True))
    share /= share.sum(axis=2, keepdims=True)
    prev = state.votes.get(layer)
    votes = np.zeros((mass.shape[0], max(end, 0 if prev is None else prev.shape[1])), np.float32)
    if prev is not None:
        votes[:, :prev.shape[1]] = prev
    votes[:, n_sink:end] += share.sum(axis=1)
    state.votes[layer] = votes


PIECE = 64  # blocks per piece: 4,096 keys x 64 dims decoded (1 MB), then one sgemm with the queries


@njit(cache=True, nogil=True, parallel=True, fastmath=True)
def _log_mass(kv, h, blocks, place, cos, sin, neox, qh, scale, piece, n_parts, out):
    """out[r, i] = log sum_j exp(scale qh[r] . k_j) over the keys j of block blocks[i] of KV
    head h of the layer ``kv`` (LayerKV), each block turned to its placed position: each block's log attention mass
    (unnormalised). Each thread takes a run of the blocks, piece by piece: decode the keys,
    one sgemm with the queries, the per-block log-sum-exp; nothing the size of the whole
    context is ever written.

    blocks, place  # (NB,) int64;  qh  # (R, HD) float32;  out  # (R, NB) float32
    """
    bkc, bkb, okc, okb, nb_base, k_bits = kv.bkc, kv.bkb, kv.okc, kv.okb, kv.nb_base, kv.k_bits
    block = okc.shape[2]
    head_dim = qh.shape[1]
    n_blocks = blocks.shape[0]
    for c in prange(n_parts):
        i0, i1 = chunk_groups(c, n_parts, n_blocks)
        keys = np.empty((piece * block, head_dim), np.float32)           # (piece*B, HD)
        raw = np.empty((block, head_dim), np.float32)                    # (B, HD)
        for p0 in range(i0, i1, piece):
            p1 = min(p0 + piece, i1)
            for i in range(p0, p1):
                b = blocks[i]
                if b < nb_base:
                    decode_keys(bkc[h, b], bkb[h, b], k_bits, block, raw)
                else:
                    decode_keys(okc[h, b], okb[h, b], k_bits, block, raw)
                for j in range(block):
                    rotate_vec(raw[j], cos[place[i]], sin[place[i]], neox, keys[(i - p0) * block + j])
            s = np.dot(qh, keys[:(p1 - p0) * block].T)                   # (R, (p1-p0)*B)
            for r in range(s.shape[0]):
                for i in range(p1 - p0):
                    m = _NEG_INF
                    for j in range(i * block, (i + 1) * block):
                        m = max(m, s[r, j] * scale)
                    t = np.float32(0.0)
                    for j in range(i * block, (i + 1) * block):
                        t += ggml_expf(s[r, j] * scale - m)
                    out[r, p0 + i] = m + np.log(t)
