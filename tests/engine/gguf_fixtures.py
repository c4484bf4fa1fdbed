"""Tiny GGUF files for engine tests: a vocabulary plus a minimal llama architecture.

llama.cpp refuses a GGUF without architecture hyper-parameters even with ``vocab_only=True``,
so every file written here carries a 1-layer llama with tiny random f32 weights
(dim 8, 2 heads). The vocabularies are the point; the weights only have to load.
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import gguf
import numpy as np

# gguf token types (llama.cpp's LLAMA_TOKEN_TYPE_*)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

DIM, N_HEADS, N_FF, N_CTX = 8, 2, 16, 256


def _tiny_llama_tensors(w: gguf.GGUFWriter, n_vocab: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)

    def rand(*shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    # numpy shapes are (rows, cols) = gguf's dims reversed: token_embd is (n_vocab, DIM).
    w.add_tensor("token_embd.weight", rand(n_vocab, DIM))   # (n_vocab, D)
    w.add_tensor("output_norm.weight", np.ones(DIM, np.float32))
    w.add_tensor("output.weight", rand(n_vocab, DIM))       # (n_vocab, D)
    w.add_tensor("blk.0.attn_norm.weight", np.ones(DIM, np.float32))
    for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(f"blk.0.{name}.weight", rand(DIM, DIM))  # (D, D)
    w.add_tensor("blk.0.ffn_norm.weight", np.ones(DIM, np.float32))
    w.add_tensor("blk.0.ffn_gate.weight", rand(N_FF, DIM))  # (FF, D)
    w.add_tensor("blk.0.ffn_up.weight", rand(N_FF, DIM))    # (FF, D)
    w.add_tensor("blk.0.ffn_down.weight", rand(DIM, N_FF))  # (D, FF)


def write_vocab_gguf(path: Path, *, model: str, tokens: list, token_types: list[int],
                     scores: list[float] | None = None, merges: list | None = None,
                     pre: str | None = None, kv: dict | None = None) -> Path:
    """Write a tiny llama GGUF whose tokenizer is the given vocabulary.

    ``kv`` holds extra tokenizer keys, e.g. {"bos_token_id": 1, "add_bos_token": False,
    "add_space_prefix": True}; each maps to ``GGUFWriter.add_<key>``.
    """
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(N_CTX)
    w.add_embedding_length(DIM)
    w.add_block_count(1)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEADS)
    w.add_head_count_kv(N_HEADS)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(DIM // N_HEADS)
    w.add_tokenizer_model(model)
    if pre is not None:
        w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(token_types)
    if scores is not None:
        w.add_token_scores(scores)
    if merges is not None:
        w.add_token_merges(merges)
    for key, value in (kv or {}).items():
        getattr(w, f"add_{key}")(value)
    _tiny_llama_tensors(w, len(tokens))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


# ---- SentencePiece-style ("llama") vocabulary

SPM_CORPUS = (
    "The quick brown fox jumps over the lazy dog. the theory of the thing: "
    "in the beginning there was nothing, then there was something interesting. "
    "Tokenizers merge the highest-scoring pair first; ties go to the leftmost pair. "
    "def main():\n    return 42\n\tindented   spaces  and  more   spaces. café naïve "
)


def spm_vocab(corpus: str = SPM_CORPUS, n_pieces: int = 320):
    """(tokens, token_types, scores) of a small SentencePiece-like vocabulary.

    Layout as in Llama 2: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then
    control / user-defined extras, then pieces with descending scores. Some scores tie on
    purpose (llama.cpp breaks ties by leftmost position), and ".▁" contains a space after a
    non-space character, which a word-by-word shortcut must not cut through.
    """
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [UNKNOWN, CONTROL, CONTROL] + [BYTE] * 256
    scores = [0.0] * len(tokens)
    for extra, kind in (("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL), ("[TOOL]", USER_DEFINED)):
        tokens.append(extra)
        types.append(kind)
        scores.append(0.0)

    text = " " + corpus.replace("\n", " ").replace("\t", " ")
    text = text.replace(" ", "\u2581")
    singles = sorted(set(text) - {"\u00ef"})  # leave "ï" out: it must take the byte fallback
    # Pieces come from inside "▁word" units, as in a real SentencePiece model.
    words = re.findall("\u2581*[^\u2581]+", text)
    counts = Counter(w[i:i + n] for w in words for n in (2, 3, 4, 5) for i in range(len(w) - n + 1))
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1] * len(kv[0]), kv[0]))
    pieces = [p for p, _ in ranked[:n_pieces]]
    must_have = (".\u2581", "\u2581\u2581", "\u2581\u2581\u2581\u2581", "\u2581the", "\u2581th",
                 "aa", "ab", "ba")
    for must in must_have:
        if must not in pieces:
            pieces.append(must)
    for i, piece in enumerate(pieces):
        tokens.append(piece)
        types.append(NORMAL)
        scores.append(-float(i // 3))  # groups of three share a score: ties
    for ch in singles:
        if ch not in tokens:
            tokens.append(ch)
            types.append(NORMAL)
            scores.append(-1000.0)
    return tokens, types, scores


def write_spm_gguf(path: Path, **kv) -> Path:
    tokens, types, scores = spm_vocab()
    kv = {"bos_token_id": 1, "eos_token_id": 2, "unk_token_id": 0, **kv}
    return write_vocab_gguf(path, model="llama", tokens=tokens, token_types=types, scores=scores, kv=kv)


# ---- byte-level BPE ("gpt2") vocabulary borrowed from a real model

def read_bpe_vocab(reader: gguf.GGUFReader):
    """(tokens, token_types, merges) as raw bytes / ints from a gpt2-tokenizer GGUF."""
    f = reader.fields
    tokens = [bytes(f["tokenizer.ggml.tokens"].parts[i]) for i in f["tokenizer.ggml.tokens"].data]
    token_type = f["tokenizer.ggml.token_type"]
    types = [int(token_type.parts[i][0]) for i in token_type.data]
    merges = [bytes(f["tokenizer.ggml.merges"].parts[i]) for i in f["tokenizer.ggml.merges"].data]
    return tokens, types, merges


def write_bpe_gguf(path: Path, vocab, pre: str, **kv) -> Path:
    tokens, types, merges = vocab
    return write_vocab_gguf(path, model="gpt2", tokens=tokens, token_types=types, merges=merges,
                            pre=pre, kv=kv)


def subset_bpe_vocab(vocab, n_merges: int = 3000, extra: tuple[bytes, ...] = (b"zzqx", b"\xc4\xa0zzqx"),
                     extra_merges: tuple[bytes, ...] = (b"1 2", b"3 4", b"12 34", b"T he")):
    """A smaller, self-consistent byte-level BPE vocabulary cut from a real one.

    Keeps the real model's leading special tokens, every single-character token (the 256
    byte characters among them) and the first ``n_merges`` merges with their results, so a
    GGUF of it loads in milliseconds. Ids differ from the real model's; merges still apply.
    ``extra`` tokens ("zzqx", "Ġzzqx") are in the vocab but no merge builds them: only a
    pre-tokenizer with ignore_merges (llama3) emits them whole. ``extra_merges`` build
    "1234" and "The", so how a pre-tokenizer groups digits or cuts "'The" shows in the ids.
    """
    tokens, types, merges = vocab
    n_special = next(i for i, t in enumerate(types) if t == NORMAL)
    keep = list(tokens[:n_special])
    keep += [t for t in tokens[n_special:] if len(t.decode("utf-8", "replace")) == 1]
    known = set(keep)
    kept_merges = []
    for merge in merges[:n_merges]:
        left, right = merge.split(b" ", 1)
        if left in known and right in known:
            kept_merges.append(merge)
            if left + right not in known:
                known.add(left + right)
                keep.append(left + right)
    for merge in extra_merges:
        kept_merges.append(merge)
        joined = merge.replace(b" ", b"")
        if joined not in known:
            known.add(joined)
            keep.append(joined)
    keep += [t for t in extra if t not in known]
    return keep, [CONTROL] * n_special + [NORMAL] * (len(keep) - n_special), kept_merges
