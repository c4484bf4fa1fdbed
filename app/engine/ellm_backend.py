"""The ``ellm`` backend: our engine (app/engine) behind the Backend protocol of backend.py."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from .attention.config import SparseConfig
from .backend import GenerationStats, SamplingParams
from .generate import PREFILL_CHUNK, generate_tokens, prefill, prefill_reusing_prefix
from .kv.blocked import BlockKVCache
from .kv.formats import KVSpec, dense_f16_bytes_per_token
from .model.chat import render_chat
from .model.tokenizer import Tokenizer
from .model.transformer import Model
from .sampling import Sampler


class EllmBackend:
    """A GGUF model run by our engine, with one KV cache that later calls reuse when their
    prompt starts with what it already holds (a follow-up question re-reads nothing)."""

    name = "ellm"

    def __init__(self, model_path: str | Path, n_ctx: int = 8192, n_threads: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, numa: str = "distribute", pin: bool = True,
                 kv: str = "f16", attention: str | SparseConfig = "dense"):
        """kv: a KV setting name (app/engine/kv/formats.py); attention: "dense", "sparse" or a
        SparseConfig. f16 + dense keeps llama.cpp's cache and numerics; anything else uses the
        blocked cache (app/engine/kv/blocked.py)."""
        self.model_path = str(model_path)
        self.n_threads = n_threads
        self._thread_plan = _plan_threads(n_threads, numa)
        if not pin and not isinstance(self._thread_plan, (int, type(None))):
            # Unpinned (benchmarks compare): only the thread count, the OS places the threads.
            self._thread_plan = self._thread_plan.count
        _apply_threads(self._thread_plan)  # before loading: weight tiles are laid out per thread count
        self.model = Model(self.model_path)
        self.tokenizer = Tokenizer.from_gguf(self.model.reader)
        self.n_ctx = int(n_ctx or self.model.config.context_length)
        self.kv_spec = KVSpec.parse(kv)
        self.attention = attention if isinstance(attention, SparseConfig) else SparseConfig(mode=attention)
        blocked = self.kv_spec.name != "f16" or self.attention.mode != "dense"
        self.cache = (self.model.new_cache(self.n_ctx, self.kv_spec, self.attention) if blocked
                      else self.model.new_cache(self.n_ctx))
        self.prefill_chunk = prefill_chunk
        self.stats = GenerationStats()
        field = self.model.reader.get_field("tokenizer.chat_template")
        self._template = field.contents() if field is not None else None
        self._bos_text = self._special_text(self.tokenizer.bos_id)
        self._eos_text = self._special_text(self.tokenizer.eos_id)

    def _special_text(self, token: int | None) -> str:
        return "" if token is None else self.tokenizer.token_bytes(token).decode("utf-8", "replace")

    # ---- Protocol ---------------------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)

    def token_bytes(self, token: int) -> bytes:
        return self.tokenizer.token_bytes(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chat(self._template, messages, self._bos_text, self._eos_text, add_generation_prompt)

    def eos_tokens(self) -> set[int]:
        return set(self.tokenizer.eot_ids)

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        """Prefill ``prompt`` (only the part not already cached), then yield generated ids
        until an end-of-generation token, max_tokens, a full context, or ``cancel()``."""
        prompt = [int(t) for t in prompt]
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt) >= self.n_ctx:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx} "
                f"(prompt + answer): shorten the prompt or open {Path(self.model_path).name} "
                f"with a larger n_ctx")
        return self._generate(prompt, params, cancel)

    def _generate(self, prompt: list[int], params: SamplingParams,
                  cancel: Callable[[], bool] | None) -> Iterator[int]:
        _apply_threads(self._thread_plan)  # numba's thread count is per calling thread
        self.stats = stats = GenerationStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        if self.blocked:
            self._observe(prompt)
        logits, reused = prefill_reusing_prefix(self.model, self.cache, prompt, self.prefill_chunk, cancel)
        stats.prefill_s = time.perf_counter() - t0
        stats.extra["reused_prompt_tokens"] = reused
        stats.extra["weight_bytes_per_token"] = self.model.weight_bytes
        stats.extra.update(self.kv_stats())
        if logits is None:  # cancelled during prefill
            return
        if self.blocked:
            self.cache.reset_mass()   # attention mass of this answer only
        stop_ids = set() if getattr(params, "ignore_eos", False) else self.eos_tokens()
        tokens = generate_tokens(self.model, self.cache, logits, Sampler(params), list(prompt),
                                 params.max_tokens, stop_ids, cancel)
        # decode_s counts the engine's time after the first token, not the time the caller
        # spends between tokens (rendering, stop-string checks).
        resumed = None
        for token in tokens:
            now = time.perf_counter()
            if resumed is None:
                stats.ttft_s = now - t0
            else:
                stats.decode_s += now - resumed
            stats.decode_tokens += 1
            yield token
            resumed = time.perf_counter()

    # ---- KV cache: settings, document prefixes, attention mass --------------------------

    @property
    def blocked(self) -> bool:
        return isinstance(self.cache, BlockKVCache)

    @property
    def prefix_multiple(self) -> int:
        """Document prefixes are padded to this many tokens (whole KV blocks)."""
        return self.kv_spec.block if self.blocked else 1

    def kv_stats(self) -> dict:
        """The KV setting and its cost: bytes stored per token, and bytes a decode step reads
        from the cache at the current length (all of it when dense, the attended blocks and
        the block bounds when sparse)."""
        c = self.model.config
        dims = (c.n_layers, c.n_kv_heads, c.head_dim, c.head_dim)
        stored = (dense_f16_bytes_per_token(*dims) if not self.blocked
                  else self.kv_spec.bytes_per_token(*dims))
        n = self.cache.n_tokens
        if self.blocked and self.attention.mode == "sparse":
            b = self.kv_spec.block
            attended = min(n, self.attention.budget_tokens(b))
            # Ranked by the question's votes: no bounds read per step (the question read every
            # block's keys once, attention/votes.py); ranked by the bounds: all of them, each step.
            bounds = 0 if self.attention.observe else (-(-n // b)) * c.n_layers * c.n_kv_heads * 2 * 2 * c.head_dim
            read = attended * stored + bounds
        else:
            read = n * stored
        return {"kv": self.kv_spec.name, "attention": self.attention.mode,
                "kv_bytes_per_token": int(round(stored)), "kv_read_bytes_per_token": int(round(read))}

    def cache_signature(self) -> dict:
        """What a persisted prefix depends on besides the model and the tokens."""
        a = self.attention
        return {"kv": self.kv_spec.name, "block": self.kv_spec.block, "attention": a.mode,
                "sinks": a.sinks, "window": a.window, "top_k": a.top_k, "dense_layers": a.dense_layers,
                "prefill_chunk": self.prefill_chunk}

    def _observe(self, prompt: list[int]) -> None:
        """Sparse attention: the prompt's last tokens choose the blocks decoding reads
        (app/engine/attention/votes.py), so they are computed afresh even when the cache still
        holds them, though never below the document's checkpoint."""
        cache = self.cache
        cache.votes.clear()
        cfg = cache.attention
        if cfg is None or cfg.mode != "sparse" or not cfg.observe:
            cache.observe = None
            return
        start = max(0, len(prompt) - cfg.observe)
        cp = cache.checkpoint
        if cp is not None and cache.common_prefix(prompt) >= cp.n_tokens:
            start = max(start, cp.n_tokens)
        start = min(start, len(prompt) - 1)
        if cache.n_tokens > start:
            cache.truncate(start)
        cache.observe = (start, len(prompt))

    def ensure_prefix(self, tokens: Sequence[int], load: Callable[[BlockKVCache], bool] | None = None,
                      save: Callable[[BlockKVCache], None] | None = None,
                      cancel: Callable[[], bool] | None = None) -> str | None:
        """Make the cache hold exactly ``tokens`` (a document prefix) and checkpoint there, so
        that every question after it prefills only itself. Returns "hit" when the prefix was
        already in memory or ``load`` restored it (a persisted cache), "miss" when it was
        computed (then ``save`` persists it), None if cancelled. The dense f16 cache keeps
        prefixes in memory only."""
        tokens = [int(t) for t in tokens]
        _apply_threads(self._thread_plan)
        cache = self.cache
        if self.blocked:
            cache.observe = None      # a document prefix has no question to observe
        if cache.n_tokens >= len(tokens) and cache.common_prefix(tokens) == len(tokens):
            cache.truncate(len(tokens))
            if self.blocked:
                cache.set_checkpoint()
            return "hit"
        if self.blocked and load is not None:
            cache.clear()
            if load(cache):
                return "hit"
        cache.clear()
        if prefill(self.model, cache, tokens, self.prefill_chunk, cancel) is None:
            cache.clear()
            return None
        if self.blocked:
            cache.set_checkpoint()
            if save is not None:
                save(cache)
        return "miss"

    def reserve(self, n_ctx: int) -> None:
        """Hold at least ``n_ctx`` tokens (a question over many documents' caches)."""
        if self.blocked and n_ctx > self.n_ctx:
            self.cache.reserve(n_ctx)
            self.n_ctx = n_ctx

    def attended_blocks(self, limit: int = 8) -> list[tuple[int, int, float]]:
        """The blocks that received the most attention mass during the last generation:
        (first token, end token, share of the mass), largest first. Empty for the dense
        f16 cache."""
        if not self.blocked:
            return []
        mass = self.cache.block_mass
        total = float(mass.sum())
        if total <= 0:
            return []
        b = self.kv_spec.block
        order = np.argsort(-mass)[:limit]
        return [(int(i) * b, min(int(i + 1) * b, self.cache.n_tokens), float(mass[i] / total))
                for i in order if mass[i] > 0]

    def reset(self) -> None:
        """Forget the cached prompt (the next generate prefills everything)."""
        self.cache.clear()

    def close(self) -> None:
        self.cache = None
        self.model = None


# ---- Threads -------------------------------------------------------------------------------


def _plan_threads(n_threads: int | None, numa: str = "distribute"):
    """The thread plan of app/engine/cpu/plan.py and cpu/pinning.py (one thread per physical core by default)."""
    try:
        from .cpu.plan import plan_threads
        from .cpu.topology import read_topology
        return plan_threads(read_topology(), threads=n_threads or 0, numa_policy=numa)
    except (ImportError, OSError, ValueError):
        return n_threads


def _apply_threads(plan) -> None:
    """Apply the plan in the calling thread; a bare count (or None) when threads.py could not
    plan, e.g. on a machine whose /sys we cannot read."""
    if plan is None or isinstance(plan, int):
        # unpinned: undo any earlier apply in this process, or this run would stay pinned
        from .cpu.pinning import unpin
        unpin(plan or 0)
        return
    from .cpu.pinning import apply
    apply(plan)
