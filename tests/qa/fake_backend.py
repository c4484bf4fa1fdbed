"""A backend without a model, for testing the answer service's logic (budgets, page choice,
citations, composition, attended passages) in milliseconds.

It implements the Backend protocol of app/engine/backend.py: its tokens are the text's
words with the white space after them (so the tokens spell the text back exactly, as a real
tokenizer's do), it "generates" a scripted answer, and it records every prompt it was given.
With ``composes=True`` it keeps prefix caches as files of token ids and lays them side by side
as eLLM's blocked cache does.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

from app.engine.backend import CacheFile, CacheFileError, Capabilities, GenerationStats, Prefix

_PIECES = re.compile(r"\S+\s*|\s+")


class FakeBackend:
    name = "fake"

    def __init__(self, model_path: Path, n_ctx: int = 4096, answer: str = "An answer.", composes: bool = False,
                 kv_bytes: int = 100, block: int = 4, focus: bool = False):
        self.model_path = str(model_path)
        self.n_ctx = n_ctx
        self.answer = answer
        self.stats = GenerationStats()
        self.capabilities = Capabilities(prefix_files=composes, composes=composes, attended_blocks=composes,
                                         focus=focus, beside=composes)
        self.prefix_multiple = block if composes else 1
        self._kv_bytes = kv_bytes
        self._vocab: dict[str, int] = {}
        self._pieces: list[str] = []
        self.prompts: list[list[int]] = []      # every prompt generate() was given
        self.cache: list[int] = []              # the tokens "held" (prefix or composed caches)
        self.attended: list[tuple[int, int, float]] = []   # what attended_blocks reports
        self.focused: list[tuple[int, list[tuple[int, int]]]] = []   # (prompts given so far, ranges) a call
        self.questions_at: list[int] = []       # where a conversation's new turn began, a call
        self.views: list[int | None] = []       # beside()'s head, a call

    # ---- text
    def tokenize(self, text: str, add_bos: bool = True, special: bool = True) -> list[int]:
        return [self._id(p) for p in _PIECES.findall(text)]

    def _id(self, piece: str) -> int:
        if piece not in self._vocab:
            self._vocab[piece] = len(self._pieces)
            self._pieces.append(piece)
        return self._vocab[piece]

    def detokenize(self, tokens) -> str:
        return "".join(self._pieces[t] for t in tokens)

    def token_bytes(self, token: int) -> bytes:
        return self._pieces[token].encode("utf-8")

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}> {m['content']} </{m['role']}>\n" for m in messages)
        return text + ("<assistant> " if add_generation_prompt else "")

    def eos_tokens(self) -> set[int]:
        return set()

    def generate(self, prompt, params, cancel=None):
        prompt = list(prompt)
        if len(prompt) >= self.n_ctx:
            raise ValueError(f"the prompt has {len(prompt)} tokens but the context holds {self.n_ctx}")
        self.prompts.append(prompt)
        reused = 0
        for a, b in zip(self.cache, prompt[:-1]):     # what the cache shares with the prompt (as the engine keeps)
            if a != b:
                break
            reused += 1
        self.stats = GenerationStats(prompt_tokens=len(prompt), kv="f16", attention="dense",
                                     kv_bytes_per_token=self._kv_bytes, reused_prompt_tokens=reused)
        self.cache = list(prompt)

        def tokens():
            for i, t in enumerate(self.tokenize(self.answer)):
                if cancel is not None and cancel():
                    return
                self.stats.decode_tokens = i + 1
                self.cache.append(t)
                yield t
        return tokens()

    # ---- prefix caches
    def kv_bytes_per_token(self) -> int:
        return self._kv_bytes

    def cache_signature(self) -> dict:
        return {"kv": "f16", "attention": "sparse" if self.capabilities.composes else "dense"}

    def ensure_prefix(self, tokens, file: CacheFile | None = None, cancel=None, progress=None) -> Prefix:
        tokens = list(tokens)
        if not self.capabilities.prefix_files:
            return Prefix("miss", "deferred")
        if self.cache[:len(tokens)] == tokens:
            self.cache = tokens
            return Prefix("hit", "memory")
        if file is not None and file.exists and json.loads(file.path.read_text()) == tokens:
            self.cache = tokens
            return Prefix("hit", "file")
        if progress is not None:     # "computed" in two steps, as a prefill reports its chunks
            progress(len(tokens) // 2, len(tokens))
            progress(len(tokens), len(tokens))
        self.cache = tokens
        saved = 0
        if file is not None:
            file.path.parent.mkdir(parents=True, exist_ok=True)
            file.path.write_text(json.dumps(tokens))
            saved = file.path.stat().st_size
        return Prefix("miss", "computed", saved)

    def compose(self, files, skip: int, room: int) -> list[int]:
        self.cache, offsets = [], []
        for i, f in enumerate(files):
            try:
                tokens = json.loads(Path(f.path).read_text())
            except (OSError, ValueError) as e:
                raise CacheFileError(f"{f.path}: unreadable ({e})", f.path) from e
            offsets.append(len(self.cache) if i else skip)
            self.cache += tokens if i == 0 else tokens[skip:]
        return offsets

    def cached_tokens(self, start: int = 0, end: int | None = None) -> list[int]:
        return self.cache[start:end]

    def attended_blocks(self, limit: int = 8) -> list[tuple[int, int, float]]:
        return self.attended[:limit]

    def focus(self, ranges) -> None:
        self.focused.append((len(self.prompts), list(ranges)))

    def question_at(self, start: int) -> None:
        self.questions_at.append(start)

    def beside(self, ranges, room: int, head: int | None = None) -> list[int]:
        """Copies of the held tokens in whole blocks, as the blocked cache lays them; ``head``
        noted in ``views`` (None: the next answer reads everything)."""
        self.views.append(head)
        b, n = self.prefix_multiple, len(self.cache)
        wanted = [i for s, e in ranges if e > s for i in range(s // b, -(-e // b)) if i < n // b]
        chosen = sorted(list(dict.fromkeys(wanted))[:max(0, room) // b])
        copied = [t for i in chosen for t in self.cache[i * b:(i + 1) * b]]
        self.cache = self.cache + copied
        return copied

    def close(self) -> None:
        pass
