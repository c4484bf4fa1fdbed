"""Chat templates: render a GGUF model's ``tokenizer.chat_template`` (Jinja2).

llama-cpp-python renders the same template with Jinja2 too
(``llama_chat_format.Jinja2ChatFormatter``), so both backends see one prompt text. A file
without a template gets its family's format (``FAMILY_TEMPLATES``, by general.architecture),
else ChatML.
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


# Gemma's turn format (Gemma 3 model card, "Prompt formatting"): <start_of_turn>user / model,
# each turn closed by <end_of_turn>. Gemma has no system role: a leading system message goes
# in front of the first user turn, separated by a blank line. BOS is left to the tokenizer.
GEMMA = (
    "{% if messages and messages[0]['role'] == 'system' %}"
    "{% set system = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
    "{% else %}{% set system = '' %}{% set turns = messages %}{% endif %}"
    "{% for message in turns %}"
    "{% if message['role'] not in ('user', 'assistant') %}"
    "{{ raise_exception('gemma has no ' + message['role'] + ' role: only user and assistant turns') }}"
    "{% endif %}"
    "{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else 'user') + '\n' }}"
    "{{ (system if loop.first else '') + (message['content'] | trim) + '<end_of_turn>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}"
)

FAMILY_TEMPLATES = {"gemma3": GEMMA, "qwen2": CHATML, "qwen3": CHATML}
"""The template of a file without one, by architecture (Qwen2/Qwen3 speak ChatML)."""


def _raise(message: str):
    raise jinja2.exceptions.TemplateError(message)


@lru_cache(maxsize=8)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    return env.from_string(template)


def render_chat(template: str | None, messages: list[dict], bos_token: str = "", eos_token: str = "",
                add_generation_prompt: bool = True, arch: str = "", tokenizer_adds_bos: bool = False) -> str:
    """The prompt text for ``messages`` ([{"role", "content"}]) under ``template`` (None: the
    format of the family ``arch``). With ``tokenizer_adds_bos`` (the model's add_bos_token:
    the backends tokenize prompts with BOS) a BOS the template writes first is left out, so
    the prompt does not start with two (llama.cpp only warns about that)."""
    text = _compile(template or FAMILY_TEMPLATES.get(arch, CHATML)).render(
        messages=messages, bos_token=bos_token, eos_token=eos_token,
        add_generation_prompt=add_generation_prompt,
    )
    if tokenizer_adds_bos and bos_token and text.startswith(bos_token):
        text = text[len(bos_token):]
    return text
