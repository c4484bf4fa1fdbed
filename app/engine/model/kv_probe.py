"""The KV quality probe: how much a smaller KV cache changes the model's predictions.

The same tokens run through the model twice, chunk by chunk in lockstep: once with the dense
f16 cache (llama.cpp's numerics) and once with the format under test (dense attention over
the blocked cache, so only the storage differs). At every position we compare the next-token
distributions: KL(p_f16 || p_spec) and whether their most likely tokens agree.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..kv.formats import KVSpec
from .transformer import Model

PROBE_CHUNK = 256


@dataclass(frozen=True)
class ProbeResult:
    kv: str
    tokens: int
    mean_kl: float
    max_kl: float
    top1_agreement: float

    def as_dict(self) -> dict:
        return {"kv": self.kv, "tokens": self.tokens, "mean_kl": self.mean_kl, "max_kl": self.max_kl,
                "top1_agreement": self.top1_agreement}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax of (T, V) float32 logits, in float64."""
    x = logits.astype(np.float64)
    x -= x.max(axis=1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=1, keepdims=True))


def kl_rows(ref_logits: np.ndarray, test_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(test)) per row of two (T, V) arrays -> (T,) float64."""
    lp = log_softmax(ref_logits)
    lq = log_softmax(test_logits)
    return (np.exp(lp) * (lp - lq)).sum(axis=1)


def probe(model: Model, tokens: Sequence[int], spec: KVSpec, chunk: int = PROBE_CHUNK,
          progress: Callable[[int, int], None] | None = None,
          cancel: Callable[[], bool] | None = None) -> ProbeResult | None:
    """Compare ``spec`` against f16 over ``tokens`` (None if cancelled)."""
    n = len(tokens)
    if n < 2:
        raise ValueError("the KV probe needs at least 2 tokens")
    ref_cache = model.new_cache(n)
    test_cache = model.new_cache(n, spec)         # attended densely
    kls, agree = [], 0
    for i in range(0, n, chunk):
        if cancel is not None and cancel():
            return None
        part = tokens[i:i + chunk]
        ref = model.forward(part, ref_cache, all_logits=True)     # (T, V) float32
        test = model.forward(part, test_cache, all_logits=True)   # (T, V) float32
        kls.append(kl_rows(ref, test))
        agree += int((ref.argmax(axis=1) == test.argmax(axis=1)).sum())
        if progress is not None:
            progress(min(i + chunk, n), n)
    kl = np.concatenate(kls)                                         # (n,) float64
    return ProbeResult(spec.name, n, float(kl.mean()), float(kl.max()), agree / n)
