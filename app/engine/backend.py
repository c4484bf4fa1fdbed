"""The protocol every inference backend implements, and what they share.

Two backends exist: ``ellm`` (our engine, app/engine) and ``llamacpp``
(llama-cpp-python, dense attention). The services (ask, summarize, complete,
bench) only talk to this protocol, so a backend can be swapped per call.
"""
from __future__ import annotations

import codecs
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

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
    """Timings of the last generation, filled by the backend as it runs."""

    prompt_tokens: int = 0
    prefill_s: float = 0.0
    ttft_s: float = 0.0
    decode_tokens: int = 0
    decode_s: float = 0.0
    extra: dict = field(default_factory=dict)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def decode_tok_s(self) -> float:
        # The first generated token comes out of prefill; decode speed counts the rest.
        n = self.decode_tokens - 1
        return n / self.decode_s if n > 0 and self.decode_s > 0 else 0.0

    def as_dict(self) -> dict:
        d = {
            "prompt_tokens": self.prompt_tokens,
            "prefill_s": round(self.prefill_s, 4),
            "prefill_tok_s": round(self.prefill_tok_s, 2),
            "ttft_s": round(self.ttft_s, 4),
            "decode_tokens": self.decode_tokens,
            "decode_s": round(self.decode_s, 4),
            "decode_tok_s": round(self.decode_tok_s, 2),
        }
        d.update(self.extra)
        return d


# ---- Protocol --------------------------------------------------------------


class Backend(Protocol):
    name: str
    n_ctx: int  # tokens the backend holds: prompt + generated
    stats: GenerationStats

    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def token_bytes(self, token: int) -> bytes: ...

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str: ...

    def eos_tokens(self) -> set[int]: ...

    def generate(self, prompt: Sequence[int], params: SamplingParams,
                 cancel: Callable[[], bool] | None = None) -> Iterator[int]:
        """Prefill ``prompt`` then yield generated token ids until EOS, max_tokens or cancel."""
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
