"""``ellm bench --needle-folder N --tokens T``: one fact in one of N documents, one question.

N documents of filler prose totalling T tokens; in one of them, at a random depth, a pass key
("The pass key is 48213. Remember it. 48213 is the pass key."). Each document's KV cache is
computed once and kept as a file (app/engine/kv/files.py); a question then lays all the caches
side by side (as app/qa/across.py does) and asks for the key. Reported: accuracy over the
trials, time to first token with warm caches (laying out the caches, prefilling the question,
the first token), decode tokens/s at that context; beside them, for reference in the same run,
dense attention on a single document of ``baseline_tokens`` tokens holding the same kind of
key (accuracy), and llama.cpp's dense decode at ``llamacpp_context`` tokens.

Filler documents are one text (their caches are copies of one file): what is measured is
finding one block among all of theirs, and computing 200K tokens of filler once per
benchmark is the cost a person pays once per folder, not per question.
"""
from __future__ import annotations

import random
import shutil
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from app.engine.backend import SamplingParams
from app.bench.passkey import HEADER, NEEDLE, QUESTION
from app.bench.passkey import SENTENCES as _SENTENCES

# The pass key test's wording (app/bench/passkey.py), which SmolLM2 answers in a single document.


def needle_sentence(key: int) -> str:
    return NEEDLE.format(key=key)


@dataclass(frozen=True)
class NeedleConfig:
    model_path: Path
    n_docs: int = 20
    tokens: int = 200_000
    trials: int = 5
    kv: str = "k8v4"
    attention: object = "sparse"        # "sparse" or a SparseConfig
    threads: int = 0
    seed: int = 0
    decode_steps: int = 32
    baseline_tokens: int = 4096          # dense single-document reference (0: skip; bench/beyond.py
                                         # gives the pass key's instead)
    llamacpp_context: int = 8192         # llama.cpp dense decode reference (0: skip)


@dataclass
class NeedleReport:
    config: dict
    accuracy: float
    trials: list[dict] = field(default_factory=list)
    ttft_s_median: float = 0.0
    decode_tok_s: float = 0.0
    kv_read_bytes_per_token: int = 0
    baseline: dict = field(default_factory=dict)
    llamacpp: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"config": self.config, "accuracy": self.accuracy, "trials": self.trials,
                "ttft_s_median": round(self.ttft_s_median, 3), "decode_tok_s": round(self.decode_tok_s, 2),
                "kv_read_bytes_per_token": self.kv_read_bytes_per_token, "baseline": self.baseline,
                "llamacpp": self.llamacpp}


def filler_tokens(backend, n: int, rng: random.Random) -> list[int]:
    """About ``n`` tokens of varied prose (no BOS)."""
    words = []
    while True:
        words.append("".join(rng.choice(_SENTENCES) for _ in range(40)))
        tokens = backend.tokenize("".join(words), add_bos=False, special=False)
        if len(tokens) >= n:
            return tokens[:n]


def _found(backend, tokens: list[int], key: int) -> bool:
    return str(key) in backend.detokenize(tokens)


def _answer(backend, prompt: list[int], steps: int = 8) -> tuple[list[int], float]:
    t0 = time.perf_counter()
    out, first = [], None
    for tok in backend.generate(prompt, SamplingParams.make_greedy(steps)):
        if first is None:
            first = time.perf_counter() - t0
        out.append(tok)
    return out, first or 0.0


def run_needle_folder(cfg: NeedleConfig, progress=lambda what: None) -> NeedleReport:
    from app.engine.backend import CacheFile
    from app.engine.ellm_backend import EllmBackend

    rng = random.Random(cfg.seed)
    per_doc = cfg.tokens // cfg.n_docs
    # documents=True: the blocked cache that folder questions lay side by side, whatever the KV
    # format and attention (dense f16 included).
    backend = EllmBackend(str(cfg.model_path), n_ctx=per_doc + 2048, n_threads=cfg.threads or None,
                          kv=cfg.kv, attention=cfg.attention, documents=True)
    B = backend.prefix_multiple
    header = backend.tokenize(HEADER, add_bos=True, special=False)
    header += backend.tokenize("\n", add_bos=False, special=False)[-1:] * (-len(header) % B)
    body = filler_tokens(backend, per_doc - len(header) - per_doc % B, rng)
    question = backend.tokenize(QUESTION, add_bos=False, special=False)
    meta = {"bench": "needle", "kv": cfg.kv}
    work = Path(tempfile.mkdtemp(prefix="ellm-needle-"))
    report = NeedleReport(config={"n_docs": cfg.n_docs, "tokens": cfg.tokens, "trials": cfg.trials, "kv": cfg.kv,
                                  "attention": backend.cache_signature()}, accuracy=0.0)
    try:
        progress(f"computing the filler document's KV cache ({len(header) + len(body)} tokens, once)")
        filler = CacheFile(work / "filler.kv", meta)
        backend.ensure_prefix(header + body, filler)
        filler = CacheFile(filler.path, meta, exists=True)
        hits, ttfts = 0, []
        for trial in range(cfg.trials):
            key = rng.randint(10000, 99999)
            doc = rng.randrange(cfg.n_docs)
            depth = rng.uniform(0.05, 0.95)
            needle = backend.tokenize(needle_sentence(key), add_bos=False, special=False)
            cut = int(len(body) * depth)
            planted = body[:cut] + needle + body[cut:len(body) - len(needle)]
            planted += body[:(-len(planted)) % B]
            progress(f"trial {trial + 1}/{cfg.trials}: key in document {doc + 1} at {depth:.0%}")
            planted_file = CacheFile(work / "planted.kv", meta)
            # The tokens before the key are the filler's: from its file, then the rest prefilled.
            backend.ensure_prefix(header + body, filler)
            backend.ensure_prefix(header + planted, planted_file)
            t0 = time.perf_counter()
            files = [CacheFile(planted_file.path, meta, exists=True) if i == doc else filler
                     for i in range(cfg.n_docs)]
            backend.compose(files, skip=len(header), room=4096)
            prompt = backend.cached_tokens() + question
            composed = time.perf_counter() - t0
            out, first = _answer(backend, prompt)
            ttft = composed + first
            ok = _found(backend, out, key)
            hits += ok
            ttfts.append(ttft)
            report.trials.append({"key": key, "doc": doc + 1, "depth": round(depth, 3), "found": ok,
                                  "answer": backend.detokenize(out).strip(), "ttft_s": round(ttft, 3)})
        report.accuracy = hits / cfg.trials
        report.ttft_s_median = statistics.median(ttfts)
        progress("decode speed at the full context")
        report.decode_tok_s, report.kv_read_bytes_per_token = _decode_speed(backend, prompt, cfg.decode_steps)
        if cfg.baseline_tokens:
            report.baseline = _baseline(cfg, rng, progress)
        if cfg.llamacpp_context:
            report.llamacpp = _llamacpp_decode(cfg, progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return report


def _decode_speed(backend, prompt: list[int], steps: int) -> tuple[float, int]:
    from app.bench.speed import decode_rate, timed_tokens

    _, stamps = timed_tokens(backend, prompt, steps)
    return decode_rate(stamps), backend.stats.kv_read_bytes_per_token


def _baseline(cfg: NeedleConfig, rng: random.Random, progress) -> dict:
    """Dense attention (f16, llama.cpp's numerics) on one document of baseline_tokens."""
    from app.engine.ellm_backend import EllmBackend

    backend = EllmBackend(str(cfg.model_path), n_ctx=cfg.baseline_tokens + 64, n_threads=cfg.threads or None)
    question = backend.tokenize(QUESTION, add_bos=False, special=False)
    hits = 0
    for trial in range(cfg.trials):
        key = rng.randint(10000, 99999)
        depth = rng.uniform(0.05, 0.95)
        progress(f"dense reference, trial {trial + 1}/{cfg.trials}: {cfg.baseline_tokens} tokens, key at {depth:.0%}")
        needle = backend.tokenize(needle_sentence(key), add_bos=False, special=False)
        body = filler_tokens(backend, cfg.baseline_tokens - len(needle) - len(question) - 16, rng)
        cut = int(len(body) * depth)
        prompt = backend.tokenize(HEADER, add_bos=True, special=False) \
            + body[:cut] + needle + body[cut:] + question
        backend.reset()
        out, _ = _answer(backend, prompt)
        hits += _found(backend, out, key)
    return {"tokens": cfg.baseline_tokens, "attention": "dense", "kv": "f16", "accuracy": hits / cfg.trials}


def _llamacpp_decode(cfg: NeedleConfig, progress) -> dict:
    from app.bench.speed import measure
    from app.engine.llamacpp_backend import LlamaCppBackend

    progress(f"llama.cpp dense decode at {cfg.llamacpp_context} tokens")
    backend = LlamaCppBackend(str(cfg.model_path), n_ctx=cfg.llamacpp_context + cfg.decode_steps + 8,
                              n_threads=cfg.threads or None)
    _, decode, _, _ = measure(backend, cfg.llamacpp_context, cfg.decode_steps)
    backend.close()
    return {"context": cfg.llamacpp_context, "decode_tok_s": round(decode, 2)}
