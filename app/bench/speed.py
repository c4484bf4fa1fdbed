"""``ellm bench``: both engines side by side on one model, machine and context.

For each engine, KV format, attention mode and context length: prefill tokens/s, decode
tokens/s (median of the per-step times), the bytes read per decoded token (weights, KV cache,
metadata) and the achieved GB/s, beside the machine's measured read bandwidth. Decode speed on
a CPU is bandwidth / bytes moved per token (docs/ARCHITECTURE.md), so the bytes column says where the
time goes. llama.cpp with its f16 cache and dense attention is the baseline every other
result is divided by, per context.

Also here, because the command line and the settings dialog both run it: the KV quality
probe of one document (``ellm kv-probe``).
"""
from __future__ import annotations

import platform
import statistics
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from app.engine.backend import SamplingParams
from app.engine.kv.sizes import LLAMACPP_KV_TYPES, KVShape
from app.engine.model.gguf_file import scan_gguf

if TYPE_CHECKING:
    from app.engine.attention.config import SparseConfig

# Plain prose so that both tokenizers see ordinary text; deterministic.
_FILLER = (
    "The river runs past the old mill and under the stone bridge. Farmers bring their grain to the "
    "market on Tuesdays, and the baker sells bread by the fountain. In the evening the lamps are lit "
    "along the harbour, and the boats come home with the tide. "
)

BASELINE = ("llamacpp", "f16", "dense")   # (engine, kv, attention) every result is compared with


@dataclass(frozen=True)
class BenchConfig:
    model_path: Path
    engines: tuple[str, ...] = ("ellm", "llamacpp")
    contexts: tuple[int, ...] = (512,)
    decode_steps: int = 32
    threads: int = 0
    kvs: tuple[str, ...] = ("f16",)
    attentions: tuple[str, ...] = ("dense",)
    sparse: SparseConfig | None = None   # the sparse runs' options (None: the engine's defaults)
    pinning: tuple[bool, ...] = (True,)  # ellm only: threads pinned one per CPU, or left to the OS


@dataclass(frozen=True)
class Run:
    """One backend of a benchmark: measured at every context."""

    engine: str
    kv: str
    attention: str
    pinned: bool | None   # None: the engine places its own threads (llama.cpp)

    @property
    def label(self) -> str:
        pin = "" if self.pinned is not False else " unpinned"
        return f"{self.engine} {self.kv} {self.attention}{pin}"


def plan_runs(cfg: BenchConfig) -> list[Run]:
    """ellm: every kv x attention x pinning. llama.cpp: dense attention, f16 (the baseline)
    and every other asked KV format it has a cache type for."""
    runs = []
    for engine in cfg.engines:
        if engine == "ellm":
            runs += [Run("ellm", kv, a, p) for kv in cfg.kvs for a in cfg.attentions for p in cfg.pinning]
        else:
            kvs = ["f16"] + [kv for kv in cfg.kvs if kv != "f16" and kv in LLAMACPP_KV_TYPES]
            runs += [Run(engine, kv, "dense", None) for kv in kvs]
    return runs


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
    kv_bytes_per_token: int = 0  # bytes the cache stores per token
    sparse: dict | None = None  # the sparse options, for sparse attention
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict:
        return {"engine": self.engine, "attention": self.attention, "kv": self.kv, "context": self.context,
                "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": round(self.decode_tok_s, 2),
                "bytes_per_token": self.bytes_per_token, "gb_s": round(self.gb_s, 3),
                "decode_steps": self.decode_steps, "pinned": self.pinned,
                "kv_bytes_per_token": self.kv_bytes_per_token, "sparse": self.sparse, "notes": self.notes}


def read_bandwidth_gb_s() -> float:
    """The machine's multi-threaded read bandwidth (best of the engine's probe)."""
    from app.engine.cpu.bandwidth import probe_read_bandwidth

    return probe_read_bandwidth().best_gb_s


# ---- Measuring ----------------------------------------------------------------------


def filler_prompt(backend, n_tokens: int, salt: int = 0) -> list[int]:
    """Exactly ``n_tokens`` tokens of prose (BOS first). Prompts of different ``salt`` differ
    from their first word on, so neither engine can reuse a cached prefix of the last one
    (both keep the previous prompt's KV and skip its common prefix)."""
    head = f"{salt}. "
    text = head + _FILLER * (n_tokens // 40 + 2)
    tokens = backend.tokenize(text, add_bos=True, special=False)
    while len(tokens) < n_tokens:
        text += _FILLER * (n_tokens // 40 + 2)
        tokens = backend.tokenize(text, add_bos=True, special=False)
    return tokens[:n_tokens]


def measure(backend, context: int, steps: int, salt: int = 0) -> tuple[float, float, int]:
    """(prefill tok/s, decode tok/s median over steps, steps done) at ``context``."""
    prompt = filler_prompt(backend, context, salt)
    t0, stamps = timed_tokens(backend, prompt, steps)
    return context / (stamps[0] - t0), decode_rate(stamps), len(stamps)


def timed_tokens(backend, prompt: list[int], steps: int) -> tuple[float, list[float]]:
    """Generate ``steps`` tokens past end-of-generation; (start time, time of each token)."""
    params = replace(SamplingParams.make_greedy(steps), ignore_eos=True)
    stamps = []
    t0 = time.perf_counter()
    for _ in backend.generate(prompt, params):
        stamps.append(time.perf_counter())
    return t0, stamps


def decode_rate(stamps: list[float]) -> float:
    """Decode tokens/s: 1 / the median time between tokens (the first comes from prefill)."""
    steps_s = np.diff(stamps)  # (steps - 1,) seconds per decode step
    return float(1.0 / statistics.median(steps_s)) if len(steps_s) else 0.0


def open_engine(engine: str, model_path: Path, n_ctx: int, threads: int, pin: bool = True,
                kv: str = "f16", attention="dense"):
    """A backend for one measurement: ``attention`` is "dense", "sparse" or a SparseConfig
    (ellm); llama.cpp is always dense, with its cache types for ``kv``."""
    if engine == "llamacpp":
        from app.engine.llamacpp_backend import LlamaCppBackend

        if kv not in LLAMACPP_KV_TYPES:
            raise ValueError(f"llama.cpp has no KV cache type for {kv!r} "
                             f"(it has {', '.join(LLAMACPP_KV_TYPES)})")
        if kv != "f16":
            shape = KVShape.from_gguf(model_path)
            if shape.key_length % 32 or shape.value_length % 32:
                raise ValueError(f"{Path(model_path).name}: llama.cpp's q8_0/q4_0 KV cache needs head sizes that "
                                 f"are multiples of 32, this model's are {shape.key_length}/{shape.value_length}")
        return LlamaCppBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, kv=kv)
    from app.engine.ellm_backend import EllmBackend

    return EllmBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, pin=pin, kv=kv, attention=attention)


def machine_info(model_path: Path, threads: int, bandwidth: float | None = None) -> dict:
    info = {"cpu": _cpu_model(), "platform": platform.platform(), "threads": threads, "model": model_path.name}
    if bandwidth is not None:
        info["read_bandwidth_gb_s"] = round(bandwidth, 2)
    return info


def run_bench(cfg: BenchConfig, progress=None) -> dict:
    from app.runtime.engines import default_threads
    from app.engine.attention.config import SparseConfig

    threads = cfg.threads or default_threads()
    weights = scan_gguf(cfg.model_path).weight_bytes_per_token()
    sparse = cfg.sparse or SparseConfig()
    sparse_opts = sparse.options()
    bandwidth = read_bandwidth_gb_s()
    results, skipped = [], []
    n_ctx = max(cfg.contexts) + cfg.decode_steps + 64
    salt = 0
    for run in plan_runs(cfg):
        attention = sparse if run.attention == "sparse" else SparseConfig(mode="dense")
        if progress:
            progress(f"{run.label}: loading")
        try:
            backend = open_engine(run.engine, cfg.model_path, n_ctx, threads, run.pinned is not False,
                                  kv=run.kv, attention=attention)
        except (ValueError, RuntimeError) as e:   # one combination this model or engine cannot run
            skipped.append({"engine": run.engine, "kv": run.kv, "attention": run.attention, "reason": str(e)})
            if progress:
                progress(f"{run.label}: skipped ({e})")
            continue
        salt += 1
        measure(backend, min(64, min(cfg.contexts)), 4, salt)  # warm-up: JIT, caches, page faults
        for context in cfg.contexts:
            if progress:
                progress(f"{run.label}: {context} tokens of context")
            salt += 1
            prefill, decode, steps = measure(backend, context, cfg.decode_steps, salt)
            # The cache's cost at this context, as the engine counted it after the prefill.
            stored, kv_read = backend.stats.kv_bytes_per_token, backend.stats.kv_read_bytes_per_token
            bpt = {"weights": weights, "kv": kv_read, "metadata": 0, "total": weights + kv_read}
            results.append(BenchResult(run.engine, run.attention, run.kv, context, prefill, decode, bpt,
                                       bpt["total"] * decode / 1e9, steps, run.pinned, stored,
                                       sparse_opts if run.attention == "sparse" else None))
        backend.close()
    rows = [r.as_dict() for r in results]
    add_ratios(rows)
    report = {"machine": machine_info(cfg.model_path, threads, bandwidth), "results": rows}
    if skipped:
        report["skipped"] = skipped
    return report


def add_ratios(rows: list[dict]) -> None:
    """Give every row ``vs_llamacpp``: its decode and prefill tok/s over llama.cpp's f16 dense
    at the same context (None where that was not measured)."""
    base = {r["context"]: r for r in rows if (r["engine"], r["kv"], r["attention"]) == BASELINE}
    for r in rows:
        b = base.get(r["context"])
        r["vs_llamacpp"] = ({"decode": round(r["decode_tok_s"] / b["decode_tok_s"], 3),
                             "prefill": round(r["prefill_tok_s"] / b["prefill_tok_s"], 3)}
                            if b and b["decode_tok_s"] and b["prefill_tok_s"] else None)


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
    head = (f"{'engine':<9} {'pin':<4} {'attn':<6} {'kv':<5} {'context':>7} {'prefill t/s':>11} "
            f"{'decode t/s':>10} {'KV B/tok':>8} {'MB/token':>9} {'(weights':>9} {'kv)':>7} {'GB/s':>6} "
            f"{'vs llama.cpp f16: decode':>24} {'prefill':>7}")
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        b = r["bytes_per_token"]
        pin = {True: "yes", False: "no"}.get(r.get("pinned"), "-")
        vs = r.get("vs_llamacpp")
        ratio = f"{vs['decode']:>23.2f}x {vs['prefill']:>6.2f}x" if vs else f"{'-':>24} {'-':>7}"
        lines.append(f"{r['engine']:<9} {pin:<4} {r['attention']:<6} {r['kv']:<5} {r['context']:>7} "
                     f"{r['prefill_tok_s']:>11.1f} {r['decode_tok_s']:>10.1f} {r.get('kv_bytes_per_token', 0):>8} "
                     f"{b['total'] / 1e6:>9.1f} {b['weights'] / 1e6:>9.1f} {b['kv'] / 1e6:>7.1f} "
                     f"{r['gb_s']:>6.2f} {ratio}")
    sparse = next((r["sparse"] for r in report["results"] if r.get("sparse")), None)
    if sparse:
        lines += ["", "sparse: " + ", ".join(f"{k} {v}" for k, v in sparse.items())]
    for s in report.get("skipped", ()):
        lines.append(f"skipped {s['engine']} {s['kv']} {s['attention']}: {s['reason']}")
    return "\n".join(lines)


def plot(report: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    labels: list[str] = []
    for r in report["results"]:
        if (label := _label(r)) not in labels:
            labels.append(label)
    for label in labels:
        rows = [r for r in report["results"] if _label(r) == label]
        xs = [r["context"] for r in rows]
        ax1.plot(xs, [r["decode_tok_s"] for r in rows], marker="o", label=label)
        ax2.plot(xs, [r["prefill_tok_s"] for r in rows], marker="o", label=label)
    for ax, title in ((ax1, "decode tokens/s"), (ax2, "prefill tokens/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("context (tokens)")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="small")
    fig.suptitle(f"{report['machine']['model']}, {report['machine']['threads']} threads")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _label(r: dict) -> str:
    return f"{r['engine']} {r['kv']} {r['attention']}" + (" unpinned" if r.get("pinned") is False else "")


# ---- KV quality probe of a document (ellm kv-probe, the settings dialog) ---------------------


