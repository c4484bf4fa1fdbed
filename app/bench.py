"""``ellm bench``: both engines side by side on one model, machine and context.

For each engine and context length: prefill tokens/s, decode tokens/s (median
of the per-step times), the bytes read per decoded token (weights, KV cache,
metadata) and the achieved GB/s, beside the machine's measured read bandwidth.
Decode speed on a CPU is bandwidth / bytes moved per token (DESIGN.md), so the
bytes column says where the time goes.
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from app.engine.backend import SamplingParams

# Plain prose so that both tokenizers see ordinary text; deterministic.
_FILLER = (
    "The river runs past the old mill and under the stone bridge. Farmers bring their grain to the "
    "market on Tuesdays, and the baker sells bread by the fountain. In the evening the lamps are lit "
    "along the harbour, and the boats come home with the tide. "
)


@dataclass(frozen=True)
class BenchConfig:
    model_path: Path
    engines: tuple[str, ...] = ("ellm", "llamacpp")
    contexts: tuple[int, ...] = (512,)
    decode_steps: int = 32
    threads: int = 0
    kv: str = "f16"
    attention: str = "dense"
    pinning: tuple[bool, ...] = (True,)  # ellm only: threads pinned one per CPU, or left to the OS


@dataclass
class BenchResult:
    engine: str
    attention: str
    kv: str
    context: int
    prefill_tok_s: float
    decode_tok_s: float
    bytes_per_token: dict
    gb_s: float
    decode_steps: int
    pinned: bool | None = None  # None: the engine places its own threads (llama.cpp)
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "attention": self.attention, "kv": self.kv, "context": self.context,
                "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": round(self.decode_tok_s, 2),
                "bytes_per_token": self.bytes_per_token, "gb_s": round(self.gb_s, 3),
                "decode_steps": self.decode_steps, "pinned": self.pinned, "notes": self.notes}


# ---- Bytes per token ------------------------------------------------------------


def model_bytes(model_path: Path) -> dict:
    """Weight bytes one decode step reads: every 2-D weight once, except the token
    embedding, of which one row is read — unless the output reuses it (tied)."""
    from gguf import GGUFReader

    reader = GGUFReader(model_path, "r")
    names = {t.name for t in reader.tensors}
    total = 0
    for t in reader.tensors:
        if t.name == "token_embd.weight":
            rows = int(t.shape[-1])
            total += int(t.n_bytes) // rows  # one row
            if "output.weight" not in names:
                total += int(t.n_bytes)  # tied output matrix
        else:
            total += int(t.n_bytes)
    return {"weights": total}


def kv_bytes_per_token(model_path: Path, kv: str) -> int:
    """KV bytes each cached token adds (the engine's KV calculator, from GGUF metadata)."""
    from app.engine.kvcalc import KVShape, kv_bytes_per_token as per_token

    return per_token(KVShape.from_gguf(model_path), kv)


def read_bandwidth_gb_s() -> float:
    """The machine's multi-threaded read bandwidth (best of the engine's probe)."""
    from app.engine.bandwidth import probe_read_bandwidth

    return probe_read_bandwidth().best_gb_s


# ---- Measuring ----------------------------------------------------------------------


def filler_prompt(backend, n_tokens: int) -> list[int]:
    """Exactly ``n_tokens`` tokens of prose (BOS first)."""
    text = _FILLER * (n_tokens // 40 + 2)
    tokens = backend.tokenize(text, add_bos=True, special=False)
    while len(tokens) < n_tokens:
        text += _FILLER * (n_tokens // 40 + 2)
        tokens = backend.tokenize(text, add_bos=True, special=False)
    return tokens[:n_tokens]


def measure(backend, context: int, steps: int) -> tuple[float, float, int]:
    """(prefill tok/s, decode tok/s median over steps, steps done) at ``context``."""
    prompt = filler_prompt(backend, context)
    params = replace(SamplingParams.make_greedy(steps), ignore_eos=True)
    stamps = []
    t0 = time.perf_counter()
    for _ in backend.generate(prompt, params):
        stamps.append(time.perf_counter())
    prefill = context / (stamps[0] - t0)
    steps_s = np.diff(stamps)  # (steps - 1,) seconds per decode step
    decode = 1.0 / statistics.median(steps_s) if len(steps_s) else 0.0
    return prefill, decode, len(stamps)


def open_engine(engine: str, model_path: Path, n_ctx: int, threads: int, pin: bool = True):
    if engine == "llamacpp":
        from app.engine.llamacpp_backend import LlamaCppBackend

        return LlamaCppBackend(str(model_path), n_ctx=n_ctx, n_threads=threads)
    from app.engine.ellm_backend import EllmBackend

    return EllmBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, pin=pin)


def run_bench(cfg: BenchConfig, progress=None) -> dict:
    from app.backends import default_threads

    threads = cfg.threads or default_threads()
    meta = model_bytes(cfg.model_path)
    kv_per_token = kv_bytes_per_token(cfg.model_path, cfg.kv)
    bandwidth = read_bandwidth_gb_s()
    machine = {"cpu": _cpu_model(), "platform": platform.platform(), "threads": threads,
               "read_bandwidth_gb_s": round(bandwidth, 2), "model": cfg.model_path.name}
    results = []
    n_ctx = max(cfg.contexts) + cfg.decode_steps + 64
    runs = [(e, p) for e in cfg.engines for p in (cfg.pinning if e == "ellm" else (None,))]
    for engine, pin in runs:
        backend = open_engine(engine, cfg.model_path, n_ctx, threads, pin is not False)
        measure(backend, min(64, min(cfg.contexts)), 4)  # warm-up: JIT, caches, page faults
        for context in cfg.contexts:
            if progress:
                progress(f"{engine}{'' if pin is None else (' pinned' if pin else ' unpinned')}: "
                         f"{context} tokens of context")
            prefill, decode, steps = measure(backend, context, cfg.decode_steps)
            kv = kv_per_token * context
            bpt = {"weights": meta["weights"], "kv": kv, "metadata": 0, "total": meta["weights"] + kv}
            results.append(BenchResult(engine, cfg.attention, cfg.kv, context, prefill, decode, bpt,
                                       bpt["total"] * decode / 1e9, steps, pin))
        backend.close()
    return {"machine": machine, "results": [r.as_dict() for r in results]}


def _cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


# ---- Reporting ------------------------------------------------------------------------


def format_table(report: dict) -> str:
    m = report["machine"]
    lines = [f"{m['model']} on {m['cpu']}, {m['threads']} threads; "
             f"measured read bandwidth {m['read_bandwidth_gb_s']:.1f} GB/s", ""]
    head = f"{'engine':<9} {'pin':<4} {'attn':<6} {'kv':<5} {'context':>7} {'prefill t/s':>11} {'decode t/s':>10} " \
           f"{'MB/token':>9} {'(weights':>9} {'kv)':>7} {'GB/s':>6}"
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        b = r["bytes_per_token"]
        pin = {True: "yes", False: "no"}.get(r.get("pinned"), "-")
        lines.append(f"{r['engine']:<9} {pin:<4} {r['attention']:<6} {r['kv']:<5} {r['context']:>7} "
                     f"{r['prefill_tok_s']:>11.1f} {r['decode_tok_s']:>10.1f} {b['total'] / 1e6:>9.1f} "
                     f"{b['weights'] / 1e6:>9.1f} {b['kv'] / 1e6:>7.1f} {r['gb_s']:>6.2f}")
    # Ratios against llama.cpp at the same context.
    ref = {(r["context"]): r for r in report["results"] if r["engine"] == "llamacpp"}
    ratios = []
    for r in report["results"]:
        base = ref.get(r["context"])
        if r["engine"] != "llamacpp" and base and base["decode_tok_s"] and base["prefill_tok_s"]:
            which = "" if r.get("pinned") is not False else " (unpinned)"
            ratios.append(f"{r['engine']}{which}/llamacpp at {r['context']}: decode "
                          f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}x, prefill "
                          f"{r['prefill_tok_s'] / base['prefill_tok_s']:.2f}x")
    if ratios:
        lines += [""] + ratios
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for engine in sorted({r["engine"] for r in report["results"]}):
        rows = [r for r in report["results"] if r["engine"] == engine]
        xs = [r["context"] for r in rows]
        ax1.plot(xs, [r["decode_tok_s"] for r in rows], marker="o", label=engine)
        ax2.plot(xs, [r["prefill_tok_s"] for r in rows], marker="o", label=engine)
    for ax, title in ((ax1, "decode tokens/s"), (ax2, "prefill tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend()
    fig.suptitle(f"{report['machine']['model']}, {report['machine']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
