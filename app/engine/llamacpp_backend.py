"""The ``llamacpp`` backend: llama-cpp-python, dense attention.

It is the reference our engine is measured against, and the way to run model
architectures our engine does not implement.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator, Sequence

from app.engine.backend import GenerationStats, SamplingParams

from .model.chat import render_chat

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
        return llama_cpp.Llama(model_path=str(model_path), **kwargs)
    with _without_extra_buffers(llama_module):
        return llama_cpp.Llama(model_path=str(model_path), **kwargs)


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, model_path: str, n_ctx: int = 8192, n_threads: int | None = None,
                 n_batch: int = 512, numa: bool | int = False, type_k: int | None = None,
                 type_v: int | None = None, flash_attn: bool = False):
        import llama_cpp  # imported here: loading the shared library costs ~0.3 s

        quiet_llama_logs()
        self.model_path = str(model_path)
        self.llm = open_llama(
            self.model_path, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads,
            n_threads_batch=n_threads, numa=numa, type_k=type_k, type_v=type_v, flash_attn=flash_attn,
            verbose=False,
        )
        self.n_ctx = self.llm.n_ctx()
        self.stats = GenerationStats()
        meta = self.llm.metadata
        self._template = meta.get("tokenizer.chat_template")
        vocab = self.llm._model.vocab if hasattr(self.llm._model, "vocab") else self.llm._model.model
        self._vocab = vocab
        self._bos = self._piece(self.llm.token_bos())
        self._eos = self._piece(self.llm.token_eos())
        self._eog = {t for t in range(self.llm.n_vocab()) if llama_cpp.llama_vocab_is_eog(vocab, t)} \
            if hasattr(llama_cpp, "llama_vocab_is_eog") else {self.llm.token_eos()}

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
        return render_chat(self._template, messages, self._bos, self._eos, add_generation_prompt)

    def eos_tokens(self) -> set[int]:
        return set(self._eog)

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        prompt = list(prompt)
        if len(prompt) + 1 > self.n_ctx:
            raise ValueError(f"prompt of {len(prompt)} tokens does not fit the context of {self.n_ctx} tokens")
        budget = min(params.max_tokens, self.n_ctx - len(prompt))
        self.stats = stats = GenerationStats(prompt_tokens=len(prompt))
        self.llm.set_seed(params.seed)
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

    def close(self) -> None:
        self.llm.close() if hasattr(self.llm, "close") else None
