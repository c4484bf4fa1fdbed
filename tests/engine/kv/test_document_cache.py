"""Questions about documents keep eLLM's KV cache in blocks, f16 too: the document is read once,
written to its file and loaded from it later, and the f16 blocks hold the same halves as the
contiguous f16 cache, so the model's predictions agree with it (kv/formats.py ``blocked_cache``)."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine.backend import CacheFile, SamplingParams
from app.engine.ellm_backend import EllmBackend
from app.engine.generate import prefill
from app.engine.kv.formats import blocked_cache

CHUNK = 64


@pytest.fixture
def doc():
    return np.random.default_rng(5).integers(3, 2000, 4 * CHUNK + 29).tolist()   # (T,) token ids


def backend(path, documents: bool, kv: str = "f16", attention: str = "dense") -> EllmBackend:
    return EllmBackend(path, n_ctx=1024, kv=kv, attention=attention, prefill_chunk=CHUNK, documents=documents)


def test_only_a_completion_without_documents_in_f16_dense_keeps_the_dense_cache():
    assert not blocked_cache("qwen2", "f16", "dense")
    assert blocked_cache("qwen2", "f16", "dense", documents=True)
    assert blocked_cache("llama", "k16v16", "dense", documents=True)
    assert blocked_cache("qwen2", "k8v8", "dense") and blocked_cache("qwen2", "f16", "sparse")
    # gemma3's sliding-window layers have no blocked cache: its documents stay on the dense one
    assert not blocked_cache("gemma3", "f16", "dense", documents=True)


def test_an_f16_document_is_read_once_and_loaded_from_its_file(tiny_model, tmp_path, doc):
    model = tiny_model("llama")
    file = CacheFile(tmp_path / "doc.kv", {"key": "doc", "kv": "f16"})
    first = backend(model, documents=True)
    assert first.blocked and first.capabilities.prefix_files
    assert first.ensure_prefix(doc, file).status == "miss" and file.path.exists()
    params = SamplingParams.make_greedy(6)
    question = doc + [7, 8, 9]
    want = list(first.generate(question, params))

    later = backend(model, documents=True)
    prefix = later.ensure_prefix(doc, CacheFile(file.path, file.meta, exists=True))
    assert (prefix.status, prefix.source, prefix.rejected) == ("hit", "file", "")
    assert list(later.generate(question, params)) == want
    assert later.stats.reused_prompt_tokens >= len(doc) // CHUNK * CHUNK


def test_a_completion_keeps_the_dense_cache_and_its_numerics(tiny_model):
    plain = backend(tiny_model("llama"), documents=False)
    assert not plain.blocked and not plain.capabilities.prefix_files


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_f16_blocks_predict_as_the_dense_f16_cache(tiny_model, doc, arch):
    """Same halves, keys rotated in two steps (block start, then offset) instead of one: the
    logits of every position agree to float32 rounding."""
    model = tiny_model(arch)
    dense, blocked = backend(model, documents=False), backend(model, documents=True)
    want = prefill(dense.model, dense.cache, doc, CHUNK, all_logits=True)            # (T, V)
    got = prefill(blocked.model, blocked.cache, doc, CHUNK, all_logits=True, state=blocked.state)
    scale = float(np.abs(want).max())
    assert np.abs(got - want).max() <= 2e-3 * scale
    assert (got.argmax(-1) == want.argmax(-1)).mean() >= 0.98


def test_passages_beside_the_question_are_copies_of_the_documents_blocks(tiny_model, doc):
    """EllmBackend.beside: the blocks holding the given ranges laid again after the document, in
    document order and within the room; the question continues after them without computing
    them again, their attention counts for the blocks they copy, and the next question's
    prefix drops them."""
    b = backend(tiny_model("llama"), documents=True, attention="sparse-decode")
    block = b.kv_spec.block
    prefix = doc[:len(doc) // block * block]
    b.ensure_prefix(prefix)
    copied = b.beside([(3 * block + 5, 4 * block + 2), (block, block + 3), (0, 0)], room=2 * block + 10)
    assert copied == prefix[block:2 * block] + prefix[3 * block:4 * block]     # two of three blocks fit, in order
    assert b.cache.n_tokens == len(prefix) + 2 * block and b.cache.checkpoint.n_tokens == b.cache.n_tokens
    question = [7, 8, 9, 10]
    list(b.generate(prefix + copied + question, SamplingParams.make_greedy(4)))
    assert b.stats.reused_prompt_tokens >= len(prefix) + len(copied) - 1
    n_doc = len(prefix) // block
    assert all(start < n_doc * block or start >= len(prefix) + len(copied) for start, _, _ in b.attended_blocks(64))
    assert b.ensure_prefix(prefix).status == "hit" and b.cache.n_tokens == len(prefix)
    assert b.beside([(0, block)], room=block - 1) == []                          # no room for a block


def test_passages_alone_read_the_header_and_their_copies_only(tiny_model, doc):
    """beside(..., head=N): the answer reads the blocks of the first N tokens, the copies and its
    own, and the bytes it reports reading per token are those blocks'."""
    b = backend(tiny_model("llama"), documents=True, attention="sparse-decode")
    block = b.kv_spec.block
    prefix = doc[:len(doc) // block * block]
    b.ensure_prefix(prefix)
    copied = b.beside([(3 * block + 5, 4 * block + 2)], room=4 * block, head=block + 1)
    list(b.generate(prefix + copied + [7, 8, 9], SamplingParams.make_greedy(4)))
    n_doc, heads = len(prefix) // block, max(2, -(-b.attention.sinks // block))    # the header's 2 blocks or the sinks'
    assert b.state.view == (2, n_doc)
    n_blocks = -(-(len(prefix) + len(copied) + 3) // block)
    assert b.stats.kv_read_bytes_per_token == (heads + n_blocks - n_doc) * block * b.kv_bytes_per_token()
    assert all(start < n_doc * block or start >= len(prefix) + len(copied)    # the copies count for
               for start, _, _ in b.attended_blocks(64))                        # the blocks they copy


def test_a_full_disk_while_writing_drops_the_file_and_keeps_the_prefix_in_memory(tiny_model, tmp_path, doc,
                                                                                 monkeypatch):
    from app.engine.kv import files as kv_files

    def full(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(kv_files.os, "fsync", full)
    model = tiny_model("llama")
    file = CacheFile(tmp_path / "doc.kv", {"key": "doc", "kv": "f16"})
    b = backend(model, documents=True)
    result = b.ensure_prefix(doc, file)
    assert (result.status, result.saved_bytes) == ("miss", 0)
    assert result.save_error == f"{file.path}: No space left on device"
    assert list(tmp_path.iterdir()) == []                  # neither the file nor its temporary is left
    again = b.ensure_prefix(doc, file)                    # the prefix is still held in memory
    assert (again.status, again.source) == ("hit", "memory")
