"""Chat templates per family: a file's own template, else its family's (gemma3), else ChatML."""
from __future__ import annotations

from pathlib import Path

import gguf
import jinja2
import pytest

from app.engine.model.chat import CHATML, render_chat
from app.engine.model.tokenizer import Tokenizer

GEMMA3_PATH = Path.home() / ".cache" / "ellm-models" / "gemma3.gguf"
CHAT = [{"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": " 4 "},
        {"role": "user", "content": "And 3+3?"}]


def test_gemma_template_folds_the_system_message_into_the_first_user_turn():
    text = render_chat(None, CHAT, bos_token="<bos>", arch="gemma3")
    assert text == ("<start_of_turn>user\nAnswer briefly.\n\nWhat is 2+2?<end_of_turn>\n"
                    "<start_of_turn>model\n4<end_of_turn>\n"
                    "<start_of_turn>user\nAnd 3+3?<end_of_turn>\n"
                    "<start_of_turn>model\n")
    assert render_chat(None, CHAT[1:2], arch="gemma3", add_generation_prompt=False) == \
        "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n"


def test_gemma_template_refuses_a_role_it_does_not_have():
    with pytest.raises(jinja2.exceptions.TemplateError, match="gemma has no tool role"):
        render_chat(None, CHAT + [{"role": "tool", "content": "x"}], arch="gemma3")


def test_other_families_without_a_template_get_chatml():
    for arch in ("llama", "qwen2", "qwen3", "phi3"):
        assert render_chat(None, CHAT[1:2], arch=arch) == render_chat(CHATML, CHAT[1:2]) == \
            "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"


def test_a_files_own_template_wins_and_its_bos_is_not_doubled():
    own = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    assert render_chat(own, CHAT[1:2], bos_token="<s>", arch="gemma3") == "<s>[user]What is 2+2?"
    assert render_chat(own, CHAT[1:2], bos_token="<s>", arch="gemma3", tokenizer_adds_bos=True) == \
        "[user]What is 2+2?"


def test_gemma3_prompt_tokenizes_to_its_turn_tokens_once_with_one_bos():
    if not GEMMA3_PATH.exists():
        pytest.skip(f"{GEMMA3_PATH} is not here")
    tok = Tokenizer.from_gguf(gguf.GGUFReader(str(GEMMA3_PATH)))
    ids = tok.encode(render_chat(None, CHAT, bos_token="<bos>", arch="gemma3", tokenizer_adds_bos=tok.add_bos))
    start, end = tok.encode("<start_of_turn>", add_bos=False), tok.encode("<end_of_turn>", add_bos=False)
    assert len(start) == len(end) == 1                                 # control tokens, not text
    assert ids[0] == tok.bos_id and ids.count(tok.bos_id) == 1
    assert ids.count(start[0]) == 4 and ids.count(end[0]) == 3


def test_both_backends_render_and_tokenize_gemma3_chat_alike(llama_cpp):
    """The family template reaches render_chat through both backends: the same text, the same ids."""
    if not GEMMA3_PATH.exists():
        pytest.skip(f"{GEMMA3_PATH} is not here")
    from app.engine.ellm_backend import EllmBackend
    from app.engine.llamacpp_backend import LlamaCppBackend

    ours = EllmBackend(GEMMA3_PATH, n_ctx=256, n_threads=1)
    theirs = LlamaCppBackend(str(GEMMA3_PATH), n_ctx=256, n_threads=1)
    try:
        text = ours.apply_chat_template(CHAT)
        assert text == theirs.apply_chat_template(CHAT) == render_chat(None, CHAT, arch="gemma3")
        assert ours.tokenize(text) == theirs.tokenize(text)
    finally:
        ours.close()
        theirs.close()
