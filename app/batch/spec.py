"""What a batch is: which documents, which tasks, which model with which settings, and the
key that names it, so that the same command finds the same batch and resumes it.

The key hashes what decides the answers: the target as the command named it (``--all``,
``--folder PATH``, ``--doc ...``), the tasks, the model's content fingerprint and the settings
that change an answer. It leaves out what only changes the speed (workers, threads, the Ray
address): a batch started on a laptop can be finished on a cluster.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass

from app.engine.backend import SamplingParams

ASK, SUMMARY = "ask", "summary"


@dataclass(frozen=True)
class Task:
    """One thing asked of every document: a question, or its summary."""

    kind: str          # ASK | SUMMARY
    question: str = ""  # "" for a summary

    @property
    def label(self) -> str:
        return self.question if self.kind == ASK else "(summary)"


@dataclass(frozen=True)
class EngineSpec:
    """How a worker opens its engine: what app/runtime/plan.py ``run_plan`` takes, resolved by
    the driver's session (its threads are the worker's own, not the driver's)."""

    engine: str
    model_path: str
    model_name: str
    n_ctx: int
    threads: int
    numa: str = "distribute"
    kv: str = "f16"
    attention: str = "dense"


@dataclass(frozen=True)
class BatchSpec:
    target: str                  # how the documents were named: "all", "folder:/path", "docs:1,4"
    doc_ids: tuple[int, ...]
    tasks: tuple[Task, ...]
    engine: EngineSpec
    params: SamplingParams
    model_fingerprint: str       # app/qa/doc_cache.model_fingerprint of the model file

    @property
    def settings(self) -> dict:
        """The settings an answer depends on (not threads or workers)."""
        p = self.params
        return {"engine": self.engine.engine, "n_ctx": self.engine.n_ctx, "kv": self.engine.kv,
                "attention": self.engine.attention, "max_tokens": p.max_tokens, "temperature": p.temperature,
                "top_k": p.top_k, "top_p": p.top_p, "repeat_penalty": p.repeat_penalty, "seed": p.seed}

    @property
    def settings_key(self) -> str:
        return short_hash(self.settings)

    @property
    def model(self) -> str:
        return self.engine.model_name

    @property
    def batch_id(self) -> str:
        return short_hash({"target": self.target, "tasks": [asdict(t) for t in self.tasks],
                           "model": self.model_fingerprint, "settings": self.settings})

    def as_dict(self) -> dict:
        """What the store keeps of the batch (``batches.spec``)."""
        return {"target": self.target, "tasks": [asdict(t) for t in self.tasks], "model": self.model,
                "model_fingerprint": self.model_fingerprint, "settings": self.settings,
                "settings_key": self.settings_key}


def short_hash(obj) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()[:16]


def tasks_from(questions: list[str], summarize: bool) -> tuple[Task, ...]:
    """The batch's tasks: each distinct question once, in order, then the summary."""
    seen: list[str] = []
    for q in questions:
        q = q.strip()
        if q and q not in seen:
            seen.append(q)
    tasks = [Task(ASK, q) for q in seen]
    if summarize:
        tasks.append(Task(SUMMARY))
    return tuple(tasks)


def read_questions(path: str) -> list[str]:
    """A questions file: one question a line; blank lines and lines starting with # are skipped."""
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip() and not line.lstrip().startswith("#")]
