"""ModelConfig: the shape and numerics of a GGUF model, read from its metadata.

Shape letters used in comments across app/engine:
  D   = dim (embedding width)        H   = n_heads         KVH = n_kv_heads
  HD  = head_dim                     G   = H // KVH (query heads per KV head)
  F   = ffn_dim                      V   = vocab_size      L   = n_layers
  T   = tokens in a chunk            C   = n_ctx (KV cache capacity)

The rules mirror llama.cpp's loader (src/llama-model.cpp ``load_hparams``,
src/llama-context.cpp for the RoPE scaling defaults) so that both engines run the
same model the same way.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from .gguf_file import field_value
from .support import ARCHITECTURES


# llama.cpp rope types (ggml.h GGML_ROPE_TYPE_*): llama uses NORMAL (rotate adjacent pairs,
# because convert_hf_to_gguf.py permutes the q/k rows of Llama checkpoints), qwen2 uses NEOX
# (rotate the first half against the second half). src/llama-model.cpp llama_model_rope_type.
ROPE_NORMAL = 0
ROPE_NEOX = 2
_ROPE_TYPE = {"llama": ROPE_NORMAL, "qwen2": ROPE_NEOX, "qwen3": ROPE_NEOX, "gemma3": ROPE_NEOX}

# Gemma 3: every 6th layer attends globally, the others through the sliding window, whose
# RoPE base is fixed at 10000 (src/llama-model.cpp load_hparams, LLM_ARCH_GEMMA3:
# set_swa_pattern(6), rope_freq_base_train_swa = 10000, rope_freq_scale_train_swa = 1).
GEMMA3_SWA_PATTERN = 6
GEMMA3_SWA_ROPE_BASE = 10000.0


class UnsupportedModelError(ValueError):
    """The GGUF file is valid but this engine cannot run it."""


def llamacpp_hint(path: str) -> str:
    return f"Run {path} with the llama.cpp engine instead (--engine llamacpp)."


@dataclass(frozen=True)
class ModelConfig:
    """Everything the forward pass needs to know about a model, and nothing it doesn't."""

    arch: str
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int            # trained context (n_ctx_train)
    rms_eps: float
    rope_type: int                 # ROPE_NORMAL or ROPE_NEOX
    rope_freq_base: float = 10000.0
    rope_dims: int = 0             # n_rot; 0 -> head_dim
    # RoPE scaling, resolved the way src/llama-context.cpp does for default cparams.
    rope_scaling: str = "none"     # "none" | "linear" | "yarn"
    rope_freq_scale: float = 1.0   # 1 / scaling factor
    rope_ext_factor: float = 0.0   # YaRN extrapolation mix, 0 unless yarn
    rope_attn_factor: float = 1.0  # magnitude scale passed to rope (mscale)
    rope_beta_fast: float = 32.0
    rope_beta_slow: float = 1.0
    rope_orig_ctx: int = 0         # n_ctx_orig_yarn; 0 -> context_length
    tied_output: bool = True       # no output.weight: the token embedding is the lm head
    # Per-architecture parts of the block (qwen3: qk_norm; gemma3: all of them).
    qk_norm: bool = False          # RMS norm of each q and k head (attn_q_norm, attn_k_norm) before RoPE
    post_norms: bool = False       # RMS norm of each sub-block's output before the residual add
    ffn_act: str = "silu"          # "silu" (SwiGLU) | "gelu" (GeGLU, tanh approximation)
    embd_scale: float = 1.0        # the embedding rows are multiplied by this (gemma: sqrt(D))
    attn_scale: float = 0.0        # q is multiplied by this before attention; 0 -> 1/sqrt(HD)
    sliding_window: int = 0        # keys a windowed layer's query sees (itself included); 0: none
    swa_pattern: int = 0           # layer il is global when il % swa_pattern == swa_pattern - 1
    rope_freq_base_swa: float = 0.0  # RoPE base of the windowed layers (their freq scale is 1)
    path: str = ""

    # derived in __post_init__
    q_dim: int = field(init=False)      # H * HD
    kv_dim: int = field(init=False)     # KVH * HD
    group_size: int = field(init=False)  # G = H // KVH

    def __post_init__(self):
        def set_(name, value):  # the dataclass is frozen; derived fields are set once, here
            object.__setattr__(self, name, value)

        if self.rope_dims == 0:
            set_("rope_dims", self.head_dim)
        if self.rope_orig_ctx == 0:
            set_("rope_orig_ctx", self.context_length)
        set_("q_dim", self.n_heads * self.head_dim)
        set_("kv_dim", self.n_kv_heads * self.head_dim)
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(
                f"{self.path}: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}.")
        set_("group_size", self.n_heads // self.n_kv_heads)
        if self.rope_dims != self.head_dim:
            # llama.cpp asserts the same for both architectures (src/models/llama.cpp).
            raise UnsupportedModelError(
                f"{self.path}: partial rotary embeddings (rope dims {self.rope_dims} != head_dim "
                f"{self.head_dim}) are not supported. " + llamacpp_hint(self.path))
        if self.head_dim % 8:
            # the attention kernels work in 8-lane vectors, as llama.cpp's tinyBLAS does
            raise UnsupportedModelError(
                f"{self.path}: head_dim {self.head_dim} is not a multiple of 8. " + llamacpp_hint(self.path))

    def is_swa(self, layer: int) -> bool:
        """Whether ``layer`` attends through the sliding window (llama_hparams::is_swa)."""
        return self.sliding_window > 0 and layer % self.swa_pattern < self.swa_pattern - 1

    # ---- Construction -------------------------------------------------------

    @classmethod
    def from_gguf(cls, reader, path: str | Path | None = None) -> ModelConfig:
        """reader: a GGUFFile (header/gguf_file.py) or a gguf.GGUFReader."""
        path = str(path if path is not None else getattr(reader, "path", "") or "<gguf>")
        arch = _field(reader, "general.architecture", path)
        if arch not in ARCHITECTURES:
            raise UnsupportedModelError(
                f"{path}: architecture '{arch}' is not supported by the ellm engine "
                f"(supported: {', '.join(ARCHITECTURES)}). " + llamacpp_hint(path))

        def key(name, default=_REQUIRED):
            return _field(reader, f"{arch}.{name}", path, default)

        n_heads = key("attention.head_count")
        if isinstance(n_heads, list):
            raise UnsupportedModelError(f"{path}: per-layer head counts are not supported. " + llamacpp_hint(path))
        n_kv_heads = key("attention.head_count_kv", n_heads)
        dim = key("embedding_length")
        head_dim = key("attention.key_length", dim // n_heads)
        if key("attention.value_length", head_dim) != head_dim:
            raise UnsupportedModelError(f"{path}: key and value head sizes differ. " + llamacpp_hint(path))
        tensors = {t.name: t for t in reader.tensors}
        if "token_embd.weight" not in tensors:
            raise UnsupportedModelError(f"{path}: tensor 'token_embd.weight' is missing.")
        vocab = int(tensors["token_embd.weight"].shape[1])  # GGUF dims are [D, V]
        context_length = key("context_length")

        rope = _rope_scaling(
            scaling=key("rope.scaling.type", "linear"),
            factor=key("rope.scaling.factor", None) or key("rope.scale_linear", 0.0),
            attn_factor=key("rope.scaling.attn_factor", 1.0),
            yarn_log_mul=key("rope.scaling.yarn_log_multiplier", 0.0),
            ext_factor=key("rope.scaling.yarn_ext_factor", -1.0),
            beta_fast=key("rope.scaling.yarn_beta_fast", 32.0),
            beta_slow=key("rope.scaling.yarn_beta_slow", 1.0),
            path=path,
        )
        return cls(
            arch=arch,
            n_layers=key("block_count"),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            ffn_dim=key("feed_forward_length"),
            vocab_size=vocab,
            context_length=context_length,
            rms_eps=key("attention.layer_norm_rms_epsilon"),
            rope_type=_ROPE_TYPE[arch],
            rope_freq_base=key("rope.freq_base", 10000.0),
            rope_dims=key("rope.dimension_count", head_dim),
            rope_orig_ctx=key("rope.scaling.original_context_length", context_length),
            tied_output="output.weight" not in tensors,
            path=path,
            **rope,
            **_block_parts(arch, key, dim, n_heads, head_dim, path),
        )

    # ---- Sizes --------------------------------------------------------------

    def kv_bytes_per_token(self, bytes_per_element: int = 2) -> int:
        """K and V bytes one token occupies in an f16 cache, all layers."""
        return 2 * self.n_layers * self.kv_dim * bytes_per_element


_REQUIRED = object()


def _block_parts(arch: str, key, dim: int, n_heads: int, head_dim: int, path: str) -> dict:
    """The fields of the block that differ from llama's, per architecture (src/models/qwen3.cpp,
    src/models/gemma3.cpp; hyper-parameters from src/llama-model.cpp load_hparams)."""
    if arch == "qwen3":
        return {"qk_norm": True}
    if arch != "gemma3":
        return {}
    if key("final_logit_softcapping", None) or key("attn_logit_softcapping", None):
        # llama.cpp's windowed gemma3 graph has no softcapping either; refuse rather than guess
        raise UnsupportedModelError(f"{path}: gemma3 logit softcapping is not supported. " + llamacpp_hint(path))
    n_layers = key("block_count")
    # gemma_pytorch config.py (query_pre_attn_scalar), as llama.cpp resolves it: the 27B model
    # (62 layers) scales by 1/sqrt(D / H), the others by 1/sqrt(HD). GGUF does not store it.
    pre_attn = dim / n_heads if n_layers == 62 else head_dim
    window = key("attention.sliding_window", 0)
    return {
        "qk_norm": True, "post_norms": True, "ffn_act": "gelu",
        "embd_scale": float(np.float32(math.sqrt(dim))),   # ggml_scale by sqrtf(n_embd)
        "attn_scale": float(np.float32(1.0) / np.sqrt(np.float32(pre_attn))),
        "sliding_window": window, "swa_pattern": GEMMA3_SWA_PATTERN if window else 0,
        "rope_freq_base_swa": GEMMA3_SWA_ROPE_BASE,
    }


def _field(reader, name: str, path: str, default=_REQUIRED):
    value = field_value(reader, name, _REQUIRED)
    if value is _REQUIRED:
        if default is _REQUIRED:
            raise UnsupportedModelError(f"{path}: GGUF metadata key '{name}' is missing.")
        return default
    return value


def _rope_scaling(scaling: str, factor: float, attn_factor: float, yarn_log_mul: float,
                  ext_factor: float, beta_fast: float, beta_slow: float, path: str) -> dict:
    """RoPE scaling parameters as llama.cpp resolves them for default context params
    (src/llama-model.cpp load_hparams + src/llama-context.cpp llama_context ctor)."""
    if scaling not in ("none", "linear", "yarn"):
        raise UnsupportedModelError(f"{path}: RoPE scaling '{scaling}' is not supported. " + llamacpp_hint(path))
    freq_scale = 1.0 if (scaling == "none" or not factor) else 1.0 / factor
    if ext_factor < 0.0:
        ext_factor = 1.0 if scaling == "yarn" else 0.0
    mscale = 1.0
    if ext_factor != 0.0:
        # llama.cpp divides out the factor that ggml's rope_yarn multiplies back in
        # (ggml-cpu/ops.cpp rope_yarn), so the net magnitude scale is get_mscale(factor).
        factor_ = 1.0 / freq_scale
        if yarn_log_mul != 0.0:
            mscale = _yarn_get_mscale(factor_, 1.0) / _yarn_get_mscale(factor_, yarn_log_mul)
        else:
            mscale = _yarn_get_mscale(factor_, 1.0)
        mscale = float(np.float32(mscale * (1.0 / (1.0 + 0.1 * math.log(factor_)))))
    return {"rope_scaling": scaling, "rope_freq_scale": freq_scale, "rope_ext_factor": ext_factor,
            "rope_attn_factor": mscale * attn_factor, "rope_beta_fast": beta_fast, "rope_beta_slow": beta_slow}


def _yarn_get_mscale(scale: float, m: float) -> float:
    """src/llama-context.cpp get_mscale: 1 + 0.1 m ln(scale) for scale > 1."""
    return 1.0 if scale <= 1.0 else 0.1 * m * math.log(scale) + 1.0
