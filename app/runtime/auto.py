"""The automatic settings: the context, KV format and attention a question gets when a person
has chosen none of them (``Settings`` n_ctx 0, kv "auto", attention "auto"). Whatever a person
did choose is kept as chosen.

The rules (docs/benchmarks.md gives the figures behind them):

* context: the whole of the documents asked about (their text and page markers), plus the
  question, the passages shown again beside it (qa/answer.py) and the answer, rounded up to
  ``CONTEXT_STEP``, as far as free memory allows next to the model (kv/sizes.py
  ``max_context``: the KV calculator). Which side of the model's trained context a document
  lies on decides how it is read, and so its cache file: that side is decided by the document
  alone (with PROMPT_ROOM and ANSWER_FLOOR), never by the answer's length, so a document read
  once is never read again because a question asks for a longer answer. A document inside the
  trained context keeps its context there: the passages and the answer get what it leaves.
  llama.cpp stops at the model's trained context; eLLM's engine goes beyond it with sparse
  attention, whose positions are remapped into the trained window. When even that does not fit,
  the answer reads the pages most relevant to the question and says so (qa/pages.py).
* KV format: ``AUTO_KV`` (f16) on every engine: the model's own numerics. For documents eLLM's
  engine keeps it in the blocked cache, persisted per document and composable across documents,
  with the engine's attended passages as citations (Qwen2.5-1.5B: 28 KiB per token, a 33K-token
  manual 0.95 GB). Only where f16 would not hold the whole document in free memory does it fall
  back to ``SMALL_KV`` (8-bit keys per channel, 8-bit values per token: 14.5 KiB per token),
  chosen over k8v4 because it changes the model's predictions five times less
  (docs/benchmarks.md); reading the whole document in k8v8 beats reading part of it in f16. On
  the FHS the defaults answered 11 of 12 right in f16 (docs/benchmarks.md).
* attention: within the model's trained window the document and the question are read densely
  (every token reads every earlier one: the model's own reading of the whole document, one cache
  file with "dense"), and from ``SPARSE_DECODE_FROM`` document tokens on the answer's tokens read
  the blocks the question voted for ("sparse-decode": answers about as often right as dense
  attention's, where sparse reading of the document too lost half of them; each answer token
  reads a fixed budget of cached tokens instead of all); below it they read every token (the
  cache is small beside the weights). Beyond the trained window "sparse-decode" too: the document
  read as "sparse" reads it (dense attention would run the model at positions it never saw; the
  same cache file), and the answer from 64 voted blocks rather than sparse's 16 (the right
  answer's words likelier on the two manuals measured past the window: docs/benchmarks.md).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine.kv.sizes import KVShape, kv_bytes_per_token, max_context
from app.engine.header.support import DENSE_ONLY
from app.runtime.model_files import mem_available, scan_gguf

AUTO = "auto"
AUTO_KV = "f16"       # the automatic KV format: f16 on every engine, for documents in eLLM's blocked cache
SMALL_KV = "k8v8"     # the automatic KV format where f16 would not hold the whole document
CONTEXT_STEP = 4096          # automatic contexts are multiples of this (fewer backend reloads)
MIN_AUTO_CONTEXT = 4096
NO_DOCUMENT_CONTEXT = 8192   # a completion without documents
SPARSE_DECODE_FROM = 8192   # document tokens from which answers read the voted blocks (docs/benchmarks.md)
PROMPT_ROOM = 512            # system prompt, question, chat template and the padding to whole KV blocks
ANSWER_FLOOR = 256           # answer tokens a document inside the trained context leaves at least
BESIDE_ROOM = 2048           # the passages shown again beside the question (qa/answer.py, qa/retrieval.py)


@dataclass(frozen=True)
class Chosen:
    """What a question runs with, and why, when the settings leave it to eLLM."""

    n_ctx: int
    kv: str
    attention: str
    wanted: int = 0        # tokens the documents, the passages beside and the answer want (0: no documents)
    note: str = ""         # what a person should know (memory too small for the whole document)

    def as_dict(self) -> dict:
        return {"n_ctx": self.n_ctx, "kv": self.kv, "attention": self.attention, "wanted": self.wanted,
                "note": self.note}


def choose(settings, model_path: Path, engine: str, doc_tokens: int | None = None,
           free_bytes: int | None = None) -> Chosen:
    """The context, KV format and attention for ``doc_tokens`` tokens of documents on
    ``engine`` ("ellm" | "llamacpp"); ``free_bytes`` defaults to MemAvailable."""
    layout = scan_gguf(model_path)
    trained = layout.context_length or NO_DOCUMENT_CONTEXT
    # the blocked cache does not run every architecture (support.py DENSE_ONLY): f16 and dense there
    blocked = engine == "ellm" and layout.architecture not in DENSE_ONLY
    kv = settings.kv if settings.kv != AUTO else AUTO_KV
    n_ctx, wanted, note = settings.n_ctx, 0, ""
    if n_ctx <= 0:
        n_ctx, wanted, note = _auto_context(settings, layout, kv, engine, trained, doc_tokens, free_bytes,
                                            blocked)
        if settings.kv == AUTO and blocked and n_ctx < document_needs(doc_tokens):
            # f16 does not hold the whole document: the smaller format may
            small = _auto_context(settings, layout, SMALL_KV, engine, trained, doc_tokens, free_bytes, blocked)
            if small[0] > n_ctx:
                kv, (n_ctx, wanted, note) = SMALL_KV, small
    attention = settings.attention
    if attention == AUTO:
        attention = document_attention(blocked, n_ctx, trained, doc_tokens or 0)
    return Chosen(n_ctx, kv, attention, wanted, note)


def document_attention(blocked: bool, n_ctx: int, trained: int, doc_tokens: int) -> str:
    """The automatic attention: dense attention's prompt and answer for short documents and on the
    contiguous cache, the document read densely and the answer from the blocks the question chose
    ("sparse-decode") from SPARSE_DECODE_FROM tokens within the trained window; beyond it too,
    where "sparse-decode" reads the document as "sparse" does (SparseConfig.for_context)."""
    if not blocked:
        return "dense"
    return "sparse-decode" if doc_tokens >= SPARSE_DECODE_FROM or n_ctx > trained else "dense"


def document_needs(doc_tokens: int | None) -> int:
    """The context a document needs whatever the question: its tokens, the prompt around them
    and ANSWER_FLOOR. Whether this fits the trained context decides how the document is read."""
    return (doc_tokens or 0) + PROMPT_ROOM + ANSWER_FLOOR


def _auto_context(settings, layout, kv: str, engine: str, trained: int, doc_tokens: int | None,
                  free_bytes: int | None, blocked: bool) -> tuple[int, int, str]:
    if not doc_tokens:
        return min(trained, NO_DOCUMENT_CONTEXT), 0, ""
    need = document_needs(doc_tokens)
    wanted = doc_tokens + PROMPT_ROOM + BESIDE_ROOM + max(settings.max_tokens, ANSWER_FLOOR)
    n_ctx = max(MIN_AUTO_CONTEXT, -(-wanted // CONTEXT_STEP) * CONTEXT_STEP)
    if need <= trained < n_ctx:
        n_ctx = trained          # the document stays inside the trained window, read as it was (not the answer's call)
    if not blocked and n_ctx > trained:   # dense attention stays inside the trained window
        n_ctx = max(MIN_AUTO_CONTEXT, trained)
    free = mem_available() if free_bytes is None else free_bytes
    if free is not None:
        per_token = kv_bytes_per_token(KVShape.from_layout(layout), kv)
        fits = max_context(per_token, free, layout.file_size) // CONTEXT_STEP * CONTEXT_STEP
        if fits < n_ctx:
            n_ctx = max(MIN_AUTO_CONTEXT, fits)
    note = ""
    if n_ctx < need:
        why = (f"{engine} reads at most the model's trained {trained:,} tokens"
               if not blocked and n_ctx == trained else "free memory allows a context of "
               f"{n_ctx:,} tokens")
        note = (f"the documents need a context of {need:,} tokens and {why}: the pages most relevant to "
                f"the question are read")
    return n_ctx, wanted, note


__all__ = ["AUTO", "AUTO_KV", "BESIDE_ROOM", "SMALL_KV", "SPARSE_DECODE_FROM", "Chosen", "choose",
           "document_attention", "document_needs"]
