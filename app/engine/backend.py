"""The protocol every inference backend implements, and what they share.

Two backends exist: ``ellm`` (our engine, app/engine) and ``llamacpp`` (llama-cpp-python,
dense attention). The services (questions, summaries, completion, benchmarks) only talk to
this protocol, so a backend can be swapped per call. Beyond generating, a backend keeps
document prefixes in its KV cache (the prefix-cache part of the protocol): it may persist a
prefix's cache in a file and load it again, lay several prefixes' caches side by side for one
question across documents, and report which blocks an answer attended to. What a backend can
do is stated in its ``capabilities``; a service asks them, never ``hasattr``.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator, Protocol, Sequence

from .kv.formats import CacheFileError  # noqa: F401  (part of the backend protocol)

# ---- Configuration ---------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is picked. temperature <= 0 means greedy."""

    max_tokens: int = 256
    temperature: float = 0.7
    top_k: int = 40
    top_p: float = 0.95
    repeat_penalty: float = 1.1
    repeat_last_n: int = 64
    seed: int = 0
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # benchmarks: keep decoding past end-of-generation tokens

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @staticmethod
    def make_greedy(max_tokens: int = 256, stop: tuple[str, ...] = ()) -> "SamplingParams":
        return SamplingParams(max_tokens=max_tokens, temperature=0.0, top_k=1, top_p=1.0,
                              repeat_penalty=1.0, stop=stop)


@dataclass
class GenerationStats:
    """Timings and costs of the last generation, filled by the backend as it runs.

    The cost fields are what one decode step reads (performance is counted in bytes moved):
    the weights it streams and the KV bytes it reads at this context, as the engine counts
    them (sparse attention reads only the blocks it attends). The window's live GB/s is
    ``read_gb_s``, not a guess from the text stream."""

    prompt_tokens: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    reused_prompt_tokens: int = 0        # prompt tokens the cache already held
    weight_bytes_per_token: int = 0      # weight bytes one decode step streams
    kv: str = ""                         # the KV format ("f16", "k8v4", ...)
    attention: str = ""                  # "dense" | "sparse" | "sparse-decode"
    kv_bytes_per_token: int = 0          # KV bytes stored per token
    kv_read_bytes_per_token: int = 0     # KV bytes one decode step reads at this context

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first generated token comes out of prefill; decode speed counts the rest.
        n = self.decode_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    @property
    def bytes_per_decode_token(self) -> int:
        return self.weight_bytes_per_token + self.kv_read_bytes_per_token

    @property
    def read_gb_s(self) -> float:
        """Memory read per second while decoding (0 until two tokens are out)."""
        return self.decode_tok_s * self.bytes_per_decode_token / 1e9

    def as_dict(self) -> dict:
        d = {
            "prompt_tokens": self.prompt_tokens,
            "prefill_s": round(self.prefill_s, 4),
            "prefill_tok_s": round(self.prefill_tok_s, 2),
            "ttft_s": round(self.ttft_s, 4),
            "decode_tokens": self.decode_tokens,
            "decode_s": round(self.decode_s, 4),
            "decode_tok_s": round(self.decode_tok_s, 2),
            "reused_prompt_tokens": self.reused_prompt_tokens,
        }
        if self.kv:
            d.update(kv=self.kv, attention=self.attention, kv_bytes_per_token=self.kv_bytes_per_token,
                     kv_read_bytes_per_token=self.kv_read_bytes_per_token,
                     weight_bytes_per_token=self.weight_bytes_per_token)
        return d


# ---- Document prefixes -----------------------------------------------------------


@dataclass(frozen=True)
class Capabilities:
    """What a backend does with document prefixes besides holding the last one in memory."""

    prefix_files: bool = False     # persists a prefix's KV cache in a file and loads it again
    composes: bool = False         # lays several prefixes' caches side by side in one context
    attended_blocks: bool = False  # reports the blocks an answer attended to (citations)
    focus: bool = False            # the next answer can be told to read given passages (``focus``)
    beside: bool = False           # lays copies of cached passages after the prefix, nearest the question


@dataclass(frozen=True)
class CacheFile:
    """A persisted prefix cache: where it lives, what it must have been made with, and whether
    the caller believes it exists (registered and on disk) or wants it written."""

    path: Path
    meta: dict
    exists: bool = False


@dataclass(frozen=True)
class Prefix:
    """What ``ensure_prefix`` did: ``status`` "hit" (the cache already held the prefix, in memory
    or from its file) or "miss" (computed now); ``source`` "memory" | "file" | "computed" |
    "deferred" (a backend without prefix caching prefills it with the question);
    ``saved_bytes``: the size of the file written on a miss (0: none); ``rejected``: why an
    existing file was not used (corrupt, other settings, other tokens) — it is overwritten;
    ``save_error``: why the file could not be written (a full disk does not fail a question)."""

    status: str
    source: str
    saved_bytes: int = 0
    rejected: str = ""
    save_error: str = ""


# ---- Protocol --------------------------------------------------------------


class Backend(Protocol):
    name: str
    model_path: str
    n_ctx: int  # tokens the backend holds: prompt + generated
    stats: GenerationStats
    capabilities: Capabilities
    prefix_multiple: int  # document prefixes are padded to a multiple of this many tokens

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...

    def eos_tokens(self) -> set[int]: ...

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        """Prefill ``prompt`` then yield generated token ids until EOS, max_tokens or cancel."""
        ...

    def kv_bytes_per_token(self) -> int:
        """KV bytes one cached token occupies in this backend's cache."""
        ...

    def cache_signature(self) -> dict:
        """What a persisted prefix depends on besides the model and the tokens."""
        ...

    def ensure_prefix(self, tokens: Sequence[int], file: CacheFile | None = None,
                      cancel: Callable[[], bool] | None = None,
                      progress: Callable[[int, int], None] | None = None) -> Prefix | None:
        """Make the cache hold exactly ``tokens`` (a document prefix), from memory, from
        ``file`` when it exists, or computed (then written to ``file``), reporting
        ``progress(done, total)`` tokens as it computes; None if cancelled."""
        ...

    def compose(self, files: Sequence[CacheFile], skip: int, room: int) -> list[int]:
        """Lay the prefixes of ``files`` one after another in the cache, the first whole and each
        other less its first ``skip`` tokens (a header they share), with ``room`` tokens to spare
        after them. Returns the first token of each. Raises CacheFileError naming a bad file."""
        ...

    def cached_tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        """The token ids the cache holds at positions [start, end)."""
        ...

    def attended_blocks(self, limit: int = 8) -> list[tuple[int, int, float]]:
        """(first token, end token, share of the mass) of the blocks the last answer attended
        to most, largest first; empty when the backend does not report them."""
        ...

    def focus(self, ranges: Sequence[tuple[int, int]]) -> None:
        """The next generation's answer also reads the cached tokens [start, end) of each range,
        whatever its attention chooses (passages a relevance ranking found); only where
        ``capabilities.focus``."""
        ...

    def question_at(self, start: int) -> None:
        """The next generation's question begins at prompt token ``start`` (a conversation's new
        turn after earlier ones): with sparse attention only its own tokens choose the blocks the
        answer reads, as a first question's do (by default the prompt's last tokens after the
        document prefix). Nothing to do for dense attention."""
        ...

    def beside(self, ranges: Sequence[tuple[int, int]], room: int, head: int | None = None) -> list[int]:
        """After the prefix the cache holds, copies of the cached tokens of ``ranges`` (passages a
        relevance ranking found), in document order, as many as fit ``room`` tokens: the
        passages again next to the question, without computing them again, read by every token
        of the answer whatever its attention chooses elsewhere. Returns the tokens
        the copies spell: the next prompt continues the prefix with them. With ``head``, the next
        generation reads only the first ``head`` tokens (the prompt's header), the copies and
        what follows them: the passages alone, as the document's reading left them. Only where
        ``capabilities.beside``."""
        ...

    def close(self) -> None: ...


# ---- Shared helpers ----------------------------------------------------------


def stream_text(backend: Backend, tokens: Iterator[int], stop: tuple[str, ...] = ()) -> Iterator[str]:
    """Turn a token stream into text pieces, holding back bytes of unfinished UTF-8
    characters and any tail that could still become a stop string."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    pending = ""
    hold = max((len(s) for s in stop), default=0)
    for tok in tokens:
        pending += decoder.decode(backend.token_bytes(tok))
        if stop:
            hits = [pending.find(s) for s in stop if s in pending]
            if hits:
                cut = min(hits)
                if cut:
                    yield pending[:cut]
                return
            if len(pending) > hold:
                yield pending[: len(pending) - hold]
                pending = pending[len(pending) - hold:]
        elif pending:
            yield pending
            pending = ""
    pending += decoder.decode(b"", final=True)
    if pending:
        yield pending
