"""Repacked weights kept between starts (app/engine/quant/planes_file.py): a second start maps
the planes the first wrote and computes the same products; a damaged, truncated or foreign file
is deleted and rebuilt, never used; the layout version is pinned to the layouts themselves."""
from __future__ import annotations

import hashlib
import json
import logging
import struct
from dataclasses import replace

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from app.engine.header.gguf_file import model_fingerprint
from app.engine.model.transformer import Model
from app.engine.quant import planes_file, qmatrix
from app.engine.quant.formats import FORMATS
from app.engine.quant.planes_file import LAYOUT_VERSION, MAGIC, PlanesFile, read
from tests.engine.tiny_gguf import QWEN2, TinySpec, smollm2_path, write_tiny_model

pytestmark = pytest.mark.skipif(smollm2_path() is None, reason="the tiny models take SmolLM2's tokenizer")


def tiny(tmp_path, qtype: Q):
    spec = TinySpec(**QWEN2, qtype=qtype, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512, n_vocab=2048)
    return write_tiny_model(tmp_path / f"tiny-{qtype.name}.gguf", spec)


GGUF_NAMES = {"wq": "attn_q", "wk": "attn_k", "wv": "attn_v", "wo": "attn_output", "w_gate": "ffn_gate",
              "w_up": "ffn_up", "w_down": "ffn_down"}


def matrices(model: Model) -> dict:
    """The model's matrices by their GGUF tensor names."""
    out = {"token_embd.weight": model.tok_embd, "output.weight": model.output}
    for i, layer in enumerate(model.layers):
        for field, name in GGUF_NAMES.items():
            out[f"blk.{i}.{name}.weight"] = getattr(layer, field)
    return out


def same_products(a: Model, b: Model) -> None:
    rng = np.random.default_rng(1)
    for name, m in matrices(a).items():
        other = matrices(b)[name]
        x = rng.standard_normal((5, m.shape[1])).astype(np.float32)     # (5, n_in) float32
        assert np.array_equal(m.matmul(x), other.matmul(x)), name
        assert np.array_equal(m.matvec(x[0]), other.matvec(x[0])), name
        assert np.array_equal(m.rows([0, 3]), other.rows([0, 3])), name


def the_file(folder, path):
    [f] = folder.glob("*.planes")
    assert f.name == planes_file.file_name(path, model_fingerprint(path))
    return f


def refuse(raw, n_out, n_in):
    raise AssertionError("repacked again")


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q8_0])
def test_a_second_start_maps_the_planes_the_first_start_wrote(tmp_path, qtype, monkeypatch):
    path = tiny(tmp_path, qtype)
    folder = tmp_path / "planes"
    first = Model(path, folder)
    assert first.planes_source == "repacked"
    kept = read(the_file(folder, path), model_fingerprint(path))
    assert set(kept) == set(matrices(first))
    monkeypatch.setattr(qmatrix, "FORMATS", {k: replace(f, repack=refuse) for k, f in FORMATS.items()})  # nothing repacked now
    second = Model(path, folder)
    assert second.planes_source == "file"
    for name, m in matrices(second).items():
        assert (kept[name].qtype, kept[name].shape) == (int(qtype), m.shape)
        assert all(isinstance(p.base, np.memmap) for p in m.planes.values()), name
    monkeypatch.undo()
    same_products(first, second)
    same_products(Model(path), second)          # and the same as with no file at all


def plane_offset(f) -> int:
    """Where the data of the first kept plane starts in the file."""
    raw = f.read_bytes()
    n = struct.unpack("<Q", raw[len(MAGIC):len(MAGIC) + 8])[0]
    header = json.loads(raw[len(MAGIC) + 12:len(MAGIC) + 12 + n])
    start = -(-(len(MAGIC) + 12 + n) // planes_file.ALIGN) * planes_file.ALIGN
    first = next(iter(header["tensors"].values()))
    return start + next(iter(first["planes"].values()))["offset"]


@pytest.mark.parametrize("damage", ["truncated", "plane byte", "header byte", "empty"])
def test_a_damaged_file_is_deleted_and_rebuilt_never_used(tmp_path, damage, caplog):
    path = tiny(tmp_path, Q.Q8_0)
    folder = tmp_path / "planes"
    good = Model(path, folder)
    f = the_file(folder, path)
    data = bytearray(f.read_bytes())
    if damage == "truncated":
        data = data[:-100]
    elif damage == "plane byte":
        data[plane_offset(f) + 7] ^= 0xFF
    elif damage == "header byte":
        data[len(MAGIC) + 12 + 30] ^= 0x01
    else:
        data = bytearray()
    f.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING):
        again = Model(path, folder)
    assert again.planes_source == "repacked"
    assert "rebuilding the repacked weights" in caplog.text and f.name in caplog.text
    same_products(good, again)
    assert Model(path, folder).planes_source == "file", "the rebuilt file is whole"
    read(the_file(folder, path), model_fingerprint(path))


def test_another_layout_version_writes_a_new_file_and_removes_the_old(tmp_path, monkeypatch):
    path = tiny(tmp_path, Q.Q8_0)
    folder = tmp_path / "planes"
    Model(path, folder)
    old = the_file(folder, path)
    (tmp_path / "other").mkdir()
    Model(tiny(tmp_path / "other", Q.Q4_0), folder)        # another model's file stays
    monkeypatch.setattr(planes_file, "LAYOUT_VERSION", LAYOUT_VERSION + 1)
    assert Model(path, folder).planes_source == "repacked"
    names = sorted(p.name for p in folder.glob("*.planes"))
    assert old.name not in names and len(names) == 2
    assert any(f"-v{LAYOUT_VERSION + 1}-" in n for n in names)


def test_an_unwritable_folder_costs_the_next_start_its_repack_only(tmp_path, caplog):
    path = tiny(tmp_path, Q.Q8_0)
    blocked = tmp_path / "planes"
    blocked.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING):
        m = Model(path, blocked)
    assert m.planes_source == "repacked" and "could not keep the repacked weights" in caplog.text
    assert PlanesFile(tmp_path / "nowhere", path, model_fingerprint(path)).load() is None


# What every repack gives for fixed bytes (the generic kernels' layouts and AVX2's Q4_K groups of
# 8 rows; AVX2's Q6_K reads the GGUF blocks as they are). If this fails because a layout changed
# on purpose, bump planes_file.LAYOUT_VERSION (files of the old layout must not be mapped) and
# record the new digests here.
LAYOUT_DIGESTS = {
    "F32": "fe4ed210c5f2444b", "F16": "698e7a31f82aa370", "BF16": "8f15fec1d8e6baa6", "Q4_0": "d6ce4d030de42ee1",
    "Q4_1": "fc8b0ed2078ba8cb", "Q5_0": "3115170cf3815143", "Q5_1": "e8b55acf4eebddce", "Q8_0": "31c7433076284415",
    "Q2_K": "de98d866a917fbf6", "Q3_K": "141e1b3a4231be6d", "Q4_K": "06accf53b54e87ee", "Q5_K": "1b8d52211bc83a18",
    "Q6_K": "cedba08c240dca24", "IQ4_NL": "41a1f308d184a9d9", "IQ4_XS": "9e870507e6b4067c", "Q4_K x8": "525418ea7ff1c150",
}


def layout_digest(qtype: Q, repack) -> str:
    rng = np.random.default_rng(int(qtype))
    n_out, n_in = 40, 512                      # a partial row group of 16 and of 8
    if qtype in (Q.F32, Q.F16, Q.BF16):
        raw = rng.integers(0, 1 << 14, (n_out, n_in)).astype({Q.F32: np.float32, Q.F16: np.float16,
                                                              Q.BF16: np.uint16}[qtype])
    else:
        block, size = GGML_QUANT_SIZES[qtype]
        raw = rng.integers(0, 256, (n_out, n_in // block * size), dtype=np.uint8)
    h = hashlib.sha256()
    for name, plane in sorted(repack(raw, n_out, n_in).items()):
        h.update(name.encode() + np.ascontiguousarray(plane).tobytes())
    return h.hexdigest()[:16]


def test_the_layout_version_is_bumped_with_any_layout_change():
    from app.engine.quant import kquants, q4k_x8

    repacks = {q.name: (q, f.repack) for q, f in FORMATS.items()}
    repacks.update({"Q4_K": (Q.Q4_K, kquants.repack_q4_k), "Q6_K": (Q.Q6_K, kquants.repack_q6_k),
                    "Q4_K x8": (Q.Q4_K, q4k_x8.repack_q4_k_x8)})
    digests = {name: layout_digest(q, f) for name, (q, f) in repacks.items()}
    assert digests == LAYOUT_DIGESTS
