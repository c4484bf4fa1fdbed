"""The local OpenAI-compatible HTTP server: Starlette routes served by uvicorn.

``GET /v1/models`` and ``POST /v1/chat/completions`` (plain JSON, or server-sent events in
OpenAI's chunk format ending with ``data: [DONE]``). Generations run one at a time, in the
order the requests came (an asyncio lock is first come, first served), in a worker thread that
holds the session's engine lock, so the window's own questions and the server's take turns on
the one backend. A streamed answer whose client goes away is cancelled at its next token (or
prefill chunk). Bound to anything but loopback the server needs an API key, and then every
request must carry it (``Authorization: Bearer KEY``). CORS headers only for ``cors`` origins.
One log line per request: who, what, the status, the time and the tokens, never the text.
"""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import socket
import threading
import time
import uuid

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from app.api.chat import ChatService, Reply
from app.api.requests import ApiError, ChatRequest, parse_chat
from app.session import Session

log = logging.getLogger("ellm.api")

MAX_BODY = 8 << 20         # bytes: a long conversation's history fits, a runaway upload does not
KEEPALIVE_S = 5.0          # a streamed answer sends an SSE comment this often while nothing else comes
DONE, READY = object(), object()    # a generation's end; its request checked, the answer coming


class ApiServerError(Exception):
    """The server cannot start; the message says why and what to do."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def error_response(e: ApiError) -> JSONResponse:
    return JSONResponse(e.body(), status_code=e.status)


class AccessAndKey:
    """ASGI middleware: the API key rule, and one log line per request."""

    def __init__(self, app, api_key: str | None):
        self.app, self.api_key = app, api_key

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0, status = time.perf_counter(), [0]
        state = scope.setdefault("state", {})

        async def sending(message):
            if message["type"] == "http.response.start":
                status[0] = message["status"]
            await send(message)

        try:
            if self.api_key is not None and scope["method"] != "OPTIONS":
                headers = dict(scope["headers"])
                if headers.get(b"authorization", b"").decode("latin-1") != f"Bearer {self.api_key}":
                    await error_response(ApiError(401, "a valid API key is required: Authorization: Bearer KEY",
                                                  type="invalid_request_error", code="invalid_api_key"))(
                        scope, receive, sending)
                    return
            await self.app(scope, receive, sending)
        finally:
            client = scope.get("client") or ("-", 0)
            usage = state.get("log", "")
            log.info("%s %s %s %s %.2fs%s", client[0], scope["method"], scope["path"], status[0] or "-",
                     time.perf_counter() - t0, f" {usage}" if usage else "")


async def read_json(request: Request):
    """The request body as JSON, at most MAX_BODY bytes (413 beyond)."""
    length = request.headers.get("content-length")
    if length is not None and length.isdigit() and int(length) > MAX_BODY:
        raise ApiError(413, f"the request body is {int(length):,} bytes; at most {MAX_BODY:,} are accepted",
                       code="request_too_large")
    body = bytearray()
    try:
        async for chunk in request.stream():
            body += chunk
            if len(body) > MAX_BODY:
                raise ApiError(413, f"the request body is over {MAX_BODY:,} bytes", code="request_too_large")
    except ClientDisconnect as e:
        raise ApiError(400, "the client went away while sending the request") from e
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ApiError(400, f"the request body is not valid JSON: {e}") from e


def build_app(session: Session, api_key: str | None = None, cors: list[str] | tuple[str, ...] = ()) -> Starlette:
    """The Starlette application over ``session``'s documents and models."""
    service = ChatService(session)
    turn = asyncio.Lock()          # FIFO: one generation at a time, in the order requests came

    async def models(request: Request):
        models = await asyncio.to_thread(service.models)
        return JSONResponse({"object": "list", "data": models})

    async def completions(request: Request):
        try:
            req = parse_chat(await read_json(request))
            checked = await asyncio.to_thread(service.check, req)
        except ApiError as e:
            return error_response(e)
        answer_id, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        queue: asyncio.Queue = asyncio.Queue()
        loop = asyncio.get_running_loop()
        stop = threading.Event()

        def put(item) -> None:
            loop.call_soon_threadsafe(queue.put_nowait, item)

        def work() -> Reply:
            with session.engine_lock:
                try:
                    run = service.prepare(req, *checked)   # the model loaded, the request checked against its context
                    put(READY)
                    return run(put, stop.is_set)
                except ApiError:
                    raise
                except Exception as e:                     # the engine failed: say so in OpenAI's shape, keep serving
                    log.exception("the generation failed")
                    raise ApiError(500, f"the generation failed: {type(e).__name__}: {e}", type="server_error",
                                   code="generation_failed") from e

        async def generation() -> Reply:
            async with turn:
                if stop.is_set():
                    raise asyncio.CancelledError
                return await asyncio.to_thread(work)

        task = asyncio.ensure_future(generation())
        task.add_done_callback(lambda _: put(DONE))
        if not req.stream:
            try:
                reply = await task
            except ApiError as e:
                return error_response(e)
            request.state.log = _usage_line(req, reply)
            return JSONResponse(_completion(answer_id, created, req, reply))
        # The response starts once the request is known to fit: a refusal is still a 4xx of its own.
        if await queue.get() is DONE:
            try:
                task.result()
            except ApiError as e:
                return error_response(e)
        return StreamingResponse(_events(answer_id, created, req, task, queue, stop, request),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

    middleware = [Middleware(AccessAndKey, api_key=api_key)]
    if cors:
        middleware.append(Middleware(CORSMiddleware, allow_origins=list(cors), allow_methods=["GET", "POST"],
                                     allow_headers=["Authorization", "Content-Type"]))
    return Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                             Route("/v1/chat/completions", completions, methods=["POST"])],
                     middleware=middleware, exception_handlers={404: _not_found, 405: _not_allowed})


async def _not_found(request: Request, exc) -> JSONResponse:
    return error_response(ApiError(404, f"{request.url.path}: no such endpoint (GET /v1/models, "
                                        f"POST /v1/chat/completions)", code="not_found"))


async def _not_allowed(request: Request, exc) -> JSONResponse:
    return error_response(ApiError(405, f"{request.method} {request.url.path} is not allowed", code="method_not_allowed"))


def _usage_line(req: ChatRequest, reply: Reply) -> str:
    return (f"model={req.model} prompt={reply.prompt_tokens} cached={reply.cached_tokens} "
            f"completion={reply.completion_tokens}")


def _completion(answer_id: str, created: int, req: ChatRequest, reply: Reply) -> dict:
    body = {"id": answer_id, "object": "chat.completion", "created": created, "model": req.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": reply.text},
                         "finish_reason": reply.finish_reason, "logprobs": None}],
            "usage": reply.usage()}
    if req.about_documents:
        body.update(citations=reply.citations, **reply.extra)
    return body


def _chunk(answer_id: str, created: int, req: ChatRequest, delta: dict, finish: str | None = None, **extra) -> str:
    body = {"id": answer_id, "object": "chat.completion.chunk", "created": created, "model": req.model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}], **extra}
    return f"data: {json.dumps(body, ensure_ascii=False)}\n\n"


async def _events(answer_id: str, created: int, req: ChatRequest, task: asyncio.Future, queue: asyncio.Queue,
                  stop: threading.Event, request: Request):
    """The answer as server-sent events; a client that goes away cancels the generation."""
    try:
        yield _chunk(answer_id, created, req, {"role": "assistant", "content": ""})
        while True:
            try:
                item = await asyncio.wait_for(queue.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield ": still working\n\n"
                continue
            if item is DONE:
                break
            yield _chunk(answer_id, created, req, {"content": item})
        try:
            reply = task.result()
        except ApiError as e:
            yield f"data: {json.dumps(e.body())}\n\n"
            yield "data: [DONE]\n\n"
            return
        request.state.log = _usage_line(req, reply)
        extra = {"citations": reply.citations, **reply.extra} if req.about_documents else {}
        yield _chunk(answer_id, created, req, {}, reply.finish_reason, **extra)
        if req.include_usage:
            usage = {"id": answer_id, "object": "chat.completion.chunk", "created": created, "model": req.model,
                     "choices": [], "usage": reply.usage()}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if not task.done():
            stop.set()                      # the client went away: the generation stops at its next step
            request.state.log = "client disconnected: generation stopped"


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on host:port, or ApiServerError saying why not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(64)
    except OSError as e:
        sock.close()
        raise ApiServerError(f"cannot listen on {host}:{port}: {e.strerror or e}") from e
    return sock


def check_binding(host: str, api_key: str | None) -> None:
    if not is_loopback(host) and not api_key:
        raise ApiServerError(f"listening on {host} makes the documents reachable from other machines: "
                             f"give an --api-key (every request must then send it), or keep 127.0.0.1")


class ApiServer:
    """The server in a background thread (the window's *Local API server*), or in the calling
    thread (``run``, ``ellm serve``)."""

    def __init__(self, session: Session, host: str = "127.0.0.1", port: int = 8080, api_key: str | None = None,
                 cors: list[str] | tuple[str, ...] = ()):
        check_binding(host, api_key)
        self.session, self.host, self.port, self.api_key, self.cors = session, host, port, api_key, tuple(cors)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _prepare(self) -> socket.socket:
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]           # port 0: the one the system chose
        app = build_app(self.session, self.api_key, self.cors)
        config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off", timeout_graceful_shutdown=2)
        self._server = uvicorn.Server(config)
        return sock

    def run(self, announce=None) -> None:
        """Serve until interrupted (Ctrl-C); ``announce(url)`` once it listens."""
        sock = self._prepare()
        if announce is not None:
            announce(self.url)
        self._server.run(sockets=[sock])

    def start(self, timeout: float = 30.0) -> None:
        """Serve in a background thread; returns once it accepts connections."""
        sock = self._prepare()
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]}, name="ellm-api",
                                        daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise ApiServerError(f"the API server on {self.url} did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._thread = None
