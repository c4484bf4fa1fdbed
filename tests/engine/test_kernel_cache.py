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
