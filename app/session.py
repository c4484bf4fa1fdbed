"""One data directory opened for use: the store, the settings, the model and the backends it
loaded. The window, the CLI, the API server and batches all work through a Session: it asks,
reads and summarizes, sizing the backend for the documents itself from one run plan
(runtime/plan.py), so no front end sizes a backend or holds logic another would miss."""
from __future__ import annotations

import threading
from dataclasses import replace
from functools import cached_property
from pathlib import Path

from app.engine.backend import SamplingParams
from app.runtime.backends import Backends
from app.runtime.model_files import ModelError, resolve_model
from app.runtime.plan import RunPlan, plan_for
from app.settings import Paths, Settings
from app.store import Store


class SessionError(Exception):
    """Something a person can fix (a setting, a model file); the message says what."""


class Session:
    def __init__(self, paths: Paths, overrides: dict | None = None, backends: Backends | None = None):
        """``backends``: the loaded backends to share with another session of this process (the API
        server's session per model): one model in memory at a time between them."""
        self.paths = paths.ensure()
        self.overrides = {k: v for k, v in (overrides or {}).items() if v is not None}
        self.backends = backends if backends is not None else Backends()
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
                count = token_counter(self.model_path, self.settings.engine)
            except (SessionError, ModelError):
                return int(doc["tokens"] or 0)
            tokens = count_page_tokens((p["text"] for p in self.store.pages(doc["id"])), count)
            self.store.set_token_count(doc["id"], doc["content_hash"], key, tokens)
        return tokens

    def plan(self, doc_tokens: int | None = None) -> RunPlan:
        """The run plan for ``doc_tokens`` tokens of documents (None: no document): the settings'
        own choices where a person made them, else eLLM's (runtime/auto.py), decided once."""
        try:
            return plan_for(self.settings, self.model_path, doc_tokens, self.paths.planes_dir)
        except (ModelError, ValueError) as e:
            raise SessionError(str(e)) from e

    def backend(self, doc_tokens: int | None = None):
        """The backend of the run plan for ``doc_tokens`` tokens of documents (None: no document),
        loaded or kept in ``backends``. Front ends ask for a question's, a document's, a batch's or
        a chat's backend below instead: the session sizes it."""
        plan = self.plan(doc_tokens)
        try:
            return self.backends.get(plan)
        except ModelError as e:
            raise SessionError(str(e)) from e
        except ValueError as e:
            raise SessionError(f"{plan.model}: cannot load the model ({e})") from e

    def question_backend(self, doc_ids, whole: bool = False):
        """The backend a question about ``doc_ids`` runs on (``whole``: every document read in
        full first, as ``ellm ask --whole`` does)."""
        return self.backend(self.doc_tokens(doc_ids) if whole else self.question_tokens(doc_ids))

    def document_backend(self, doc_id: int):
        """The backend that reads or summarizes one document: its context holds it whole."""
        return self.backend(self.doc_tokens([doc_id]))

    def batch_plan(self, doc_ids) -> RunPlan:
        """The plan of a batch over ``doc_ids``: sized for the largest, so one engine per worker
        serves every document."""
        return self.plan(self._largest(doc_ids))

    def batch_backend(self, doc_ids):
        """The backend of ``batch_plan``, for a batch run in this process."""
        return self.backend(self._largest(doc_ids))

    def _largest(self, doc_ids) -> int | None:
        """The tokens of the largest of ``doc_ids`` (None: none has any)."""
        return max((self.doc_tokens([d]) for d in doc_ids), default=0) or None

    def chat_backend(self):
        """The backend of a conversation with the model alone (no document)."""
        return self.backend(None)

    def ask(self, question: str, doc_ids, *, whole: bool = False, greedy: bool = False,
            max_tokens: int | None = None, params: SamplingParams | None = None, backend=None, **kwargs):
        """Answer ``question`` about ``doc_ids`` on the backend sized for it (qa/answer.py
        ``answer``; ``kwargs`` are its ``listen``, ``options``, ``conversation`` and ``save``). ``params``: a
        request's own sampling (the API's), else the settings' (``greedy``, ``max_tokens``).
        ``backend``: the one ``question_backend`` gave this caller already (a chat keeps one for all
        its turns; the API checks the request against its context first), else it is asked now."""
        from app.qa.answer import DOCUMENT, AnswerOptions, answer

        if whole:
            kwargs["options"] = replace(kwargs.get("options") or AnswerOptions(), source=DOCUMENT)
        backend = backend if backend is not None else self.question_backend(doc_ids, whole)
        return answer(self.store, backend, question, list(doc_ids), params or self.sampling(greedy, max_tokens),
                      **kwargs)

    def read(self, doc_id: int, caches, **kwargs):
        """Read ``doc_id`` into its cache ahead of its questions (qa/reading.py ``read_document``)."""
        from app.qa.reading import read_document

        return read_document(self.store, self.document_backend(doc_id), doc_id, caches, **kwargs)

    def summarize(self, doc_id: int, max_tokens: int | None = None, **kwargs):
        """Summarize ``doc_id`` on the backend that holds it whole (qa/summarize.py)."""
        from app.qa.summarize import summarize

        return summarize(self.store, self.document_backend(doc_id), doc_id, self.sampling(max_tokens=max_tokens),
                         model_name=self.model_path.name, **kwargs)

    def backend_keeps_files(self) -> bool:
        """Whether the backend a document gets keeps its KV cache in a file (eLLM's blocked
        cache), i.e. whether reading ahead persists anything."""
        return self.plan(1).blocked

    def engine_note(self) -> str:
        """Why the automatic engine choice took llama.cpp for this model ("" otherwise): the run
        plan's own note, so the choice is made where every other setting is."""
        try:
            return self.plan().engine_note
        except SessionError:
            return ""

    def token_counter(self):
        from app.runtime.engines import token_counter

        try:
            return token_counter(self.model_path, self.settings.engine)
        except ModelError as e:
            raise SessionError(str(e)) from e

    def sampling(self, greedy: bool = False, max_tokens: int | None = None) -> SamplingParams:
        s = self.settings
        n = max_tokens or s.max_tokens
        if greedy:
            return SamplingParams.make_greedy(n)
        return SamplingParams(max_tokens=n, temperature=s.temperature, top_k=s.top_k, top_p=s.top_p,
                              repeat_penalty=s.repeat_penalty, seed=s.seed)
