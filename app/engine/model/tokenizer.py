"""Tokenizer read from GGUF metadata; gives exactly llama.cpp's token ids.

A Python re-implementation of llama.cpp's tokenizers (src/llama-vocab.cpp, src/unicode.cpp,
as vendored by llama-cpp-python 0.3.36), not a translation of its code:

- ``tokenizer.ggml.model == "gpt2"``: byte-level BPE (``llm_tokenizer_bpe_session``) after the
  pre-tokenizer that ``tokenizer.ggml.pre`` selects (``llm_tokenizer_bpe`` constructor) and
  ``unicode_regex_split`` runs.
- ``tokenizer.ggml.model == "llama"``: SentencePiece-style merging by score with byte
  fallback (``llm_tokenizer_spm_session``).
- Special tokens are cut out of the text first (``tokenizer_st_partition``); BOS/EOS and the
  end-of-generation set follow ``llama_vocab::impl::load``.

Everything works on Python ``str``: for valid UTF-8, llama.cpp's codepoint indexing is ours.
Other vocab types (bert, t5, rwkv, ...) and pre-tokenizers not listed in ``PRE_TOKENIZERS``
are refused with a message that points at the llama.cpp backend.
"""
from __future__ import annotations

import heapq
import re

import gguf

from ..header.gguf_file import field_array, field_value
from .pretokenize import (
    PRE_TOKENIZERS,
    byte_decode,
    byte_encode,
    compiled,
    one_byte_text,
    pre_tokenize,
)

# ---- Token attributes (llama.h: llama_token_attr) and gguf token types

ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5

_ATTR_OF_TOKEN_TYPE = {  # gguf.TokenType -> attribute, as llama_vocab::impl::load maps them
    gguf.TokenType.UNKNOWN: ATTR_UNKNOWN, gguf.TokenType.UNUSED: ATTR_UNUSED,
    gguf.TokenType.NORMAL: ATTR_NORMAL, gguf.TokenType.CONTROL: ATTR_CONTROL,
    gguf.TokenType.USER_DEFINED: ATTR_USER_DEFINED, gguf.TokenType.BYTE: ATTR_BYTE,
}

_EOT_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
              "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
              "<end_of_utterance>"}
_FIM_TEXTS = {  # id slot -> texts llama_vocab::impl::load recognises
    "fim_pre": {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>",
                "▁<PRE>", "<|code_prefix|>", "<|prefix|>"},
    "fim_suf": {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>",
                "▁<SUF>", "<|code_suffix|>", "<|suffix|>"},
    "fim_mid": {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>",
                "▁<MID>", "<|code_middle|>", "<|middle|>"},
    "fim_pad": {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"},
    "fim_rep": {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"},
    "fim_sep": {"<|file_sep|>"},
}
_EOG_TEXTS = {"<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>",
              "<|calls|>", "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>",
              "_<EOT>", "[EOT]", "[EOS]", "<|end_of_text|>", "<end_of_utterance>", "<eos>",
              "<turn|>", "<|tool_response>", "<｜end▁of▁sentence｜>", "[e~["}
# special id slot -> GGUF keys, in llama_vocab::impl::load's order (later keys win)
_SPECIAL_KEYS = (
    ("bos", "bos_token_id"), ("eos", "eos_token_id"), ("eot", "eot_token_id"),
    ("eom", "eom_token_id"), ("unk", "unknown_token_id"), ("sep", "seperator_token_id"),
    ("pad", "padding_token_id"), ("mask", "mask_token_id"), ("fim_pre", "fim_pre_token_id"),
    ("fim_suf", "fim_suf_token_id"), ("fim_mid", "fim_mid_token_id"),
    ("fim_pad", "fim_pad_token_id"), ("fim_rep", "fim_rep_token_id"),
    ("fim_sep", "fim_sep_token_id"), ("fim_pre", "prefix_token_id"),
    ("fim_suf", "suffix_token_id"), ("fim_mid", "middle_token_id"),
)

_SPACE = "\u2581"  # "▁", SentencePiece's visible space
_WORD_CACHE_LIMIT = 200_000


# ---- Public API

class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary, identical to llama.cpp's."""

    def __init__(self, *, model: str, tokens: list[str], attrs: list[int], scores: list[float],
                 merges: list[str], pre: str, special: dict[str, int | None], add_bos: bool,
                 add_eos: bool, add_space_prefix: bool, eog: set[int]):
        self.model = model                 # "gpt2" (byte-level BPE) or "llama" (SPM)
        self.pre = pre
        self.tokens = tokens               # (n_vocab,) token text; raw bytes via surrogateescape
        self.attrs = attrs                 # (n_vocab,) ATTR_* bit set
        self.scores = scores               # (n_vocab,) SPM merge scores
        self.vocab_size = len(tokens)
        self.bos_id = special["bos"]
        self.eos_id = special["eos"]
        self.eot_ids = set(eog)
        self.add_bos = add_bos             # what encode(add_bos=True) does, from the GGUF
        self.add_eos = add_eos
        self.add_space_prefix = add_space_prefix
        self._token_to_id = {t: i for i, t in enumerate(tokens)}  # a repeated text: last id wins
        # Merge ranks keyed by pair; a repeated pair keeps its first rank (unordered_map::emplace).
        self._ranks: dict[tuple[str, str], int] = {}
        for rank, merge in enumerate(merges):
            cut = merge.find(" ", 1)
            pair = (merge[:cut], merge[cut + 1:]) if cut >= 0 else ("", "")
            self._ranks.setdefault(pair, rank)
        # Special tokens that are cut out of the text, longest first (cache_special_tokens).
        self._special_ids = sorted(
            (i for i, a in enumerate(attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)),
            key=lambda i: (-len(tokens[i].encode("utf-8", "surrogateescape")), i))
        self._word_cache: dict[str, list[int]] = {}
        self._piece_cache: dict[int, bytes] = {}
        if model == "gpt2":
            steps, self._ignore_merges, _ = PRE_TOKENIZERS[pre]
            self._steps = tuple(compiled(p) for p in steps)
        else:
            self._spm_cut = self._spm_cut_pattern()

    @classmethod
    def from_gguf(cls, reader) -> Tokenizer:
        """Read the vocabulary and its rules as llama_vocab::impl::load does. reader: a
        GGUFFile (header/gguf_file.py) or a gguf.GGUFReader."""
        model = field_value(reader, "tokenizer.ggml.model")
        pre = field_value(reader, "tokenizer.ggml.pre") or "default"
        refused = why_not_tokenizer(model, pre)
        if refused:
            raise ValueError(f"eLLM's tokenizer cannot read this model: {refused}; use the llamacpp backend")
        tokens = field_array(reader, "tokenizer.ggml.tokens")
        if not tokens:
            raise ValueError("the GGUF file has no tokenizer.ggml.tokens; it cannot be tokenized")
        tokens = [t or f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
        n_vocab = len(tokens)
        types = field_array(reader, "tokenizer.ggml.token_type")
        attrs = ([_ATTR_OF_TOKEN_TYPE.get(t, ATTR_UNDEFINED) for t in types] if types
                 else [ATTR_NORMAL] * n_vocab)
        scores = [float(s) for s in (field_array(reader, "tokenizer.ggml.scores") or [0.0] * n_vocab)]
        merges = field_array(reader, "tokenizer.ggml.merges") or []
        if model == "gpt2" and not merges:
            raise ValueError("the GGUF file has no tokenizer.ggml.merges for its gpt2 tokenizer")

        # Defaults per vocab type, then the GGUF keys.
        special: dict[str, int | None] = dict.fromkeys((slot for slot, _ in _SPECIAL_KEYS), None)
        if model == "llama":
            special |= {"bos": 1, "eos": 2, "unk": 0}
            add_bos, add_space_prefix = True, True
        else:
            special |= {"bos": 11, "eos": 11}
            add_bos, add_space_prefix = PRE_TOKENIZERS[pre][2], False
        add_space_prefix = bool(field_value(reader, "tokenizer.ggml.add_space_prefix", add_space_prefix))
        for slot, key in _SPECIAL_KEYS:
            if special[slot] is not None and special[slot] >= n_vocab:
                special[slot] = None  # a default out of range is disabled
            new_id = field_value(reader, f"tokenizer.ggml.{key}")
            if new_id is not None and new_id < n_vocab:
                special[slot] = new_id
        add_bos = bool(field_value(reader, "tokenizer.ggml.add_bos_token", add_bos))
        add_eos = bool(field_value(reader, "tokenizer.ggml.add_eos_token", False))

        eog = _detect_special_tokens(tokens, attrs, special)
        return cls(model=model, tokens=tokens, attrs=attrs, scores=scores, merges=merges, pre=pre,
                   special=special, add_bos=add_bos, add_eos=add_eos,
                   add_space_prefix=add_space_prefix, eog=eog)

    def encode(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        """Token ids of ``text``, as ``llama_tokenize(text, add_special=add_bos,
        parse_special=special)``: BOS (and EOS) only where the model asks for them.

        Text that is not valid UTF-8 (lone surrogates) is encoded with "?" in their place.
        """
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            text = text.encode("utf-8", "replace").decode("utf-8")
        fragments = self._partition(text, special) if text else []
        out: list[int] = []
        if add_bos and self.add_bos:
            if self.bos_id is None:
                raise ValueError("the model asks for a BOS token but has none")
            out.append(self.bos_id)
        if self.model == "llama":
            prev_special = True  # the first fragment gets the leading space too
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                    prev_special = True
                else:
                    if self.add_space_prefix and prev_special:
                        frag = " " + frag
                    out.extend(self._spm_encode(frag.replace(" ", _SPACE)))
                    prev_special = False
        else:
            for frag in fragments:
                if isinstance(frag, int):
                    out.append(frag)
                else:
                    out.extend(self._bpe_encode(frag))
        if add_bos and self.add_eos:
            if self.eos_id is None:
                raise ValueError("the model asks for an EOS token but has none")
            out.append(self.eos_id)
        return out

    def token_bytes(self, token: int, special: bool = True) -> bytes:
        """The bytes of ``token`` (llama_token_to_piece with lstrip 0); control and unknown
        tokens give their text, or nothing when ``special`` is False."""
        if not 0 <= token < self.vocab_size:
            raise IndexError(f"token id {token} is outside the vocabulary (0..{self.vocab_size - 1})")
        if not special and self.attrs[token] & (ATTR_UNKNOWN | ATTR_CONTROL):
            return b""
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token)
        return piece

    def decode(self, tokens, special: bool = True) -> str:
        """The text of ``tokens``: their bytes joined, as utf-8 with errors="replace".

        As llama-cpp-python's ``Llama.detokenize``, a space that starts the text right after
        a leading BOS is dropped (the SentencePiece prefix space); with ``special`` the BOS
        text comes first, so this only matters for ``special=False``.
        """
        tokens = [int(t) for t in tokens]
        raw = b"".join(self.token_bytes(t, special) for t in tokens)
        if tokens and tokens[0] == self.bos_id and raw.startswith(b" "):
            raw = raw[1:]
        return raw.decode("utf-8", "replace")

    # ---- special tokens (tokenizer_st_partition)

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """``text`` as raw-text fragments and special token ids. Each special token, longest
        first, is cut out of every remaining raw fragment, leftmost occurrence first. Control
        and unknown tokens only when ``parse_special``; user-defined tokens always."""
        fragments: list[str | int] = [text]
        for tid in self._special_ids:
            if not parse_special and self.attrs[tid] & (ATTR_CONTROL | ATTR_UNKNOWN):
                continue
            piece = self.tokens[tid]
            if not any(isinstance(f, str) and piece in f for f in fragments):
                continue
            split: list[str | int] = []
            for frag in fragments:
                if isinstance(frag, int) or piece not in frag:
                    split.append(frag)
                    continue
                start = 0
                while (hit := frag.find(piece, start)) >= 0:
                    if hit > start:
                        split.append(frag[start:hit])
                    split.append(tid)
                    start = hit + len(piece)
                if start < len(frag):
                    split.append(frag[start:])
            fragments = split
        return fragments

    # ---- byte-level BPE (llm_tokenizer_bpe_session)

    def _bpe_encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for word in pre_tokenize(text, self._steps):
            ids = cache.get(word)
            if ids is None:
                if len(cache) > _WORD_CACHE_LIMIT:
                    cache.clear()
                ids = cache[word] = self._bpe_word(byte_encode(word))
            out.extend(ids)
        return out

    def _bpe_word(self, word: str) -> list[int]:
        """Merge the characters of one byte-encoded word, lowest merge rank first, ties to
        the leftmost pair; a result missing from the vocab falls back to single bytes."""
        token_to_id = self._token_to_id
        if self._ignore_merges and word in token_to_id:
            return [token_to_id[word]]
        if not word:
            return []
        syms = list(word)  # symbol text; "" once merged into its left neighbour
        n = len(syms)
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        ranks = self._ranks
        heap: list[tuple[int, int, int, str]] = []  # (rank, left, right, text)

        def add_bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            rank = ranks.get((syms[left], syms[right]))
            if rank is not None:
                heapq.heappush(heap, (rank, left, right, syms[left] + syms[right]))

        for i in range(1, n):
            add_bigram(i - 1, i)
        while heap:
            _, left, right, text = heapq.heappop(heap)
            if not syms[left] or not syms[right] or syms[left] + syms[right] != text:
                continue  # outdated
            syms[left], syms[right] = text, ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add_bigram(prv[left], left)
            add_bigram(left, nxt[left])

        out = []
        for sym in syms:
            if not sym:
                continue
            tid = token_to_id.get(sym)
            if tid is not None:
                out.append(tid)
                continue
            for b in sym.encode("utf-8", "surrogateescape"):  # unknown bytes are dropped
                tid = token_to_id.get(one_byte_text(b))
                if tid is not None:
                    out.append(tid)
        return out

    # ---- SentencePiece-style merging (llm_tokenizer_spm_session)

    def _spm_cut_pattern(self) -> re.Pattern:
        """Where the text may be cut into independent chunks: before a "▁" whose left
        neighbour c is not "▁" and no vocab token contains c + "▁". No merge can cross such a
        cut, so chunks tokenize alone and can be cached (Llama 2 vocabularies cut every word)."""
        before_space = {t[i - 1] for t in self.tokens for i in range(1, len(t)) if t[i] == _SPACE}
        before_space.add(_SPACE)
        excluded = "".join(f"\\U{ord(c):08x}" for c in sorted(before_space))
        return re.compile(f"(?<=[^{excluded}])(?={_SPACE})")

    def _spm_encode(self, text: str) -> list[int]:
        out: list[int] = []
        cache = self._word_cache
        for chunk in self._spm_cut.split(text):
            ids = cache.get(chunk)
            if ids is None:
                if len(cache) > _WORD_CACHE_LIMIT:
                    cache.clear()
                ids = cache[chunk] = self._spm_chunk(chunk)
            out.extend(ids)
        return out

    def _spm_chunk(self, text: str) -> list[int]:
        """Merge adjacent symbols whose concatenation is a token, highest score first, ties
        to the leftmost; symbols that are not tokens become <0xNN> byte tokens."""
        if not text:
            return []
        token_to_id, scores = self._token_to_id, self.scores
        n = len(text)
        start = list(range(n))  # (n,) first codepoint of each symbol
        size = [1] * n          # (n,) codepoints in each symbol; 0 once merged away
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        prv = list(range(-1, n - 1))
        heap: list[tuple[float, int, int, int]] = []  # (-score, left, right, size)

        def add_bigram(left: int, right: int) -> None:
            if left < 0 or right < 0:
                return
            both = size[left] + size[right]
            tid = token_to_id.get(text[start[left]:start[left] + both])
            if tid is not None:
                heapq.heappush(heap, (-scores[tid], left, right, both))

        for i in range(1, n):
            add_bigram(i - 1, i)
        while heap:
            _, left, right, both = heapq.heappop(heap)
            if not size[left] or not size[right] or size[left] + size[right] != both:
                continue  # outdated
            size[left], size[right] = both, 0
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prv[nxt[right]] = left
            add_bigram(prv[left], left)
            add_bigram(left, nxt[left])

        # llama.cpp's resegment() also looks merged symbols up in rev_merge, but every merged
        # symbol is a token; only single codepoints can miss, and those fall back to bytes.
        out = []
        i = 0
        while i >= 0:
            sym = text[start[i]:start[i] + size[i]]
            tid = token_to_id.get(sym)
            if tid is not None:
                out.append(tid)
            else:
                out.extend(self._byte_token(b) for b in sym.encode("utf-8", "surrogateescape"))
            i = nxt[i]
        return out

    def _byte_token(self, b: int) -> int:
        """llama_vocab::byte_to_token for SPM: <0xNN>, else the 1-byte text itself."""
        tid = self._token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = self._token_to_id.get(one_byte_text(b))
        if tid is None:
            raise ValueError(f"the vocabulary has no byte token for 0x{b:02X}")
        return tid

    # ---- pieces (llama_vocab::impl::token_to_piece, special = true)

    def _piece(self, token: int) -> bytes:
        text, attr = self.tokens[token], self.attrs[token]
        if attr & (ATTR_UNKNOWN | ATTR_CONTROL | ATTR_USER_DEFINED):
            return text.encode("utf-8", "surrogateescape")
        if attr & ATTR_NORMAL:
            if self.model == "llama":
                return text.replace(_SPACE, " ").encode("utf-8", "surrogateescape")
            return byte_decode(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""  # unused / undefined tokens print nothing


def why_not_tokenizer(model: str | None, pre: str | None) -> str:
    """Why this tokenizer cannot read a file whose header says ``tokenizer.ggml.model`` =
    ``model`` and ``tokenizer.ggml.pre`` = ``pre``, as a clause ("" when it can). The automatic
    engine choice asks it from the header alone (app/runtime/engines.py)."""
    if model not in ("gpt2", "llama"):
        return f"its tokenizer reads tokenizer.ggml.model 'gpt2' and 'llama', not {model!r}"
    if model == "gpt2" and (pre or "default") not in PRE_TOKENIZERS:
        return f"its tokenizer does not know the pre-tokenizer {pre!r}"
    return ""


def _detect_special_tokens(tokens: list[str], attrs: list[int],
                           special: dict[str, int | None]) -> set[int]:
    """Fill the EOT/EOM/FIM slots from token texts, mark control-looking tokens as control,
    and return the end-of-generation set (llama_vocab::impl::load, "auto-detect special
    tokens by text" and "special_eog_ids"). Updates ``attrs`` and ``special`` in place.

    llama.cpp walks an unordered_map; when a vocabulary holds two candidates for one FIM slot
    its pick is unspecified, ours is the lower id.
    """
    for tid, text in enumerate(tokens):
        if special["eot"] is None and text in _EOT_TEXTS:
            special["eot"] = tid
            attrs[tid] |= ATTR_CONTROL
        if special["eom"] is None and text == "<|eom_id|>":
            special["eom"] = tid
            attrs[tid] |= ATTR_CONTROL
        for slot, texts in _FIM_TEXTS.items():
            if special[slot] is None and text in texts:
                special[slot] = tid
                attrs[tid] |= ATTR_CONTROL
    # (llama.cpp also flags control tokens named "unused" as UNUSED; nothing here reads it.)
    eog = {special[s] for s in ("fim_pad", "fim_rep", "fim_sep") if special[s] is not None}
    for tid, text in enumerate(tokens):
        if text in _EOG_TEXTS:
            eog.add(tid)
            attrs[tid] |= ATTR_CONTROL
        if text in ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"):
            attrs[tid] = ATTR_USER_DEFINED  # gpt-oss: always rendered
    eog |= {special[s] for s in ("eos", "eot", "eom") if special[s] is not None}

    texts = {tokens[t]: t for t in eog}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if has_call and "<|end|>" in texts and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])  # o200k_harmony / solar-open: <|end|> is not an end
        attrs[texts["<|end|>"]] = ATTR_USER_DEFINED
    if ("<|tool_response>" in texts or "<|plamo:eos|>" in texts) and "</s>" in texts:
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = ATTR_NORMAL
    return eog
