"""Attention over selected blocks of the blocked KV cache (app/engine/attention/select.py chooses them).

decode  (one query token): ``_decode_kernel`` decodes each selected block to float32 once
        (keys lo_d + c step_d per channel, values scale_j (c - offset)) into L1, where all the
        query heads of its KV head read it (attention/block_products.py). Online softmax with
        a running max per head (FlashAttention, Dao et al. 2022), the block list split across
        threads and the partial results merged by their log-sum-exp.
prefill (a chunk of T tokens): the selected blocks are decoded and rotated to their placed
        positions once per chunk and KV head, then scores and outputs are BLAS matrix
        products (attention/products.py); the causal mask uses true positions.
"""
from __future__ import annotations

import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from ..kv.blocked import BlockKVCache, decode_keys
from ..ops.f16 import f16_to_f32
from ..ops.rope import rotate, rotate_vec
from ..quant import blas
from ..cpu.threads import num_threads
from ..ops.amx import HAS_AMX_BF16
from . import products, products_amx
from .block_products import add_values, exp_block, scores
from .products_amx import pack_key, pack_value, zero_padding
from .products import merge_runs
from .state import AttentionState
from .select import Selection, nominal_distance, select
from .votes import add_votes, observed_attention, observing, vote_blocks, votes_from_own_scores

_NEG_INF = np.float32(-np.inf)


def attend_blocks(q: np.ndarray, cache: BlockKVCache, layer: int, pos0: int, state: AttentionState,
                  rope, neox: bool) -> np.ndarray:
    """Attention of queries q (T, H, HD) float32 (before RoPE) at positions pos0.. over the
    cache of ``layer``, which already holds their keys and values. Returns (T, H, HD) float32.

    rope: the model's RopeTables (cos/sin by position). The last prompt tokens (the question,
    ``state.observe``) choose their blocks by exact attention mass and vote for the blocks
    decoding reads (attention/votes.py).
    """
    state.follow(cache)
    cfg = state.config
    n_tok, _, head_dim = q.shape
    n = pos0 + n_tok
    first = observing(state, pos0, n_tok)
    if (first is not None and VOTES_FROM_PREFILL and votes_from_own_scores(cfg, cache, n)
            and _prefill_gives_masses(q, cache, n)):
        # The question reads every block at its true position anyway: the block masses it votes
        # with come from the scores of its own attention, not from a second pass over the keys.
        span = vote_blocks(cache, cfg, layer, pos0 + first, n, state.read_from)
        if span is None:
            return _attend(q, cache, layer, pos0, state, rope, neox, n)
        n_sink, end = span
        group = q.shape[1] // cache.config.n_kv_heads
        mass = np.empty((cache.config.n_kv_heads, (n_tok - first) * group, end), np.float32)   # (KVH, R, NB)
        out = _attend(q, cache, layer, pos0, state, rope, neox, n, masses=(first * group, mass))
        add_votes(state, layer, mass[:, :, n_sink:], n_sink, end)
        return out
    if first is not None:
        cos, sin = rope.rows(0, max(n, nominal_distance(cfg, cache.block, 1)) + cache.block + 1)
        a = cache.layer(layer)
        scale = np.float32(1.0 / np.sqrt(np.float32(head_dim)))

        def attend_one(q_t, n_limit, sel):
            return _decode(q_t, a, cache, state, n, n_limit, sel, cos, sin, neox, scale)

        with blas.one_blas_thread():
            tail = observed_attention(q[first:], cache, layer, pos0 + first, state, cos, sin, neox, attend_one)
        if tail is not None:
            if first == 0:
                return tail
            out = np.empty(q.shape, np.float32)                     # (T, H, HD)
            out[first:] = tail
            out[:first] = _attend(q[:first], cache, layer, pos0, state, rope, neox, n)
            return out
    return _attend(q, cache, layer, pos0, state, rope, neox, n)


def _attend(q, cache: BlockKVCache, layer: int, pos0: int, state: AttentionState, rope, neox: bool,
            n: int, masses=None) -> np.ndarray:
    """attend_blocks for queries at pos0.. when the cache holds ``n`` tokens (>= pos0 + T:
    the later ones are masked). masses: (row0, mass), the block masses of the query rows from
    row0 on to be written by a dense prefill (_prefill)."""
    n_tok, _, head_dim = q.shape
    cos, sin = rope.rows(0, n + 1)
    sel = _selection(cache, layer, q, pos0, state, cos, sin, neox)
    need = int(max(sel.place.max(initial=0), sel.qpos.max(initial=0))) + cache.block + 1
    if need > cos.shape[0]:
        cos, sin = rope.rows(0, need)
    scale = np.float32(1.0 / np.sqrt(np.float32(head_dim)))
    a = cache.layer(layer)
    if masses is not None and (n_tok == 1 or sel.ranked or sel.compressed):
        raise ValueError("block masses come from a dense prefill at true positions")
    if n_tok == 1:
        return _decode(q, a, cache, state, n, pos0 + 1, sel, cos, sin, neox, scale)
    if sel.ranked and n_tok <= PER_QUERY_MAX:
        # A short chunk (a question after a cached document) chooses blocks query by query,
        # as decoding does: a chunk-wide mean query would let the question's tokens share
        # one choice with everything else in the chunk.
        out = np.empty(q.shape, np.float32)                        # (T, H, HD)
        for t in range(n_tok):
            sel_t = select(cache, layer, q[t:t + 1], pos0 + t, state, cos, sin, neox)
            out[t] = _decode(q[t:t + 1], a, cache, state, n, pos0 + t + 1, sel_t, cos, sin, neox, scale)[0]
        return out
    return _prefill(q, a, cache, pos0, n, sel, cos, sin, neox, scale, masses)


PER_QUERY_MAX = 48   # chunks up to this many tokens select per query
F16_AS_STORED = True   # decode reads f16 blocks as stored (tests switch it off to compare bits)
AMX_ATTENTION = HAS_AMX_BF16   # prefill products on AMX tiles (tests switch it off to compare)
AMX_MIN_ROWS = 256             # query rows (tokens x query heads per KV head) from which prefill takes the tiles
VOTES_FROM_PREFILL = True     # a dense question votes with its own scores (tests switch it off to compare)


def _selection(cache, layer, q, pos0, state: AttentionState, cos, sin, neox) -> Selection:
    """select(), or during decode the previous step's blocks for up to ``reselect`` steps
    while the new token stays in the same (last) block."""
    cfg = state.config
    if q.shape[0] > 1 or cfg.reselect == 1 or cfg.mode == "dense":
        state.selection.pop(layer, None)
        return select(cache, layer, q, pos0, state, cos, sin, neox)
    prev = state.selection.get(layer)
    if prev is not None and pos0 - prev[0] < cfg.reselect and pos0 // cache.block == int(prev[1].blocks[0, -1]):
        old = prev[1]
        ns = old.blocks.shape[1]
        qpos = (ns - 1) * cache.block + pos0 % cache.block if old.compressed else pos0
        return Selection(old.blocks, old.place, np.array([qpos], np.int64), old.compressed, old.retrieved,
                         old.ranked, old.read_whole)
    sel = select(cache, layer, q, pos0, state, cos, sin, neox)
    state.selection[layer] = (pos0, sel)
    return sel


# ---- Decode ---------------------------------------------------------------------------------


def _decode(q, a, cache: BlockKVCache, state: AttentionState, n, n_limit, sel: Selection, cos, sin, neox, scale):
    """One query over its selected blocks: ``n`` tokens are stored, the query sees the first
    ``n_limit`` of them (causal)."""
    n_heads, head_dim = q.shape[1], q.shape[2]
    kvh, ns = sel.blocks.shape
    n_split = max(1, min(4, ns // 4)) if kvh < 4 else 1
    out = np.empty((1, n_heads, head_dim), np.float32)        # (1, H, HD)
    bmax = np.empty((n_heads, ns), np.float32)                 # (H, NS) block score max
    bsum = np.empty((n_heads, ns), np.float32)                 # (H, NS) block exp-sum
    _decode_kernel(q[0], a, n, n_limit, F16_AS_STORED, sel.blocks, sel.place, int(sel.qpos[0]), cos, sin, neox,
                   scale, n_split, out[0], bmax, bsum, state.block_mass, sel.credit[0], sel.credit[1])
    return out


@njit(cache=True, nogil=True, parallel=True)   # not fastmath: see _gather_packed
def _decode_kernel(q, kv, n, n_limit, as_stored, blocks, place, qpos, cos, sin, neox, scale, n_split, out, bmax,
                   bsum, mass, credit0, credit1):
    """One query token over the selected blocks. Each block is decoded to float32 once and
    read from L1 by all the query heads of its KV head (the group shares the decoding).

    q       # (H, HD) float32 before RoPE, at placed position qpos
    kv      # the layer's blocks (kv/blocked.py LayerKV)
    as_stored       # f16 blocks read as stored (where HD % 32 == 0), not decoded first: same bits
    blocks, place   # (KVH, NS) int64 block ids and their placed start positions
    out     # (H, HD) float32;  bmax, bsum  # (H, NS) float32 per-block softmax pieces
    mass    # (NB,) float64 += each retrieved block's share of the attention (summed over
            # heads), for columns credit0 <= i < credit1 (sinks and window always get mass)
    """
    bkc, bvc, okc, ovc, tail_k, tail_v = kv.bkc, kv.bvc, kv.okc, kv.ovc, kv.tail_k, kv.tail_v
    nb_base, k_bits, v_bits = kv.nb_base, kv.k_bits, kv.v_bits
    n_kv_heads, block, head_dim = tail_k.shape
    n_heads = q.shape[0]
    group = n_heads // n_kv_heads
    ns = blocks.shape[1]
    n_full = n // block
    n_items = n_kv_heads * n_split
    f16 = k_bits == 16 and v_bits == 16
    # the products' 16-lane paths read f16 bits (block_products.py); as_stored: F16_AS_STORED
    direct = as_stored and head_dim % 32 == 0
    part_m = np.empty((n_items, group), np.float32)
    part_l = np.empty((n_items, group), np.float32)
    part_acc = np.empty((n_items, group, head_dim), np.float32)
    for item in prange(n_items):
        h = item // n_split
        split = item - h * n_split
        i0 = split * ns // n_split
        i1 = (split + 1) * ns // n_split
        qr = np.empty((group, head_dim), np.float32)   # (G, HD) the group's queries, rotated
        kx = np.empty((block, head_dim), np.float32)   # (B, HD) the block's keys, decoded
        vx = np.empty((block, head_dim), np.float32)   # (B, HD) its values, decoded
        s = np.empty((group, block), np.float32)       # (G, B) scores, then weights
        m = part_m[item]
        l = part_l[item]
        acc = part_acc[item]
        for g in range(group):
            m[g] = _NEG_INF
            l[g] = 0.0
            for d in range(head_dim):
                acc[g, d] = 0.0
        for i in range(i0, i1):
            b = blocks[h, i]
            n_valid = min(block, n_limit - b * block)
            if n_valid <= 0:
                continue
            rel = qpos - place[h, i]
            for g in range(group):
                rotate_vec(q[h * group + g], cos[rel], sin[rel], neox, qr[g])
            # f16 keys and values are read as stored, each row converted in registers (exact, so
            # the same bits as converting the block first): a block's f32 copies (2 x 32 KB at HD
            # 128) would overflow L1 next to the query heads' rows. Other formats are decoded.
            if direct and b >= n_full:   # the f16 tail (of every format): no bounds or scales
                _attend_block(tail_k[h], tail_v[h], qr, n_valid, scale, s, h, i, bmax, bsum, m, l, acc)
            elif direct and f16 and b < nb_base:
                _attend_block(f16_rows(bkc[h, b]), f16_rows(bvc[h, b]), qr, n_valid, scale, s, h, i,
                              bmax, bsum, m, l, acc)
            elif direct and f16:
                _attend_block(f16_rows(okc[h, b]), f16_rows(ovc[h, b]), qr, n_valid, scale, s, h, i,
                              bmax, bsum, m, l, acc)
            else:
                _decode_chosen(kv, n_full, h, b, n_valid, kx, vx)
                _attend_block(kx, vx, qr, n_valid, scale, s, h, i, bmax, bsum, m, l, acc)
    # Merge the splits of each head by their log-sum-exp; credit each block its mass.
    for h in range(n_kv_heads):
        for g in range(group):
            hq = h * group + g
            r0, r1 = h * n_split, (h + 1) * n_split
            mm, inv = merge_runs(part_m[r0:r1], part_l[r0:r1], part_acc[r0:r1], g, out[hq])
            for i in range(credit0, credit1):
                b = blocks[h, i]
                if n_limit - b * block > 0:
                    mass[b] += np.exp(bmax[hq, i] - mm) * bsum[hq, i] * inv


@njit(inline="always")
def _attend_block(k, v, qr, n_valid, scale, s, h, i, bmax, bsum, m, l, acc):
    """The group's queries qr (G, HD) over one block (column i of KV head h): scores, the online
    softmax's running max m (G,), sum l (G,) and output acc (G, HD) updated, the block's own max
    and exp-sum kept in bmax, bsum (H, NS). k, v (>= n_valid, HD): float32, or uint16 f16 bits
    where HD % 32 == 0 (the products' 16-lane paths convert them; their plain loops would not)."""
    group, head_dim = qr.shape
    scores(k, qr, n_valid, scale, s)
    for g in range(group):
        hq = h * group + g
        bm, bs = exp_block(s, g, n_valid)
        bmax[hq, i] = bm
        bsum[hq, i] = bs
        if bm > m[g]:
            f = np.exp(m[g] - bm)
            l[g] *= f
            for d in range(head_dim):
                acc[g, d] *= f
            m[g] = bm
        w = np.exp(bm - m[g])
        l[g] += bs * w
        for j in range(n_valid):
            s[g, j] *= w
    add_values(v, s, n_valid, acc)


def f16_rows(codes):
    """A block's stored codes as a C-contiguous uint16 (B, HD) array of f16 bits, for the f16
    formats; numba compiles the decode kernel for every format's code dtype, so for uint8
    codes (never f16: their k_bits/v_bits say so) it types as an empty array."""
    raise NotImplementedError("f16_rows is compiled code only")


@overload(f16_rows, inline="always")
def _f16_rows(codes):
    if isinstance(codes, types.Array) and codes.dtype == types.uint16:
        if codes.layout == "C":
            return lambda codes: codes
        return lambda codes: np.ascontiguousarray(codes)
    return lambda codes: np.empty((0, 0), np.uint16)


# ---- Prefill ---------------------------------------------------------------------------------


def _on_tiles(n_rows: int, head_dim: int) -> bool:
    """Whether a prefill's products of ``n_rows`` query rows per KV head take AMX's bfloat16
    tiles (products_amx): a chunk of a document being read does; a question's few rows take
    sgemms, where scattering the keys into the tiles' layout costs about what the tiles save
    (AMX_MIN_ROWS)."""
    return AMX_ATTENTION and n_rows >= AMX_MIN_ROWS and head_dim % 32 == 0


def _prefill_gives_masses(q, cache: BlockKVCache, n: int) -> bool:
    """Whether a dense prefill of the queries q (T, H, HD) over ``n`` tokens can give block masses
    (its products split by keys, on sgemms)."""
    n_tok, n_heads, head_dim = q.shape
    group = n_heads // cache.config.n_kv_heads
    return n_tok > 1 and products.splits_keys(n, n_tok) and not _on_tiles(n_tok * group, head_dim)


def _prefill(q, a, cache: BlockKVCache, pos0, n, sel: Selection, cos, sin, neox, scale, masses=None):
    """Queries at pos0.. over their selected blocks; the cache holds ``n`` tokens. Per KV
    head, the blocks are decoded once, then scores, masked softmax and values are one-thread
    sgemms in numba's threads (attention/products.py). masses: (row0, mass (KVH, T*G - row0,
    NB)) to be filled with the block masses of the query rows from row0 on (products.by_keys),
    for a selection of every block in order, so that key rows are positions."""
    n_tok, n_heads, head_dim = q.shape
    kvh, ns = sel.blocks.shape
    group = n_heads // kvh
    B = cache.block
    out = np.empty((n_tok, n_heads, head_dim), np.float32)                # (T, H, HD)
    qrot = rotate(q, cos[sel.qpos], sin[sel.qpos], neox)                    # (T, H, HD)
    true_pos = pos0 + np.arange(n_tok, dtype=np.int64)                      # (T,)
    t_buf = np.empty(ns * B, np.int64)                                      # (N,) true positions
    out_h = np.empty((n_tok * group, head_dim), np.float32)                 # (T*G, HD)
    n_parts = num_threads()
    on_tiles = _on_tiles(n_tok * group, head_dim)
    if on_tiles and masses is not None:
        raise ValueError("block masses come from the sgemms' scores, not AMX tiles")
    if on_tiles:   # packed keys and values: four (padded(N, 32) * HD,) uint16, reused for each head
        packed = tuple(np.empty(products_amx.packed_size(ns * B, head_dim), np.uint16) for _ in range(4))
    else:
        k_buf = np.empty((ns * B, head_dim), np.float32)                    # (N, HD)
        v_buf = np.empty((ns * B, head_dim), np.float32)                    # (N, HD)
    for h in range(kvh):
        qh = np.ascontiguousarray(qrot[:, h * group:(h + 1) * group]).reshape(n_tok * group, head_dim)
        if on_tiles:
            count = _gather_packed(a, n, h, sel.blocks[h], sel.place[h], cos, sin, neox, *packed, t_buf)
            q_hi, q_lo = products_amx.pack_queries(qh, n_parts)
            products_amx.attend(q_hi, q_lo, *packed, count, t_buf[:count], true_pos, n_tok * group, group,
                                scale, n_parts, out_h)
        else:
            count = _gather(a, n, h, sel.blocks[h], sel.place[h], cos, sin, neox, k_buf, v_buf, t_buf)
            with blas.one_blas_thread():
                products.attend(qh, k_buf[:count], v_buf[:count], t_buf[:count], true_pos, group, scale,
                                n_parts, out_h, None if masses is None else (masses[0], B, masses[1][h]))
        out[:, h * group:(h + 1) * group] = out_h.reshape(n_tok, group, head_dim)
    return out


@njit(cache=True, nogil=True, parallel=True)   # not fastmath: see _gather_packed
def _gather(kv, n, h, blocks, place, cos, sin, neox, k_out, v_out, t_out):
    """Decode the selected blocks of KV head h of the layer ``kv`` (LayerKV): keys rotated to their
    placed positions (R(place) applied to the block-frame key gives R(place + j) k), values as they are.
    Block i fills rows i*B.. (only the last block can be partial).

    blocks, place  # (NS,) int64;  k_out, v_out  # (>= NS*B, HD) float32;  t_out  # (>= NS*B,) int64
    Returns the number of rows written.
    """
    _, block, head_dim = kv.tail_k.shape
    n_full = n // block
    ns = blocks.shape[0]
    for i in prange(ns):
        b = blocks[i]
        n_valid = min(block, n - b * block)
        r0 = i * block
        kraw = np.empty((block, head_dim), np.float32)
        _decode_chosen(kv, n_full, h, b, n_valid, kraw, v_out[r0:r0 + block])
        for j in range(n_valid):
            rotate_vec(kraw[j], cos[place[i]], sin[place[i]], neox, k_out[r0 + j])
            t_out[r0 + j] = b * block + j
    return _rows(blocks, block, n)


@njit(cache=True, nogil=True, parallel=True)
def _gather_packed(kv, n, h, blocks, place, cos, sin, neox, k_hi, k_lo, v_hi, v_lo, t_out):
    """_gather's keys and values written straight into products_amx's packed bfloat16 pairs
    (no float32 copy of the head's cache between); the padding after the last key zeroed.
    Neither gather, nor the decode kernel, is fastmath: a parallel kernel loaded from numba's
    cache is optimized again when it is linked, so under fastmath the rotation's products fused
    into FMAs differently in a process that compiled it than in one that loaded it, and the same
    prompt read (and answered) to other bits after a restart (docs/engine.md, "Kernels loaded
    from the cache"). Nothing measurable is lost: the gathers have no reductions, and the
    decode kernel's products and exponentials are block_products' explicit lanes (head sizes
    that are multiples of 32, every model measured here).

    k_hi, k_lo, v_hi, v_lo  # (>= packed_size(NS*B, HD),) uint16;  t_out  # (>= NS*B,) int64
    Returns the number of keys written.
    """
    _, block, head_dim = kv.tail_k.shape
    n_full = n // block
    ns = blocks.shape[0]
    for i in prange(ns):
        b = blocks[i]
        n_valid = min(block, n - b * block)
        r0 = i * block
        kraw = np.empty((block, head_dim), np.float32)
        vraw = np.empty((block, head_dim), np.float32)
        krot = np.empty(head_dim, np.float32)
        _decode_chosen(kv, n_full, h, b, n_valid, kraw, vraw)
        for j in range(n_valid):
            rotate_vec(kraw[j], cos[place[i]], sin[place[i]], neox, krot)
            pack_key(krot, r0 + j, k_hi, k_lo)
            pack_value(vraw[j], r0 + j, v_hi, v_lo)
            t_out[r0 + j] = b * block + j
    count = _rows(blocks, block, n)
    zero_padding(count, head_dim, k_hi, k_lo, v_hi, v_lo)
    return count


@njit(inline="always")
def _rows(blocks, block, n):
    """Keys the gathered blocks hold (of ``n`` cached): every block but the last is whole."""
    ns = blocks.shape[0]
    return (ns - 1) * block + min(block, n - blocks[ns - 1] * block)


@njit(inline="always")
def _decode_chosen(kv, n_full, h, b, n_valid, k_out, v_out):
    """Rows 0..n_valid-1 of block b of KV head h of the layer ``kv`` (LayerKV) as float32, from
    the tail (f16, not yet quantized), the base blocks or the cache's own."""
    if b >= n_full:
        _decode_block(kv.tail_k[h], kv.tail_k[h], kv.tail_v[h], kv.tail_v[h, 0], 16, 16, n_valid, k_out, v_out)
    elif b < kv.nb_base:
        _decode_block(kv.bkc[h, b], kv.bkb[h, b], kv.bvc[h, b], kv.bvs[h, b], kv.k_bits, kv.v_bits, n_valid,
                      k_out, v_out)
    else:
        _decode_block(kv.okc[h, b], kv.okb[h, b], kv.ovc[h, b], kv.ovs[h, b], kv.k_bits, kv.v_bits, n_valid,
                      k_out, v_out)


@njit(inline="always")
def _decode_block(kc, kb, vc, vs, k_bits, v_bits, n_valid, k_out, v_out):
    """Rows 0..n_valid-1 of one stored block as float32: k_out, v_out (>= n_valid, HD)."""
    head_dim = k_out.shape[1]
    half = head_dim // 2
    decode_keys(kc, kb, k_bits, n_valid, k_out)
    if v_bits == 16:
        for j in range(n_valid):
            for d in range(head_dim):
                v_out[j, d] = f16_to_f32(np.uint16(vc[j, d]))
    elif v_bits == 8:
        for j in range(n_valid):
            sc = f16_to_f32(vs[j])
            for d in range(head_dim):
                v_out[j, d] = (np.float32(vc[j, d]) - np.float32(128.0)) * sc
    else:
        for j in range(n_valid):
            sc = f16_to_f32(vs[j])
            for d in range(half):
                c = vc[j, d]
                v_out[j, d] = (np.float32(c & 0x0F) - np.float32(8.0)) * sc
                v_out[j, d + half] = (np.float32(c >> 4) - np.float32(8.0)) * sc
