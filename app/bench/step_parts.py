"""Where an eLLM decode step's and prefill chunk's time goes: the bench's answer to "what limits
this figure".

A decode step is timed in parts by wrapping, for a few extra steps after the measured ones,
the functions the transformer calls for each part (the wrappers are removed afterwards, so
the measured steps run the engine untouched); a prefill chunk likewise, for one more chunk
appended to the measured context (``chunk_parts``):

  weights    the weight products (ProductStack.matvec, QMatrix.matvec; a chunk's through
             _linear): weight bytes / this time is the rate the kernels stream the weights;
  attention  reading the KV cache and attending over it (attend_blocks, attend), less the
             block choice: KV bytes read / this time is the rate the cache is read;
  choice     sparse attention's block choice (select: the blocks' key bounds scored against
             the query), zero for a step that reuses the last choice; in a chunk also the
             observed queries' votes for the blocks an answer reads (observed_attention, with
             those queries' own attention), except where the question attends densely
             ("sparse-decode" inside the trained window): its attention's products give the
             votes, timed as attention;
  kernels    the small per-layer kernels: norms, RoPE with the biases, SwiGLU/GeGLU, writing
             the new token's keys and values into the cache;
  other      the rest of the step: the Python between the calls, the embedding row, sampling
             and the generator's own bookkeeping (the "Python overhead per token").

Each wrapper adds a Python call and two clock reads (~0.5-1 us, counted in "other"), a few
hundred calls a step. Only calls made from Python are seen: a jitted function calling another
(_qkv_bias_rope calls _qkv_bias_rope_keys) is timed as its caller, and one compiled while the
wrappers are in place would find a Python function under the name, so the bench times parts
only after the measured steps have compiled every call of a decode step.
"""
from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from contextlib import contextmanager

# (part, module, class or None, function): what is timed as each part. A call inside another of
# the same part (a ProductStack's lone matrix through QMatrix.matvec) counts once, in the outer.
TIMED = (
    ("weights", "app.engine.model.transformer", None, "_linear"),
    ("weights", "app.engine.quant.stack", "ProductStack", "matvec"),
    ("weights", "app.engine.quant.qmatrix", "QMatrix", "matvec"),
    ("attention", "app.engine.model.transformer", None, "attend_blocks"),
    ("attention", "app.engine.model.transformer", None, "attend"),
    ("choice", "app.engine.attention.blocks", None, "select"),
    ("choice", "app.engine.attention.blocks", None, "observed_attention"),
    ("kernels", "app.engine.model.transformer", None, "rms_norm_rows"),
    ("kernels", "app.engine.model.transformer", None, "add_rms_norm_rows"),
    ("kernels", "app.engine.model.transformer", None, "_qkv_bias_rope_keys"),
    ("kernels", "app.engine.model.transformer", None, "_qkv_bias_rope"),
    ("kernels", "app.engine.model.transformer", None, "_head_norm"),
    ("kernels", "app.engine.model.transformer", None, "swiglu"),
    ("kernels", "app.engine.model.transformer", None, "geglu"),
    ("kernels", "app.engine.kv.blocked", "BlockKVCache", "update"),
    ("kernels", "app.engine.kv.contiguous", "KVCache", "update"),
)
PARTS = ("weights", "attention", "choice", "kernels", "other")


class PartClock:
    """Seconds spent in each part while installed (``timed_parts``)."""

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(PARTS, 0.0)
        self._inside = dict.fromkeys(PARTS, 0)

    def wrap(self, part: str, fn):
        def timed(*args, **kwargs):
            if self._inside[part]:
                return fn(*args, **kwargs)
            self._inside[part] += 1
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[part] += time.perf_counter() - t0
                self._inside[part] -= 1
        return timed


@contextmanager
def timed_parts() -> Iterator[PartClock]:
    """Install the wrappers of TIMED for the block's duration; the clock's seconds accumulate."""
    clock = PartClock()
    installed = []
    try:
        for part, module, owner, name in TIMED:
            target = importlib.import_module(module)
            if owner is not None:
                target = getattr(target, owner)
            original = target.__dict__[name]
            setattr(target, name, clock.wrap(part, original))
            installed.append((target, name, original))
        yield clock
    finally:
        for target, name, original in reversed(installed):
            setattr(target, name, original)


def step_parts(backend, prompt: list[int], steps: int, weight_bytes: int) -> dict:
    """Decode ``steps`` tokens after ``prompt`` on an EllmBackend with the parts timed: the
    milliseconds of each part per step and the rates the weights and the KV cache were read at.
    Counted from the first token on (what came before it, the prompt's uncached tokens, is the
    prefill's), as decode_rate counts."""
    from dataclasses import replace

    from app.engine.backend import SamplingParams

    params = replace(SamplingParams.make_greedy(steps + 1), ignore_eos=True)
    marks = []   # (time, seconds of each part so far) as each token is handed over
    with timed_parts() as clock:
        for _ in backend.generate(prompt, params):
            marks.append((time.perf_counter(), dict(clock.seconds)))
    n = len(marks) - 1
    if n < 1:
        raise ValueError("step_parts needs at least one decode step")
    (t_first, first), (t_last, last) = marks[0], marks[-1]
    part_s = {p: (last[p] - first[p]) / n for p in PARTS if p != "other"}   # seconds a step
    part_s["attention"] -= part_s["choice"]          # the choice runs inside attention's call
    step_s = (t_last - t_first) / n
    part_s["other"] = step_s - sum(part_s.values())
    kv_read = backend.stats.kv_read_bytes_per_token
    return {"steps": n, "step_ms": round(step_s * 1e3, 3),
            **{f"{p}_ms": round(part_s[p] * 1e3, 3) for p in PARTS},
            "weights_gb_s": round(weight_bytes / part_s["weights"] / 1e9, 2) if part_s["weights"] > 0 else None,
            "kv_gb_s": round(kv_read / part_s["attention"] / 1e9, 2) if part_s["attention"] > 0 else None}


def chunk_parts(backend, prompt: list[int], extra: list[int]) -> dict:
    """Prefill ``extra`` after ``prompt`` (which the backend's cache holds, or shares a prefix
    with) on an EllmBackend with the parts timed: the milliseconds of each part for the chunk,
    the tokens it prefilled, and its tokens/s. What a chunk at the end of a long context costs,
    the slowest of its reading."""
    from dataclasses import replace

    from app.engine.backend import SamplingParams

    params = replace(SamplingParams.make_greedy(1), ignore_eos=True)
    with timed_parts() as clock:
        t0 = time.perf_counter()
        for _ in backend.generate(list(prompt) + list(extra), params):
            break
        chunk_s = time.perf_counter() - t0
        part_s = dict(clock.seconds)
    part_s["attention"] -= part_s["choice"]
    part_s["other"] = chunk_s - sum(part_s[p] for p in PARTS if p != "other")
    tokens = backend.stats.prompt_tokens - backend.stats.reused_prompt_tokens
    return {"tokens": tokens, "at": backend.stats.reused_prompt_tokens, "chunk_ms": round(chunk_s * 1e3, 1),
            "tok_s": round(tokens / chunk_s, 2) if chunk_s > 0 else None,
            **{f"{p}_ms": round(part_s[p] * 1e3, 1) for p in PARTS}}
