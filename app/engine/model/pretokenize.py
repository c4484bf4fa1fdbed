"""Pre-tokenization for byte-level BPE, as llama.cpp does it (src/unicode.cpp, src/llama-vocab.cpp):
Unicode classes, the regex splits that ``tokenizer.ggml.pre`` selects, and the byte-level
alphabet (``unicode_byte_to_utf8_map``) that BPE tokens are spelled in.
"""
from __future__ import annotations

import re
import unicodedata

# ---- Unicode classes (src/unicode.cpp, tables from scripts/gen-unicode-data.py)
#
# llama.cpp classifies codepoints with its own tables, generated from UnicodeData.txt 15.1.
# We use `unicodedata` and add the codepoints assigned in Unicode 15.0/15.1 when the running
# Python is older (3.11 ships 14.0). On a Python whose Unicode is newer than 15.1, codepoints
# assigned after 15.1 would be classed by their new category where llama.cpp sees "undefined".

_WHITESPACE = frozenset([*range(0x09, 0x0E), 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B),
                         0x2028, 0x2029, 0x202F, 0x205F, 0x3000])  # gen-unicode-data.py's list

# (first, last, category letter): the difference between unicodedata 14.0 and llama.cpp's
# unicode-data.cpp; every entry is a codepoint that was unassigned in 14.0.
_UNICODE_15_1_ADDITIONS = (
    (0x0CF3, 0x0CF3, "M"), (0x0ECE, 0x0ECE, "M"), (0x2FFC, 0x2FFF, "S"), (0x31EF, 0x31EF, "S"),
    (0x10EFD, 0x10EFF, "M"), (0x1123F, 0x11240, "L"), (0x11241, 0x11241, "M"),
    (0x11B00, 0x11B09, "P"), (0x11F00, 0x11F01, "M"), (0x11F02, 0x11F02, "L"),
    (0x11F03, 0x11F03, "M"), (0x11F04, 0x11F10, "L"), (0x11F12, 0x11F33, "L"),
    (0x11F34, 0x11F3A, "M"), (0x11F3E, 0x11F42, "M"), (0x11F43, 0x11F4F, "P"),
    (0x11F50, 0x11F59, "N"), (0x1342F, 0x1342F, "L"), (0x13439, 0x1343F, "C"),
    (0x13440, 0x13440, "M"), (0x13441, 0x13446, "L"), (0x13447, 0x13455, "M"),
    (0x1B132, 0x1B132, "L"), (0x1B155, 0x1B155, "L"), (0x1D2C0, 0x1D2D3, "N"),
    (0x1DF25, 0x1DF2A, "L"), (0x1E030, 0x1E06D, "L"), (0x1E08F, 0x1E08F, "M"),
    (0x1E4D0, 0x1E4EB, "L"), (0x1E4EC, 0x1E4EF, "M"), (0x1E4F0, 0x1E4F9, "N"),
    (0x1F6DC, 0x1F6DC, "S"), (0x1F774, 0x1F776, "S"), (0x1F77B, 0x1F77F, "S"),
    (0x1F7D9, 0x1F7D9, "S"), (0x1FA75, 0x1FA77, "S"), (0x1FA87, 0x1FA88, "S"),
    (0x1FAAD, 0x1FAAF, "S"), (0x1FABB, 0x1FABD, "S"), (0x1FABF, 0x1FABF, "S"),
    (0x1FACE, 0x1FACF, "S"), (0x1FADA, 0x1FADB, "S"), (0x1FAE8, 0x1FAE8, "S"),
    (0x1FAF7, 0x1FAF8, "S"), (0x2B739, 0x2B739, "L"), (0x2EBF0, 0x2EE5D, "L"),
    (0x31350, 0x323AF, "L"),
)
_NEEDS_15_1 = tuple(map(int, unicodedata.unidata_version.split("."))) < (15, 1, 0)

# The pre-tokenizer patterns run on a "collapsed" copy of the text (the idea of llama.cpp's
# unicode_regex_split): ASCII stays itself, a non-ASCII whitespace becomes \x0b, any other
# non-ASCII codepoint becomes one private-use character per class. One character in, one
# out, so match offsets index the original text.
_COLLAPSED = {"L": "\ue001", "N": "\ue002", "P": "\ue003", "M": "\ue004", "S": "\ue005"}
_COLLAPSED_OTHER = "\ue006"  # controls, separators that are not whitespace, unassigned


def _category_letter(cpt: int) -> str:
    """First letter of the Unicode category llama.cpp's tables give ``cpt``."""
    if _NEEDS_15_1 and cpt >= 0x0CF3:
        for first, last, cat in _UNICODE_15_1_ADDITIONS:
            if first <= cpt <= last:
                return cat
    return unicodedata.category(chr(cpt))[0]


class _CollapseTable(dict):
    """codepoint -> collapsed character, for ``str.translate``; filled on first sight."""

    def __missing__(self, cpt: int) -> str:
        if cpt < 0x80:
            ch = chr(cpt)
        elif cpt in _WHITESPACE:
            ch = "\x0b"
        else:
            ch = _COLLAPSED.get(_category_letter(cpt), _COLLAPSED_OTHER)
        self[cpt] = ch
        return ch


_COLLAPSE = _CollapseTable()


def _collapse(text: str) -> str:
    return text if text.isascii() else text.translate(_COLLAPSE)


# ---- Pre-tokenizers (llm_tokenizer_bpe constructor, unicode_regex_split)
#
# Character classes over the collapsed text. \s is llama.cpp's whitespace set; ASCII has no
# \p{M}, and \p{P} / \p{S} in ASCII are the lists of unicode_regex_split's k_ucat_map.
_WS = "\\t\\n\\x0b\\x0c\\r "
_L = "A-Za-z" + _COLLAPSED["L"]
_N = "0-9" + _COLLAPSED["N"]
_P = "!-#%-*,-/:;?@\\[-\\]_{}" + _COLLAPSED["P"]

# The custom splitters (unicode_regex_split_custom_gpt2 / _llama3 / _qwen2) walk the text by
# hand; each alternative below is one of their branches, in their order. Their "\s+(?!\S)"
# leaves the last space of a run for the next word, and a run at the end of a segment whole.
_WS_TAIL = f"|[{_WS}]+(?![^{_WS}])|[{_WS}]+"
_GPT2 = f"'s|'t|'re|'ve|'m|'ll|'d| ?[{_L}]+| ?[{_N}]+| ?[^{_WS}{_L}{_N}]+" + _WS_TAIL
_CONTRACTIONS_ANY_CASE = "'[sStTmMdD]|'(?:[rR][eE]|[vV][eE]|[lL][lL])"
_LLAMA3 = (f"{_CONTRACTIONS_ANY_CASE}|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]{{1,3}}"
           f"| ?[^{_WS}{_L}{_N}]+[\\r\\n]*|[{_WS}]*[\\r\\n]+" + _WS_TAIL)
_QWEN2 = (f"{_CONTRACTIONS_ANY_CASE}|[^\\r\\n{_L}{_N}]?[{_L}]+|[{_N}]"
          f"| ?[^{_WS}{_L}{_N}]+[\\r\\n]*|[{_WS}]*[\\r\\n]+" + _WS_TAIL)
# The rest go through std::regex on llama.cpp's own collapsed text.
_DIGIT = f"[{_N}]"                                   # "\p{N}"
_DIGITS = f"[{_N}]+"                                 # "\p{N}+"
_THREE_ASCII_DIGITS = "[0-9][0-9][0-9]"              # "[0-9][0-9][0-9]"
_PUNCT_RUN = f"[{_P}$+<=>^~|]+"                      # "[\p{P}\$\+<=>\^~\|]+"

_DEFAULT_STEPS = (_PUNCT_RUN, _GPT2, _DIGITS, _THREE_ASCII_DIGITS)
_SMOLLM_STEPS = (_DIGIT, _GPT2)

# tokenizer.ggml.pre -> (patterns applied in turn, ignore_merges, add_bos default)
PRE_TOKENIZERS = {
    "default": (_DEFAULT_STEPS, False, False),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo"), ((_GPT2,), False, False)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                     "minerva", "mellum2"), (_SMOLLM_STEPS, False, False)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2"), ((_QWEN2,), False, False)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral",
                     "midm-2.0", "lfm2"), ((_LLAMA3,), True, True)),
    **dict.fromkeys(("dbrx", "smaug-bpe"), ((_LLAMA3,), False, False)),
}
_COMPILED: dict[str, re.Pattern] = {}


def compiled(pattern: str) -> re.Pattern:
    if pattern not in _COMPILED:
        _COMPILED[pattern] = re.compile(pattern)
    return _COMPILED[pattern]


def pre_tokenize(text: str, steps: tuple[re.Pattern, ...]) -> list[str]:
    """Words of ``text``: each pattern splits every segment of the previous one into its
    matches and the gaps between them (unicode_regex_split's offsets)."""
    collapsed = _collapse(text)
    bounds = [(0, len(text))]
    for pattern in steps:
        split = []
        for start, end in bounds:
            last = start
            for m in pattern.finditer(collapsed, start, end):
                a, b = m.span()
                if a > last:
                    split.append((last, a))
                split.append((a, b))
                last = b
            if last < end:
                split.append((last, end))
        bounds = split
    return [text[a:b] for a, b in bounds]


# ---- Byte-level encoding (unicode_byte_to_utf8_map): every byte is a printable character

def _bytes_to_unicode() -> list[str]:
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars = [""] * 256
    extra = 0
    for b in range(256):
        if b in printable:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


BYTE_CHARS = _bytes_to_unicode()                           # byte -> character
BYTE_OF_CHAR = {c: b for b, c in enumerate(BYTE_CHARS)}   # character -> byte
_LATIN1_TO_BYTE_CHARS = {b: c for b, c in enumerate(BYTE_CHARS)}  # for str.translate


def byte_encode(word: str) -> str:
    return word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHARS)


def one_byte_text(b: int) -> str:
    """The vocab key of the 1-byte string ``bytes([b])`` (token texts use surrogateescape)."""
    return chr(b) if b < 0x80 else chr(0xDC00 + b)




def byte_decode(text: str) -> bytes:
    """llama_decode_text: byte-level characters back to bytes."""
    out = bytearray()
    for ch in text:
        b = BYTE_OF_CHAR.get(ch)
        if b is not None:
            out.append(b)
        else:
            utf8_hex = ch.encode("utf-8", "surrogateescape").hex().encode()
            out += b"[UNK_BYTE_0x" + utf8_hex + text.encode("utf-8", "surrogateescape") + b"]"
    return bytes(out)
