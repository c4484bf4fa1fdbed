"""`ellm bench`: the measurement plumbing and the bytes-per-token accounting."""
from __future__ import annotations

import json

import pytest
from gguf import GGUFReader

from app.engine.kv.sizes import KVShape, kv_bytes_per_token
from app.engine.header.gguf_file import scan_gguf
from app.runtime.model_files import default_model_path


def test_weight_bytes_count_every_matrix_once_and_one_embedding_row():
    path = default_model_path()
    reader = GGUFReader(path, "r")
    all_bytes = sum(int(t.n_bytes) for t in reader.tensors)
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    # SmolLM2 ties its output to the embedding: the whole matrix is read for the logits.
    assert scan_gguf(path).weight_bytes_per_token() == all_bytes + int(embd.n_bytes) // 49152
    shape = KVShape.from_gguf(path)
    assert (shape.n_layers, shape.n_kv_heads, shape.key_length, shape.value_length) == (30, 3, 64, 64)
    assert kv_bytes_per_token(shape, "f16") == 2 * 30 * 3 * 64 * 2


def test_bench_llamacpp_json_and_plot(cli, tmp_path):
    out, png = tmp_path / "b.json", tmp_path / "b.png"
    rc, text, _ = cli("bench", "--engines", "llamacpp", "--contexts", "64,128", "--steps", "4",
                      "--json", str(out), "--plot", str(png))
    assert rc == 0 and "llamacpp" in text and "GB/s" in text
    report = json.loads(out.read_text())
    assert set(report) == {"machine", "results"} and report["machine"]["read_bandwidth_gb_s"] > 0
    assert report["machine"]["weight_stream_gb_s"] > 0
    assert [r["context"] for r in report["results"]] == [64, 128]
    for r in report["results"]:
        assert {"engine", "attention", "kv", "context", "prefill_tok_s", "decode_tok_s", "bytes_per_token",
                "gb_s"} <= set(r)
        assert r["prefill_tok_s"] > 0 and r["decode_tok_s"] > 0 and r["decode_steps"] == 4
        b = r["bytes_per_token"]
        assert b["total"] == b["weights"] + b["kv"] and b["kv"] == 2 * 30 * 3 * 64 * 2 * r["context"]
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_bench_rejects_unknown_engines(cli):
    rc, _, err = cli("bench", "--engines", "gpu")
    assert rc == 1 and "unknown engine 'gpu'" in err


def test_bench_ellm_pinned_and_unpinned_side_by_side(cli, tmp_path, no_bandwidth_probe):
    out = tmp_path / "pin.json"
    rc, text, _ = cli("bench", "--engines", "ellm", "--contexts", "32", "--steps", "3", "--pin", "on,off",
                      "--json", str(out))
    assert rc == 0
    rows = json.loads(out.read_text())["results"]
    assert [(r["engine"], r["pinned"]) for r in rows] == [("ellm", True), ("ellm", False)]
    assert all(r["decode_tok_s"] > 0 for r in rows)


def test_bench_rejects_a_bad_pin_choice(cli):
    rc, _, err = cli("bench", "--pin", "sometimes")
    assert rc == 1 and "--pin takes on, off or on,off" in err


@pytest.mark.parametrize("attention", ["sparse", "dense"])
def test_needle_folder_bench_reports_every_trial_and_both_references(attention):
    """The needle-in-a-folder bench end to end on two small documents (it had gone out of step
    with measure()'s return value unnoticed: nothing ran it); dense f16 too, whose caches are the
    blocked ones folder questions lay side by side."""
    from app.bench.needle import NeedleConfig, run_needle_folder

    cfg = NeedleConfig(default_model_path(), n_docs=2, tokens=2048, trials=2, kv="f16", decode_steps=3,
                       baseline_tokens=300, llamacpp_context=128, attention=attention)
    said = []
    report = run_needle_folder(cfg, progress=said.append).as_dict()
    assert [t["doc"] in (1, 2) and 0.05 <= t["depth"] <= 0.95 for t in report["trials"]] == [True, True]
    assert report["accuracy"] == sum(t["found"] for t in report["trials"]) / 2
    assert all(str(t["key"]) in t["answer"] for t in report["trials"] if t["found"])
    assert report["decode_tok_s"] > 0 and report["kv_read_bytes_per_token"] > 0
    assert report["baseline"]["tokens"] == 300 and 0 <= report["baseline"]["accuracy"] <= 1
    assert report["llamacpp"] == {"context": 128, "decode_tok_s": report["llamacpp"]["decode_tok_s"]}
    assert report["llamacpp"]["decode_tok_s"] > 0
    assert sum("dense reference, trial" in s for s in said) == 2


def test_needle_folder_bench_refuses_a_tiny_reference_or_no_trials(cli):
    rc, _, err = cli("bench", "--needle-folder", "2", "--tokens", "4096", "--baseline-tokens", "10")
    assert rc == 1 and "--baseline-tokens T needs at least 256 tokens" in err
    rc, _, err = cli("bench", "--needle-folder", "2", "--tokens", "4096", "--trials", "0")
    assert rc == 1 and "--trials must be at least 1, not 0" in err
