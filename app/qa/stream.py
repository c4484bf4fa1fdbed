"""An answer generated from prompt tokens and streamed as it comes: its text pieces to the
front end, the engine's statistics with each, and the moment the first piece came (the
``ttft_s`` a person waited, counted from the question)."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

from app.engine.backend import Backend, GenerationStats, SamplingParams, stream_text

TextSink = Callable[[str], None]
StatsSink = Callable[[GenerationStats], None]
ProgressSink = Callable[[int, int, str], None]   # (tokens read, of total, what) — 0, 0: no count


@dataclass(frozen=True)
class Listeners:
    """Who follows a question on its way to an answer, all optional: ``on_text`` receives the
    answer as it streams, ``on_stats`` the engine's statistics with each piece (tokens/s, bytes
    read), ``progress(done, total, line)`` a document being read into its cache (tokens read of
    total, time left); ``cancel()`` returning true stops it."""

    on_text: TextSink | None = None
    on_stats: StatsSink | None = None
    progress: ProgressSink | None = None
    cancel: Callable[[], bool] | None = None

    def cancelled(self) -> bool:
        return self.cancel is not None and bool(self.cancel())


class AnswerStream:
    """Generates an answer from prompt tokens, streaming its text to ``listen.on_text`` (and the
    engine's statistics to ``listen.on_stats``), noting when the first piece came (seconds after
    ``t_start``) and whether ``listen.cancel`` stopped it."""

    def __init__(self, backend: Backend, params: SamplingParams, listen: Listeners, t_start: float):
        self.backend, self.params = backend, params
        self.listen = listen
        self.t_start = t_start
        self.cancelled = False
        self.first_token_s: float | None = None
        self.prompt: list[int] = []          # the prompt it generated from
        self.generated: list[int] = []       # the ids it generated (what the backend now holds after the prompt)
        self.base = 0                        # how many prompt tokens are the documents' part

    def stop_now(self) -> bool:
        if self.listen.cancelled():
            self.cancelled = True
        return self.cancelled

    def timings(self, **parts) -> dict:
        """The engine's statistics of the answer, with ``parts`` (seconds of its stages) and the
        time a person waited: to the first token and in all, from ``t_start``."""
        timings = self.backend.stats.as_dict()
        # The engine's ttft counts from its own prefill; a person waits from the question.
        timings["engine_ttft_s"] = timings.pop("ttft_s", 0.0)
        timings.update(parts)
        timings["ttft_s"] = timings["first_token_s"] = round(self.first_token_s or 0.0, 4)
        timings["total_s"] = round(time.perf_counter() - self.t_start, 3)
        return timings

    def run(self, tokens: list[int], base: int = 0, lead: str = "") -> str:
        """The answer's text; ``base``: how many of ``tokens`` are the documents' part; ``lead``:
        streamed before its first piece, if there is one (what separates it from an answer before)."""
        pieces = []
        self.prompt, self.generated, self.base = list(tokens), [], base

        def ids():
            for token in self.backend.generate(tokens, self.params, self.stop_now):
                self.generated.append(token)
                yield token

        for piece in stream_text(self.backend, ids(), self.params.stop):
            if self.first_token_s is None:
                self.first_token_s = time.perf_counter() - self.t_start
            if lead and not pieces and self.listen.on_text:
                self.listen.on_text(lead)
            pieces.append(piece)
            if self.listen.on_text:
                self.listen.on_text(piece)
            if self.listen.on_stats:
                self.listen.on_stats(self.backend.stats)
        return "".join(pieces).strip()


__all__ = ["AnswerStream", "Listeners", "ProgressSink", "StatsSink", "TextSink"]
