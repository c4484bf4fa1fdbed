"""A long document prefix read in several sittings: while it is computed its part so far is
checkpointed beside its cache file; a reading stopped (paused, the app closed) resumes from the
checkpoint, and the cache it ends with is the one an uninterrupted reading writes, byte for byte."""
from __future__ import annotations

import numpy as np
import pytest

from app.engine import ellm_backend
from app.engine.backend import CacheFile
from app.engine.ellm_backend import EllmBackend

CHUNK = 64


@pytest.fixture
def doc():
    return np.random.default_rng(3).integers(3, 2000, 10 * CHUNK + 17).tolist()   # (T,) token ids


def backend(path):
    return EllmBackend(path, n_ctx=2048, kv="k8v4", attention="dense", prefill_chunk=CHUNK)


def test_a_stopped_reading_resumes_from_its_checkpoint_and_ends_as_a_fresh_one(tiny_model, tmp_path, doc,
                                                                               monkeypatch):
    model = tiny_model("llama")
    meta = {"key": "doc", "kv": "k8v4"}
    fresh = CacheFile(tmp_path / "fresh.kv", meta)
    assert backend(model).ensure_prefix(doc, fresh).status == "miss"

    monkeypatch.setattr(ellm_backend, "CHECKPOINT_S", 0.0)     # checkpoint after every chunk
    file = CacheFile(tmp_path / "doc.kv", meta)
    partial = tmp_path / "doc.kv.partial"
    seen: list[int] = []
    stop_after_4 = lambda: len(seen) > 4                        # noqa: E731  (progress 0, then 4 chunks)
    first = backend(model)
    assert first.ensure_prefix(doc, file, cancel=stop_after_4, progress=lambda d, t: seen.append(d)) is None
    assert partial.exists() and not file.path.exists()
    assert seen[:5] == [0, CHUNK, 2 * CHUNK, 3 * CHUNK, 4 * CHUNK]

    resumed: list[tuple[int, int]] = []
    again = backend(model)                                     # another process: nothing in memory
    result = again.ensure_prefix(doc, file, progress=lambda d, t: resumed.append((d, t)))
    assert result.status == "miss" and result.saved_bytes > 0
    assert resumed[0] == (4 * CHUNK, len(doc)) and resumed[-1] == (len(doc), len(doc))
    assert not partial.exists()
    assert file.path.read_bytes() == fresh.path.read_bytes()


def test_a_checkpoint_of_other_tokens_is_ignored_and_removed(tiny_model, tmp_path, doc, monkeypatch):
    model = tiny_model("llama")
    meta = {"key": "doc", "kv": "k8v4"}
    monkeypatch.setattr(ellm_backend, "CHECKPOINT_S", 0.0)
    file = CacheFile(tmp_path / "doc.kv", meta)
    calls = []
    other = [t + 1 for t in doc]
    assert backend(model).ensure_prefix(other, file, cancel=lambda: len(calls) > 3,
                                        progress=lambda d, t: calls.append(d)) is None
    seen: list[int] = []
    assert backend(model).ensure_prefix(doc, file, progress=lambda d, t: seen.append(d)).status == "miss"
    assert seen[0] == 0 and not (tmp_path / "doc.kv.partial").exists()


def test_a_prompt_that_is_exactly_the_read_prefix_is_answered_from_all_of_it(tiny_model, doc):
    """The last prompt token is always computed again for its logits; the blocked cache can only
    go back to a block boundary or its checkpoint, so when the prompt ends at the checkpoint the
    prefill restarts at the block boundary, at the right positions (it once ran the last token
    at position 0 and answered from nothing)."""
    from app.engine.backend import SamplingParams

    model = tiny_model("llama")
    params = SamplingParams.make_greedy(6)
    fresh = backend(model)
    want = list(fresh.generate(doc, params))
    read = backend(model)
    assert read.ensure_prefix(doc).status == "miss"
    assert list(read.generate(doc, params)) == want
    assert read.cache.n_tokens == len(doc) + len(want) - 1


def test_a_follow_up_keeps_everything_the_cache_holds_past_the_checkpoint(tiny_model, doc):
    """A conversation's next turn extends the last prompt and its answer: the cache keeps all of
    it, though it ends mid-block after the document's checkpoint, and prefills only the new
    tokens; the logits are those of a fresh computation of the whole."""
    from app.engine.backend import SamplingParams

    model = tiny_model("llama")
    b = backend(model)
    b.ensure_prefix(doc[:9 * CHUNK])                             # a checkpoint on a block boundary
    params = SamplingParams.make_greedy(5)
    first = doc[:9 * CHUNK] + doc[9 * CHUNK:9 * CHUNK + 7]       # the question, mid-block
    answer = list(b.generate(first, params))
    held = b.cached_tokens()
    assert held[:len(first)] == first and len(held) == len(first) + len(answer) - 1
    follow = first + answer + doc[-9:]
    again = list(b.generate(follow, params))
    assert b.stats.reused_prompt_tokens == len(held)              # not cut back to the checkpoint
    fresh = backend(model)
    assert list(fresh.generate(follow, params)) == again
