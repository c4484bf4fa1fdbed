"""The transformer: weights read in place from a GGUF file, and its forward pass.

One forward pass handles a chunk of T tokens (prefill, matmul) or a single token (decode,
matvec). The op order is llama.cpp's graph for these architectures (src/models/llama.cpp,
src/models/qwen2.cpp, qwen3.cpp, gemma3.cpp, helpers in src/llama-graph.cpp):

  x = embd[tokens] (* sqrt(D): gemma3)
  per layer:  h  = rms_norm(x) * attn_norm
              q, k, v = Wq h (+bq), Wk h (+bk), Wv h (+bv)
              q, k = rms_norm(q) * q_norm, rms_norm(k) * k_norm, per head (qwen3, gemma3)
              q, k = rope(q), rope(k)      (gemma3: base 10000 in the sliding-window layers)
              a  = Wo attention(q, K, V)   (gemma3: q scaled first; a window in most layers)
              x  = x + a                   (gemma3: x + rms_norm(a) * attn_post_norm)
              h  = rms_norm(x) * ffn_norm
              f  = Wdown (act(Wgate h) * Wup h)     act: silu, gemma3: gelu (tanh)
              x  = x + f                   (gemma3: x + rms_norm(f) * ffn_post_norm)
  logits = Wout (rms_norm(x) * output_norm) (+ output bias)

The norm weights are used as the file stores them: llama.cpp's converter already wrote
Gemma's (1 + w) into the GGUF (convert_hf_to_gguf.py, Gemma3Model.modify_tensors).

Shape letters: see app/engine/header/model_config.py.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, quants
from numba import njit

from ..attention.blocks import attend_blocks
from ..attention.dense import attend
from ..attention.state import AttentionState
from ..kv.blocked import BlockKVCache
from ..kv.contiguous import KVCache
from ..kv.formats import KVSpec
from ..ops.norms import add_rms_norm_rows, geglu, gelu_f16_table, rms_norm_rows, swiglu
from ..ops.rope import RopeTables, rope_heads
from ..quant import blas
from ..quant.planes_file import PlanesFile
from ..quant.qmatrix import QMatrix
from ..quant.stack import ProductStack
from ..header.model_config import ROPE_NEOX, ModelConfig, UnsupportedModelError, llamacpp_hint
from ..header.gguf_file import GGUFFile, model_fingerprint, scan_gguf

_NO_BIAS = np.zeros(0, dtype=np.float32)  # (0,) float32: "no bias" / "none" for the kernels

# ---- q, k, v: biases and rotation ----------------------------------------------------------


@njit(inline="always")
def _add_bias(x, bias):
    """x (T, n) += bias (n,) float32; a (0,) bias is no bias."""
    if bias.shape[0]:
        for t in range(x.shape[0]):
            for i in range(x.shape[1]):
                x[t, i] += bias[i]


@njit(cache=True, nogil=True)
def _qkv_bias_rope_keys(q, k, v, bq, bk, bv, cos, sin, neox):
    """In place, in llama.cpp's order (src/llama-graph.cpp build_qkv, then ggml_rope_ext):
    add the q/k/v biases (ggml_add), then rope k by the angles given. The blocked cache calls
    this alone (k rotated by each key's offset inside its block, q left for the attention
    kernel to place: app/engine/kv/blocked.py).

    q  # (T, H*HD) float32      k, v  # (T, KVH*HD) float32      cos, sin  # (T, HD/2) float32
    bq # (H*HD,) or (0,)        bk, bv  # (KVH*HD,) or (0,)
    """
    n_tok = q.shape[0]
    head_dim = 2 * cos.shape[1]
    _add_bias(q, bq)
    _add_bias(k, bk)
    _add_bias(v, bv)
    rope_heads(k.reshape(n_tok, k.shape[1] // head_dim, head_dim), cos, sin, neox)


@njit(cache=True, nogil=True)
def _qkv_bias_rope(q, k, v, bq, bk, bv, cos, sin, neox):
    """_qkv_bias_rope_keys, then q roped by the same angles (the contiguous cache's case)."""
    _qkv_bias_rope_keys(q, k, v, bq, bk, bv, cos, sin, neox)
    head_dim = 2 * cos.shape[1]
    rope_heads(q.reshape(q.shape[0], q.shape[1] // head_dim, head_dim), cos, sin, neox)


# ---- RoPE tables ------------------------------------------------------------------------


# ---- Weights ------------------------------------------------------------------------------

@dataclass
class LayerWeights:
    attn_norm: np.ndarray   # (D,) float32
    wq: QMatrix             # (H*HD, D)
    wk: QMatrix             # (KVH*HD, D)
    wv: QMatrix             # (KVH*HD, D)
    wo: QMatrix             # (D, H*HD)
    bq: np.ndarray          # (H*HD,) float32, or (0,) — qwen2
    bk: np.ndarray          # (KVH*HD,) float32, or (0,)
    bv: np.ndarray          # (KVH*HD,) float32, or (0,)
    bo: np.ndarray          # (D,) float32, or (0,)
    q_norm: np.ndarray      # (HD,) float32, or (0,) — qwen3, gemma3: RMS norm of each q head
    k_norm: np.ndarray      # (HD,) float32, or (0,) — and of each k head
    attn_post_norm: np.ndarray  # (D,) float32, or (0,) — gemma3: norm of the attention output
    ffn_norm: np.ndarray    # (D,) float32
    ffn_post_norm: np.ndarray   # (D,) float32, or (0,) — gemma3: norm of the FFN output
    w_gate: QMatrix         # (F, D)
    w_up: QMatrix           # (F, D)
    w_down: QMatrix         # (D, F)

    def __post_init__(self):
        # a decode step's products of one input, each set in one call where the formats allow
        self.qkv = ProductStack((self.wq, self.wk, self.wv))
        self.gate_up = ProductStack((self.w_gate, self.w_up))


def _vector(t) -> np.ndarray:
    """A 1-D tensor (norm weight, bias) as float32 — a view when it is stored as F32."""
    if t.tensor_type == GGMLQuantizationType.F32:
        return np.asarray(t.data, dtype=np.float32).reshape(-1)
    return quants.dequantize(t.data, GGMLQuantizationType(t.tensor_type)).astype(np.float32).reshape(-1)


class Model:
    """A llama/qwen2/qwen3/gemma3 model read from a GGUF file. Weights stay memory-mapped and quantized."""

    def __init__(self, path: str | Path, planes_dir: str | Path | None = None):
        """planes_dir: where the repacked weights are kept between starts (quant/planes_file.py);
        None repacks at every start."""
        self.path = str(path)
        self.reader = GGUFFile(self.path)  # memory-mapped; tensors are views of the file
        self.config = ModelConfig.from_gguf(self.reader, self.path)
        c = self.config
        tensors = {t.name: t for t in self.reader.tensors}
        kept = PlanesFile(planes_dir, self.path, model_fingerprint(self.path)) if planes_dir else None
        stored = kept.load() if kept else None
        self.planes_source = "file" if stored is not None else "repacked"   # where the planes came from
        made: dict[str, QMatrix] = {}

        def matrix(name: str) -> QMatrix:
            try:
                made[name] = QMatrix.from_tensor(tensors[name], kept=(stored or {}).get(name))
                return made[name]
            except KeyError:
                raise UnsupportedModelError(f"{self.path}: tensor '{name}' is missing.") from None
            except (NotImplementedError, ValueError) as e:
                # e names the tensor and the problem; the advice is given here, once
                raise UnsupportedModelError(f"{self.path}: {e}. " + llamacpp_hint(self.path)) from e

        def vector(name: str, required: bool = True) -> np.ndarray:
            if name not in tensors:
                if required:
                    raise UnsupportedModelError(f"{self.path}: tensor '{name}' is missing.")
                return _NO_BIAS
            return _vector(tensors[name])

        self.tok_embd = matrix("token_embd.weight")        # (V, D)
        # Tied embeddings: without output.weight the embedding matrix is the lm head.
        self.output = self.tok_embd if c.tied_output else matrix("output.weight")  # (V, D)
        self.output_norm = vector("output_norm.weight")    # (D,) float32
        self.output_bias = vector("output.bias", False)    # (V,) float32 or (0,)
        self.layers = [
            LayerWeights(
                attn_norm=vector(f"blk.{i}.attn_norm.weight"),
                wq=matrix(f"blk.{i}.attn_q.weight"),
                wk=matrix(f"blk.{i}.attn_k.weight"),
                wv=matrix(f"blk.{i}.attn_v.weight"),
                wo=matrix(f"blk.{i}.attn_output.weight"),
                bq=vector(f"blk.{i}.attn_q.bias", False),
                bk=vector(f"blk.{i}.attn_k.bias", False),
                bv=vector(f"blk.{i}.attn_v.bias", False),
                bo=vector(f"blk.{i}.attn_output.bias", False),
                q_norm=vector(f"blk.{i}.attn_q_norm.weight", c.qk_norm),
                k_norm=vector(f"blk.{i}.attn_k_norm.weight", c.qk_norm),
                attn_post_norm=vector(f"blk.{i}.post_attention_norm.weight", c.post_norms),
                ffn_norm=vector(f"blk.{i}.ffn_norm.weight"),
                ffn_post_norm=vector(f"blk.{i}.post_ffw_norm.weight", c.post_norms),
                w_gate=matrix(f"blk.{i}.ffn_gate.weight"),
                w_up=matrix(f"blk.{i}.ffn_up.weight"),
                w_down=matrix(f"blk.{i}.ffn_down.weight"),
            )
            for i in range(c.n_layers)
        ]
        freq_factors = tensors.get("rope_freqs.weight")
        self.rope = RopeTables(c, None if freq_factors is None else _vector(freq_factors))
        # gemma3's sliding-window layers: their own RoPE base, no frequency scaling
        # (llama_model::get_rope_freq_base / get_rope_freq_scale of an SWA layer)
        self.rope_swa = (RopeTables(replace(c, rope_freq_base=c.rope_freq_base_swa, rope_freq_scale=1.0))
                         if c.sliding_window else None)
        self.gelu_table = gelu_f16_table() if c.ffn_act == "gelu" else None   # (65536,) float32
        repacked = {name: m for name, m in made.items() if not m.reads_the_file}
        if kept is not None and stored is None and repacked:
            kept.save(repacked)
        self.eps = np.float32(c.rms_eps)
        self.neox = c.rope_type == ROPE_NEOX

    @property
    def weight_bytes(self) -> int:
        """Weight bytes one decode step streams, by the one rule of header/gguf_file.py (every
        matrix once, one embedding row, the lm head once even when tied)."""
        return scan_gguf(self.path).weight_bytes_per_token()

    def new_cache(self, n_ctx: int, kv: KVSpec | None = None) -> KVCache | BlockKVCache:
        """The contiguous f16 cache (llama.cpp's numerics) without a KV format; the blocked cache in
        format ``kv`` otherwise (attended with an AttentionState: attention/state.py)."""
        if kv is None:
            return KVCache(self.config, n_ctx)
        if self.config.sliding_window:
            raise UnsupportedModelError(
                f"{self.path}: the blocked KV cache ({kv.name}) does not implement the sliding-window "
                f"layers of '{self.config.arch}'; use the f16 KV cache with dense attention "
                "(--kv f16 --attention dense) or the llama.cpp engine (--engine llamacpp).")
        return BlockKVCache(self.config, n_ctx, kv)

    # ---- Forward pass ----------------------------------------------------------------

    def forward(self, tokens: Sequence[int], cache: KVCache | BlockKVCache, all_logits: bool = False,
                state: AttentionState | None = None) -> np.ndarray:
        """Run ``tokens`` at positions cache.n_tokens.. and append them to the cache. A blocked
        cache is attended as ``state`` says (its SparseConfig; dense attention when None).

        Returns the logits of the last token (V,) float32, or of every token (T, V)
        float32 when ``all_logits``. T == 1 takes the matvec path (decode).
        """
        if state is None and isinstance(cache, BlockKVCache):
            state = AttentionState()                 # dense attention over the blocked cache
        ids = np.asarray(tokens, dtype=np.int64)  # (T,)
        n_tok = ids.shape[0]
        pos0 = cache.n_tokens
        if pos0 + n_tok > cache.n_ctx:
            raise ValueError(f"context full: {pos0 + n_tok} tokens > n_ctx {cache.n_ctx}")
        c = self.config
        cos, sin = self.rope.rows(pos0, n_tok)   # (T, HD/2) float32 each
        cos_swa, sin_swa = self.rope_swa.rows(pos0, n_tok) if self.rope_swa else (cos, sin)

        x = np.ascontiguousarray(self.tok_embd.rows(ids), dtype=np.float32)  # (T, D) residual stream
        if c.embd_scale != 1.0:
            x *= np.float32(c.embd_scale)        # gemma3: ggml_scale(inpL, sqrtf(n_embd))
        h = np.empty_like(x)                     # (T, D) normalised input of a sub-block
        pending = None                           # (T, D) output of the last sub-block, not yet added to x
        for il, lw in enumerate(self.layers):
            self._norm(x, pending, lw.attn_norm, h)
            swa = c.is_swa(il)
            pending = self._attention_block(il, lw, h, cache, state, pos0, cos_swa if swa else cos,
                                            sin_swa if swa else sin, c.sliding_window if swa else 0)
            if lw.attn_post_norm.shape[0]:
                rms_norm_rows(pending, lw.attn_post_norm, self.eps, pending)
            self._norm(x, pending, lw.ffn_norm, h)
            pending = self._ffn_block(lw, h)
            if lw.ffn_post_norm.shape[0]:
                rms_norm_rows(pending, lw.ffn_post_norm, self.eps, pending)
        self._norm(x, pending, self.output_norm, h)
        cache.commit(ids)

        h_out = h if all_logits else h[-1:]      # (T or 1, D): llama.cpp also keeps only the rows it outputs
        logits = _linear(self.output, h_out)     # (T or 1, V) float32
        if self.output_bias.shape[0]:
            logits += self.output_bias
        return logits if all_logits else logits[0]

    def _norm(self, x, pending, w, out) -> None:
        """out = rms_norm(x (+= pending)) * w."""
        if pending is None:
            rms_norm_rows(x, w, self.eps, out)
        else:
            add_rms_norm_rows(x, pending, w, self.eps, out)

    def _attention_block(self, il, lw: LayerWeights, h, cache, state, pos0, cos, sin, window) -> np.ndarray:
        """Wo · attention(rope(Wq h + bq), rope(Wk h + bk), Wv h + bv) (+ bo) -> (T, D) float32."""
        c = self.config
        n_tok = h.shape[0]
        if n_tok == 1:
            q, k, v = (o.reshape(1, -1) for o in lw.qkv.matvec(h[0]))
        else:
            q = _linear(lw.wq, h)   # (T, H*HD) float32
            k = _linear(lw.wk, h)   # (T, KVH*HD) float32
            v = _linear(lw.wv, h)   # (T, KVH*HD) float32
        if lw.q_norm.shape[0]:
            # qwen3/gemma3: each head RMS-normed before RoPE (src/models/qwen3.cpp: build_norm of the
            # (HD, H, T) view, then ggml_rope_ext); no biases in these architectures
            _head_norm(q, lw.q_norm, self.eps)
            _head_norm(k, lw.k_norm, self.eps)
        if isinstance(cache, BlockKVCache):
            in_block = (pos0 + np.arange(n_tok)) % cache.block               # (T,) offsets in block
            table_cos, table_sin = self.rope.rows(0, cache.block)
            _qkv_bias_rope_keys(q, k, v, lw.bq, lw.bk, lw.bv, np.ascontiguousarray(table_cos[in_block]),
                                np.ascontiguousarray(table_sin[in_block]), self.neox)
            cache.update(il, pos0, k, v)
            q = q.reshape(n_tok, c.n_heads, c.head_dim)                 # (T, H, HD) float32, unrotated
            att = attend_blocks(q, cache, il, pos0, state, self.rope, self.neox)
        else:
            _qkv_bias_rope(q, k, v, lw.bq, lw.bk, lw.bv, cos, sin, self.neox)
            cache.update(il, pos0, k, v)
            q = q.reshape(n_tok, c.n_heads, c.head_dim)                 # (T, H, HD) float32
            scale = None
            if c.attn_scale:
                # gemma3: ggml_scale(Qcur, f_attention_scale) after RoPE, then scores times 1
                q *= np.float32(c.attn_scale)
                scale = 1.0
            att = attend(q, cache, il, pos0, scale=scale, window=window)  # (T, H, HD) float32
        o = _linear(lw.wo, att.reshape(n_tok, c.q_dim))                 # (T, D) float32
        if lw.bo.shape[0]:
            o += lw.bo
        return o

    def _ffn_block(self, lw: LayerWeights, h) -> np.ndarray:
        """Wdown (act(Wgate h) * Wup h) -> (T, D) float32; act is silu, or gelu (gemma3)."""
        if h.shape[0] == 1:
            gate, up = (o.reshape(1, -1) for o in lw.gate_up.matvec(h[0]))
        else:
            gate = _linear(lw.w_gate, h)   # (T, F) float32
            up = _linear(lw.w_up, h)       # (T, F) float32
        if self.gelu_table is not None:
            geglu(gate, up, self.gelu_table, gate)
        else:
            swiglu(gate, up, gate)
        return _linear(lw.w_down, gate)


def _head_norm(x: np.ndarray, w: np.ndarray, eps: np.float32) -> None:
    """In place: x (T, n_heads*HD) float32, each HD-wide head RMS-normed and times w (HD,)."""
    if not x.flags.c_contiguous:
        raise ValueError("head norm needs a C-contiguous (T, n_heads*HD) array to work in place")
    rows = x.reshape(-1, w.shape[0])        # (T*n_heads, HD) view of x
    rms_norm_rows(rows, w, eps, rows)


def _linear(w: QMatrix, x: np.ndarray) -> np.ndarray:
    """x (T, n_in) float32 -> (T, n_out) float32 through the quantized weight matrix: the
    bit-exact kernels for decode and short chunks, dequantized BLAS for long ones (blas.py)
    unless the matrix's integer kernels are as fast for long chunks too (QMatrix.batches_fast)."""
    if x.shape[0] == 1:
        return w.matvec(x[0]).reshape(1, -1)
    if x.shape[0] >= blas.BLAS_MIN_TOKENS and not w.batches_fast:
        return blas.matmul(w, x)
    return w.matmul(x)
