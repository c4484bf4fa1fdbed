"""Weight-streaming benchmark of the QMatrix kernels ("performance is counted in bytes").

    python -m app.bench.quants types  [--threads 2] [--types Q4_1 Q8_0]   # GB/s per type
    python -m app.bench.quants model  [--threads 2]   # SmolLM2 decode weight stream vs llama.cpp

`types` cycles matvec over enough matrices (> L3) that weights come from DRAM, and reports
weight bytes per second; matmul (prefill, 64 tokens) reports weight bytes * tokens per second.
`model` runs every weight matrix of the default GGUF once per token (q, k, v, o, gate, up, down
per layer, then the tied output matrix) and compares tokens/s with llama.cpp's decode on the
same file and thread count. Timings are the best of several rounds. On a shared machine the
wall clock includes time the threads wait for a core, so CPU time per thread is printed as
well: the wall time the same work would take on idle cores.
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numba
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, quants

from app.engine.quant.qmatrix import QMatrix
from app.engine.quant.stream_probe import made_up_blocks

STREAM_BYTES = 64 << 20  # working set of `types`: twice the 32 MiB L3 here


def _random_matrix(qtype, n_out, n_in, rng) -> np.ndarray:
    """GGUF-layout random weights of one matrix (finite f16 scales)."""
    if qtype in (Q.Q4_0, Q.Q4_1, Q.Q8_0):
        return quants.quantize(rng.standard_normal((n_out, n_in)).astype(np.float32), qtype)
    if qtype == Q.F32:
        return rng.standard_normal((n_out, n_in)).astype(np.float32)
    if qtype in (Q.F16, Q.BF16):
        return rng.standard_normal((n_out, n_in)).astype(np.float16).view(np.uint16)
    return made_up_blocks(qtype, n_out, n_in, rng)


def _best_time(fn, rounds: int, reps: int, cpu: bool = False) -> float:
    """Best seconds per call of fn; with cpu, process CPU seconds divided by the threads."""
    clock = time.process_time if cpu else time.perf_counter
    scale = numba.get_num_threads() if cpu else 1
    fn()
    best = float("inf")
    for _ in range(rounds):
        t = clock()
        for _ in range(reps):
            fn()
        best = min(best, (clock() - t) / reps / scale)
    return best


def bench_types(n_out: int, n_in: int, n_tok: int, types: list[str] | None = None) -> None:
    rng = np.random.default_rng(0)
    print(f"threads={numba.get_num_threads()}  matrix {n_out}x{n_in}  working set {STREAM_BYTES >> 20} MiB")
    print(f"{'type':6} {'MB/matrix':>9} {'matvec GB/s':>12} {'(cpu)':>6} {'matmul GB/s':>12} {'(cpu)':>6}"
          f"  (matmul: weight bytes x {n_tok} tokens / s)")
    all_types = (Q.Q4_1, Q.Q8_0, Q.Q4_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.BF16, Q.F32)
    for qtype in [Q[t] for t in types] if types else all_types:
        m0 = QMatrix.from_array(_random_matrix(qtype, n_out, n_in, rng), qtype)
        n_copies = max(1, STREAM_BYTES // m0.nbytes)
        mats = [m0] + [QMatrix.from_array(_random_matrix(qtype, n_out, n_in, rng), qtype)
                       for _ in range(n_copies - 1)]
        x = rng.standard_normal(n_in).astype(np.float32)      # (n_in,) float32
        xs = rng.standard_normal((n_tok, n_in)).astype(np.float32)  # (n_tok, n_in) float32

        def run_matvec():
            for m in mats:
                m.matvec(x)

        t_mv = _best_time(run_matvec, rounds=7, reps=3) / len(mats)
        c_mv = _best_time(run_matvec, rounds=7, reps=3, cpu=True) / len(mats)
        t_mm = _best_time(lambda: m0.matmul(xs), rounds=5, reps=2)
        c_mm = _best_time(lambda: m0.matmul(xs), rounds=5, reps=2, cpu=True)
        gb = m0.nbytes / 1e9
        print(f"{qtype.name:6} {m0.nbytes / 1e6:9.2f} {gb / t_mv:12.2f} {gb / c_mv:6.2f}"
              f" {gb * n_tok / t_mm:12.2f} {gb * n_tok / c_mm:6.2f}")


def bench_model(path: Path, n_threads: int, n_gen: int, rounds: int = 40) -> None:
    reader = GGUFReader(str(path))
    t0 = time.perf_counter()
    mats = {t.name: QMatrix.from_tensor(t) for t in reader.tensors
            if len(t.shape) == 2 and int(t.shape[1]) > 1}
    load_s = time.perf_counter() - t0
    n_layer = 1 + max(int(n.split(".")[1]) for n in mats if n.startswith("blk."))
    order = [mats[f"blk.{i}.{w}.weight"] for i in range(n_layer)
             for w in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
    order.append(mats.get("output.weight", mats["token_embd.weight"]))   # tied output
    total = sum(m.nbytes for m in order)
    rng = np.random.default_rng(0)
    xs = {m.shape[1]: rng.standard_normal(m.shape[1]).astype(np.float32) for m in order}

    def ellm_token():
        for m in order:
            m.matvec(xs[m.shape[1]])

    llama_step = _llama_cpp_decoder(path, n_threads)
    ellm_token()
    # Alternate the two so that a busy neighbour slows both alike; keep each one's best.
    best = {"ellm": [float("inf")] * 2, "llama.cpp": [float("inf")] * 2}
    for _ in range(rounds):
        for name, step, n in (("ellm", ellm_token, 1), ("llama.cpp", llama_step, n_gen)):
            if step is None:
                continue
            w0, c0 = time.perf_counter(), time.process_time()
            step() if name == "ellm" else step(n)
            w1, c1 = time.perf_counter(), time.process_time()
            best[name][0] = min(best[name][0], (w1 - w0) / n)
            best[name][1] = min(best[name][1], (c1 - c0) / n / n_threads)
    print(f"{path.name}: {len(order)} matvecs/token, {total / 1e6:.1f} MB/token, repack {load_s:.2f} s, "
          f"threads={numba.get_num_threads()}, best of {rounds} alternating rounds")
    (tw, tc) = best["ellm"]
    print(f"  ellm kernels, weights only: wall {tw * 1e3:.2f} ms/token = {1 / tw:.1f} tok/s"
          f" = {total / tw / 1e9:.2f} GB/s; cpu/thread {tc * 1e3:.2f} ms = {1 / tc:.1f} tok/s"
          f" = {total / tc / 1e9:.2f} GB/s")
    by_type: dict[str, list] = {}
    for m in order:
        by_type.setdefault(m.qtype.name, []).append(m)
    for name, ms in by_type.items():
        nbytes = sum(m.nbytes for m in ms)
        t = _best_time(lambda: [m.matvec(xs[m.shape[1]]) for m in ms], rounds=10, reps=3, cpu=True)
        print(f"    {name}: {len(ms)} matrices, {nbytes / 1e6:.1f} MB, cpu/thread {t * 1e3:.2f} ms"
              f" = {nbytes / t / 1e9:.2f} GB/s")
    if llama_step is None:
        print("  llama-cpp-python not installed: no comparison")
        return
    (lw, lc) = best["llama.cpp"]
    print(f"  llama.cpp decode, whole model: wall {lw * 1e3:.2f} ms/token = {1 / lw:.1f} tok/s;"
          f" cpu/thread {lc * 1e3:.2f} ms = {1 / lc:.1f} tok/s")
    print(f"  ellm/llama.cpp speed: wall {lw / tw:.2f}, cpu {lc / tc:.2f}")


def _llama_cpp_decoder(path: Path, n_threads: int):
    """A function that runs n llama.cpp decode steps (as ellm's matvec path), or None."""
    try:
        from app.engine.llamacpp_backend import open_llama
    except ImportError:
        return None
    llm = open_llama(path, n_ctx=2048, n_threads=n_threads, n_threads_batch=n_threads,
                          n_batch=64, verbose=False)
    prompt = llm.tokenize(b"Once upon a time")

    def steps(n: int) -> None:
        if llm.n_tokens + n + 1 >= llm.n_ctx():
            llm.reset()
        if llm.n_tokens == 0:
            llm.eval(prompt)
        for _ in range(n):
            llm.eval([prompt[-1]])

    steps(1)
    return steps


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=("types", "model"))
    p.add_argument("--threads", type=int, default=numba.config.NUMBA_NUM_THREADS)
    p.add_argument("--n-out", type=int, default=1536)
    p.add_argument("--n-in", type=int, default=1536)
    p.add_argument("--n-tok", type=int, default=64)
    p.add_argument("--types", nargs="*", help="e.g. Q4_1 Q8_0 (default: all)")
    p.add_argument("--gguf", type=Path, default=None, help="GGUF file (default: the default model)")
    p.add_argument("--n-gen", type=int, default=8, help="llama.cpp decode steps per timed round")
    a = p.parse_args(argv)
    numba.set_num_threads(a.threads)
    if a.what == "types":
        bench_types(a.n_out, a.n_in, a.n_tok, a.types)
    else:
        from app.runtime.model_files import default_model_path

        bench_model(a.gguf or default_model_path(), a.threads, a.n_gen)


if __name__ == "__main__":
    main()
