"""The blocked, quantized KV cache: formats, sizes, resuming, persistence."""
from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from app.engine.attention.config import SparseConfig
from app.engine.attention.state import AttentionState
from app.engine.generate import prefill
from app.engine.kv.blocked import BlockKVCache
from app.engine.kv.files import KVFileError, load, save
from app.engine.kv.formats import KVSpec
from app.engine.kv.sizes import KVShape, kv_bytes_per_token
from app.engine.header.model_config import ModelConfig
from app.engine.model.transformer import Model

SPECS = ("f16", "k8v8", "k8v4", "k4v4")


def _config(n_layers=2, n_kv_heads=2, head_dim=32, context_length=512) -> ModelConfig:
    return ModelConfig(arch="llama", n_layers=n_layers, dim=n_kv_heads * head_dim, n_heads=n_kv_heads,
                       n_kv_heads=n_kv_heads, head_dim=head_dim, ffn_dim=64, vocab_size=100,
                       context_length=context_length, rms_eps=1e-5, rope_type=0)


@pytest.mark.parametrize("name", SPECS)
def test_round_trip_error_is_within_half_a_quantization_step(name):
    spec = KVSpec.parse(name, block=16)
    cfg = _config()
    cache = BlockKVCache(cfg, 64, spec)
    rng = np.random.default_rng(1)
    n = 40   # two full blocks and a partial one (still f16)
    k = rng.normal(0, 1, (n, cfg.n_kv_heads * cfg.head_dim)).astype(np.float32)
    k[:, 3] *= 20            # an outlier channel, as real keys have (KIVI)
    v = rng.normal(0, 1, (n, cfg.n_kv_heads * cfg.head_dim)).astype(np.float32)
    cache.update(0, 0, k, v)
    cache.commit(range(n))
    kd, vd = cache.dequantize(0)                              # (KVH, n, HD)
    k3 = k.reshape(n, cfg.n_kv_heads, cfg.head_dim).transpose(1, 0, 2).astype(np.float16).astype(np.float32)
    v3 = v.reshape(n, cfg.n_kv_heads, cfg.head_dim).transpose(1, 0, 2).astype(np.float16).astype(np.float32)
    full = 32
    # The partial block waits in f16: exact.
    assert np.array_equal(kd[:, full:], k3[:, full:]) and np.array_equal(vd[:, full:], v3[:, full:])
    if spec.k_bits == 16:
        assert np.array_equal(kd, k3) and np.array_equal(vd, v3)
        return
    for b in range(2):
        blk = k3[:, b * 16:(b + 1) * 16]                     # (KVH, B, HD)
        step = (blk.max(axis=1) - blk.min(axis=1)) / ((1 << spec.k_bits) - 1)   # (KVH, HD)
        err = np.abs(kd[:, b * 16:(b + 1) * 16] - blk)
        assert (err <= step[:, None, :] * 0.5 + 1e-2 * np.abs(blk) + 1e-3).all()
    cmax = (1 << (spec.v_bits - 1)) - 1
    scale = np.abs(v3[:, :full]).max(axis=2, keepdims=True) / cmax      # (KVH, n, 1)
    assert (np.abs(vd[:, :full] - v3[:, :full]) <= scale * 0.5 * 1.01 + 1e-3).all()
    # Not trivially exact either: quantization did happen.
    assert not np.array_equal(kd[:, :full], k3[:, :full])


@pytest.mark.parametrize("name", SPECS[1:])
def test_bytes_per_token_follow_the_formula(name):
    spec = KVSpec.parse(name)
    shape = KVShape(n_layers=30, n_kv_heads=3, key_length=64, value_length=64, context_length=8192)
    hd, b = 64, spec.block
    per_head = hd * spec.k_bits / 8 + 2 * 2 * hd / b + hd * spec.v_bits / 8 + 2
    assert kv_bytes_per_token(shape, name) == int(np.ceil(30 * 3 * per_head))
    assert kv_bytes_per_token(shape, "f16") == 2 * 30 * 3 * 64 * 2
    cfg = _config(n_layers=3, n_kv_heads=2, head_dim=64)
    cache = BlockKVCache(cfg, 4 * b, spec)
    cache.commit(range(4 * b))
    assert cache.nbytes == pytest.approx(4 * b * spec.bytes_per_token(3, 2, 64, 64))


def test_k8v4_holds_at_most_0_4_of_f16_for_smollm2_shape():
    shape = KVShape(n_layers=30, n_kv_heads=3, key_length=64, value_length=64, context_length=8192)
    assert kv_bytes_per_token(shape, "k8v4") <= 0.4 * kv_bytes_per_token(shape, "f16")


def test_unknown_kv_setting_names_the_choices():
    with pytest.raises(ValueError, match="f16, k8v8, k8v4, k4v4"):
        KVSpec.parse("k2v2")


@pytest.fixture(scope="module")
def llama(tiny_model):
    return Model(tiny_model("llama"))


def _cache(model, n_ctx=512, kv="k8v4"):
    return model.new_cache(n_ctx, KVSpec.parse(kv, block=16))


def test_resuming_at_the_checkpoint_equals_a_fresh_run(llama):
    rng = np.random.default_rng(2)
    prefix = rng.integers(3, 2000, 75).tolist()      # ends inside a block
    q1 = rng.integers(3, 2000, 30).tolist()
    q2 = rng.integers(3, 2000, 20).tolist()
    fresh = _cache(llama)
    prefill(llama, fresh, prefix, chunk=32)
    want = prefill(llama, fresh, q2, chunk=32, all_logits=True)

    reused = _cache(llama)
    prefill(llama, reused, prefix, chunk=32)
    reused.set_checkpoint()
    prefill(llama, reused, q1, chunk=32)              # fills and quantizes the checkpoint's block
    assert reused.common_prefix(prefix + q2) == len(prefix)
    assert reused.truncate(len(prefix)) == len(prefix)
    got = prefill(llama, reused, q2, chunk=32, all_logits=True)
    assert np.array_equal(got, want)


def test_truncating_elsewhere_rounds_down_to_a_block(llama):
    cache = _cache(llama)
    prefill(llama, cache, list(range(3, 60)), chunk=32)
    assert cache.truncate(40) == 32
    assert cache.n_tokens == 32


def test_truncating_inside_the_last_block_keeps_that_point_and_equals_a_fresh_run(llama):
    """A conversation's next turn cuts the cache inside its last, partly filled block (the
    answer's last tokens are recomputed with the new turn): the f16 tail still holds what comes
    before, so nothing else is recomputed, and the result is a fresh run's."""
    rng = np.random.default_rng(4)
    head = rng.integers(3, 2000, 52).tolist()            # ends inside block 3 (16-token blocks)
    tail = rng.integers(3, 2000, 5).tolist()
    more = rng.integers(3, 2000, 10).tolist()
    fresh = _cache(llama)
    prefill(llama, fresh, head, chunk=32)
    want = prefill(llama, fresh, more, chunk=32, all_logits=True)
    cut = _cache(llama)
    prefill(llama, cut, head, chunk=32)
    prefill(llama, cut, tail, chunk=32)
    assert cut.common_prefix(head + more) == len(head)
    assert cut.truncate(len(head)) == len(head)
    assert np.array_equal(prefill(llama, cut, more, chunk=32, all_logits=True), want)


def test_saved_cache_loads_memory_mapped_and_answers_identically(llama, tmp_path):
    rng = np.random.default_rng(3)
    prefix = rng.integers(3, 2000, 90).tolist()
    question = rng.integers(3, 2000, 12).tolist()
    sparse = SparseConfig(mode="sparse", sinks=16, window=32, top_k=2)
    a, a_state = _cache(llama), AttentionState(sparse)
    prefill(llama, a, prefix, chunk=32, state=a_state)
    a.set_checkpoint()
    meta = {"model": "tiny", "kv": "k8v4"}
    path = tmp_path / "doc.kv"
    save(a, path, meta)
    want = prefill(llama, a, question, chunk=32, all_logits=True, state=a_state)
    want_next = llama.forward([5], a, state=a_state)

    b, b_state = _cache(llama), AttentionState(sparse)
    load(b, path, meta)
    assert b.tokens == prefix
    assert all(isinstance(x, np.memmap) for x in b.base.values() if x.size)
    got = prefill(llama, b, question, chunk=32, all_logits=True, state=b_state)
    assert np.array_equal(got, want)
    assert np.array_equal(llama.forward([5], b, state=b_state), want_next)


def _corrupt(path, where):
    data = bytearray(path.read_bytes())
    if where == "truncate":
        path.write_bytes(bytes(data[: len(data) - 100]))
    else:
        data[-200] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("where", ["truncate", "flip"])
def test_a_damaged_cache_file_is_refused_with_the_reason(llama, tmp_path, where):
    cache = _cache(llama)
    prefill(llama, cache, list(range(3, 80)), chunk=32)
    path = tmp_path / "doc.kv"
    save(cache, path, {"m": 1})
    _corrupt(path, where)
    fresh = _cache(llama)
    with pytest.raises(KVFileError, match="truncated|corrupt") as e:
        load(fresh, path, {"m": 1})
    assert str(path) in str(e.value)
    assert fresh.n_tokens == 0


def test_a_cache_made_with_other_settings_is_refused(llama, tmp_path):
    cache = _cache(llama)
    prefill(llama, cache, list(range(3, 40)), chunk=32)
    path = tmp_path / "doc.kv"
    save(cache, path, {"model": "a"})
    with pytest.raises(KVFileError, match="other settings"):
        load(_cache(llama), path, {"model": "b"})
    with pytest.raises(KVFileError, match="k_bits|v_bits"):
        load(_cache(llama, kv="k4v4"), path, {"model": "a"})


def _rss() -> int:
    gc.collect()
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _mapped_rss(path) -> int:
    """Resident bytes of this process's mappings of ``path`` (/proc/self/smaps)."""
    total, inside = 0, False
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()
            if len(head) >= 5 and "-" in head[0] and ":" in head[3]:   # a mapping's first line
                inside = line.rstrip().endswith(str(path))
            elif inside and line.startswith("Rss:"):
                total += int(head[1]) * 1024
    return total


def test_loading_does_not_copy_the_cache_into_memory(tmp_path):
    cfg = _config(n_layers=8, n_kv_heads=8, head_dim=128, context_length=8192)
    spec = KVSpec.parse("k8v8")
    n = 4096
    cache = BlockKVCache(cfg, n, spec)
    rng = np.random.default_rng(4)
    kv = rng.normal(0, 1, (n, 8 * 128)).astype(np.float32)
    for layer in range(cfg.n_layers):
        cache.update(layer, 0, kv, kv)
    cache.commit(range(n))
    path = tmp_path / "big.kv"
    size = save(cache, path, {})
    assert size > 30e6
    del cache, kv
    fresh = BlockKVCache(cfg, n + 64, spec)
    before = _rss()
    load(fresh, path, {})
    grown = _rss() - before
    assert _mapped_rss(path) < 0.05 * size          # the blocks are mapped, not read in
    # A copy would grow the process by the whole file; the checksum pass reads it in 16 MB chunks,
    # and in a full test run other threads of the process allocate too (seen: 33 MB of 72 MB).
    assert grown < 0.6 * size, f"loading grew the process by {grown} bytes for a {size}-byte file"
    assert fresh.n_tokens == n and fresh.nb_base == n // spec.block


@pytest.mark.parametrize("from_file", [False, True])
def test_copies_of_blocks_read_as_those_tokens_at_their_new_positions(llama, tmp_path, from_file):
    """copy_blocks lays whole blocks again after the cache's last block: keys are stored in
    their block's frame, so a copy is what writing the same keys and values at the new
    positions gives, and the next tokens see it there (f16: bit for bit)."""
    rng = np.random.default_rng(4)
    prefix = rng.integers(3, 2000, 64).tolist()        # four whole blocks of 16
    question = rng.integers(3, 2000, 9).tolist()
    copied = _cache(llama, kv="f16")
    prefill(llama, copied, prefix, chunk=32)
    if from_file:                                       # the sources memory-mapped from a document's file
        save(copied, tmp_path / "doc.kv", {"kv": "f16"})
        copied = _cache(llama, kv="f16")
        load(copied, tmp_path / "doc.kv", {"kv": "f16"})
        assert copied.nb_base == 4
    copied.copy_blocks([2, 0])
    assert copied.n_tokens == 96 and copied.tokens[64:] == prefix[32:48] + prefix[:16]

    written = _cache(llama, kv="f16")
    prefill(llama, written, prefix, chunk=32)
    for layer in range(llama.config.n_layers):
        k, v = written.dequantize(layer, 64)                     # (KVH, 64, HD) keys in their block's frame
        kv_dims = k.shape[0] * k.shape[2]
        for dst, src in ((4, 2), (5, 0)):
            keys = k[:, src * 16:(src + 1) * 16].transpose(1, 0, 2).reshape(16, kv_dims)
            values = v[:, src * 16:(src + 1) * 16].transpose(1, 0, 2).reshape(16, kv_dims)
            written.update(layer, dst * 16, keys, values)
    written.commit(prefix[32:48] + prefix[:16])
    for layer in range(llama.config.n_layers):
        assert all(np.array_equal(a, b) for a, b in zip(copied.dequantize(layer), written.dequantize(layer)))
    got = prefill(llama, copied, question, chunk=32, all_logits=True)
    want = prefill(llama, written, question, chunk=32, all_logits=True)
    assert np.array_equal(got, want)


def test_only_whole_blocks_are_copied_after_a_whole_block(llama):
    cache = _cache(llama, kv="f16")
    prefill(llama, cache, list(range(3, 43)), chunk=32)          # 40 tokens: 2 blocks and a half
    with pytest.raises(ValueError, match="after a whole block, not after 40 tokens"):
        cache.copy_blocks([0])
    cache.truncate(32)
    with pytest.raises(ValueError, match="only the cache's 2 whole blocks"):
        cache.copy_blocks([2])
    small = _cache(llama, n_ctx=48, kv="f16")
    prefill(llama, small, list(range(3, 35)), chunk=32)
    with pytest.raises(ValueError, match="KV cache full: 64 tokens > n_ctx 48"):
        small.copy_blocks([0, 1])
