"""Live decode speed while an answer streams: tokens/s and the memory traffic it implies.

Decoding one token reads every weight and the KV cache of the context (DESIGN.md,
"Performance is counted in bytes"), so bytes/s = tokens/s x (model bytes + KV bytes
per token x context tokens). The figures come from the hardware report; this only
keeps the running rate.
"""
from __future__ import annotations

import time


def bytes_per_decode_token(model_bytes: int, kv_bytes_per_token: int, context_tokens: int) -> int:
    return int(model_bytes) + int(kv_bytes_per_token) * int(context_tokens)


class LiveRate:
    """Pieces of streamed text counted against the time since the first one
    (the first token's latency is prefill, not decode)."""

    def __init__(self, clock=time.perf_counter):
        self._clock = clock
        self.first: float | None = None
        self.last: float | None = None
        self.count = 0

    def add(self, n: int = 1) -> None:
        now = self._clock()
        if self.first is None:
            self.first = now
        else:
            self.count += n
        self.last = now

    @property
    def tok_s(self) -> float | None:
        if self.first is None or self.last is None or self.last <= self.first or not self.count:
            return None
        return self.count / (self.last - self.first)

    def gb_s(self, bytes_per_token: int | None) -> float | None:
        rate = self.tok_s
        if rate is None or not bytes_per_token:
            return None
        return rate * bytes_per_token / 1e9
