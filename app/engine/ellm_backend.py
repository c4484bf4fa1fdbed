"""The ``ellm`` backend: our engine (app/engine) behind the Backend protocol of backend.py."""
from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from .backend import GenerationStats, SamplingParams
from .chat import render_chat
from .generate import PREFILL_CHUNK, generate_tokens, prefill_reusing_prefix
from .model import Model
from .sampling import Sampler
from .tokenizer import Tokenizer


class EllmBackend:
    """A GGUF model run by our engine, with one KV cache that later calls reuse when their
    prompt starts with what it already holds (a follow-up question re-reads nothing)."""

    name = "ellm"

    def __init__(self, model_path: str | Path, n_ctx: int = 8192, n_threads: int | None = None,
                 prefill_chunk: int = PREFILL_CHUNK, numa: str = "distribute", pin: bool = True):
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
        self.cache = self.model.new_cache(self.n_ctx)
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
        logits, reused = prefill_reusing_prefix(self.model, self.cache, prompt, self.prefill_chunk, cancel)
        stats.prefill_s = time.perf_counter() - t0
        stats.extra["reused_prompt_tokens"] = reused
        stats.extra["weight_bytes_per_token"] = self.model.weight_bytes
        stats.extra["kv_bytes_per_token"] = self.model.config.kv_bytes_per_token()
        if logits is None:  # cancelled during prefill
            return
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

    def reset(self) -> None:
        """Forget the cached prompt (the next generate prefills everything)."""
        self.cache.clear()

    def close(self) -> None:
        self.cache = None
        self.model = None


# ---- Threads -------------------------------------------------------------------------------


def _plan_threads(n_threads: int | None, numa: str = "distribute"):
    """The thread plan of app/engine/threads.py (one thread per physical core by default)."""
    try:
        from .threads import plan_threads
        from .topology import read_topology
        return plan_threads(read_topology(), threads=n_threads or 0, numa_policy=numa)
    except (ImportError, OSError, ValueError):
        return n_threads


def _apply_threads(plan) -> None:
    """Apply the plan in the calling thread; a bare count (or None) when threads.py could not
    plan, e.g. on a machine whose /sys we cannot read."""
    if plan is None or isinstance(plan, int):
        if plan:
            import numba
            numba.set_num_threads(min(plan, numba.config.NUMBA_NUM_THREADS))
        return
    from .threads import apply
    apply(plan)
