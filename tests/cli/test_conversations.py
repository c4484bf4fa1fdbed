"""Conversations on the command line with the default model (SmolLM2 through llama.cpp):
`ask` starts a thread, `ask --thread` adds a turn that sees the earlier one, `chat` reads
questions from its prompt, `threads` lists, shows, renames and deletes them."""
from __future__ import annotations

import io

import pytest

LLAMACPP = ("--engine", "llamacpp", "--ctx", "2048", "--max-tokens", "16", "--greedy")
QUESTION = "Who kept the lamp of the northern lighthouse burning?"


@pytest.fixture
def ingested(cli, corpus):
    assert cli("ingest", str(corpus))[0] == 0
    return corpus


def test_ask_starts_a_thread_and_ask_thread_adds_a_turn_that_sees_the_first(cli, ingested, data_dir):
    rc, first, err = cli("ask", QUESTION, "--doc", "treaty.pdf", *LLAMACPP, "--json", json_out=True)
    assert rc == 0 and first["thread"], err
    thread = first["thread"]
    rc, second, err = cli("ask", "For how many years?", "--thread", str(thread), *LLAMACPP, "--json", json_out=True)
    assert rc == 0 and second["thread"] == thread and second["documents"] == first["documents"], err
    # the follow-up's prompt holds the first turn: it is longer than the first prompt and its answer
    assert second["timings"]["prompt_tokens"] > first["timings"]["prompt_tokens"] + first["timings"]["decode_tokens"]
    rc, listed, _ = cli("threads", "--json", json_out=True)
    assert rc == 0 and [(t["id"], t["turns"], t["title"]) for t in listed] == [(thread, 2, QUESTION)]
    assert set(listed[0]) == {"id", "title", "kind", "documents", "folder", "turns", "created_at", "updated_at"}
    rc, shown, _ = cli("threads", "--show", str(thread), "--json", json_out=True)
    assert [t["question"] for t in shown["turns"]] == [QUESTION, "For how many years?"]
    assert shown["turns"][0]["answer"] == first["answer"]
    rc, out, _ = cli("threads", "--rename", str(thread), "The lighthouse")
    assert rc == 0 and "Thread " + str(thread) + ": The lighthouse" in out
    assert cli("threads", "--search", "lighthouse", "--json", json_out=True)[1][0]["id"] == thread
    assert cli("threads", "--search", "zeppelin", "--json", json_out=True)[1] == []
    rc, out, _ = cli("threads", "--delete", str(thread))
    assert rc == 0 and cli("threads", "--json", json_out=True)[1] == []


def test_an_unknown_thread_and_a_thread_with_a_target_are_refused(cli, ingested):
    rc, _, err = cli("ask", "Anything?", "--thread", "999", *LLAMACPP)
    assert rc == 1 and "no thread 999" in err
    rc, first, _ = cli("ask", QUESTION, "--doc", "treaty.pdf", *LLAMACPP, "--json", json_out=True)
    rc, _, err = cli("ask", "More?", "--thread", str(first["thread"]), "--doc", "treaty.pdf", *LLAMACPP)
    assert rc == 1 and "--thread continues" in err
    rc, _, err = cli("ask", "Nothing to ask about?", *LLAMACPP)
    assert rc == 1 and "--doc" in err and "--thread" in err


def test_chat_with_a_model_that_cannot_load_says_so_before_the_prompt_and_stores_nothing(cli, ingested,
                                                                                         monkeypatch, tmp_path):
    bad = tmp_path / "notes.gguf"
    bad.write_text("These are my notes, saved with the wrong name.\n" * 40)
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{QUESTION}\n/quit\n"))
    rc, out, err = cli("chat", "--doc", "treaty.pdf", "--model", str(bad))
    assert rc == 1 and "not a GGUF model file" in err and "Chatting about" not in err and "eLLM> " not in out
    assert cli("threads", "--json", json_out=True)[1] == []


def test_chat_answers_each_line_as_a_turn_of_one_thread(cli, ingested, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.StringIO(f"{QUESTION}\n\nFor how many years?\n/quit\n"))
    rc, out, err = cli("chat", "--doc", "treaty.pdf", *LLAMACPP)
    assert rc == 0, err
    assert out.count("eLLM> ") == 2 and out.count("Sources:") == 2 and "Chatting about " in err
    rc, listed, _ = cli("threads", "--json", json_out=True)
    assert len(listed) == 1 and listed[0]["turns"] == 2
    monkeypatch.setattr("sys.stdin", io.StringIO("And when did it end?\n"))      # continued, then Ctrl-D
    rc, out, err = cli("chat", "--thread", str(listed[0]["id"]), *LLAMACPP)
    assert rc == 0 and "2 turns so far" in err
    assert cli("threads", "--json", json_out=True)[1][0]["turns"] == 3
