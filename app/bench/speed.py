"""``ellm bench``: both engines side by side on one model, machine and context.

For each engine, KV format, attention mode and context length: prefill tokens/s, decode
tokens/s (median of the per-step times), the bytes read per decoded token (weights, KV cache,
metadata) and the achieved GB/s, beside the machine's measured read bandwidth. Decode speed on
a CPU is bandwidth / bytes moved per token (docs/ARCHITECTURE.md), so the bytes column says where the
time goes. llama.cpp with its f16 cache and dense attention is the baseline every other
result is divided by, per context.

What keeps the figures honest: every context gets a backend of its own, sized as a document of
that many tokens would be (so a short row is never read the way a longer one in the same run
must be); each row says how its prompt was read and whether the context lies beyond the model's
trained window; a ratio divides only figures measured in this run (a prefill recorded with a
kept state is shown, marked, never divided); both engines run pinned one thread per CPU, or
both not (``pinning``).

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

from app.bench.step_parts import PARTS, chunk_parts, step_parts
from app.engine.backend import SamplingParams
from app.engine.generate import PREFILL_CHUNK
from app.engine.kv.sizes import LLAMACPP_KV_TYPES, KVShape
from app.engine.header.gguf_file import scan_gguf
from app.runtime.auto import AUTO

if TYPE_CHECKING:
    from app.engine.attention.config import SparseConfig

# Plain prose so that both tokenizers see ordinary text; deterministic.
_FILLER = (
    "The river runs past the old mill and under the stone bridge. Farmers bring their grain to the "
    "market on Tuesdays, and the baker sells bread by the fountain. In the evening the lamps are lit "
    "along the harbour, and the boats come home with the tide. "
)

BASELINE = ("llamacpp", "f16", "dense")   # (engine, kv, attention) every result is compared with
AUTO_NOTE = "automatic settings, blocked cache: attention "   # an auto row's note, then its mode


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
    pinning: tuple[bool, ...] = (True,)  # both engines: threads pinned one per CPU, or left to the OS
    llamacpp_best: bool = False          # llama.cpp in every configuration a user could pick
    llamacpp_kvs: tuple[str, ...] = ("f16", "k8v8")   # ... of these caches (k8v8: its q8_0)
    states_dir: Path | None = None       # where prefilled contexts are kept (None: prefill every run)


@dataclass(frozen=True)
class Run:
    """One backend of a benchmark: measured at every context."""

    engine: str
    kv: str
    attention: str
    pinned: bool
    flash_attn: bool | None = None   # llama.cpp: flash attention (None: its default for the KV type)

    @property
    def label(self) -> str:
        pin = "" if self.pinned else " unpinned"
        fa = {True: " flash-attn", False: " no-flash-attn"}.get(self.flash_attn, "")
        return f"{self.engine} {self.kv} {self.attention}{pin}{fa}"


# llama.cpp's configurations a user picks from for speed (--llamacpp-best): its f16 and q8_0
# caches (k8v8 here), flash attention on and off. A quantized V cache needs flash attention, so
# k8v8 without it is listed as skipped with that reason.
LLAMACPP_BEST = (("f16", False), ("f16", True), ("k8v8", True), ("k8v8", False))
LLAMACPP_BEST_KVS = tuple(dict.fromkeys(kv for kv, _ in LLAMACPP_BEST))


def plan_runs(cfg: BenchConfig) -> list[Run]:
    """ellm: every kv x attention x pinning. llama.cpp: dense attention, f16 (the baseline)
    and every other asked KV format it has a cache type for, in every pinning."""
    runs = []
    for engine in cfg.engines:
        if engine == "ellm":
            runs += [Run("ellm", kv, a, p) for kv in cfg.kvs for a in cfg.attentions for p in cfg.pinning]
        elif cfg.llamacpp_best:
            runs += [Run(engine, kv, "dense", p, fa) for kv, fa in LLAMACPP_BEST if kv in cfg.llamacpp_kvs
                     for p in cfg.pinning]
        else:
            kvs = ["f16"] + [kv for kv in cfg.kvs if kv != "f16" and kv in LLAMACPP_KV_TYPES]
            runs += [Run(engine, kv, "dense", p) for kv in kvs for p in cfg.pinning]
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
    pinned: bool | None = None  # threads pinned one per CPU (both engines alike)
    kv_bytes_per_token: int = 0  # bytes the cache stores per token
    sparse: dict | None = None  # the sparse options, for sparse attention
    flash_attn: bool | None = None  # llama.cpp's flash attention (None: eLLM)
    prefill_from: str = "measured"  # "measured" now, or "state": recorded when the kept state was made
    notes: list[str] = field(default_factory=list)
    step_parts: dict | None = None  # eLLM: a decode step's time by part (bench/step_parts.py)
    chunk_parts: dict | None = None  # eLLM: the context's last prefill chunk's time by part
    reading: str = "dense"    # how the prompt was read: "dense", or "sparse" (a lossy read)
    beyond_trained: bool = False   # the context (prompt + answer + margin) exceeds the trained window

    def as_dict(self) -> dict:
        return {"engine": self.engine, "attention": self.attention, "kv": self.kv, "context": self.context,
                "prefill_tok_s": round(self.prefill_tok_s, 2), "decode_tok_s": round(self.decode_tok_s, 2),
                "bytes_per_token": self.bytes_per_token, "gb_s": round(self.gb_s, 3),
                "decode_steps": self.decode_steps, "pinned": self.pinned,
                "kv_bytes_per_token": self.kv_bytes_per_token, "sparse": self.sparse,
                "flash_attn": self.flash_attn, "prefill_from": self.prefill_from, "notes": self.notes,
                "step_parts": self.step_parts, "chunk_parts": self.chunk_parts, "reading": self.reading,
                "beyond_trained": self.beyond_trained}


def read_bandwidth_gb_s() -> float:
    """The machine's multi-threaded read bandwidth (best of the engine's probe)."""
    from app.engine.cpu.bandwidth import probe_read_bandwidth

    return probe_read_bandwidth().best_gb_s


def stream_gb_s(threads: int) -> float | None:
    """The rate the engine's Q4_K/Q6_K kernels stream weights for one token on ``threads``
    threads (best of engine/quant/stream_probe.py): a ceiling of decode, nearer than the read
    bandwidth; None where the probe cannot run."""
    from app.engine.quant.stream_probe import probe_weight_stream

    try:
        return probe_weight_stream(threads).best_gb_s
    except (MemoryError, RuntimeError, ValueError):
        return None


# ---- Measuring ----------------------------------------------------------------------


def answer_options(backend, given: dict) -> dict:
    """The sparse options a row's decode steps read with: ``given`` (the run's), with the K its
    mode gives an answer token ("sparse-decode": 64 unless --top-k)."""
    state = getattr(backend, "state", None)
    if state is None:
        return given
    return {**given, "top_k": state.config.k_for(1)}


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


# The warm-up prompt: two prefill chunks, as a measured prefill has (full chunks, the second
# attending over the first), so what a measurement takes is compiled and paged in before it:
# a warm-up of one short chunk leaves the kernels of a full chunk, and of a chunk over earlier
# ones, to be compiled inside the first measured prefill.
WARMUP_TOKENS = PREFILL_CHUNK + 64
PART_STEPS = 16   # eLLM decode steps timed by part after each measurement (bench/step_parts.py)


def measure(backend, context: int, steps: int, salt: int = 0, states=None,
            progress=None) -> tuple[float, float, int, str]:
    """(prefill tok/s, decode tok/s median over steps, steps done, where the prefill figure
    comes from) at ``context``. With ``states`` (BenchStates) the prompt's cache is loaded when
    it was kept by an earlier run (its prefill speed is the one recorded then: "state"), else
    prefilled, timed and kept ("measured"); decode then starts from it."""
    prompt = filler_prompt(backend, context, salt)
    if states is None:
        t0, stamps = timed_tokens(backend, prompt, steps)
        return context / (stamps[0] - t0), decode_rate(stamps), len(stamps), "measured"
    # The kept prefix is all but the prompt's last token, which generate then computes for its
    # logits (as a question after a read document: the prefix from the cache, the rest anew).
    done = states.prefill(backend, prompt[:-1], context, progress=_every(30.0, progress))
    _, stamps = timed_tokens(backend, prompt, steps)
    return done.prefill_tok_s, decode_rate(stamps), len(stamps), "state" if done.source == "loaded" else "measured"


def _every(seconds: float, say):
    """A prefill progress callback that says "N of M tokens prefilled" at most every ``seconds``
    (a 32K context takes tens of minutes on two cores)."""
    if say is None:
        return None
    last = [time.monotonic()]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] >= seconds:
            last[0] = time.monotonic()
            say(f"{done} of {total} tokens prefilled")

    return progress


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
                kv: str = "f16", attention="dense", flash_attn: bool | None = None, documents: bool = False):
    """A backend for one measurement: ``attention`` is "dense", "sparse" or a SparseConfig
    (ellm; ``documents``: the cache questions about documents use, blocked even for f16 dense);
    llama.cpp is always dense, with its cache types for ``kv`` and ``flash_attn`` (None: on
    exactly for a quantized cache). ``pin``: one thread pinned on each CPU of the thread plan,
    for either engine."""
    if engine == "llamacpp":
        from app.engine.llamacpp_backend import LlamaCppBackend

        if kv not in LLAMACPP_KV_TYPES:
            raise ValueError(f"llama.cpp has no KV cache type for {kv!r} "
                             f"(it has {', '.join(LLAMACPP_KV_TYPES)})")
        if flash_attn is False and LLAMACPP_KV_TYPES[kv][1] != LLAMACPP_KV_TYPES["f16"][1]:
            raise ValueError(f"llama.cpp's quantized V cache ({kv}) needs flash attention")
        if kv != "f16":
            shape = KVShape.from_gguf(model_path)
            if shape.key_length % 32 or shape.value_length % 32:
                raise ValueError(f"{Path(model_path).name}: llama.cpp's q8_0/q4_0 KV cache needs head sizes that "
                                 f"are multiples of 32, this model's are {shape.key_length}/{shape.value_length}")
        return LlamaCppBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, kv=kv, flash_attn=flash_attn,
                               pin_cpus=thread_plan(threads).cpus if pin else None)
    from app.engine.ellm_backend import EllmBackend

    return EllmBackend(str(model_path), n_ctx=n_ctx, n_threads=threads, pin=pin, kv=kv, attention=attention,
                       documents=documents)


def machine_info(model_path: Path, threads: int, bandwidth: float | None = None,
                 stream: float | None = None, pinning: tuple[bool, ...] = (True,)) -> dict:
    from app.engine.llamacpp_backend import cpu_has_amx

    info = {"cpu": _cpu_model(), "platform": platform.platform(), "threads": threads, "model": model_path.name,
            "trained_context": scan_gguf(model_path).context_length or None,
            "pinning": " and ".join(PINNING[p] for p in pinning), "notes": []}
    if cpu_has_amx():
        info["notes"].append(AMX_NOTE)
    if bandwidth is not None:
        info["read_bandwidth_gb_s"] = round(bandwidth, 2)
    if stream is not None:
        info["weight_stream_gb_s"] = round(stream, 2)
    return info


PINNING = {True: "both engines pinned one thread per CPU of the thread plan",
           False: "both engines' threads placed by the OS (unpinned)"}
AMX_NOTE = ("llama.cpp runs without its AMX and repacked weight buffers on this AMX CPU: llama-cpp-python "
            "0.3.36 crashes with them (a segmentation fault at the first matrix product), as "
            "'llama-cli --no-repack' would run")
# The default contexts stay this far inside the trained window, for the answer and the margin
# a document's context is sized with (run_bench: context + decode steps + CONTEXT_MARGIN).
CONTEXT_MARGIN = 64


def default_contexts(model_path: Path, decode_steps: int) -> tuple[int, ...]:
    """Contexts a speed run measures when none are asked for, all inside the model's trained
    window: 4,096 tokens, half the window, and the window's last round figure (one significant
    digit) that leaves room for the answer: for a 32,768-token model 4,096, 16,384 and 30,000."""
    trained = scan_gguf(model_path).context_length or 4096
    room = trained - decode_steps - CONTEXT_MARGIN
    if room < 1:
        return (max(1, trained // 2),)
    unit = 10 ** (len(str(room)) - 1)
    picks = {c for c in (4096, trained // 2, room // unit * unit) if 0 < c <= room}
    return tuple(sorted(picks)) or (room,)


def thread_plan(threads: int):
    from app.runtime.engines import thread_plan as plan

    return plan(threads)


def run_bench(cfg: BenchConfig, progress=None) -> dict:
    from app.engine.attention.config import SparseConfig
    from app.runtime.engines import default_threads

    threads = cfg.threads or default_threads()
    weights = scan_gguf(cfg.model_path).weight_bytes_per_token()
    sparse = cfg.sparse or SparseConfig()
    sparse_opts = sparse.options()
    bandwidth = read_bandwidth_gb_s()
    stream = stream_gb_s(threads)
    results, skipped = [], []
    states = None
    if cfg.states_dir is not None:
        from app.bench.states import BenchStates

        states = BenchStates(cfg.states_dir)
    trained = scan_gguf(cfg.model_path).context_length or 0
    for run in plan_runs(cfg):
        # A backend per context, sized as a document of that many tokens answered in
        # decode_steps tokens: the context decides how the engine reads (dense within the trained
        # window, sparse beyond it), so one sized for the run's longest would read them all so.
        # "auto": what such a question runs with nothing chosen (runtime/auto.py): the blocked
        # cache (every question about documents), the document read densely within the trained
        # window (the answer from the voted blocks from SPARSE_DECODE_FROM tokens on), beyond it
        # the document read as sparse reads it and the answer from the voted blocks.
        groups = [((c,), _auto_attention(cfg, c) if run.attention == AUTO else run.attention) for c in cfg.contexts]
        for contexts, mode in groups:
            attention = sparse.in_mode(mode)
            n_ctx = max(contexts) + cfg.decode_steps + CONTEXT_MARGIN
            if progress:
                progress(f"{run.label}: loading")
            try:
                backend = open_engine(run.engine, cfg.model_path, n_ctx, threads, run.pinned,
                                      kv=run.kv, attention=attention, flash_attn=run.flash_attn,
                                      documents=run.attention == AUTO)
            except (ValueError, RuntimeError) as e:   # one combination this model or engine cannot run
                skipped.append({"engine": run.engine, "kv": run.kv, "attention": run.attention,
                                "flash_attn": run.flash_attn, "contexts": list(contexts), "reason": str(e)})
                if progress:
                    progress(f"{run.label}: skipped ({e})")
                continue
            flash_attn = getattr(backend, "flash_attn", None)
            measure(backend, min(WARMUP_TOKENS, min(contexts)), 4, -1)  # warm-up: JIT, caches, page faults
            for context in contexts:
                if progress:
                    progress(f"{run.label}: {context} tokens of context")
                # The same prompt for every run at a context (and across runs of the bench, so kept
                # states match); each run loads it anew, so nothing is reused from another context.
                say = (lambda what, label=f"{run.label}: {context} tokens of context": progress(f"{label}: {what}")) \
                    if progress else None
                prefill, decode, steps, source = measure(backend, context, cfg.decode_steps, context, states, say)
                if say:   # each figure as soon as it is measured: a long run stopped early keeps them
                    say(f"prefill {prefill:.1f} tok/s ({source}), decode {decode:.1f} tok/s")
                # The cache's cost at this context, as the engine counted it after the prefill.
                stored, kv_read = backend.stats.kv_bytes_per_token, backend.stats.kv_read_bytes_per_token
                bpt = {"weights": weights, "kv": kv_read, "metadata": 0, "total": weights + kv_read}
                notes = [f"{AUTO_NOTE}{mode}"] if run.attention == AUTO else []
                parts = chunk = None
                if run.engine == "ellm":   # after the measured steps, so that they run untouched
                    prompt = filler_prompt(backend, context, context)
                    parts = step_parts(backend, prompt, PART_STEPS, weights)
                    # the context's last chunk read again (other tokens): a chunk at the context's end
                    n = min(PREFILL_CHUNK, context - 1)
                    chunk = chunk_parts(backend, prompt[:context - n], filler_prompt(backend, n + 1, -2)[1:])
                results.append(BenchResult(run.engine, run.attention, run.kv, context, prefill, decode, bpt,
                                           bpt["total"] * decode / 1e9, steps, run.pinned, stored,
                                           None if mode == "dense" else answer_options(backend, sparse_opts),
                                           flash_attn, source, notes, parts, chunk, reading_of(backend),
                                           bool(trained) and n_ctx > trained))
            backend.close()
    rows = [r.as_dict() for r in results]
    add_ratios(rows)
    report = {"machine": machine_info(cfg.model_path, threads, bandwidth, stream, cfg.pinning), "results": rows}
    if skipped:
        report["skipped"] = skipped
    return report


def _auto_attention(cfg: BenchConfig, context: int) -> str:
    """The attention the automatic settings choose for a document of ``context`` tokens and an
    answer of the bench's decode steps, on eLLM's engine (free memory as it is now)."""
    from app.runtime.auto import choose
    from app.settings import Settings

    return choose(Settings(max_tokens=cfg.decode_steps), cfg.model_path, "ellm", doc_tokens=context).attention


def reading_of(backend) -> str:
    """How the backend read its prompt: "dense", or "sparse" (eLLM's sparse reading, a lossy
    read: the mode its persisted prefixes are made in)."""
    return "dense" if backend.cache_signature().get("attention", "dense") == "dense" else "sparse"


def add_ratios(rows: list[dict]) -> None:
    """Give every row ``vs_llamacpp``: its decode and prefill tok/s over llama.cpp's f16 dense
    at the same context and pinning (None where that was not measured), and ``vs_llamacpp_best``:
    over the fastest llama.cpp row at that context and pinning, decode and prefill each against
    its own fastest, with which configuration that was (None without llama.cpp rows). Only
    figures measured in this run are divided: a prefill recorded with a kept state gets None."""
    def key(r):
        return r["context"], r.get("pinned")

    def measured(r):
        return r.get("prefill_from", "measured") == "measured"

    base = {key(r): r for r in rows if (r["engine"], r["kv"], r["attention"]) == BASELINE
            and not r.get("flash_attn")}
    best_decode: dict[tuple, dict] = {}
    best_prefill: dict[tuple, dict] = {}
    for r in rows:
        if r["engine"] != "llamacpp":
            continue
        k = key(r)
        if r["decode_tok_s"] > best_decode.get(k, {}).get("decode_tok_s", 0):
            best_decode[k] = r
        if measured(r) and r["prefill_tok_s"] > best_prefill.get(k, {}).get("prefill_tok_s", 0):
            best_prefill[k] = r

    def ratio(a, b, field):
        if field == "prefill_tok_s" and not (measured(a) and measured(b)):
            return None
        return round(a[field] / b[field], 3) if b[field] else None

    for r in rows:
        b = base.get(key(r))
        r["vs_llamacpp"] = ({"decode": ratio(r, b, "decode_tok_s"), "prefill": ratio(r, b, "prefill_tok_s")}
                            if b else None)
        bd, bp = best_decode.get(key(r)), best_prefill.get(key(r))
        r["vs_llamacpp_best"] = ({"decode": ratio(r, bd, "decode_tok_s"),
                                  "prefill": ratio(r, bp, "prefill_tok_s") if bp else None,
                                  "decode_of": llamacpp_config(bd), "prefill_of": llamacpp_config(bp) if bp else None}
                                 if bd else None)


def llamacpp_config(row: dict) -> str:
    """A llama.cpp row's configuration in words: "k8v8 flash-attn", "f16"."""
    return row["kv"] + (" flash-attn" if row.get("flash_attn") else "")


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
             f"measured read bandwidth {m['read_bandwidth_gb_s']:.1f} GB/s"
             + (f", weight kernels stream {m['weight_stream_gb_s']:.1f} GB/s" if m.get("weight_stream_gb_s") else ""),
             f"threads: {m.get('pinning', '-')}"
             + (f"; model trained for {m['trained_context']:,} tokens" if m.get("trained_context") else "")]
    lines += [f"note: {n}" for n in m.get("notes", ())]
    lines.append("")
    best = any(r["engine"] == "llamacpp" and r.get("flash_attn") for r in report["results"])
    head = (f"{'engine':<9} {'pin':<4} {'attn':<6} {'kv':<5} {'fa':<3} {'context':>7} {'window':<6} {'read':<6} "
            f"{'prefill t/s':>11} "
            f"{'decode t/s':>10} {'KV B/tok':>8} {'MB/token':>9} {'(weights':>9} {'kv)':>7} {'GB/s':>6} "
            f"{'vs llama.cpp f16: decode':>24} {'prefill':>7}")
    if best:
        head += f" {'vs best: decode':>15} {'prefill':>7}"
    lines += [head, "-" * len(head)]
    for r in report["results"]:
        b = r["bytes_per_token"]
        pin = {True: "yes", False: "no"}.get(r.get("pinned"), "-")
        fa = {True: "on", False: "off"}.get(r.get("flash_attn"), "-")
        vs = r.get("vs_llamacpp") or {}
        ratio = f"{_times(vs.get('decode')):>24} {_times(vs.get('prefill')):>7}"
        if best:
            vb = r.get("vs_llamacpp_best") or {}
            ratio += f" {_times(vb.get('decode')):>15} {_times(vb.get('prefill')):>7}"
        prefill = f"{r['prefill_tok_s']:.1f}" + ("*" if r.get("prefill_from") == "state" else "")
        window = "beyond" if r.get("beyond_trained") else "inside"
        lines.append(f"{r['engine']:<9} {pin:<4} {r['attention']:<6} {r['kv']:<5} {fa:<3} {r['context']:>7} "
                     f"{window:<6} {r.get('reading', 'dense'):<6} "
                     f"{prefill:>11} {r['decode_tok_s']:>10.1f} {r.get('kv_bytes_per_token', 0):>8} "
                     f"{b['total'] / 1e6:>9.1f} {b['weights'] / 1e6:>9.1f} {b['kv'] / 1e6:>7.1f} "
                     f"{r['gb_s']:>6.2f} {ratio}")
    if any(r.get("prefill_from") == "state" for r in report["results"]):
        lines += ["", "* prefill recorded when the kept prefilled state was made (an earlier run): shown, "
                  "never divided (--no-states measures every prefill in this run)"]
    if best:
        firsts = {}
        for r in report["results"]:
            if r.get("vs_llamacpp_best"):
                firsts.setdefault(r["context"], r["vs_llamacpp_best"])
        lines += ["", "llama.cpp's fastest: " + "; ".join(
            f"{c}: decode {v['decode_of']}, prefill {v['prefill_of'] or '-'}" for c, v in firsts.items())]
    if any(r.get("beyond_trained") for r in report["results"]):
        lines += ["", "beyond: the context exceeds the model's trained window; eLLM reads such a prompt as "
                  "its 'read' column says (sparse: a lossy read, not comparable with llama.cpp's dense one)"]
    chosen = [f"{r['context']} {n[len(AUTO_NOTE):]}" for r in report["results"] for n in r.get("notes", ())
              if n.startswith(AUTO_NOTE)]
    if chosen:
        lines += ["", "auto: the automatic settings for a document of that many tokens (blocked cache): "
                  + ", ".join(chosen)]
    sparse = next((r["sparse"] for r in report["results"] if r.get("sparse")), None)
    if sparse:
        lines += ["", "sparse: " + ", ".join(f"{k} {v}" for k, v in sparse.items())]
    lines += parts_table(report["results"])
    for s in report.get("skipped", ()):
        fa = {True: " flash-attn", False: " no-flash-attn"}.get(s.get("flash_attn"), "")
        lines.append(f"skipped {s['engine']} {s['kv']} {s['attention']}{fa}: {s['reason']}")
    return "\n".join(lines)


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def parts_table(rows: list[dict]) -> list[str]:
    """Where each eLLM row's decode step goes (bench/step_parts.py), in ms a step."""
    rows = [r for r in rows if r.get("step_parts")]
    if not rows:
        return []
    head = (f"{'attn':<6} {'kv':<5} {'context':>7} {'step ms':>8} "
            + " ".join(f"{p + ' ms':>12}" for p in PARTS) + f" {'weights GB/s':>12} {'KV GB/s':>8}")
    lines = ["", f"where an eLLM decode step goes ({rows[0]['step_parts']['steps']} steps timed by part after "
             "the measured ones; choice: sparse block choice; kernels: norms, RoPE, SwiGLU, cache writes; "
             "other: Python and sampling)", head, "-" * len(head)]
    for r in rows:
        sp = r["step_parts"]
        rate = lambda v: f"{v:.1f}" if v else "-"  # noqa: E731
        lines.append(f"{r['attention']:<6} {r['kv']:<5} {r['context']:>7} {sp['step_ms']:>8.2f} "
                     + " ".join(f"{sp[p + '_ms']:>12.2f}" for p in PARTS)
                     + f" {rate(sp['weights_gb_s']):>12} {rate(sp['kv_gb_s']):>8}")
    chunks = [r for r in rows if r.get("chunk_parts")]
    if chunks:
        head = (f"{'attn':<6} {'kv':<5} {'context':>7} {'tokens':>6} {'chunk ms':>9} {'tok/s':>7} "
                + " ".join(f"{p + ' ms':>12}" for p in PARTS))
        lines += ["", "where an eLLM prefill chunk goes (the context's last chunk read again with other tokens, "
                  "timed by part; choice: the observed queries' votes for the blocks an answer reads)",
                  head, "-" * len(head)]
        for r in chunks:
            cp = r["chunk_parts"]
            lines.append(f"{r['attention']:<6} {r['kv']:<5} {r['context']:>7} {cp['tokens']:>6} {cp['chunk_ms']:>9.1f} "
                         f"{cp['tok_s'] or 0:>7.1f} " + " ".join(f"{cp[p + '_ms']:>12.1f}" for p in PARTS))
    return lines


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
    return (f"{r['engine']} {r['kv']} {r['attention']}" + (" unpinned" if r.get("pinned") is False else "")
            + (" flash-attn" if r.get("flash_attn") else ""))


# ---- KV quality probe of a document (ellm kv-probe, the settings dialog) ---------------------


