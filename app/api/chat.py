"""Answering a chat request: about documents through the answer service, or the model alone.

A request about documents is a turn of a conversation (qa/conversation.py): its earlier
user/assistant messages are the turns, its last user message the question. The conversations
this server answered are kept (the last ``KEPT_CONVERSATIONS``), keyed by the model, the
documents and the turns: a client that sends the history back as OpenAI clients do finds its
conversation, and its follow-up continues the cache (``usage.prompt_tokens_details.
cached_tokens`` counts what it reused). A request without documents is the model's own chat,
whose prompt reuses whatever the cache shares with it. Answers over the API are not saved to the
window's threads: the client keeps its conversation.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

from app.api.requests import ApiError, ChatRequest, bad
from app.engine.backend import SamplingParams, stream_text
from app.qa.answer import AskError
from app.qa.conversation import Conversation
from app.qa.stream import Listeners
from app.qa.targets import EVERYTHING, FOLDER, SELECTED, resolve
from app.runtime.model_files import list_models
from app.session import Session, SessionError

KEPT_CONVERSATIONS = 16


@dataclass
class Reply:
    """What a request got: the text, why it ended, the tokens it cost, the pages it used."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    citations: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)      # eLLM's own: answered_from, note

    def usage(self) -> dict:
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "total_tokens": self.prompt_tokens + self.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": self.cached_tokens}}


class ChatService:
    """The models a server offers and the conversations it has answered."""

    def __init__(self, session: Session):
        self.session = session
        self._sessions: dict[str, Session] = {}
        self._conversations: OrderedDict[tuple, Conversation] = OrderedDict()
        self._lock = threading.Lock()

    # ---- models ---------------------------------------------------------------------------

    def models(self) -> list[dict]:
        """OpenAI's model objects: the configured model first, then the models folder's."""
        out, seen = [], set()
        paths = []
        try:
            paths.append(self.session.model_path)
        except SessionError:
            pass
        paths += [Path(m.path) for m in list_models(self.session.paths.models_dir) if not m.error and m.path]
        for p in paths:
            if p.name in seen:
                continue
            seen.add(p.name)
            created = int(p.stat().st_mtime) if p.exists() else 0
            out.append({"id": p.name, "object": "model", "created": created, "owned_by": "ellm"})
        return out

    def model_session(self, model: str) -> Session:
        """The session that runs ``model`` (a name GET /v1/models lists); 404 otherwise."""
        known = {m["id"] for m in self.models()}
        name = model if model in known else f"{model}.gguf" if f"{model}.gguf" in known else None
        if name is None:
            raise ApiError(404, f"The model '{model}' does not exist here; GET /v1/models lists "
                                f"{', '.join(sorted(known)) or 'none (add a .gguf to the models folder)'}",
                           code="model_not_found", param="model")
        try:
            if self.session.model_path.name == name:
                return self.session
        except SessionError:
            pass
        if name not in self._sessions:
            path = next(Path(m.path) for m in list_models(self.session.paths.models_dir) if Path(m.path).name == name)
            # the window's loaded backends: one model in memory at a time, whichever a request names
            self._sessions[name] = Session(self.session.paths, {**self.session.overrides, "model": str(path)},
                                           backends=self.session.backends)
        return self._sessions[name]

    # ---- documents --------------------------------------------------------------------------

    def targets(self, req: ChatRequest, session: Session):
        """The documents a request is about (qa/targets.py resolves them as the window does)."""
        docs = session.store.documents()
        if req.documents:
            ids = []
            for ref in req.documents:
                found = session.store.find_documents(ref)
                if not found:
                    raise ApiError(404, f"no document matches '{ref}' (give an id, a title or a file name)",
                                   code="document_not_found", param="documents")
                if len(found) > 1:
                    raise bad(f"'{ref}' matches {len(found)} documents; give an id: "
                              + "; ".join(f"{d['id']}: {d['title']}" for d in found[:8]), "documents")
                ids.append(found[0]["id"])
            target = resolve(SELECTED, docs, ids)
        elif req.folder:
            target = resolve(FOLDER, docs, [], chosen_folder=str(Path(req.folder).expanduser().resolve()))
            if not target.doc_ids:
                raise ApiError(404, target.problem, code="document_not_found", param="folder")
        else:
            target = resolve(EVERYTHING, docs, [])
            if not target.doc_ids:
                raise ApiError(404, target.problem, code="document_not_found", param="all")
        return target

    # ---- answering --------------------------------------------------------------------------

    def params(self, req: ChatRequest, session: Session) -> SamplingParams:
        p = session.sampling(max_tokens=req.max_tokens)
        changes = {k: v for k, v in (("temperature", req.temperature), ("top_p", req.top_p), ("seed", req.seed))
                   if v is not None}
        return replace(p, stop=req.stop, **changes)

    def check(self, req: ChatRequest) -> tuple[Session, object]:
        """Everything that can be refused before the engine runs: the model and the documents."""
        session = self.model_session(req.model)
        return session, self.targets(req, session) if req.about_documents else None

    def prepare(self, req: ChatRequest, session: Session, target) -> Callable[[Callable[[str], None],
                                                                               Callable[[], bool]], Reply]:
        """Load the model and check that the request fits its context (in a worker thread; the
        caller holds the engine). Returns what generates the reply: ``run(on_text, cancel)``."""
        try:
            if target is None:
                return self._chat(req, session)
            return self._about(req, session, target)
        except SessionError as e:
            raise ApiError(500, str(e), type="server_error", code="model_error") from e

    def _about(self, req, session: Session, target):
        doc_ids = list(target.doc_ids)
        backend = session.question_backend(doc_ids)
        params = self.params(req, session)
        question_tokens = len(backend.tokenize(req.question, add_bos=False, special=False))
        if question_tokens + params.max_tokens + 64 > backend.n_ctx:
            raise bad(f"the context is {backend.n_ctx} tokens: the question takes {question_tokens} and max_tokens "
                      f"{params.max_tokens}; shorten them", "messages", code="context_length_exceeded")
        key = (session.model_path.name, tuple(doc_ids), tuple((t.question, t.answer) for t in req.turns))

        def run(on_text, cancel) -> Reply:
            with self._lock:
                conv = self._conversations.pop(key, None) or Conversation(None, list(req.turns))
            try:
                result = session.ask(req.question, doc_ids, params=params, backend=backend,
                                     listen=Listeners(on_text=on_text, cancel=cancel), save=False, conversation=conv)
            except (AskError, ValueError) as e:
                raise bad(str(e), "messages", code="context_length_exceeded" if "context" in str(e) else None) from e
            with self._lock:
                self._conversations[key[:2] + (key[2] + ((req.question, result.answer),),)] = conv
                while len(self._conversations) > KEPT_CONVERSATIONS:
                    self._conversations.popitem(last=False)
            t = result.timings
            titles = {d: (session.store.document(d) or {}).get("title", "") for d in {c["doc"] for c in result.citations}}
            citations = [{"doc": c["doc"], "title": titles.get(c["doc"], ""), "page": c["page"], "text": c["text"]}
                         for c in result.citations]
            completion = int(t.get("decode_tokens", 0))
            # A document read during this request was not cached before it: nothing counts as cached then.
            cached = int(t.get("reused_prompt_tokens", 0)) if t.get("kv_cache") != "miss" else 0
            return Reply(result.answer, "length" if completion >= params.max_tokens else "stop",
                         int(t.get("prompt_tokens", 0)), completion, cached, citations,
                         {"answered_from": result.answered_from, "note": result.notes})
        return run

    def _chat(self, req, session: Session):
        backend = session.chat_backend()
        params = self.params(req, session)
        prompt = backend.tokenize(backend.apply_chat_template(req.messages()), add_bos=True, special=True)
        if len(prompt) + params.max_tokens > backend.n_ctx:
            raise bad(f"the context is {backend.n_ctx} tokens: the messages take {len(prompt)} and max_tokens "
                      f"{params.max_tokens}; shorten them", "messages", code="context_length_exceeded")

        def run(on_text, cancel) -> Reply:
            pieces = []
            for piece in stream_text(backend, backend.generate(prompt, params, cancel), params.stop):
                pieces.append(piece)
                on_text(piece)
            s = backend.stats
            return Reply("".join(pieces), "length" if s.decode_tokens >= params.max_tokens else "stop",
                         s.prompt_tokens, s.decode_tokens, s.reused_prompt_tokens)
        return run
