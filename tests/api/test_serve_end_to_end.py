"""`ellm serve` as a person runs it, with the default model (SmolLM2) on eLLM's engine: the
official ``openai`` client lists the model, gets a plain and a streamed answer about a document
with citations, and a follow-up whose prompt is mostly cached (``cached_tokens``). The server
runs with the network guard in its listen-only mode: it listens on loopback and never connects
out (tests/reliability/hooks/ellm_netguard.py)."""
from __future__ import annotations

import re
import subprocess
import time

import openai
import pytest

from tests.conftest import TREATY_PAGES
from tests.docs.make_samples import make_pdf
from tests.reliability.helpers import cli_command, cli_env, run_cli

QUESTION = "Who kept the lamp of the northern lighthouse burning?"


@pytest.fixture
def served(data_dir, tmp_path):
    """(base URL, network log) of `ellm serve --port 0` over one ingested PDF."""
    make_pdf(tmp_path / "treaty.pdf", TREATY_PAGES, title="River Treaty History")
    assert run_cli(data_dir, "ingest", str(tmp_path / "treaty.pdf"), timeout=120).rc == 0
    log = tmp_path / "network-attempts.log"
    env = cli_env(ELLM_TEST_NO_NETWORK="listen", ELLM_TEST_NETWORK_LOG=str(log))
    err = open(tmp_path / "serve.err", "w+")
    proc = subprocess.Popen(cli_command(data_dir, "serve", "--port", "0", "--max-tokens", "24"), env=env,
                            stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline, url = time.monotonic() + 120, None
        while url is None:
            assert proc.poll() is None and time.monotonic() < deadline, (tmp_path / "serve.err").read_text()
            found = re.search(r"on (http://127\.0\.0\.1:\d+)/v1", (tmp_path / "serve.err").read_text())
            url = found.group(1) if found else None
            time.sleep(0.1)
        yield url, log, tmp_path / "serve.err"
    finally:
        proc.terminate()
        proc.wait(30)
        err.close()


def test_the_openai_client_talks_to_ellm_serve_and_nothing_leaves_the_machine(served):
    url, log, err = served
    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=600)
    model = client.models.list().data[0].id
    assert model.endswith(".gguf")
    about = {"documents": ["treaty.pdf"]}
    first = client.chat.completions.create(model=model, messages=[{"role": "user", "content": QUESTION}],
                                           temperature=0, extra_body=about)
    text = first.choices[0].message.content
    assert text.strip() and first.usage.completion_tokens > 0
    cites = first.model_dump()["citations"]
    assert cites and all(c["title"] == "River Treaty History" and 1 <= c["page"] <= 3 for c in cites)
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": text},
               {"role": "user", "content": "For how many years?"}]
    chunks = list(client.chat.completions.create(model=model, messages=history, temperature=0, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=about))
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed.strip() and [c for c in chunks if c.choices][-1].model_dump()["citations"]
    usage = chunks[-1].usage
    # the follow-up continues the first answer's cache: only its own turn is new
    assert usage.prompt_tokens > first.usage.prompt_tokens + first.usage.completion_tokens - 2
    assert usage.prompt_tokens - usage.prompt_tokens_details.cached_tokens < 64
    # a request's line is written once its response is complete: the client may read [DONE] before it
    deadline, log_lines = time.monotonic() + 30, []
    while len(log_lines) < 2 and time.monotonic() < deadline:
        log_lines = [line for line in err.read_text().splitlines() if "POST /v1/chat/completions 200" in line]
        time.sleep(0.1)
    assert len(log_lines) == 2 and "lighthouse" not in "".join(log_lines)
    assert not log.exists(), log.read_text()


def test_a_non_loopback_bind_without_a_key_is_refused(data_dir):
    run = run_cli(data_dir, "serve", "--host", "0.0.0.0", "--port", "0", timeout=60)
    assert run.rc == 1 and "--api-key" in run.err
