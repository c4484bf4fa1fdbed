"""The ``llamacpp`` backend: llama-cpp-python, dense attention.

It is the reference our engine is measured against, and the way to run model
architectures our engine does not implement.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from .backend import CacheFile, Capabilities, GenerationStats, Prefix, SamplingParams
from .kv.sizes import LLAMACPP_KV_TYPES, KVShape, llamacpp_kv_bytes_per_token
from .model.chat import render_chat
from .header.gguf_file import scan_gguf

_quiet_callback = None


def quiet_llama_logs() -> None:
    """Silence llama.cpp's own stderr log (context sizes, warnings meant for its
    developers); our errors are raised as exceptions with messages of our own."""
    global _quiet_callback
    import llama_cpp

    if _quiet_callback is None:
        _quiet_callback = llama_cpp.llama_log_callback(lambda level, text, data: None)
        llama_cpp.llama_log_set(_quiet_callback, None)


def cpu_has_amx(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether the CPU advertises Intel AMX (Sapphire Rapids and later Xeons)."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return "amx_int8" in flags.split()


_params_lock = threading.Lock()
_opened: weakref.WeakSet = weakref.WeakSet()   # every Llama this process made


@atexit.register
def _close_all() -> None:
    """Free llama.cpp's models before the interpreter tears its modules down; a Llama left to
    its __del__ at that point fails with "'NoneType' object is not callable" on stderr."""
    for llm in list(_opened):
        llm.close()


@contextmanager
def _without_extra_buffers(llama_module):
    """Load models with ``use_extra_bufts = false`` (llama.cpp's ``--no-repack``): weights stay
    in the plain CPU buffer. llama-cpp-python's ``Llama`` takes its model parameters from
    ``llama_model_default_params()`` and has no argument for this one, so the default is
    swapped while the model loads."""
    with _params_lock:
        default = llama_module.llama_cpp.llama_model_default_params

        def params():
            p = default()
            p.use_extra_bufts = False
            return p

        llama_module.llama_cpp.llama_model_default_params = params
        try:
            yield
        finally:
            llama_module.llama_cpp.llama_model_default_params = default


def open_llama(model_path: str | Path, **kwargs):
    """``llama_cpp.Llama(model_path, **kwargs)``, the one place this project creates one.

    On CPUs with AMX, llama.cpp (llama-cpp-python 0.3.36, built natively) puts the weights in
    its AMX buffer type and crashes in ``ggml_backend_amx_mul_mat`` at the first matrix
    product (a segmentation fault, every model tried). There the extra buffer types (AMX and
    the repacked layouts) are turned off, which is what ``llama-cli --no-repack`` does; the
    products then run in ggml's plain vec_dot kernels."""
    import llama_cpp
    import llama_cpp.llama as llama_module

    if kwargs.get("vocab_only") or not cpu_has_amx():
        llm = llama_cpp.Llama(model_path=str(model_path), **kwargs)
    else:
        with _without_extra_buffers(llama_module):
            llm = llama_cpp.Llama(model_path=str(model_path), **kwargs)
    _opened.add(llm)
    return llm


class LlamaCppBackend:
    """llama-cpp-python with dense attention. It keeps the last prompt in its own cache (a
    prompt that starts with it prefills only the rest) but no prefix files and no composed
    caches: a document prefix is prefilled with the question."""

    name = "llamacpp"
    capabilities = Capabilities()
    prefix_multiple = 1

    def __init__(self, model_path: str, n_ctx: int = 8192, n_threads: int | None = None,
                 n_batch: int = 512, numa: bool | int = False, kv: str = "f16", flash_attn: bool | None = None,
                 pin_cpus: Sequence[int] | None = None):
        """kv: a KV setting name, mapped onto llama.cpp's cache types (f16, q8_0, q4_0); its
        quantized V cache needs flash attention, which is on by default exactly then.
        pin_cpus: run one thread pinned on each of these CPUs (llamacpp_threads.py; the
        benchmark pins both engines alike), instead of ``n_threads`` placed by the OS."""
        import llama_cpp  # imported here: only this engine pays for loading the shared library

        if kv not in LLAMACPP_KV_TYPES:
            raise ValueError(f"unknown KV setting {kv!r}: use one of {', '.join(LLAMACPP_KV_TYPES)}")
        type_k, type_v = LLAMACPP_KV_TYPES[kv]
        quiet_llama_logs()
        self.model_path = str(model_path)
        self.kv = kv
        self.flash_attn = kv != "f16" if flash_attn is None else flash_attn
        self.llm = open_llama(
            self.model_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=len(pin_cpus) if pin_cpus else n_threads,
            n_threads_batch=len(pin_cpus) if pin_cpus else n_threads, numa=numa, type_k=type_k, type_v=type_v, flash_attn=self.flash_attn,
            verbose=False,
        )
        self.n_ctx = self.llm.n_ctx()
        self.pinned = None
        if pin_cpus:
            from .llamacpp_threads import PinnedPool

            self.pinned = PinnedPool(self.llm.ctx, pin_cpus)
        self.stats = GenerationStats()
        layout = scan_gguf(self.model_path)
        self._shape = KVShape.from_layout(layout)
        self._weight_bytes = layout.weight_bytes_per_token()
        self._template = self.llm.metadata.get("tokenizer.chat_template")
        vocab = self.llm._model.vocab
        self._bos = self._piece(self.llm.token_bos())
        self._eos = self._piece(self.llm.token_eos())
        self._eog = {t for t in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)}
        self._arch = layout.architecture
        self._adds_bos = bool(llama_cpp.llama_vocab_get_add_bos(vocab))

    def _piece(self, token: int) -> str:
        if token < 0:
            return ""
        return self.llm.detokenize([token], special=True).decode("utf-8", errors="replace")

    # ---- Protocol ----------------------------------------------------------

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return self.llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self.llm.detokenize(list(tokens), special=True).decode("utf-8", errors="replace")

    def token_bytes(self, token: int) -> bytes:
        return self.llm.detokenize([token], special=True)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chat(self._template, messages, self._bos, self._eos, add_generation_prompt,
                           arch=self._arch, tokenizer_adds_bos=self._adds_bos)

    def eos_tokens(self) -> set[int]:
        return set(self._eog)

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        prompt = list(prompt)
        if len(prompt) + 1 > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx} tokens")
        budget = min(params.max_tokens, self.n_ctx - len(prompt))
        self.stats = stats = GenerationStats(prompt_tokens=len(prompt))
        stats.reused_prompt_tokens = min(self._common_prefix(prompt), len(prompt) - 1)
        stats.weight_bytes_per_token = self._weight_bytes
        stats.kv, stats.attention = self.kv, "dense"
        stats.kv_bytes_per_token = self.kv_bytes_per_token()
        stats.kv_read_bytes_per_token = stats.kv_bytes_per_token * len(prompt)
        self.llm.set_seed(params.seed)
        self._note_caller()
        t0 = time.perf_counter()
        stream = self.llm.generate(
            prompt, top_k=params.top_k if not params.greedy else 1, top_p=params.top_p, min_p=0.0,
            temp=params.temperature if not params.greedy else 0.0,
            repeat_penalty=params.repeat_penalty if not params.greedy else 1.0, reset=True,
        )
        t_first = None
        try:
            for token in stream:
                now = time.perf_counter()
                if t_first is None:
                    t_first = now
                    stats.ttft_s = stats.prefill_s = now - t0
                stats.decode_tokens += 1
                stats.decode_s = now - t_first
                if token in self._eog and not params.ignore_eos:
                    return
                yield int(token)
                if stats.decode_tokens >= budget or (cancel is not None and cancel()):
                    return
        finally:
            stream.close()

    def _common_prefix(self, prompt: list[int]) -> int:
        """Prompt tokens llama-cpp-python keeps from its last prompt (Llama.generate, reset=True
        still reuses the longest common prefix)."""
        n = 0
        for a, b in zip(self.llm.input_ids[:self.llm.n_tokens].tolist(), prompt):
            if a != b:
                break
            n += 1
        return n

    # ---- Protocol: the KV cache and document prefixes ---------------------------------

    def kv_bytes_per_token(self) -> int:
        return llamacpp_kv_bytes_per_token(self._shape, self.kv)

    def cache_signature(self) -> dict:
        return {"kv": self.kv, "attention": "dense", "flash_attn": self.flash_attn}

    def ensure_prefix(self, tokens: Sequence[int], file: CacheFile | None = None,
                      cancel: Callable[[], bool] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> Prefix | None:
        """Evaluate the prefix now, in batches, so its reading shows progress and can be
        cancelled; the question's generate then keeps it (Llama.generate reuses the longest
        common prefix). Kept in memory only: llama.cpp's state files are not ours to compose."""
        tokens = [int(t) for t in tokens]
        keep = self._common_prefix(tokens)
        if keep >= len(tokens):
            return Prefix("hit", "memory")
        llm = self.llm
        self._note_caller()
        llm.n_tokens = keep          # Llama.eval drops the cache after n_tokens before it evaluates
        if progress is not None:
            progress(keep, len(tokens))
        step = max(1, llm.n_batch)
        for i in range(keep, len(tokens), step):
            if cancel is not None and cancel():
                return None
            llm.eval(tokens[i:i + step])
            if progress is not None:
                progress(min(i + step, len(tokens)), len(tokens))
        return Prefix("miss", "computed")

    def save_state(self, path: str | Path) -> int:
        """Write the context's state (KV cache, tokens; llama_state_save_file) to ``path``;
        its size in bytes. The benchmark keeps long prefilled contexts this way."""
        import llama_cpp

        n = self.llm.n_tokens
        tokens = (llama_cpp.llama_token * max(1, n))(*self.llm.input_ids[:n].tolist())
        if not llama_cpp.llama_state_save_file(self.llm.ctx, str(path).encode(), tokens, n):
            raise OSError(f"{path}: llama.cpp could not write its state")
        return Path(path).stat().st_size

    def load_state(self, path: str | Path, tokens: Sequence[int]) -> bool:
        """Restore a state written by ``save_state`` if it holds exactly ``tokens``; the next
        ``generate`` of those tokens then evaluates only the last one again (for its logits)."""
        import ctypes

        import llama_cpp

        tokens = [int(t) for t in tokens]
        if len(tokens) > self.n_ctx:
            return False
        out = (llama_cpp.llama_token * max(1, self.n_ctx))()
        n_out = ctypes.c_size_t(0)
        if not llama_cpp.llama_state_load_file(self.llm.ctx, str(path).encode(), out, self.n_ctx,
                                               ctypes.byref(n_out)):
            self.llm.reset()
            return False
        if list(out[:n_out.value]) != tokens:
            self.llm.reset()
            return False
        self.llm.input_ids[:len(tokens)] = tokens
        self.llm.n_tokens = len(tokens)
        self.llm._requires_eval = True   # the restored logits are not a live decode's
        return True

    def compose(self, files: Sequence[CacheFile], skip: int, room: int) -> list[int]:
        raise ValueError("llama.cpp cannot lay several documents' caches side by side")

    def cached_tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        return self.llm.input_ids[:self.llm.n_tokens].tolist()[start:end]

    def attended_blocks(self, limit: int = 8) -> list[tuple[int, int, float]]:
        return []

    def focus(self, ranges: Sequence[tuple[int, int]]) -> None:
        pass      # dense attention reads every cached token anyway

    def question_at(self, start: int) -> None:
        pass      # dense attention: no block choice to make

    def beside(self, ranges: Sequence[tuple[int, int]], room: int, head: int | None = None) -> list[int]:
        return []  # llama.cpp's cache holds no blocks to copy (capabilities.beside is False)

    def _note_caller(self) -> None:
        if self.pinned is not None:
            self.pinned.note_caller()

    def close(self) -> None:
        if self.pinned is not None:
            self.pinned.close()
        self.llm.close()
