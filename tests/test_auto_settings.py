"""The automatic settings (app/runtime/auto.py): the context holds the whole document and the
answer as far as memory allows, in an f16 cache where it holds the document and k8v8 where only
that does, dense attention inside the trained context (the answer from the voted blocks for long
documents) and beyond it the same, the document read as sparse attention reads it
("sparse-decode"); whatever a person chose is kept."""
from __future__ import annotations

import pytest

from app.engine.kv.sizes import KVShape, kv_bytes_per_token, safety_margin
from app.runtime.auto import (AUTO_KV, BESIDE_ROOM, CONTEXT_STEP, NO_DOCUMENT_CONTEXT, SMALL_KV, SPARSE_DECODE_FROM,
                              choose, document_needs)
from app.runtime.model_files import packaged_model_path, scan_gguf
from app.settings import Settings

GIB = 1 << 30


@pytest.fixture(scope="module")
def model():
    path = packaged_model_path()
    return path, scan_gguf(path).context_length


def test_the_defaults_leave_the_context_kv_and_attention_to_eLLM():
    s = Settings()
    assert (s.n_ctx, s.kv, s.attention) == (0, "auto", "auto")


def test_a_document_inside_the_trained_context_is_read_whole_and_densely(model):
    path, trained = model
    c = choose(Settings(), path, "ellm", doc_tokens=2000, free_bytes=16 * GIB)
    wanted = 2000 + 512 + BESIDE_ROOM + Settings().max_tokens
    assert c.wanted == wanted and c.n_ctx == -(-wanted // CONTEXT_STEP) * CONTEXT_STEP == 8192
    assert (c.kv, c.attention, c.note) == (AUTO_KV, "dense", "")
    assert c.n_ctx <= trained


def test_beyond_the_trained_context_the_engine_answers_from_the_voted_blocks(model):
    path, trained = model
    c = choose(Settings(), path, "ellm", doc_tokens=3 * trained, free_bytes=16 * GIB)
    assert c.n_ctx >= c.wanted > 3 * trained and c.n_ctx % CONTEXT_STEP == 0
    assert (c.kv, c.attention, c.note) == (AUTO_KV, "sparse-decode", "")


def test_llama_cpp_stops_at_the_trained_context_and_says_so(model):
    path, trained = model
    c = choose(Settings(), path, "llamacpp", doc_tokens=3 * trained, free_bytes=16 * GIB)
    assert (c.n_ctx, c.kv, c.attention) == (trained, "f16", "dense")
    assert "trained" in c.note and "most relevant" in c.note


def test_free_memory_bounds_the_context_and_the_note_says_so(model):
    path, _ = model
    roomy = choose(Settings(), path, "ellm", doc_tokens=200_000, free_bytes=64 * GIB)
    tight = choose(Settings(), path, "ellm", doc_tokens=200_000, free_bytes=2 * GIB)
    assert roomy.n_ctx >= roomy.wanted and roomy.note == ""
    assert CONTEXT_STEP <= tight.n_ctx < tight.wanted and "free memory" in tight.note


def test_where_f16_does_not_hold_the_document_the_smaller_format_does(model):
    """Memory for 12K tokens of k8v8 but not of f16 (which needs 1.9x the bytes): the whole
    document in k8v8 rather than a part of it in f16; where neither holds it, the format that
    holds more of it."""
    path, _ = model
    layout = scan_gguf(path)
    shape = KVShape.from_layout(layout)
    doc = 12 * 1024 - 512 - BESIDE_ROOM - Settings().max_tokens
    need = 12 * 1024 * kv_bytes_per_token(shape, SMALL_KV)
    assert 12 * 1024 * kv_bytes_per_token(shape, AUTO_KV) > 1.5 * need
    free = layout.file_size + need + 256 * kv_bytes_per_token(shape, SMALL_KV)
    free += safety_margin(free)
    c = choose(Settings(), path, "ellm", doc_tokens=doc, free_bytes=free)
    assert (c.kv, c.n_ctx, c.note) == (SMALL_KV, 12 * 1024, "")
    short = choose(Settings(), path, "ellm", doc_tokens=4 * doc, free_bytes=free)
    assert (short.kv, short.n_ctx) == (SMALL_KV, 12 * 1024) and "free memory" in short.note
    roomy = choose(Settings(), path, "ellm", doc_tokens=doc, free_bytes=free * 4)
    assert (roomy.kv, roomy.n_ctx) == (AUTO_KV, 12 * 1024)


def test_a_document_just_inside_the_trained_context_stays_dense(model):
    """The passages beside the question and the answer get what the trained context leaves."""
    path, trained = model
    doc = trained - document_needs(0) - 8
    c = choose(Settings(), path, "ellm", doc_tokens=doc, free_bytes=16 * GIB)
    assert c.wanted > trained and (c.n_ctx, c.attention) == (trained, "dense")


@pytest.mark.parametrize("side", [-1, 1])
def test_the_answer_length_never_moves_a_document_across_the_trained_context(side, tmp_path):
    """How a document is read (dense inside the trained window, sparse beyond: its cache file)
    is decided by the document alone: any answer length reads it the same way."""
    from app.engine.attention.config import SparseConfig
    from tests.engine.tiny_gguf import TinySpec, write_tiny_model

    trained = 32768
    path = write_tiny_model(tmp_path / "tiny-32k.gguf", TinySpec(context_length=trained))
    doc = trained - document_needs(0) + (1 if side > 0 else -64)
    readings = set()
    for max_tokens in (1, 16, 96, 160, 512, 2048, 8192):
        c = choose(Settings(max_tokens=max_tokens), path, "ellm", doc_tokens=doc, free_bytes=16 * GIB)
        assert (c.n_ctx <= trained) == (side < 0) and c.note == ""
        readings.add(SparseConfig(mode=c.attention).prompt_config(c.n_ctx, trained))
    assert len(readings) == 1 and next(iter(readings)).mode == ("dense" if side < 0 else "sparse")


def test_long_documents_inside_the_trained_context_are_read_densely_and_answered_sparsely(tmp_path):
    """From SPARSE_DECODE_FROM document tokens on, inside the trained window, the answer reads the
    blocks the question voted for ("sparse-decode"), and past the window too; shorter documents
    and llama.cpp read densely."""
    from tests.engine.tiny_gguf import TinySpec, write_tiny_model

    path = write_tiny_model(tmp_path / "tiny-32k.gguf", TinySpec(context_length=32768))
    at = {doc: choose(Settings(), path, "ellm", doc_tokens=doc, free_bytes=16 * GIB)
          for doc in (SPARSE_DECODE_FROM - 1, SPARSE_DECODE_FROM, 30_000, 40_000)}
    assert [c.attention for c in at.values()] == ["dense", "sparse-decode", "sparse-decode", "sparse-decode"]
    assert at[30_000].n_ctx == 32768 and at[40_000].n_ctx > 32768
    assert choose(Settings(), path, "llamacpp", doc_tokens=30_000, free_bytes=16 * GIB).attention == "dense"
    assert choose(Settings(attention="dense"), path, "ellm", doc_tokens=30_000).attention == "dense"


def test_without_documents_a_completion_gets_the_usual_context(model):
    path, trained = model
    c = choose(Settings(), path, "ellm", doc_tokens=None, free_bytes=16 * GIB)
    assert c.n_ctx == min(trained, NO_DOCUMENT_CONTEXT) and c.wanted == 0
    assert (c.kv, c.attention) == ("f16", "dense")      # nothing to persist: llama.cpp's numerics


def test_a_persons_choices_are_kept(model):
    path, _ = model
    s = Settings(n_ctx=2048, kv="f16", attention="sparse")
    c = choose(s, path, "ellm", doc_tokens=100_000, free_bytes=16 * GIB)
    assert (c.n_ctx, c.kv, c.attention, c.note) == (2048, "f16", "sparse", "")
    with pytest.raises(ValueError, match="0 \\(automatic\\) or at least 256"):
        Settings(n_ctx=100)


def test_gemma3_gets_the_f16_cache_and_dense_attention_inside_its_window(tmp_path):
    """The blocked cache does not implement gemma3's sliding-window layers (support.py
    DENSE_ONLY): the automatic settings keep it on f16 and dense, inside the trained context."""
    from tests.engine.tiny_gguf import GEMMA3, TinySpec, write_tiny_model

    path = write_tiny_model(tmp_path / "tiny-gemma3.gguf", TinySpec(**{**GEMMA3, "context_length": 8192}))
    c = choose(Settings(), path, "ellm", doc_tokens=3 * 8192, free_bytes=16 * GIB)
    assert (c.n_ctx, c.kv, c.attention) == (8192, "f16", "dense")
    assert "ellm reads at most the model's trained 8,192 tokens" in c.note
    assert choose(Settings(), path, "ellm", doc_tokens=1000, free_bytes=16 * GIB).kv == "f16"
