"""One data directory opened for use: the store, the settings, the model and
its backend. The CLI and the GUI both work through a Session, so neither holds
logic the other would miss."""
from __future__ import annotations

import threading
from functools import cached_property
from pathlib import Path

from app.settings import Paths, Settings
from app.engine.backend import SamplingParams
from app.runtime.model_files import ModelError, resolve_model
from app.store import Store


class SessionError(Exception):
    """Something a person can fix (a setting, a model file); the message says what."""


class Session:
    def __init__(self, paths: Paths, overrides: dict | None = None):
        self.paths = paths.ensure()
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        # One backend (one KV cache) serves the session: whoever runs it (an answer, a summary,
        # reading ahead) holds this lock.
        self.engine_lock = threading.RLock()

    @cached_property
    def store(self) -> Store:
        return Store(self.paths.db)

    @property
    def settings(self) -> Settings:
        """The stored settings with this session's overrides (command-line options) on top."""
        try:
            return Settings.from_dict({**self.store.settings(), **self.overrides})
        except (ValueError, TypeError) as e:
            raise SessionError(str(e)) from e

    def save_settings(self, settings: Settings) -> None:
        self.store.clear_settings()
        self.store.set_settings(settings.changed())

    @property
    def model_path(self) -> Path:
        try:
            return resolve_model(self.settings.model, self.paths.models_dir)
        except ModelError as e:
            raise SessionError(str(e)) from e

    def doc_tokens(self, doc_ids) -> int:
        """The documents' tokens in a prompt: their text by this model's tokenizer and their page
        markers (qa/pages.py) — what an automatic context must hold."""
        from app.qa.pages import PAGE_MARKER_TOKENS

        total = 0
        for i in doc_ids:
            doc = self.store.document(int(i))
            if doc:
                total += self.model_tokens(doc) + PAGE_MARKER_TOKENS * int(doc["pages"] or 0)
        return total

    def question_tokens(self, doc_ids) -> int:
        """The documents' tokens an automatic context must hold for a question about ``doc_ids``:
        all of them (``doc_tokens``) for one document, or when each is read or short enough to read
        at once. Otherwise the question is answered at once from what is ready (qa/answer.py): the
        read documents its best passages come from, whole, and the others' passages; the context
        holds the read ones (no more than the model's trained window takes, so their caches are
        the ones reading made) and room for the passages."""
        from app.qa.across import ROOM
        from app.qa.answer import PASSAGES_ROOM, READ_AT_ONCE
        from app.qa.reading import READ, read_states
        from app.runtime.auto import BESIDE_ROOM, document_needs
        from app.runtime.model_files import scan_gguf

        ids = [int(i) for i in doc_ids]
        if len(ids) < 2 or not self.backend_keeps_files():   # nothing stays read: every question reads all
            return self.doc_tokens(ids)
        try:
            states = read_states(self.store, self.model_path)
        except (SessionError, OSError):
            return self.doc_tokens(ids)
        sizes = {d: self.doc_tokens([d]) for d in ids}
        read = [d for d in ids if states.get(d) == READ]
        if all(d in read or sizes[d] <= READ_AT_ONCE for d in ids):
            return sum(sizes.values())
        spare = PASSAGES_ROOM + ROOM       # what Job.read_among_best leaves beside the read documents
        trained = scan_gguf(self.model_path).context_length or 0
        room = max(0, trained - document_needs(0) - BESIDE_ROOM - spare)
        return min(sum(sizes[d] for d in read), room) + spare

    def model_tokens(self, doc: dict) -> int:
        """The document's text in tokens of the settings' model: ingestion's count when that
        model made it, else counted now and kept (store.token_counts). Where the model cannot
        be opened, ingestion's count (the question then says what is wrong with the model)."""
        from app.library.ingest import count_page_tokens
        from app.runtime.engines import token_counter, tokenizer_key

        try:
            key = tokenizer_key(self.model_path)
        except (SessionError, OSError):
            return int(doc["tokens"] or 0)
        tokens = self.store.token_count(doc["id"], doc["content_hash"], key)
        if tokens is None:
            try:
                count = token_counter(self.model_path)
            except (SessionError, ModelError):
                return int(doc["tokens"] or 0)
            tokens = count_page_tokens((p["text"] for p in self.store.pages(doc["id"])), count)
            self.store.set_token_count(doc["id"], doc["content_hash"], key, tokens)
        return tokens

    def chosen(self, doc_tokens: int | None = None):
        """The context, KV format and attention for ``doc_tokens`` of documents: the settings'
        own where a person chose them, else eLLM's choice (app/runtime/auto.py)."""
        from app.runtime.auto import choose
        from app.runtime.engines import choose_engine

        path = self.model_path
        try:
            return choose(self.settings, path, choose_engine(self.settings.engine, path).name, doc_tokens)
        except ModelError as e:
            raise SessionError(str(e)) from e

    def backend(self, doc_tokens: int | None = None):
        """The backend for a question about ``doc_tokens`` tokens of documents (None: no document)."""
        from app.runtime.engines import open_backend

        s = self.settings
        path = self.model_path
        c = self.chosen(doc_tokens)
        try:
            return open_backend(s.engine, path, c.n_ctx, s.threads, s.numa, kv=c.kv, attention=c.attention,
                                planes_dir=self.paths.planes_dir, documents=bool(doc_tokens))
        except ModelError as e:
            raise SessionError(str(e)) from e
        except ValueError as e:
            raise SessionError(f"{path}: cannot load the model ({e})") from e

    def backend_keeps_files(self) -> bool:
        """Whether the backend a document gets keeps its KV cache in a file (eLLM's blocked
        cache), i.e. whether reading ahead persists anything."""
        from app.engine.model.support import blocked_cache
        from app.runtime.engines import choose_engine

        c, path = self.chosen(1), self.model_path
        choice = choose_engine(self.settings.engine, path)
        return choice.name == "ellm" and blocked_cache(choice.architecture, c.kv, c.attention, documents=True)

    def engine_note(self) -> str:
        """Why the automatic engine choice took llama.cpp for this model ("" otherwise)."""
        from app.runtime.engines import engine_note

        try:
            return engine_note(self.settings.engine, self.model_path)
        except SessionError:
            return ""

    def token_counter(self):
        from app.runtime.engines import token_counter

        try:
            return token_counter(self.model_path)
        except ModelError as e:
            raise SessionError(str(e)) from e

    def sampling(self, greedy: bool = False, max_tokens: int | None = None) -> SamplingParams:
        s = self.settings
        n = max_tokens or s.max_tokens
        if greedy:
            return SamplingParams.make_greedy(n)
        return SamplingParams(max_tokens=n, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                              repeat_penalty=s.repeat_penalty, seed=s.seed)
