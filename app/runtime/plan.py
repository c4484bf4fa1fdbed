"""A run plan: everything one run of a model is decided by, decided once, here.

The engine (runtime/engines.py: from the model's header), the context, KV format and attention
(runtime/auto.py: from the settings and the documents), the sparse configuration that attention
reads that context with (attention/config.py ``SparseConfig.for_context``), the cache kind
(kv/formats.py ``blocked_cache``) and the threads and NUMA policy (cpu/plan.py) come together in
one frozen value. Backends are built from it and keyed by it (runtime/backends.py); nothing
after this works any of it out again.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from app.engine.attention.config import SparseConfig
from app.engine.cpu.plan import ThreadPlan
from app.engine.kv.formats import KV_NAMES, blocked_cache
from app.runtime.auto import choose
from app.runtime.engines import EngineChoice, choose_engine, thread_plan
from app.runtime.model_files import check_gguf_header


@dataclass(frozen=True)
class RunPlan:
    """One run of a model, decided: what a backend is built from and keyed by."""

    engine: str                      # "ellm" | "llamacpp"
    model: str                       # the GGUF file
    n_ctx: int                       # the context the backend holds (eLLM's blocked cache grows to it)
    kv: str                          # a KV format (kv/formats.py KV_NAMES)
    attention: str                   # an attention mode (attention/config.py MODES)
    sparse: SparseConfig | None      # how eLLM's engine reads a context of n_ctx tokens; None on llama.cpp
    blocked: bool                    # the cache kind: blocked (True) or contiguous
    threads: ThreadPlan | int        # cpu/plan.py's plan, or a bare count where /sys cannot be read
    numa: str                        # the NUMA policy the plan was made with
    documents: bool = False          # the backend answers about documents
    planes_dir: str | None = None    # where eLLM's engine keeps the model's repacked weights
    trained: int = 0                 # the model's trained context (0: the header does not say)
    wanted: int = 0                  # tokens the documents, the passages beside and the answer want
    note: str = ""                   # what a person should know (memory too small for the documents)
    engine_note: str = ""            # why the automatic engine choice took llama.cpp ("" otherwise)

    @property
    def thread_count(self) -> int:
        return self.threads.count if isinstance(self.threads, ThreadPlan) else int(self.threads or 0)

    @property
    def grows(self) -> bool:
        """eLLM's blocked cache grows in place (EllmBackend.reserve): one loaded model serves every
        context of this plan's other settings; llama.cpp's and the contiguous cache are sized at load."""
        return self.engine == "ellm" and self.blocked

    def key(self) -> tuple:
        """What tells two loaded backends apart: a backend opened for one plan serves another with
        the same key (growing its cache to the larger context)."""
        common = (self.engine, self.model, None if self.grows else self.n_ctx, self.thread_count, self.numa,
                  self.kv)
        return common + ((self.sparse, self.blocked, self.planes_dir) if self.engine == "ellm" else ())


def run_plan(engine: str | EngineChoice, model_path: str | Path, n_ctx: int, threads: int = 0,
             numa: str = "distribute", kv: str = "f16", attention: str = "dense", documents: bool = False,
             planes_dir: str | Path | None = None, wanted: int = 0, note: str = "") -> RunPlan:
    """The plan for settings already resolved (no ``auto`` left but the engine's): the engine from
    the header, the sparse configuration for ``n_ctx``, the cache kind and the threads."""
    if kv not in KV_NAMES:
        raise ValueError(f"unknown KV format {kv!r}: use one of {', '.join(KV_NAMES)}")
    if not isinstance(engine, EngineChoice):     # (plan_for has checked the file and chosen)
        check_gguf_header(model_path)
        engine = choose_engine(engine, Path(model_path))
    choice = engine
    trained = choice.context_length
    ours = choice.name == "ellm"
    try:
        plan = thread_plan(threads, numa)       # a bad count or policy is refused here (ValueError)
    except OSError:                             # no /sys to read: the count alone, placed by the OS
        plan = threads
    return RunPlan(engine=choice.name, model=str(model_path), n_ctx=int(n_ctx), kv=kv, attention=attention,
                   sparse=SparseConfig(mode=attention).for_context(n_ctx, trained or n_ctx) if ours else None,
                   blocked=ours and blocked_cache(choice.architecture, kv, attention, documents),
                   threads=plan, numa=numa, documents=documents,
                   planes_dir=str(planes_dir) if planes_dir is not None else None, trained=trained,
                   wanted=wanted, note=note, engine_note=choice.note)


def plan_for(settings, model_path: str | Path, doc_tokens: int | None = None,
             planes_dir: str | Path | None = None, free_bytes: int | None = None) -> RunPlan:
    """The plan for ``settings`` (a person's choices, ``auto`` where they left it to eLLM) and
    ``doc_tokens`` tokens of documents (None: no document): runtime/auto.py decides what is left."""
    check_gguf_header(model_path)
    choice = choose_engine(settings.engine, Path(model_path))
    chosen = choose(settings, Path(model_path), choice.name, doc_tokens, free_bytes)
    return run_plan(choice, model_path, chosen.n_ctx, settings.threads, settings.numa, kv=chosen.kv,
                    attention=chosen.attention, documents=bool(doc_tokens), planes_dir=planes_dir,
                    wanted=chosen.wanted, note=chosen.note)
