"""The OpenAI-compatible API (app/api): the official ``openai`` client gets plain and streamed
answers with citations and a follow-up that reuses the cache; malformed requests get a 4xx in
OpenAI's shape and the server keeps serving; a client that goes away stops its generation; two
clients at once are served one after the other; the API key and CORS rules."""
from __future__ import annotations

import http.client
import json
import threading
import time
from pathlib import Path

import openai
import pytest

from app.api.server import ApiServer, ApiServerError
from app.qa.conversation import next_turn
from tests.api.conftest import ANSWER

QUESTION = "What was the secret signal?"


def client(server, key="not-needed"):
    return openai.OpenAI(base_url=server.url + "/v1", api_key=key, max_retries=0, timeout=30)


def raw(server, method: str, path: str, body: bytes | str | None = None, headers: dict | None = None):
    """(status, parsed JSON body, headers) of one plain HTTP request."""
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request(method, path, body=body, headers={"Content-Type": "application/json", **(headers or {})})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, json.loads(data) if data else None, dict(r.getheaders())


def assert_openai_error(status, body, want_status, code=None):
    assert status == want_status, body
    assert set(body) == {"error"} and {"message", "type", "code"} <= set(body["error"]) and body["error"]["message"]
    if code is not None:
        assert body["error"]["code"] == code, body


def test_models_lists_the_configured_model_first_then_the_installed_ones(server):
    from app.runtime.model_files import list_models

    ids = [m.id for m in client(server).models.list()]
    installed = [Path(m.path).name for m in list_models(server.session.paths.models_dir) if not m.error]
    assert ids[0] == "fake.gguf" and set(ids) == {"fake.gguf", *installed}


def test_a_plain_answer_about_a_document_has_citations_and_usage(server, api_session):
    r = client(server).chat.completions.create(model="fake.gguf", messages=[{"role": "user", "content": QUESTION}],
                                               extra_body={"documents": ["Harbour Log"]})
    assert r.choices[0].message.content == ANSWER and r.choices[0].finish_reason == "stop"
    extra = r.model_dump()
    assert extra["citations"][0] == {"doc": 1, "title": "Harbour Log", "page": 3,
                                     "text": extra["citations"][0]["text"]}
    assert "three green lamps" in extra["citations"][0]["text"]
    prompt = api_session.fake.prompts[-1]
    assert r.usage.prompt_tokens == len(prompt) and r.usage.completion_tokens == len(api_session.fake.tokenize(ANSWER))
    assert r.usage.prompt_tokens_details.cached_tokens == 0        # the document was read by this request


def test_a_streamed_answer_arrives_in_chunks_and_ends_with_its_citations(server):
    stream = client(server).chat.completions.create(
        model="fake.gguf", messages=[{"role": "user", "content": QUESTION}], stream=True,
        stream_options={"include_usage": True}, extra_body={"documents": ["1"]})
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == ANSWER and len([c for c in chunks if c.choices and c.choices[0].delta.content]) > 3
    last = [c for c in chunks if c.choices][-1]
    assert last.choices[0].finish_reason == "stop" and last.model_dump()["citations"][0]["page"] == 3
    assert chunks[-1].usage.completion_tokens > 0


def test_a_follow_up_the_server_recognises_prefills_only_its_new_turn(server, api_session):
    c = client(server)
    first = c.chat.completions.create(model="fake.gguf", messages=[{"role": "user", "content": QUESTION}],
                                      extra_body={"documents": ["log.txt"]})
    history = [{"role": "user", "content": QUESTION},
               {"role": "assistant", "content": first.choices[0].message.content},
               {"role": "user", "content": "And where were they?"}]
    second = c.chat.completions.create(model="fake.gguf", messages=history, extra_body={"documents": ["log.txt"]})
    fake = api_session.fake
    assert fake.prompts[-1] == fake.prompts[-2] + fake.tokenize(ANSWER) + next_turn(fake, "And where were they?")
    new = second.usage.prompt_tokens - second.usage.prompt_tokens_details.cached_tokens
    assert new == len(next_turn(fake, "And where were they?"))
    # a history the server did not answer is still a conversation: its turns are laid out again
    other = [dict(history[0]), {"role": "assistant", "content": "Two red lamps."}, dict(history[2])]
    third = c.chat.completions.create(model="fake.gguf", messages=other, extra_body={"documents": ["log.txt"]})
    assert "Two red lamps." in fake.detokenize(fake.prompts[-1])
    assert third.usage.prompt_tokens_details.cached_tokens < third.usage.prompt_tokens - len(
        next_turn(fake, "And where were they?"))


def test_a_request_without_documents_is_the_models_own_chat(server, api_session):
    r = client(server).chat.completions.create(model="fake.gguf", messages=[
        {"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}], max_tokens=5)
    prompt = api_session.fake.detokenize(api_session.fake.prompts[-1])
    assert "Be brief." in prompt and "Hello there" in prompt and "[Page" not in prompt
    assert r.choices[0].message.content == ANSWER and "citations" not in r.model_dump()


@pytest.mark.parametrize("body, status, code", [
    (b"{not json", 400, None),
    (b"[1, 2]", 400, None),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "temprature": 1}), 400, None),
    (json.dumps({"model": "fake.gguf", "messages": []}), 400, None),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "wizard", "content": "q"}]}), 400, None),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "max_tokens": "lots"}), 400,
     None),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "assistant", "content": "a"}]}), 400, None),
    (json.dumps({"model": "nope", "messages": [{"role": "user", "content": "q"}]}), 404, "model_not_found"),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "documents": ["Atlas"]}), 404,
     "document_not_found"),
    (json.dumps({"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "documents": ["1"],
                 "max_tokens": 100000}), 400, "context_length_exceeded"),
])
def test_malformed_requests_get_a_4xx_in_openais_shape_and_the_server_keeps_serving(server, body, status, code):
    got, parsed, _ = raw(server, "POST", "/v1/chat/completions", body)
    assert_openai_error(got, parsed, status, code)
    assert raw(server, "GET", "/v1/models")[0] == 200


def test_the_unknown_field_and_the_context_limit_are_named(server):
    _, body, _ = raw(server, "POST", "/v1/chat/completions", json.dumps(
        {"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "temprature": 1}))
    assert "temprature" in body["error"]["message"] and body["error"]["param"] == "temprature"
    _, body, _ = raw(server, "POST", "/v1/chat/completions", json.dumps(
        {"model": "fake.gguf", "messages": [{"role": "user", "content": "q"}], "documents": ["1"], "max_tokens": 100000,
         "stream": True}))
    assert "4096" in body["error"]["message"]           # a streamed request too is refused before it streams


def test_an_oversized_body_is_refused_with_413(server):
    from app.api.server import MAX_BODY

    status, body, _ = raw(server, "POST", "/v1/chat/completions", b"x" * (MAX_BODY + 1))
    assert_openai_error(status, body, 413)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)   # a body sent in chunks, no length
    conn.putrequest("POST", "/v1/chat/completions")
    conn.putheader("Transfer-Encoding", "chunked")
    conn.endheaders()
    piece = b"y" * (1 << 20)
    try:
        for _ in range(MAX_BODY // len(piece) + 2):
            conn.send(b"%x\r\n%s\r\n" % (len(piece), piece))
        conn.send(b"0\r\n\r\n")
    except OSError:
        pass                            # the server may close the connection as soon as it refuses
    r = conn.getresponse()
    assert r.status == 413 and json.loads(r.read())["error"]["code"] == "request_too_large"
    assert raw(server, "GET", "/v1/models")[0] == 200


def test_an_unknown_endpoint_is_a_404_in_openais_shape(server):
    status, body, _ = raw(server, "GET", "/v1/embeddings")
    assert_openai_error(status, body, 404)


def test_a_client_that_disconnects_mid_stream_stops_its_generation(server, api_session):
    fake = api_session.fake
    fake.answer, fake.delay = " ".join(f"word{i}" for i in range(400)), 0.02
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(
        {"model": "fake.gguf", "messages": [{"role": "user", "content": QUESTION}], "documents": ["1"],
         "stream": True}), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    assert r.status == 200 and r.getheader("content-type").startswith("text/event-stream")
    seen = b""
    while b"word2" not in seen:      # the answer's first words have come
        seen += r.fp.readline()
    conn.sock.shutdown(2)
    conn.close()
    deadline = time.monotonic() + 10
    while fake.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert fake.running == 0 and fake.cancelled == 1 and fake.finished == 0
    assert len(fake.cache) < len(fake.prompts[-1]) + 100       # stopped long before its 400 words
    fake.answer, fake.delay = ANSWER, 0.0
    assert client(server).chat.completions.create(model="fake.gguf", messages=[{"role": "user", "content": "hi"}]) \
        .choices[0].message.content == ANSWER


def test_two_clients_at_once_are_served_one_after_the_other(server, api_session):
    fake = api_session.fake
    fake.delay = 0.02
    replies, errors = {}, []

    def ask(name, question):
        try:
            r = client(server).chat.completions.create(model="fake.gguf", messages=[{"role": "user", "content": question}],
                                                       extra_body={"documents": ["1"]})
            replies[name] = r.choices[0].message.content
        except Exception as e:     # noqa: BLE001 - the test reports it
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(n, q)) for n, q in (("a", QUESTION), ("b", "When does it open?"))]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join(60)
    assert errors == [] and replies == {"a": ANSWER, "b": ANSWER}
    assert fake.most_at_once == 1 and fake.finished == 2


def test_a_non_loopback_bind_needs_an_api_key_and_then_every_request_carries_it(api_session):
    with pytest.raises(ApiServerError, match="--api-key"):
        ApiServer(api_session, "0.0.0.0", 0)
    keyed = ApiServer(api_session, "127.0.0.1", 0, api_key="s3cret")
    keyed.start()
    try:
        status, body, _ = raw(keyed, "GET", "/v1/models")
        assert_openai_error(status, body, 401, "invalid_api_key")
        assert raw(keyed, "GET", "/v1/models", headers={"Authorization": "Bearer wrong"})[0] == 401
        with pytest.raises(openai.AuthenticationError):
            client(keyed, key="wrong").models.list()
        assert [m.id for m in client(keyed, key="s3cret").models.list()][0] == "fake.gguf"
    finally:
        keyed.stop()


def test_cors_is_off_unless_an_origin_is_given(api_session, server):
    origin = {"Origin": "http://localhost:3000"}
    assert "access-control-allow-origin" not in {k.lower() for k in raw(server, "GET", "/v1/models", headers=origin)[2]}
    open_to = ApiServer(api_session, "127.0.0.1", 0, cors=["http://localhost:3000"])
    open_to.start()
    try:
        headers = {k.lower(): v for k, v in raw(open_to, "GET", "/v1/models", headers=origin)[2].items()}
        assert headers["access-control-allow-origin"] == "http://localhost:3000"
    finally:
        open_to.stop()


def test_a_port_in_use_is_a_clear_error(api_session, server):
    with pytest.raises(ApiServerError, match=f"cannot listen on 127.0.0.1:{server.port}"):
        ApiServer(api_session, "127.0.0.1", server.port).start()


def test_one_log_line_per_request_without_the_text(server, caplog):
    import logging

    caplog.set_level(logging.INFO, logger="ellm.api")
    client(server).chat.completions.create(model="fake.gguf", messages=[{"role": "user", "content": QUESTION}],
                                           extra_body={"documents": ["1"]})
    deadline = time.monotonic() + 10          # the line is written once the response is sent
    while not [r for r in caplog.records if r.name == "ellm.api"] and time.monotonic() < deadline:
        time.sleep(0.02)
    lines = [r.getMessage() for r in caplog.records if r.name == "ellm.api"]
    assert len(lines) == 1 and "POST /v1/chat/completions 200" in lines[0] and "prompt=" in lines[0]
    assert QUESTION not in lines[0] and "green" not in lines[0]
