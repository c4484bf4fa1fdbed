"""The ``ellm`` backend: our engine (app/engine) behind the Backend protocol of backend.py."""
from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from .attention.config import SparseConfig
from .attention.state import AttentionState
from .attention.select import view_head
from .backend import CacheFile, CacheFileError, Capabilities, GenerationStats, Prefix, SamplingParams
from .generate import PREFILL_CHUNK, generate_tokens, prefill, prefill_reusing_prefix
from .kv import files as kv_files
from .kv.formats import KVSpec
from .kv.sizes import KVShape, kv_bytes_per_token, kv_read_bytes_per_token
from .model.chat import render_chat
from .kv.formats import blocked_cache
from .model.tokenizer import Tokenizer
from .model.transformer import Model
from .sampling import Sampler


CHECKPOINT_S = 60.0   # while a long prefix is read, its part computed so far is saved this often


class EllmBackend:
    """A GGUF model run by our engine, with one KV cache that later calls reuse when their
    prompt starts with what it already holds (a follow-up question re-reads nothing)."""

    name = "ellm"

    def __init__(self, model_path: str | Path, n_ctx: int = 8192, n_threads=None,
                 prefill_chunk: int = PREFILL_CHUNK, numa: str = "distribute", pin: bool = True,
                 kv: str = "f16", attention: str | SparseConfig = "dense", planes_dir: str | Path | None = None,
                 documents: bool = False):
        """n_threads: a count (0 or None: one per physical core) or a cpu/plan.py ThreadPlan made
        by the caller (app/runtime's run plan); kv: a KV format (app/engine/kv/formats.py);
        attention: a mode of attention/config.py MODES or a SparseConfig; documents: the backend
        answers about documents. Which cache that takes is kv/formats.py ``blocked_cache``'s rule:
        f16 + dense without documents keeps llama.cpp's cache and numerics, anything else the
        blocked cache (app/engine/kv/blocked.py). planes_dir: where the repacked weights are kept
        between starts (quant/planes_file.py; None: repacked at every start)."""
        self.model_path = str(model_path)
        self.n_threads = n_threads
        self._thread_plan = _plan_threads(n_threads, numa)
        if not pin and not isinstance(self._thread_plan, (int, type(None))):
            # Unpinned (benchmarks compare): only the thread count, the OS places the threads.
            self._thread_plan = self._thread_plan.count
        _apply_threads(self._thread_plan)  # before loading: weight tiles are laid out per thread count
        # Mapped planes lie where the page cache put them; over several NUMA nodes the repack
        # instead places each thread's rows on its node (cpu/numa.py), so it runs every start.
        nodes = getattr(self._thread_plan, "per_node", ())
        self.model = Model(self.model_path, planes_dir if len(nodes) <= 1 else None)
        self.tokenizer = Tokenizer.from_gguf(self.model.reader)
        self.n_ctx = int(n_ctx or self.model.config.context_length)
        self.kv_spec = KVSpec.parse(kv)
        self.attention = attention if isinstance(attention, SparseConfig) else SparseConfig(mode=attention)
        self.blocked = blocked_cache(self.model.config.arch, self.kv_spec.name, self.attention.mode,
                                     documents)
        self.cache = self.model.new_cache(self.n_ctx, self.kv_spec if self.blocked else None)
        # How the current question reads the blocked cache (votes, selections, attention mass).
        self.state = AttentionState(self._sparse_for_context()) if self.blocked else None
        self.capabilities = Capabilities(prefix_files=self.blocked, composes=self.blocked,
                                         attended_blocks=self.blocked,
                                         focus=self.blocked and self.attention.mode != "dense", beside=self.blocked)
        self._focus = np.zeros(0, np.int64)           # (F,) blocks the next answer reads besides
        self._copies: dict[int, int] = {}             # block laid beside the question -> the block it copies
        self._view: tuple[int, int] | None = None      # the next answer reads these blocks only (AttentionState.view)
        self._question_at = 0                         # the next prompt's question starts here (question_at)
        self.prefix_multiple = self.kv_spec.block if self.blocked else 1
        self.prefill_chunk = prefill_chunk
        self.stats = GenerationStats()
        self._shape = KVShape.from_config(self.model.config)
        self._template = self.model.reader.value("tokenizer.chat_template")
        self._bos_text = self._special_text(self.tokenizer.bos_id)
        self._eos_text = self._special_text(self.tokenizer.eos_id)

    def _special_text(self, token: int | None) -> str:
        return "" if token is None else self.tokenizer.token_bytes(token).decode("utf-8", "replace")

    # ---- Protocol: text and generation -------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.tokenizer.encode(text, add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.tokenizer.decode(tokens)

    def token_bytes(self, token: int) -> bytes:
        return self.tokenizer.token_bytes(token)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chat(self._template, messages, self._bos_text, self._eos_text, add_generation_prompt,
                           arch=self.model.config.arch, tokenizer_adds_bos=self.tokenizer.add_bos)

    def eos_tokens(self) -> set[int]:
        return set(self.tokenizer.eot_ids)

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        """Prefill ``prompt`` (only the part not already cached), then yield generated ids
        until an end-of-generation token, max_tokens, a full context, or ``cancel()``."""
        prompt = [int(t) for t in prompt]
        focus, self._focus = self._focus, np.zeros(0, np.int64)     # told for this answer only
        question_at, self._question_at = self._question_at, 0
        if self._copies and self.cache.common_prefix(prompt) < (max(self._copies) + 1) * self.kv_spec.block:
            self._drop_copies()                                      # this prompt does not keep them
        view, self._view = self._view, None
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        if len(prompt) >= self.n_ctx:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx} "
                f"(prompt + answer): shorten the prompt or open {Path(self.model_path).name} "
                f"with a larger n_ctx")
        return self._generate(prompt, params, cancel, focus, question_at, view)

    def _generate(self, prompt: list[int], params: SamplingParams, cancel: Callable[[], bool] | None,
                  focus: np.ndarray, question_at: int = 0, view: tuple[int, int] | None = None) -> Iterator[int]:
        _apply_threads(self._thread_plan)  # numba's thread count is per calling thread
        self.stats = stats = GenerationStats(prompt_tokens=len(prompt))
        t0 = time.perf_counter()
        if self.blocked:
            self._observe(prompt, focus, question_at, view)
        logits, reused = prefill_reusing_prefix(self.model, self.cache, prompt, self.prefill_chunk, cancel,
                                                state=self.state)
        stats.prefill_s = time.perf_counter() - t0
        stats.reused_prompt_tokens = reused
        self._fill_costs(stats, len(prompt))
        if logits is None:  # cancelled during prefill
            return
        if self.blocked:
            self.state.reset_mass()   # attention mass of this answer only
        stop_ids = set() if params.ignore_eos else self.eos_tokens()
        tokens = generate_tokens(self.model, self.cache, logits, Sampler(params), list(prompt),
                                 params.max_tokens, stop_ids, cancel, state=self.state)
        # decode_s counts the engine's time after the first token, not the time the caller
        # spends between tokens (rendering, stop-string checks).
        # Decoding may read focus blocks on top of K (select() counts them): the bytes follow,
        # for the last step too (it runs after the last token is handed over).
        state = self.state if self.blocked else None
        resumed, counted = None, state.focus_read if state is not None else 0
        try:
            for token in tokens:
                now = time.perf_counter()
                if resumed is None:
                    stats.ttft_s = now - t0
                else:
                    stats.decode_s += now - resumed
                stats.decode_tokens += 1
                if state is not None and state.focus_read != counted:
                    counted = state.focus_read
                    self._fill_costs(stats, len(prompt))
                yield token
                resumed = time.perf_counter()
        finally:
            if state is not None and state.focus_read != counted:
                self._fill_costs(stats, len(prompt))

    def _fill_costs(self, stats: GenerationStats, n_tokens: int) -> None:
        """What a decode step reads with ``n_tokens`` cached (kv/sizes.py counts it): the
        weights, and all of the cache when dense, the attended blocks when sparse (with every
        block laid beside the question), the view's blocks with one (``beside(..., head=N)``)."""
        stats.weight_bytes_per_token = self.model.weight_bytes
        stats.kv, stats.attention = self.kv_spec.name, self.attention.mode
        stats.kv_bytes_per_token = self.kv_bytes_per_token()
        view = self.state.view if self.blocked else None
        if view is not None:                                      # as select() lays the view out
            b = self.kv_spec.block
            head = view_head(view, self.state.config, b)
            stats.kv_read_bytes_per_token = (head + max(0, -(-n_tokens // b) - view[1])) * b * stats.kv_bytes_per_token
            return
        sparse = self.state.config if self.blocked else None
        extra = self.state.focus_read if sparse is not None else 0
        if sparse is not None and self.state.read_from is not None:   # the copies beside, past the window
            b = self.kv_spec.block
            extra += max(0, -(-n_tokens // b) - self.state.read_from - sparse.window_blocks(b))
        if extra:                                                 # the focus comes on top of K
            sparse = replace(sparse, answer_k=sparse.k_for(1) + extra)
        stats.kv_read_bytes_per_token = kv_read_bytes_per_token(self._shape, self.kv_spec.name,
                                                                n_tokens, sparse)

    def _observe(self, prompt: list[int], focus: np.ndarray, question_at: int = 0,
                 view: tuple[int, int] | None = None) -> None:
        """Sparse attention: the prompt's last tokens choose the blocks decoding reads
        (app/engine/attention/votes.py), so they are computed afresh even when the cache still
        holds them, though never below the document's checkpoint nor before ``question_at`` (a
        conversation's new turn: its own tokens choose, as a first question's do); decoding also
        reads the ``focus`` blocks. With a view (``beside(..., head=N)``) nothing votes: the
        question after the checkpoint is computed afresh, reading the sinks and the copies only."""
        cache, cfg = self.cache, self.attention
        if view is not None:
            cp = cache.checkpoint
            if cp is not None and cache.n_tokens > cp.n_tokens and cache.common_prefix(prompt) >= cp.n_tokens:
                cache.truncate(cp.n_tokens)
            self.state.start_question(None, focus, view)
            return
        read_from = None if question_at else self._read_from()
        if not cfg.sparse or not cfg.observe:
            self.state.start_question(None, focus, read_from=read_from)
            return
        start = max(0, len(prompt) - cfg.observe)
        cp = cache.checkpoint
        if cp is not None and cache.common_prefix(prompt) >= cp.n_tokens:
            start = max(start, cp.n_tokens)
        start = min(max(start, question_at), len(prompt) - 1)
        if cache.n_tokens > start:
            cache.truncate(start)
        self.state.start_question((start, len(prompt)), focus, read_from=read_from)

    # ---- Protocol: the KV cache and document prefixes -------------------------------------

    def kv_bytes_per_token(self) -> int:
        """KV bytes one cached token occupies: llama.cpp's f16 layout when dense, the blocked
        format's codes, scales and bounds otherwise."""
        if not self.blocked:
            return kv_bytes_per_token(self._shape, "f16")
        return math.ceil(self.kv_spec.bytes_per_token(*self._shape.dims))

    def cache_signature(self) -> dict:
        """What a persisted prefix depends on besides the model and the tokens."""
        a = self.attention.prompt_config(self.n_ctx, self._trained())
        return {"kv": self.kv_spec.name, "block": self.kv_spec.block, "attention": a.mode,
                "sinks": a.sinks, "window": a.window, "top_k": a.k, "dense_layers": a.dense_layers,
                "prefill_chunk": self.prefill_chunk}

    def ensure_prefix(self, tokens: Sequence[int], file: CacheFile | None = None,
                      cancel: Callable[[], bool] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> Prefix | None:
        """Make the cache hold exactly ``tokens`` (a document prefix) and checkpoint there, so that
        every question after it prefills only itself: from memory when the cache holds it, from
        ``file`` when it exists and passes its checks, else computed — resuming after the part
        the cache already shares with it, in whole prefill chunks so the result is what a fresh
        computation gives — and then written to ``file``. ``progress(done, total)`` reports the
        tokens of the prefix computed so far. None if cancelled."""
        tokens = [int(t) for t in tokens]
        _apply_threads(self._thread_plan)
        cache = self.cache
        self._drop_copies()
        if self.blocked:
            self.state.start_question(None)      # a document prefix has no question to observe
        if cache.n_tokens >= len(tokens) and cache.common_prefix(tokens) == len(tokens):
            cache.truncate(len(tokens))
            if self.blocked:
                cache.set_checkpoint()
            return Prefix("hit", "memory")
        rejected = ""
        if self.blocked and file is not None and file.exists:
            try:
                kv_files.load(cache, file.path, file.meta)
                if cache.tokens == tokens:
                    return Prefix("hit", "file")
                rejected = f"{file.path}: the KV cache file holds other tokens"
            except CacheFileError as e:
                rejected = str(e)
        partial = _partial_path(file) if self.blocked and file is not None else None
        if partial is not None and cache.common_prefix(tokens) < len(tokens) // 2:
            self._resume_from(partial, file.meta, tokens)
        keep = cache.common_prefix(tokens) // self.prefill_chunk * self.prefill_chunk
        cache.truncate(keep)
        if keep == 0:
            cache.clear()
        last_save = [time.perf_counter()]

        def after_chunk(done: int, _n: int) -> None:
            if progress is not None:
                progress(keep + done, len(tokens))
            if partial is not None and time.perf_counter() - last_save[0] >= CHECKPOINT_S:
                self._checkpoint(partial, file.meta)
                last_save[0] = time.perf_counter()

        after_chunk(0, len(tokens) - keep)
        if prefill(self.model, cache, tokens[keep:], self.prefill_chunk, cancel, state=self.state,
                   progress=after_chunk) is None:
            if partial is not None and cache.n_tokens > keep:
                self._checkpoint(partial, file.meta)      # a paused reading resumes from here
            cache.clear()
            return None
        saved, save_error = 0, ""
        if self.blocked:
            cache.set_checkpoint()
            if file is not None:
                try:
                    saved = kv_files.save(cache, file.path, file.meta)
                    partial.unlink(missing_ok=True)
                except OSError as e:
                    save_error = f"{file.path}: {e.strerror or e}"
        return Prefix("miss", "computed", saved, rejected, save_error)

    def _checkpoint(self, path: Path, meta: dict) -> None:
        """The part of a prefix computed so far, in whole prefill chunks, written beside its file
        (a full disk only loses the checkpoint)."""
        n = self.cache.n_tokens
        if n == 0 or n % self.prefill_chunk:
            return          # only after a whole chunk: a resumed prefix must equal a fresh one
        try:
            kv_files.save(self.cache, path, meta)
        except OSError:
            pass

    def _resume_from(self, path: Path, meta: dict, tokens: list[int]) -> None:
        """Load the checkpoint of this prefix, if one exists and holds its first tokens."""
        if not path.exists():
            return
        try:
            kv_files.load(self.cache, path, meta)
        except CacheFileError:
            path.unlink(missing_ok=True)
            self.cache.clear()
            return
        if self.cache.common_prefix(tokens) < self.cache.n_tokens:    # another prefix's: not ours
            self.cache.clear()
            path.unlink(missing_ok=True)

    def compose(self, files: Sequence[CacheFile], skip: int, room: int) -> list[int]:
        """The files' prefixes side by side: the first memory-mapped whole, the others copied
        without their first ``skip`` tokens (the header every prefix starts with)."""
        if not self.capabilities.composes:
            raise ValueError("only the blocked KV cache lays several documents side by side")
        cache = self.cache
        cache.clear()
        self._drop_copies()
        sizes = [_checked(f, lambda f: kv_files.read_header(f.path)["n_tokens"]) for f in files]
        self.reserve(sum(sizes) - skip * (len(files) - 1) + room)
        offsets = []
        for i, f in enumerate(files):
            offsets.append(cache.n_tokens if i else skip)
            if i == 0:
                _checked(f, lambda f: kv_files.load(cache, f.path, f.meta))
            else:
                _checked(f, lambda f: kv_files.append(cache, f.path, f.meta, skip=skip))
        cache.set_checkpoint()
        return offsets

    def focus(self, ranges: Sequence[tuple[int, int]]) -> None:
        """The next answer reads the blocks holding tokens [start, end) of each range besides the
        blocks its attention chooses (sparse modes; the dense modes read everything anyway)."""
        if not self.capabilities.focus:
            return
        b = self.kv_spec.block
        blocks = [b0 for s, e in ranges if e > s for b0 in range(s // b, -(-e // b))]
        self._focus = np.array(list(dict.fromkeys(blocks)), np.int64)   # (F,) best passage first

    def question_at(self, start: int) -> None:
        """The next prompt's question begins at token ``start`` (Backend.question_at)."""
        self._question_at = max(0, int(start))

    def beside(self, ranges: Sequence[tuple[int, int]], room: int, head: int | None = None) -> list[int]:
        """Copies of the blocks holding ``ranges`` after the prefix the cache holds (a whole number
        of blocks: prefixes are padded to them), in document order, as many as ``room`` tokens
        hold, best range first; checkpointed after them, so the question's observed tokens start
        there. Every token of the answer to the question that follows reads all of them
        (``_read_from``); their attention mass counts for the blocks they copy
        (``attended_blocks``). With ``head``, the next answer reads the blocks of the first
        ``head`` tokens, the copies and its own only (AttentionState.view)."""
        if not self.capabilities.beside:
            return []
        cache, b = self.cache, self.kv_spec.block
        n_full = cache.n_tokens // b
        if cache.n_tokens % b or cache.checkpoint is None or cache.checkpoint.n_tokens != cache.n_tokens:
            return []           # the cache does not end with a prefix (ensure_prefix, compose) to follow
        wanted = [i for s, e in ranges if e > s for i in range(s // b, -(-e // b)) if i < n_full]
        chosen = sorted(list(dict.fromkeys(wanted))[:max(0, room) // b])
        if not chosen:
            return []
        cache.copy_blocks(chosen)
        cache.set_checkpoint()
        self._copies = {n_full + k: i for k, i in enumerate(chosen)}
        self._view = None if head is None else (-(-head // b), n_full)
        return list(cache.tokens[n_full * b:])

    def _read_from(self) -> int | None:
        """The first block laid beside the question (``beside``): its answer reads every copy,
        not only those the votes rank high (AttentionState.read_from). On the tuning half that
        answered 81 of 90 questions against 76 (docs/benchmarks.md). A conversation's later turn
        (``question_at``) is not told to: the copies are the first question's passages, and
        reading every earlier turn whole would grow with the conversation."""
        return min(self._copies) if self._copies else None

    def _drop_copies(self) -> None:
        """The cache no longer holds the blocks ``beside`` laid after the prefix, nor the view of them."""
        self._copies, self._view = {}, None

    def reserve(self, n_ctx: int) -> None:
        """Hold at least ``n_ctx`` tokens (a question over many documents' caches). Past the
        trained context attention may read otherwise (SparseConfig.for_context): then what the
        cache holds, read the other way, is dropped (a prefix comes back from its file)."""
        if self.blocked and n_ctx > self.n_ctx:
            before = self.cache_signature()
            self.cache.reserve(n_ctx)
            self.n_ctx = n_ctx
            self.state.config = self._sparse_for_context()
            if self.cache_signature() != before:
                self.cache.clear()

    def _trained(self) -> int:
        """The model's trained context (this context where the file does not say)."""
        return self.model.config.context_length or self.n_ctx

    def _sparse_for_context(self) -> SparseConfig:
        """How attention reads a context of this backend's size (SparseConfig.for_context)."""
        return self.attention.for_context(self.n_ctx, self._trained())

    def cached_tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        return list(self.cache.tokens[start:end])

    def attended_blocks(self, limit: int = 8) -> list[tuple[int, int, float]]:
        """The blocks that received the most attention mass during the last generation:
        (first token, end token, share of the mass), largest first. Empty for the contiguous
        f16 cache."""
        if not self.blocked:
            return []
        mass = self.state.block_mass.copy()                   # (NB,) float64
        for copy, block in self._copies.items():               # a copy's mass is its block's
            if copy < mass.shape[0]:
                mass[block] += mass[copy]
                mass[copy] = 0.0
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
        self._drop_copies()

    def close(self) -> None:
        self.cache = None
        self.model = None


def _partial_path(file: CacheFile) -> Path:
    """Where the checkpoint of ``file``'s prefix lives while it is being computed."""
    return Path(file.path).with_name(Path(file.path).name + ".partial")


def _checked(file: CacheFile, read):
    """read(file), with a CacheFileError that names the file it came from."""
    try:
        return read(file)
    except CacheFileError as e:
        raise CacheFileError(str(e), file.path) from e


# ---- Threads -------------------------------------------------------------------------------


def _plan_threads(n_threads, numa: str = "distribute"):
    """The thread plan of app/engine/cpu/plan.py (one thread per physical core by default), or
    the bare count where /sys cannot be read; a plan made by the caller is taken as it is."""
    from .cpu.plan import ThreadPlan, plan_threads
    from .cpu.topology import read_topology

    if isinstance(n_threads, ThreadPlan):
        return n_threads
    try:
        return plan_threads(read_topology(), threads=n_threads or 0, numa_policy=numa)
    except (OSError, ValueError):
        return n_threads


def _apply_threads(plan) -> None:
    """Apply the plan in the calling thread; a bare count (or None) when no plan could be made."""
    from .cpu.pinning import apply, unpin

    if plan is None or isinstance(plan, int):
        # unpinned: undo any earlier apply in this process, or this run would stay pinned
        unpin(plan or 0)
        return
    apply(plan)
