"""numba's kernel cache sits in a folder keyed on the engine's sources (app/engine/kernel_cache.py)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from app.engine.kernel_cache import BASE_VARIABLE, source_key


def test_the_key_follows_every_source_file(tmp_path):
    (tmp_path / "ops").mkdir()
    (tmp_path / "ops" / "expf.py").write_text("A = 1\n")
    (tmp_path / "kernel.py").write_text("from .ops.expf import A\n")
    first = source_key(tmp_path)
    assert source_key(tmp_path) == first and len(first) == 16
    (tmp_path / "ops" / "expf.py").write_text("A = 2\n")   # a file the kernel only inlines from
    assert source_key(tmp_path) != first
    (tmp_path / "ops" / "expf.py").write_text("A = 1\n")
    (tmp_path / "ops" / "expf.py").rename(tmp_path / "ops" / "exp.py")   # the same bytes, renamed
    assert source_key(tmp_path) != first


def _cache_dir_of_a_fresh_process(env: dict) -> str:
    code = ("import numba, app.engine.ops.expf, os; "
            "print(numba.config.CACHE_DIR); print(os.environ['NUMBA_CACHE_DIR'])")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2]).stdout.split()
    assert out[0] == out[1]
    return out[0]


def test_numba_is_pointed_at_the_keyed_folder_here_and_in_child_processes(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("NUMBA_CACHE_DIR", BASE_VARIABLE)}
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    key = source_key()
    assert _cache_dir_of_a_fresh_process(env) == str(tmp_path / "xdg" / "ellm" / "kernels" / key)
    mine = {**env, "NUMBA_CACHE_DIR": str(tmp_path / "mine")}      # a person's own choice: the base
    assert _cache_dir_of_a_fresh_process(mine) == str(tmp_path / "mine" / key)
    # a child inherits NUMBA_CACHE_DIR set to the keyed folder and the base: the same folder, not nested
    child = {**env, "NUMBA_CACHE_DIR": str(tmp_path / "mine" / key), BASE_VARIABLE: str(tmp_path / "mine")}
    assert _cache_dir_of_a_fresh_process(child) == str(tmp_path / "mine" / key)


# A prompt read into the blocked cache, then two greedy steps: prints the logits' hash and whether
# the gather and decode kernels came from numba's cache.
_READ_AND_ANSWER = """
import hashlib, sys
import numpy as np
from app.engine.attention import blocks
from app.engine.attention.config import SparseConfig
from app.engine.attention.state import AttentionState
from app.engine.generate import decode_one_token, prefill
from app.engine.kv.formats import KVSpec
from app.engine.model.transformer import Model
model = Model(sys.argv[1])
cache = model.new_cache(512, KVSpec.parse("k8v4", block=16))
state = AttentionState(SparseConfig(mode="sparse-decode"))
logits = prefill(model, cache, list(range(3, 203)), chunk=48, state=state)
seen = [np.asarray(logits).tobytes()]
for _ in range(2):
    logits = decode_one_token(model, cache, int(np.argmax(logits)), state)
    seen.append(np.asarray(logits).tobytes())
print(hashlib.sha256(b"".join(seen)).hexdigest())
print(sum(blocks._gather.stats.cache_hits.values()), sum(blocks._decode_kernel.stats.cache_hits.values()))
"""


def test_a_kernel_loaded_from_the_cache_computes_what_a_fresh_one_does(tmp_path, tiny_model):
    """numba optimizes a parallel kernel loaded from its cache again when it links it, so a fastmath
    kernel can compute other bits than the one the process compiled (docs/engine.md, "Kernels
    loaded from the cache"): a prompt read and answered by kernels compiled in the process, then by
    the same kernels loaded from the cache, gives the same logits."""
    model = tiny_model("llama", head_dim=64)
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    env[BASE_VARIABLE] = str(tmp_path / "kernels")      # an empty cache: the first process compiles
    runs = [subprocess.run([sys.executable, "-c", _READ_AND_ANSWER, str(model)], env=env, capture_output=True,
                           text=True, check=True, cwd=Path(__file__).resolve().parents[2]).stdout.split()
            for _ in range(2)]
    (fresh, fresh_hits, _), (cached, gather_hits, decode_hits) = (r[:3] for r in runs)
    assert fresh_hits == "0" and gather_hits != "0" and decode_hits != "0"   # compiled, then loaded
    assert fresh == cached
