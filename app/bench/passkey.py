"""``ellm bench --passkey``: can the model still find one fact in a long context?

The pass key test of Mohtashami & Jaggi 2023 ("Landmark Attention", section 4.2): a random
5-digit number is hidden at some depth in filler prose of a given length, and the prompt ends
by asking for it as a plain completion (no chat template, so a small model answers too):

    <header> <prose ...> The pass key is 48213. Remember it. 48213 is the pass key. <prose ...>
    What is the pass key? The pass key is

Greedy decoding of a few tokens; a trial is correct when the number appears in the output.
Every attention mode (and engine) gets the very same prompts, so dense and sparse attention
are compared trial for trial. Beyond the model's trained context dense attention is expected
to fail (RoPE positions it never saw); sparse attention places the retrieved blocks inside
the trained window (app/engine/attention/select.py), which is the comparison this test exists for.
"""
from __future__ import annotations

import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.attention.config import SparseConfig

DEPTHS = (0.1, 0.3, 0.5, 0.7, 0.9)  # where the needle sits, as a fraction of the prompt; cycled over trials
SEED = 1234          # the keys of the trials (the same for every context, engine and attention)
NEW_TOKENS = 8       # " 48213." is 7 tokens with SmolLM2's digit-by-digit tokenizer
CTX_MARGIN = 64      # n_ctx = context + this (room for the answer)

HEADER = ("There is an important piece of information hidden inside a lot of irrelevant text. "
          "Find it and memorize it. I will quiz you about the important information there.")
NEEDLE = " The pass key is {key}. Remember it. {key} is the pass key."
QUESTION = " What is the pass key? The pass key is"

# Plain prose, cycled; each sentence starts with a space so that the sentences tokenize
# the same apart as together (byte-level BPE splits words with their leading space).
SENTENCES = (
    " The river runs past the old mill and under the stone bridge.",
    " Farmers bring their grain to the market on Tuesdays, and the baker sells bread by the fountain.",
    " In the evening the lamps are lit along the harbour, and the boats come home with the tide.",
    " The library on the hill keeps maps of every road in the valley, some of them very old.",
    " Children walk to school along the canal, counting the ducks and the barges.",
    " In spring the orchards turn white with blossom and the bees are busy from dawn to dusk.",
    " The clockmaker repairs the town clock every autumn, climbing the narrow stairs of the tower.",
    " Travellers stop at the inn by the crossroads for soup, bread and a bed for the night.",
    " The weather changes quickly in the mountains, so the shepherds carry warm coats all year.",
    " On market days the square is full of stalls selling cheese, apples, wool and pottery.",
    " The ferry crosses the lake twice a day, carrying letters, parcels and a few passengers.",
    " At night the lighthouse sweeps its beam across the water and the fishermen find their way.",
)


@dataclass(frozen=True)
class PasskeyPrompt:
    tokens: tuple[int, ...]   # (n_tokens,) the whole prompt, BOS (if the model uses one) first
    key: int
    depth: float              # the depth asked for
    needle_at: int            # index of the needle's first token

    @property
    def needle_depth(self) -> float:
        """Where the needle really starts, as a fraction of the prompt."""
        return self.needle_at / len(self.tokens)


Tokenize = Callable[[str, bool], list[int]]   # (text, add_bos) -> token ids


def build_prompt(tokenize: Tokenize, n_tokens: int, key: int, depth: float) -> PasskeyPrompt:
    """A prompt of exactly ``n_tokens`` tokens with ``key`` hidden at ``depth`` (0..1).

    The needle starts at round(depth x n_tokens), moved only as far as the header and the
    question need. Each stretch of filler ends with a whole sentence (so the needle and the
    question follow a full stop) and starts inside one, as an excerpt of a longer text would.
    """
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"the pass key depth must be between 0 and 1, not {depth}")
    header = tokenize(HEADER, True)
    needle = tokenize(NEEDLE.format(key=key), False)
    question = tokenize(QUESTION, False)
    fixed = len(header) + len(needle) + len(question)
    if n_tokens < fixed + 16:
        raise ValueError(f"a pass key prompt needs at least {fixed + 16} tokens, not {n_tokens}")
    last = n_tokens - len(question) - len(needle)        # latest start of the needle
    at = min(max(round(depth * n_tokens), len(header)), last)
    sentences = [tokenize(s, False) for s in SENTENCES]
    before, next_sentence = _filler(sentences, at - len(header), 0)
    after, _ = _filler(sentences, last - at, next_sentence)
    tokens = (*header, *before, *needle, *after, *question)
    assert len(tokens) == n_tokens and tokens[at:at + len(needle)] == tuple(needle)
    return PasskeyPrompt(tokens, key, depth, at)


def _filler(sentences: list[list[int]], n: int, first: int) -> tuple[list[int], int]:
    """Exactly ``n`` tokens of prose: whole sentences from index ``first`` on (cycling), cut
    at the front. Returns the tokens and the index of the sentence that would come next."""
    out: list[int] = []
    i = first
    while len(out) < n:
        out += sentences[i % len(sentences)]
        i += 1
    return (out[len(out) - n:] if n else []), i


def trial_cases(trials: int, seed: int = SEED) -> list[tuple[int, float]]:
    """(key, depth) of each trial: random 5-digit keys from ``seed``, depths cycling DEPTHS."""
    rng = random.Random(seed)
    return [(rng.randrange(10000, 100000), DEPTHS[i % len(DEPTHS)]) for i in range(trials)]


# ---- Running ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class PasskeyConfig:
    model_path: Path
    contexts: tuple[int, ...] = (4096,)
    engines: tuple[str, ...] = ("ellm",)
    kvs: tuple[str, ...] = ("f16",)
    attentions: tuple[str, ...] = ("dense", "sparse")
    sparse: SparseConfig | None = None   # the sparse runs' options (None: the engine's defaults)
    trials: int = 5
    seed: int = SEED
    threads: int = 0
    new_tokens: int = NEW_TOKENS


@dataclass
class PasskeyResult:
    engine: str
    kv: str
    attention: str
    context: int
    cases: list[dict] = field(default_factory=list)

    @property
    def correct(self) -> int:
        return sum(c["correct"] for c in self.cases)

    def by_depth(self) -> list[dict]:
        depths = sorted({c["depth"] for c in self.cases})
        return [{"depth": d, "trials": sum(c["depth"] == d for c in self.cases),
                 "correct": sum(c["correct"] for c in self.cases if c["depth"] == d)} for d in depths]

    def as_dict(self) -> dict:
        n = len(self.cases)
        return {"engine": self.engine, "kv": self.kv, "attention": self.attention, "context": self.context,
                "trials": n, "correct": self.correct, "accuracy": round(self.correct / n, 4) if n else None,
                "by_depth": self.by_depth(), "cases": self.cases}


def variants(cfg: PasskeyConfig) -> list[tuple[str, str, str]]:
    """(engine, kv, attention) to run: every combination on ellm; llama.cpp is dense only."""
    return [(e, kv, a) for e in cfg.engines for kv in cfg.kvs
            for a in (cfg.attentions if e == "ellm" else ("dense",))]


def run_passkey(cfg: PasskeyConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Every variant at every context on the same prompts: {"machine", "config", "results"}."""
    from app.runtime.engines import default_threads
    from app.bench.speed import machine_info, open_engine
    from app.engine.backend import SamplingParams
    from app.engine.attention.config import SparseConfig

    threads = cfg.threads or default_threads()
    cases = trial_cases(cfg.trials, cfg.seed)
    sparse = cfg.sparse or SparseConfig()
    results, skipped = [], []
    for context in cfg.contexts:
        for engine, kv, attention in variants(cfg):
            mode = sparse.in_mode(attention)
            try:
                backend = open_engine(engine, cfg.model_path, context + CTX_MARGIN, threads, kv=kv,
                                      attention=mode)
            except (ValueError, RuntimeError) as e:   # a combination this model or engine cannot run
                skipped.append({"engine": engine, "kv": kv, "attention": attention, "context": context,
                                "reason": str(e)})
                if progress:
                    progress(f"{engine} {kv} {attention}, {context} tokens: skipped ({e})")
                continue
            tokenize = _tokenizer(backend)
            result = PasskeyResult(engine, kv, attention, context)
            for i, (key, depth) in enumerate(cases):
                prompt = build_prompt(tokenize, context, key, depth)
                t0 = time.perf_counter()
                out = list(backend.generate(prompt.tokens, SamplingParams.make_greedy(cfg.new_tokens)))
                text = backend.detokenize(out)
                ok = str(key) in text
                result.cases.append({"depth": depth, "needle_at": prompt.needle_at, "key": key,
                                     "output": text, "correct": ok,
                                     "seconds": round(time.perf_counter() - t0, 2)})
                if progress:
                    progress(f"{engine} {kv} {attention}, {context} tokens: trial {i + 1}/{len(cases)} "
                             f"(depth {depth:.0%}) {'found' if ok else 'missed'} {key}: {text.strip()!r}")
            backend.close()
            results.append(result)
    config = {"contexts": list(cfg.contexts), "trials": cfg.trials, "seed": cfg.seed, "depths": list(DEPTHS),
              "new_tokens": cfg.new_tokens,
              "sparse": sparse.options()}
    report = {"machine": machine_info(cfg.model_path, threads), "config": config,
              "results": [r.as_dict() for r in results]}
    if skipped:
        report["skipped"] = skipped
    return report


def _tokenizer(backend) -> Tokenize:
    return lambda text, add_bos: backend.tokenize(text, add_bos=add_bos, special=False)


# ---- Reporting --------------------------------------------------------------------------------


def format_passkey(report: dict) -> str:
    """Accuracy per context, one column per (engine, kv, attention), side by side."""
    rows = report["results"]
    cols: list[tuple[str, str, str]] = []
    for r in rows:
        c = (r["engine"], r["kv"], r["attention"])
        if c not in cols:
            cols.append(c)
    cell = {(r["context"], r["engine"], r["kv"], r["attention"]): r for r in rows}
    m, cfg = report["machine"], report["config"]
    names = [f"{e} {kv} {a}" for e, kv, a in cols]
    width = max([12, *map(len, names)])
    title = (f"Pass key retrieval, {m['model']}: {cfg['trials']} trials per cell, depths "
             f"{', '.join(f'{d:.0%}' for d in cfg['depths'])}, greedy, {cfg['new_tokens']} new tokens")
    lines = [title, "",
             f"{'context':>8}  " + "  ".join(f"{n:>{width}}" for n in names)]
    lines.append("-" * len(lines[-1]))
    for context in cfg["contexts"]:
        cells = []
        for e, kv, a in cols:
            r = cell.get((context, e, kv, a))
            cells.append(f"{r['correct']}/{r['trials']} ({r['accuracy']:.0%})" if r and r["trials"] else "-")
        lines.append(f"{context:>8}  " + "  ".join(f"{c:>{width}}" for c in cells))
    for s in report.get("skipped", ()):
        lines.append(f"skipped {s['engine']} {s['kv']} {s['attention']} at {s['context']}: {s['reason']}")
    return "\n".join(lines)


def depth_detail(report: dict) -> Sequence[str]:
    """One line per result: which depths were found."""
    return [f"{r['engine']} {r['kv']} {r['attention']} at {r['context']}: "
            + ", ".join(f"{d['depth']:.0%} {d['correct']}/{d['trials']}" for d in r["by_depth"])
            for r in report["results"]]
