"""Sparse retrieval attention over the blocked KV cache (docs/ARCHITECTURE.md, "Sparse attention reads what the question needs").

A query attends exactly to the union of: the blocks holding the first S tokens (attention
sinks, Xiao et al. 2023 "StreamingLLM"), the blocks holding the last W tokens (local window),
and the top-K other blocks ranked per KV head by an upper bound of the query's score against
the block's per-channel key bounds (Quest, Tang et al. 2024, section 3.2:
sum_d max(q_d lo_d, q_d hi_d)); the heads sharing a KV head (GQA) take the largest bound.
S and W are rounded up to whole blocks. When every block fits the budget, all are attended:
the result is dense attention over the same cache.

Positions. Keys are stored rotated only by their offset inside their block (kv/blocked.py), so
a block is placed at any position P by rotating the query by (p_query - P). While the query
sits inside the model's trained context, every block keeps its true position. Beyond it, the
attended blocks are laid out one after another in their original order (sinks first, the
window and the query last) and numbered from 0: what the model sees is a short document
inside its trained window, in the spirit of InfLLM (Xiao et al. 2024), which also rotates
cached keys at attention time, here by whole blocks. The blocks a single query was told to
read (``state.focus``) go last among the retrieved ones there, nearest the query.

A view (``state.view``) narrows what a question and its answer read to the first blocks (the
prompt's header) and the blocks from a given one on: copies of the passages a relevance ranking
found, laid after the document (kv/blocked.py ``copy_blocks``), and the question. They are laid
out one after another from position 0, so the model reads a short prompt of those passages whose
keys and values are the ones the whole document's reading computed.

Decode (one query token) runs a fused numba kernel that reads each attended block once for
all query heads of its KV head, with an online softmax (FlashAttention-style running max);
prefill chunks gather and dequantize the attended blocks once per chunk and multiply with
BLAS, so a chunk attends causally to itself and sparsely to the rest: cost linear in length.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from ..kv.blocked import BlockKVCache
from ..ops.f16 import f16_to_f32
from ..ops.rope import rotate, rotate_vec
from .config import SparseConfig
from .state import AttentionState


@dataclass
class Selection:
    """Blocks attended by a chunk of queries, per KV head, and where they are placed."""

    blocks: np.ndarray   # (KVH, NS) int64 block ids, ascending
    place: np.ndarray    # (KVH, NS) int64 start position of each block as the query sees it (beyond
                         # the trained context not ascending where a focus goes last)
    qpos: np.ndarray     # (T,) int64 position of each query as it sees itself
    compressed: bool
    retrieved: tuple[int, int] = (0, 0)   # columns of ``blocks`` chosen by ranking (not sinks/window)
    ranked: bool = False                  # some blocks were left out
    read_whole: bool = False              # everything from state.read_from on is read (the copies)

    @property
    def credit(self) -> tuple[int, int]:
        """Columns whose attention mass an answer credits (state.block_mass): ``retrieved``, and
        with ``read_whole`` every column from it to the end."""
        return (self.retrieved[0], self.blocks.shape[1]) if self.read_whole else self.retrieved


# ---- Selection ------------------------------------------------------------------------------


def select(cache: BlockKVCache, layer: int, q: np.ndarray, pos0: int, state: AttentionState,
           cos: np.ndarray, sin: np.ndarray, neox: bool, scores: np.ndarray | None = None,
           first_local: int | None = None) -> Selection:
    """The blocks queries q (T, H, HD) float32 (before RoPE) at positions pos0.. attend.

    cos, sin  # (P, HD/2) float32 rope tables covering every position used
    scores    # (KVH, >= NC) float32: rank the candidates by these (one query's exact block
              # scores, attention/votes.py) instead of the key bounds; first_local: where the
              # always-attended local blocks start instead of the window's first block.
    A decoding query (T = 1) of a layer with votes (attention/votes.py) ranks by the votes, and
    every block after the voted ones (the question, the answer so far) is local, as is every
    block from ``state.read_from`` on. A single query also reads the candidates in
    ``state.focus``, each head its own top K besides them.
    """
    cfg = state.config
    n_tok = q.shape[0]
    B = cache.block
    n = pos0 + n_tok                      # tokens in the cache, these queries included
    n_blocks = -(-n // B)
    KVH = cache.config.n_kv_heads
    n_train = cache.config.context_length or n
    if state.view is not None and state.view[1] < n_blocks:
        return _view(view_head(state.view, cfg, B), state.view[1], n_blocks, KVH, B, pos0, n_tok)
    compressed = cfg.sparse and n > n_train
    dense = cfg.mode == "dense" or (not compressed and (layer < cfg.dense_layers
                                                        or (n_tok > 1 and cfg.dense_prompt)))
    read_whole = first_local is None and n_tok == 1 and state.read_from is not None
    if first_local is None:
        first_local = max(0, (pos0 - cfg.window) // B) if n_tok > 1 else max(0, (n - cfg.window) // B)
        if read_whole:    # blocks laid beside the question: read whole
            first_local = min(first_local, state.read_from)
    voted = state.votes.get(layer) if n_tok == 1 and scores is None and not dense else None
    if voted is not None and voted.shape[1] <= first_local:
        first_local, scores = voted.shape[1], voted
    else:
        voted = None
    n_sink = min(-(-cfg.sinks // B), first_local)
    n_cand = first_local - n_sink
    # Blocks the question is told to read (state.focus, best first) come on top of the K it
    # chooses; beyond the trained context only as many as keep every position inside it.
    focus = state.focus[(state.focus >= n_sink) & (state.focus < first_local)] - n_sink \
        if n_tok == 1 and not dense else _NO_FOCUS                  # (F,) candidate columns
    k = cfg.k_for(n_tok)
    if compressed:   # every position inside the trained context: K, then the focus, as far as they fit
        room = max(0, n_train // B - 1 - n_sink - (n_blocks - first_local))
        k = min(k, room)
        focus = focus[:room - k]
    budget = k + focus.shape[0]
    ranked = not dense and n_cand > budget
    n_chosen = budget if ranked else n_cand
    if n_tok == 1 and not dense:
        state.focus_read = focus.shape[0]                             # on top of K, for the byte count
    if not ranked:
        top = _NO_TOP
    elif voted is not None:   # the votes stay put while decoding: rank them once
        kept = state.vote_top.get(layer)
        if kept is None or kept[0] is not voted or kept[1].shape[1] != n_chosen:
            kept = state.vote_top[layer] = (voted, _top_k(voted[:, -n_cand:], n_chosen, focus))
        top = kept[1]
    else:
        if scores is None:
            candidates = np.arange(n_sink, first_local, dtype=np.int64)   # (NC,) blocks to rank
            qref, rel = _reference_queries(q, KVH, pos0, B, candidates, cfg, compressed, cos, sin, neox)
            scores = np.empty((KVH, n_cand), np.float32)                  # (KVH, NC) upper bounds
            kv = cache.layer(layer)
            _block_bounds(qref, kv.bkb, kv.okb, kv.nb_base, candidates, rel, cos, sin, neox, scores)
        top = _top_k(scores[:, :n_cand], n_chosen, focus)
    ns = n_sink + n_chosen + (n_blocks - first_local)
    blocks = np.empty((KVH, ns), np.int64)                            # (KVH, NS)
    place = np.empty((KVH, ns), np.int64)                             # (KVH, NS)
    qpos = np.empty(n_tok, np.int64)                                  # (T,)
    # Beyond the trained context the retrieved blocks are numbered anew anyway: the passages the
    # question was told to read (the focus) go last among them, nearest the question. The model
    # leans on what sits nearest (recency); in document order the last chapters' voted blocks sat
    # there instead and the answers took their lines (docs/benchmarks.md).
    late = np.zeros(n_cand if compressed and ranked and focus.shape[0] else 0, np.bool_)   # (NC,) or (0,)
    if late.shape[0]:
        late[focus] = True
    _assemble(top, n_sink, first_local, n_blocks, n_chosen, ranked, compressed, late, B, pos0, blocks, place, qpos)
    # The copies beside the question are passages of the document: their mass counts for the
    # answer's citations (the question's and the answer's own blocks are left out by the caller).
    return Selection(blocks, place, qpos, compressed, (n_sink, n_sink + n_chosen), ranked, read_whole)


def view_head(view: tuple[int, int], cfg: SparseConfig, B: int) -> int:
    """The blocks a view (state.view) reads before its copies: the header's, at least the
    sinks', never past the first copy."""
    head, first = view
    return min(max(head, -(-cfg.sinks // B)), first)


def _view(n_sink: int, first: int, n_blocks: int, n_kv_heads: int, B: int, pos0: int, n_tok: int) -> Selection:
    """The first ``n_sink`` blocks (view_head) and the blocks from ``first`` on (state.view), one
    after another from position 0: what the queries see is a short prompt of the passages and the
    question."""
    ns = n_sink + n_blocks - first
    blocks = np.empty((n_kv_heads, ns), np.int64)                     # (KVH, NS)
    place = np.empty((n_kv_heads, ns), np.int64)                      # (KVH, NS)
    qpos = np.empty(n_tok, np.int64)                                  # (T,)
    _assemble(np.zeros((n_kv_heads, 0), np.int64), n_sink, first, n_blocks, 0, True, True,
              np.zeros(0, np.bool_), B, pos0, blocks, place, qpos)
    return Selection(blocks, place, qpos, True, (n_sink, n_sink), True)


_NO_TOP = np.zeros((1, 1), np.int64)
_NO_FOCUS = np.zeros(0, np.int64)


def _top_k(scores: np.ndarray, k: int, focus: np.ndarray = _NO_FOCUS) -> np.ndarray:
    """Columns of the k highest scores per row, ascending: scores (KVH, NC) -> (KVH, k) int64;
    the columns ``focus`` (F,) first whatever their scores. A partial sort: at 200K tokens
    (3,125 candidates) a full sort per layer and head was half of a decode step."""
    if focus.shape[0]:
        scores = scores.copy()
        scores[:, focus] = np.inf                                    # ranked first by every head
    top = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    top.sort(axis=1)
    return top.astype(np.int64)


@njit(cache=True, nogil=True)
def _assemble(top, n_sink, first_local, n_blocks, n_chosen, ranked, compressed, late, B, pos0, blocks, place, qpos):
    """Fill blocks/place (KVH, NS) and qpos (T,): sinks, the chosen candidates top (KVH, K)
    (ascending, counted from the first candidate) or all of them, then the local blocks;
    placed at true positions, or one after another from 0 when ``compressed``, the chosen
    candidates marked in ``late`` (NC,) bool (empty: none) after the other chosen ones."""
    n_kv_heads, ns = blocks.shape
    for h in range(n_kv_heads):
        col = 0
        for b in range(n_sink):
            blocks[h, col] = b
            col += 1
        if ranked:
            for i in range(n_chosen):
                blocks[h, col] = n_sink + top[h, i]
                col += 1
        else:
            for b in range(n_sink, first_local):
                blocks[h, col] = b
                col += 1
        for b in range(first_local, n_blocks):
            blocks[h, col] = b
            col += 1
        if not compressed:
            for i in range(ns):
                place[h, i] = blocks[h, i] * B
            continue
        slot = 0
        for i in range(n_sink + n_chosen):            # the sinks and the chosen not late, in order
            if i < n_sink or late.shape[0] == 0 or not late[blocks[h, i] - n_sink]:
                place[h, i] = slot * B
                slot += 1
        if late.shape[0]:
            for i in range(n_sink, n_sink + n_chosen):  # then the late ones, in order
                if late[blocks[h, i] - n_sink]:
                    place[h, i] = slot * B
                    slot += 1
        for i in range(n_sink + n_chosen, ns):        # the local blocks, the queries' own last
            place[h, i] = slot * B
            slot += 1
    for t in range(qpos.shape[0]):
        p = pos0 + t
        if compressed:   # the queries sit in the local blocks, the same for every head
            qpos[t] = (ns - (n_blocks - p // B)) * B + p % B
        else:
            qpos[t] = p


def nominal_distance(cfg: SparseConfig, block: int, n_tok: int) -> int:
    """Beyond the trained context a candidate block's true distance means nothing to the
    model: it is ranked, for a chunk of ``n_tok`` queries, as if it sat in the middle of the
    span they retrieve."""
    return cfg.window + cfg.k_for(n_tok) * block // 2


def _reference_queries(q, kvh, pos0, B, candidates, cfg, compressed, cos, sin, neox):
    """The query each KV head ranks blocks with, and its rotation per candidate.

    Prefill chunks rank with the mean of their queries, each first rotated to the chunk's
    first position (so the mean is taken in one frame). Returns qref (KVH, G, HD) float32
    and rel (NC,) int64: the position offset each candidate is scored at (its true distance,
    or beyond the trained context a nominal one: the middle of the retrieved span).
    """
    n_tok, n_heads, head_dim = q.shape
    if n_tok == 1:
        qm = q[0]
    else:
        offs = np.arange(n_tok, dtype=np.int64)
        qm = rotate(q, cos[offs], sin[offs], neox).mean(axis=0)
    qref = np.ascontiguousarray(qm.reshape(kvh, n_heads // kvh, head_dim), dtype=np.float32)
    if compressed:
        rel = np.full(candidates.shape[0], nominal_distance(cfg, B, n_tok), np.int64)
    else:
        rel = pos0 - candidates * B
    return qref, rel


@njit(cache=True, nogil=True, fastmath=True)
def _block_bounds(qref, bkb, okb, nb_base, candidates, rel, cos, sin, neox, out):
    """out[h, i] = max over the group's heads g of sum_d max(q'_d lo_d, q'_d hi_d), with
    q' = qref[h, g] rotated by rel[i] and (lo, hi) the key bounds of block candidates[i].

    qref  # (KVH, G, HD) float32;  bkb, okb  # (KVH, NB, 2, HD) uint16;  out  # (KVH, NC) float32
    rel   # (NC,) int64 offsets (the rotated queries are reused while the offset repeats)
    """
    n_kv_heads, group, head_dim = qref.shape
    qr = np.empty((group, head_dim), np.float32)   # (G, HD) rotated queries
    lo = np.empty(head_dim, np.float32)
    hi = np.empty(head_dim, np.float32)
    for h in range(n_kv_heads):
        last = -1
        for i in range(candidates.shape[0]):
            b = candidates[i]
            r = rel[i]
            if r != last:
                for g in range(group):
                    rotate_vec(qref[h, g], cos[r], sin[r], neox, qr[g])
                last = r
            if b < nb_base:
                for d in range(head_dim):
                    lo[d] = f16_to_f32(bkb[h, b, 0, d])
                    hi[d] = f16_to_f32(bkb[h, b, 1, d])
            else:
                for d in range(head_dim):
                    lo[d] = f16_to_f32(okb[h, b, 0, d])
                    hi[d] = f16_to_f32(okb[h, b, 1, d])
            best = np.float32(-np.inf)
            for g in range(group):
                ub = np.float32(0.0)
                for d in range(head_dim):
                    ub += max(qr[g, d] * lo[d], qr[g, d] * hi[d])
                best = max(best, ub)
            out[h, i] = best


# ---- Rotation helpers -------------------------------------------------------------------------


