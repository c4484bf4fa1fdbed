"""Picking the next token from logits.

The chain is llama-cpp-python's (llama.py ``_init_sampler``), i.e. llama.cpp's samplers in
this order: repetition penalty -> top-k -> top-p -> temperature -> draw. Temperature <= 0
means greedy (argmax after the penalty, first index on ties like llama_sampler_greedy).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from .backend import SamplingParams


def apply_repetition_penalty(logits: np.ndarray, recent: Sequence[int], penalty: float) -> np.ndarray:
    """llama.cpp's penalty (src/llama-sampler.cpp llama_sampler_penalties_apply): every
    distinct token among ``recent`` gets logit / penalty if logit > 0, else logit * penalty.

    logits  # (V,) float32 — returned as a new array when changed
    """
    if penalty == 1.0 or len(recent) == 0:
        return logits
    ids = np.unique(np.asarray(recent, dtype=np.int64))  # each token once, however often it occurs
    out = logits.copy()
    sel = out[ids]
    p = np.float32(penalty)
    out[ids] = np.where(sel > 0, sel / p, sel * p)
    return out


def top_k_candidates(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k highest logits, sorted descending: (ids (k,) int64, logits (k,) float32).
    k <= 0 keeps the whole vocabulary (llama.cpp: top_k <= 0 is a no-op)."""
    n = logits.shape[0]
    if 0 < k < n:
        ids = np.argpartition(-logits, k - 1)[:k]
    else:
        ids = np.arange(n)
    # stable sort on -logit: equal logits keep ascending id order
    ids = ids[np.argsort(-logits[ids], kind="stable")]
    return ids, logits[ids]


def softmax(x: np.ndarray) -> np.ndarray:
    """(n,) -> (n,) float64 probabilities."""
    e = np.exp(x.astype(np.float64) - np.max(x))
    return e / e.sum()


def top_p_cut(sorted_logits: np.ndarray, p: float, min_keep: int = 1) -> int:
    """How many of the descending ``sorted_logits`` top-p keeps: the smallest prefix whose
    probability mass reaches p (llama_sampler_top_p_apply; the token crossing p is kept)."""
    if p >= 1.0:
        return sorted_logits.shape[0]
    cum = np.cumsum(softmax(sorted_logits))
    n = int(np.searchsorted(cum, p, side="left")) + 1
    return max(min_keep, min(n, sorted_logits.shape[0]))


class Sampler:
    """Stateful sampler for one generation: owns the seeded RNG."""

    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def __call__(self, logits: np.ndarray, history: Sequence[int]) -> int:
        """logits (V,) float32 of the next position; history = prompt + generated ids."""
        p = self.params
        if p.repeat_penalty != 1.0 and p.repeat_last_n != 0:
            n = len(history) if p.repeat_last_n < 0 else p.repeat_last_n
            logits = apply_repetition_penalty(logits, history[-n:] if n else [], p.repeat_penalty)
        if p.greedy:
            return int(np.argmax(logits))
        ids, cand = top_k_candidates(logits, p.top_k)
        keep = top_p_cut(cand, p.top_p)
        ids, cand = ids[:keep], cand[:keep]
        probs = softmax(cand / np.float32(p.temperature))
        return int(ids[self.rng.choice(len(ids), p=probs)])
