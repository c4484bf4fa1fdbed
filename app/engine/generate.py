"""Generation: prefill (chunked), decode one token, and the token generator.

In the style of gpt-fast's ``prefill`` / ``decode_one_token`` / ``decode_n_tokens``; stop
strings are left to backend.stream_text, which sees the decoded text.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import numpy as np

from .attention.state import AttentionState
from .kv.contiguous import KVCache
from .model.transformer import Model
from .sampling import Sampler

PREFILL_CHUNK = 256  # tokens per prefill matmul; llama.cpp's default n_ubatch is 512


def prefill(model: Model, cache: KVCache, tokens: Sequence[int], chunk: int = PREFILL_CHUNK,
            cancel: Callable[[], bool] | None = None, all_logits: bool = False,
            state: AttentionState | None = None,
            progress: Callable[[int, int], None] | None = None) -> np.ndarray | None:
    """Run ``tokens`` after what the cache already holds, in chunks of ``chunk`` tokens (a
    blocked cache attended as ``state`` says, see Model.forward); ``progress(done, total)``
    after each chunk, in tokens of ``tokens``.

    Returns the logits of the last token (V,) float32, or of every token (T, V) float32
    with ``all_logits``; None when ``cancel()`` turned True between two chunks (the cache
    then holds the chunks that finished).
    """
    if len(tokens) == 0:
        raise ValueError("prefill needs at least one token")
    parts = []
    for i in range(0, len(tokens), chunk):
        if i and cancel is not None and cancel():
            return None
        parts.append(model.forward(tokens[i:i + chunk], cache, all_logits=all_logits, state=state))
        if progress is not None:
            progress(min(i + chunk, len(tokens)), len(tokens))
    return np.concatenate(parts) if all_logits else parts[-1]


def prefill_reusing_prefix(model: Model, cache: KVCache, tokens: Sequence[int], chunk: int = PREFILL_CHUNK,
                           cancel: Callable[[], bool] | None = None,
                           state: AttentionState | None = None) -> tuple[np.ndarray | None, int]:
    """Prefill only the part of ``tokens`` the cache does not already hold.

    The last token is always recomputed (its logits are needed). Returns the last logits
    (V,) float32 (None if cancelled) and the number of tokens reused from the cache.
    """
    cache.truncate(min(cache.common_prefix(tokens), len(tokens) - 1))
    n_keep = cache.n_tokens   # the blocked cache keeps less: a block boundary or its checkpoint
    return prefill(model, cache, tokens[n_keep:], chunk, cancel, state=state), n_keep


def decode_one_token(model: Model, cache: KVCache, token: int, state: AttentionState | None = None) -> np.ndarray:
    """Append one token; returns the logits (V,) float32 of the next position."""
    return model.forward((token,), cache, state=state)


def generate_tokens(model: Model, cache: KVCache, logits: np.ndarray, sampler: Sampler,
                    history: list[int], max_tokens: int, stop_ids: set[int],
                    cancel: Callable[[], bool] | None = None,
                    state: AttentionState | None = None) -> Iterator[int]:
    """Yield up to ``max_tokens`` tokens, starting from the prefill's last ``logits`` (V,).

    Stops at an id in ``stop_ids`` (end of generation: neither yielded nor fed back), when
    the context is full, or when ``cancel()`` returns True (checked between tokens).
    ``history`` (prompt + generated ids) is extended in place; the sampler's penalty reads it.
    """
    for i in range(max_tokens):
        if cancel is not None and cancel():
            return
        token = sampler(logits, history)
        if token in stop_ids:
            return
        history.append(token)
        yield token
        if i == max_tokens - 1 or cache.n_tokens >= cache.n_ctx:
            return
        if cancel is not None and cancel():
            return
        logits = decode_one_token(model, cache, token, state)
