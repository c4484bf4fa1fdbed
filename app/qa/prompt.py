"""The prompt of a question: the chat template around the documents' pages and the question.

The part before the question (system prompt, the opening of the user turn, the pages) does
not depend on the question, so its KV cache is computed once per document (qa/doc_cache.py);
it is padded with blank lines to whole KV blocks, so that several documents' caches can sit
side by side (qa/across.py). The blank lines go before the pages, never between the pages and
the question: up to a block of lone newlines just before the question cost the 1.5B model three
of twelve answers on the FHS (docs/benchmarks.md).
"""
from __future__ import annotations

from dataclasses import dataclass

SYSTEM_PROMPT = (
    "You are eLLM, an assistant that answers questions about the documents given to you. "
    "Answer from the documents only, clearly and briefly. After each fact, cite the page it comes "
    "from as [p. N]. If the documents do not contain the answer, say so."
)


def build_messages(question: str, context_text: str) -> list[dict]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"{context_text}{QUESTION_LEAD}{question}"},
    ]


QUESTION_LEAD = "\n\nQuestion: "
BESIDE_LEAD = "\n\nThe passages most relevant to the question, again:\n\n"
_DOCS = "\u27e6documents\u27e7"
_SLOT = "\u27e6question\u27e7"


@dataclass
class Prompt:
    """A question's prompt in three parts. ``header`` (system prompt and the opening of the
    user turn) and ``doc`` (the pages) do not depend on the question: their KV cache is
    computed once per document (app/qa/doc_cache.py). Both are padded with blank lines to whole
    KV blocks, so that several documents' caches can sit side by side (app/qa/across.py): the
    header at its end, the pages in front of them, so the question follows the last page."""

    header: list[int]
    doc: list[int]
    suffix: list[int]
    header_text: str
    doc_text: str

    @property
    def prefix(self) -> list[int]:
        return self.header + self.doc

    @property
    def tokens(self) -> list[int]:
        return self.header + self.doc + self.suffix

    @property
    def prefix_text(self) -> str:
        return self.header_text + self.doc_text


def _padded(backend, tokens: list[int], text: str, front: bool = False) -> tuple[list[int], str]:
    """``tokens`` and ``text`` with blank lines added to a multiple of the backend's
    prefix_multiple tokens, at the end or (``front``) at the start."""
    multiple = backend.prefix_multiple
    if len(tokens) % multiple == 0:
        return tokens, text
    newline = backend.tokenize("\n", add_bos=False, special=False)[-1:]
    n_pad = multiple - len(tokens) % multiple
    pad, pad_text = newline * n_pad, backend.token_bytes(newline[0]).decode("utf-8", "replace") * n_pad
    return (pad + tokens, pad_text + text) if front else (tokens + pad, text + pad_text)


def build_prompt(backend, question: str, context_text: str, beside: str = "") -> Prompt:
    """The prompt of ``question`` about ``context_text`` (pages with markers); ``beside``:
    passages (pages with markers) shown again between the pages and the question, in the
    question's part. Document text is tokenized without special tokens: a document cannot
    smuggle in chat markup."""
    rendered = backend.apply_chat_template(build_messages(_SLOT, _DOCS))
    cut = rendered.index(_DOCS)
    header_text, rest = rendered[:cut], rendered[cut + len(_DOCS):]
    header, header_text = _padded(backend, backend.tokenize(header_text, add_bos=True, special=True), header_text)
    doc, doc_text = _padded(backend, backend.tokenize(context_text, add_bos=False, special=False), context_text,
                            front=True)
    return Prompt(header, doc, _suffix(backend, rest, question, beside), header_text, doc_text)


def question_suffix(backend, question: str, beside: str = "") -> list[int]:
    """The tokens after a document prefix: ``beside`` (as in build_prompt), the question and the
    end of the user turn."""
    rendered = backend.apply_chat_template(build_messages(_SLOT, _DOCS))
    return _suffix(backend, rendered[rendered.index(_DOCS) + len(_DOCS):], question, beside)


def _suffix(backend, rest: str, question: str, beside: str) -> list[int]:
    tokens = backend.tokenize(BESIDE_LEAD + beside, add_bos=False, special=False) if beside else []
    return tokens + backend.tokenize(rest.replace(_SLOT, question), add_bos=False, special=True)
