"""A chat completion request as OpenAI's API defines it, read and checked.

``POST /v1/chat/completions`` takes OpenAI's body (``model``, ``messages``, ``stream``,
``max_tokens``, ``temperature``, ``stop``, ...) and eLLM's extension, what the question is
about: ``documents`` (ids, titles or file names), ``folder`` (a path) or ``all`` (true). A
field OpenAI does not define is refused, as OpenAI refuses it, naming the field; fields OpenAI
defines that change nothing here (``user``, ``seed`` with sampling, ...) are accepted.
Every problem is an ``ApiError`` with the HTTP status and OpenAI's error object.
"""
from __future__ import annotations

from dataclasses import dataclass

from app.qa.conversation import Turn

# Fields of OpenAI's chat completion request that a request may carry (those unused here change nothing).
OPENAI_FIELDS = {"model", "messages", "stream", "stream_options", "max_tokens", "max_completion_tokens",
                 "temperature", "top_p", "stop", "n", "seed", "user", "presence_penalty", "frequency_penalty",
                 "logit_bias", "logprobs", "top_logprobs", "response_format", "metadata", "store",
                 "parallel_tool_calls", "service_tier", "reasoning_effort"}
EXTENSION_FIELDS = {"documents", "folder", "all"}
ROLES = ("system", "developer", "user", "assistant")


class ApiError(Exception):
    """A request that cannot be served: the HTTP status and OpenAI's error object."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error", code: str | None = None,
                 param: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad(message: str, param: str | None = None, code: str | None = None) -> ApiError:
    return ApiError(400, message, code=code, param=param)


@dataclass(frozen=True)
class ChatRequest:
    """What a chat request asks: the model, the conversation so far and the question, what it is
    about, and how to sample."""

    model: str
    question: str
    turns: tuple[Turn, ...]          # the earlier user/assistant pairs, oldest first
    system: str                      # the client's system messages (used without documents)
    documents: tuple[str, ...] = ()  # as given: ids, titles or file names
    folder: str | None = None
    all: bool = False
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] = ()
    seed: int | None = None

    @property
    def about_documents(self) -> bool:
        return bool(self.documents or self.folder or self.all)

    def messages(self) -> list[dict]:
        """The conversation as chat-template messages (the model alone, no documents)."""
        out = [{"role": "system", "content": self.system}] if self.system else []
        for t in self.turns:
            out += [{"role": "user", "content": t.question}, {"role": "assistant", "content": t.answer}]
        return out + [{"role": "user", "content": self.question}]


def _text(content, where: str) -> str:
    """A message's content: a string, or OpenAI's list of parts of which only text is read."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise bad(f"{where}.content[{i}]: only text parts ({{\"type\": \"text\", \"text\": ...}}) are "
                          f"supported", f"{where}.content")
            parts.append(part["text"])
        return "".join(parts)
    raise bad(f"{where}.content must be a string or a list of text parts", f"{where}.content")


def _number(body: dict, name: str, kind, low, high):
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
        raise bad(f"{name} must be {'an integer' if kind is int else 'a number'}, not {value!r}", name)
    if not low <= value <= high:
        raise bad(f"{name} must be between {low} and {high}, not {value}", name)
    return kind(value)


def parse_chat(body) -> ChatRequest:
    """The request in ``body`` (parsed JSON), checked; ApiError (400) names what is wrong."""
    if not isinstance(body, dict):
        raise bad("the request body must be a JSON object")
    unknown = sorted(set(body) - OPENAI_FIELDS - EXTENSION_FIELDS)
    if unknown:
        raise bad(f"Unrecognized request argument supplied: {', '.join(unknown)}", unknown[0])
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad("model is required: one of the ids GET /v1/models lists", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise bad("messages must be a non-empty list of {\"role\", \"content\"} objects", "messages")
    system, dialogue = [], []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise bad(f"{where}.role must be one of {', '.join(ROLES)}", f"{where}.role")
        text = _text(m.get("content"), where)
        if m["role"] in ("system", "developer"):
            system.append(text)
        else:
            dialogue.append((m["role"], text, where))
    if not dialogue or dialogue[-1][0] != "user" or not dialogue[-1][1].strip():
        raise bad("the last message must be the user's question, not empty", "messages")
    turns, expect = [], "user"
    for role, text, where in dialogue[:-1]:
        if role != expect:
            raise bad(f"{where}: the conversation must alternate user and assistant messages", where)
        if role == "assistant":
            turns.append(Turn(pending, text))
        pending, expect = text, "assistant" if role == "user" else "user"
    if expect != "user":
        raise bad("the last message must be the user's question after the assistant's answer", "messages")
    n = body.get("n", 1)
    if n != 1:
        raise bad("n must be 1: one answer per request", "n")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise bad("stream must be true or false", "stream")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise bad("stream_options must be an object", "stream_options")
    stop = body.get("stop")
    if stop is None:
        stop = ()
    elif isinstance(stop, str):
        stop = (stop,)
    elif isinstance(stop, list) and all(isinstance(s, str) and s for s in stop) and len(stop) <= 4:
        stop = tuple(stop)
    else:
        raise bad("stop must be a string or a list of up to 4 strings", "stop")
    max_tokens = _number(body, "max_completion_tokens", int, 1, 1 << 20)
    max_tokens = _number(body, "max_tokens", int, 1, 1 << 20) if max_tokens is None else max_tokens
    documents, folder, everything = body.get("documents"), body.get("folder"), body.get("all", False)
    if documents is not None and (not isinstance(documents, list) or not documents
                                  or not all(isinstance(d, (str, int)) and not isinstance(d, bool) for d in documents)):
        raise bad("documents must be a non-empty list of document ids, titles or file names", "documents")
    if folder is not None and (not isinstance(folder, str) or not folder):
        raise bad("folder must be a path", "folder")
    if not isinstance(everything, bool):
        raise bad("all must be true or false", "all")
    if sum(x for x in (documents is not None, folder is not None, everything)) > 1:
        raise bad("give one of documents, folder or all", "documents")
    return ChatRequest(model=model, question=dialogue[-1][1].strip(), turns=tuple(turns), system="\n\n".join(system),
                       documents=tuple(str(d) for d in documents or ()), folder=folder, all=everything,
                       stream=stream, include_usage=bool(options.get("include_usage")), max_tokens=max_tokens,
                       temperature=_number(body, "temperature", float, 0, 2), top_p=_number(body, "top_p", float, 0, 1),
                       stop=stop, seed=_number(body, "seed", int, -(1 << 63), (1 << 63) - 1))
