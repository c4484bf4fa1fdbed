"""eLLM's inference engine: GGUF models on the CPU, moving as few bytes per token as it can.

It imports nothing of the app and could ship alone. The packages, by concept:

    ops/        numeric primitives: SIMD lanes, one FMA, ggml's exp, f16 conversions, norms, RoPE
    quant/      weight formats: repacking, integer and BLAS kernels, activation quantization
    kv/         KV cache formats, the dense and blocked caches, cache files, sizes, the probe
    attention/  dense attention, sparse block choice, the question's votes, sparse kernels
    model/      configuration from GGUF metadata, the transformer, tokenizer, chat template
    cpu/        topology, thread plan, pinning, NUMA placement, bandwidth probe

and the modules beside them: the backend protocol (``backend``), our backend
(``ellm_backend``), llama.cpp's (``llamacpp_backend``), generation and sampling.

Public API (imported lazily, so ``from app.engine import SparseConfig`` does not load numba):
"""
from __future__ import annotations

import importlib

from .kernel_cache import use_keyed_cache

use_keyed_cache()   # before any kernel module compiles or loads a kernel (kernel_cache.py says why)

_PUBLIC = {
    # the protocol every backend implements
    "Backend": "backend", "SamplingParams": "backend", "GenerationStats": "backend", "stream_text": "backend",
    # the backends
    "EllmBackend": "ellm_backend", "LlamaCppBackend": "llamacpp_backend", "open_llama": "llamacpp_backend",
    # models
    "Model": "model.transformer", "ModelConfig": "header.model_config", "UnsupportedModelError": "header.model_config",
    "ARCHITECTURES": "header.support", "Tokenizer": "model.tokenizer",
    # KV cache
    "KVSpec": "kv.formats", "KV_NAMES": "kv.formats", "KVShape": "kv.sizes", "kv_bytes_per_token": "kv.sizes",
    # attention
    "SparseConfig": "attention.config", "MODES": "attention.config",
    # the machine
    "ThreadPlan": "cpu.plan", "plan_threads": "cpu.plan", "NUMA_POLICIES": "cpu.plan",
    "read_topology": "cpu.topology", "probe_read_bandwidth": "cpu.bandwidth",
}
__all__ = sorted(_PUBLIC)
__doc__ += "\n".join(f"    {name:<24} {module}" for name, module in sorted(_PUBLIC.items(), key=lambda kv: kv[1])) + "\n"


def __getattr__(name: str):
    module = _PUBLIC.get(name)
    if module is None:
        raise AttributeError(f"module 'app.engine' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value
