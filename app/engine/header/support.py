"""What eLLM's engine runs, decided from a GGUF header alone: milliseconds, nothing loaded.

``--engine auto`` asks ``why_not`` before it loads anything; the loader (header/model_config.py,
quant/qmatrix.py) takes its lists from here, so the header's verdict and the loader's agree.
"""
from __future__ import annotations

from .gguf_file import GGUFLayout

ARCHITECTURES = ("llama", "qwen2", "qwen3", "gemma3")
"""``general.architecture`` values the transformer implements (model/transformer.py)."""

DENSE_ONLY = frozenset({"gemma3"})
"""Architectures the blocked KV cache (kv/blocked.py, sparse attention) does not implement:
gemma3's sliding-window layers run on the f16 cache with dense attention only, and the blocked
cache refuses them (Model.new_cache); the automatic settings choose f16 and dense for them."""

WEIGHT_TYPES = frozenset({"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "IQ4_NL", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K",
                          "IQ4_XS", "F16", "BF16", "F32"})
"""GGML tensor types the weight kernels implement (quant/qmatrix.py)."""


def why_not(layout: GGUFLayout) -> str:
    """Why the engine cannot run this file, as a clause ("" when it can): its architecture,
    or tensor types it has no kernels for."""
    if layout.architecture not in ARCHITECTURES:
        return (f"it does not implement architecture '{layout.architecture}' "
                f"(it runs {', '.join(ARCHITECTURES)})")
    missing = sorted(layout.tensor_types - WEIGHT_TYPES)
    if missing:
        return f"it has no kernels for tensor type{'s' if len(missing) > 1 else ''} {', '.join(missing)}"
    return ""
