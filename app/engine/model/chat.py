"""Chat templates: render a GGUF model's ``tokenizer.chat_template`` (Jinja2).

llama-cpp-python renders the same template with Jinja2 too
(``llama_chat_format.Jinja2ChatFormatter``), so both backends see one prompt text.
"""
from __future__ import annotations

from functools import lru_cache

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

# ChatML is what SmolLM2 and Qwen2 use; a model without a template gets it too.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True) -> str:
    """The prompt text for ``messages`` ([{"role", "content"}]) under ``template``."""
    return _compile(template or CHATML).render(
        messages=messages, bos_token=bos_token, eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
    )
