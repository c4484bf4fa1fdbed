"""The KV quality probe of a document: how much a KV format changes the model's predictions
on the document's first tokens (the engine's model/kv_probe.py), for ``ellm kv-probe`` and the
settings dialog's *KV quality probe*."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

PROBE_TOKENS = 4096     # default: the first this many tokens of the document



class ProbeError(Exception):
    """What a person can fix: the document, the model, the KV setting; the message says which."""



def document_text(store, doc_id: int) -> str:
    """The document's pages, in order, as one text."""
    return "\n\n".join(p["text"] for p in store.pages(doc_id))



def probe_tokens(tokenizer, text: str, limit: int) -> list[int]:
    """The first ``limit`` tokens of ``text`` (BOS as the model wants it), tokenizing only
    as much text as that needs: a long document costs no more than a short one."""
    chars = limit * 8
    while True:
        tokens = tokenizer.encode(text[:chars], add_bos=True, special=False)
        if len(tokens) > limit or chars >= len(text):
            return tokens[:limit]
        chars *= 2



def probe_document(store, doc: dict, model_path: Path, kv: str, limit: int = PROBE_TOKENS, threads: int = 0,
                   numa: str = "distribute", progress: Callable[[int, int], None] | None = None,
                   cancel: Callable[[], bool] | None = None):
    """Run the KV probe (app/engine/model/kv_probe.py) of ``kv`` against f16 on the first ``limit``
    tokens of ``doc`` (a store row) with the model at ``model_path``. Returns its
    ProbeResult, or None if cancelled; raises ProbeError saying what to change."""
    from app.engine.header.model_config import ARCHITECTURES
    from app.engine.header.support import DENSE_ONLY
    from app.runtime.engines import thread_plan
    from app.runtime.model_files import ModelError, scan_gguf

    if limit < 2:
        raise ProbeError(f"the KV probe needs at least 2 tokens, not {limit}")
    from app.engine.kv.formats import KVSpec

    try:
        spec = KVSpec.parse(kv)
    except ValueError as e:
        raise ProbeError(str(e)) from e
    try:
        arch = scan_gguf(model_path).architecture
    except ModelError as e:
        raise ProbeError(str(e)) from e
    if arch not in ARCHITECTURES:
        raise ProbeError(f"{model_path.name}: the KV probe runs on eLLM's own engine, which implements "
                         f"{', '.join(ARCHITECTURES)} models, not '{arch}'; choose such a model")
    if arch in DENSE_ONLY:
        raise ProbeError(f"{model_path.name}: the KV probe compares the blocked cache's formats, which do not "
                         f"implement the sliding-window layers of '{arch}'; choose another model")
    text = document_text(store, doc["id"])
    if not text.strip():
        raise ProbeError(f"{doc['path']}: the document has no text to probe")
    from app.engine.cpu.pinning import apply
    from app.engine.model.kv_probe import probe
    from app.engine.model.tokenizer import Tokenizer
    from app.engine.model.transformer import Model

    try:
        apply(thread_plan(threads, numa))
    except (OSError, ValueError):   # no readable /sys: numba's own thread count
        pass
    try:
        model = Model(model_path)
    except ValueError as e:   # UnsupportedModelError names the file and the problem
        raise ProbeError(str(e)) from e
    tokens = probe_tokens(Tokenizer.from_gguf(model.reader), text, limit)
    if len(tokens) < 2:
        raise ProbeError(f"{doc['path']}: the document has fewer than 2 tokens; nothing to probe")
    return probe(model, tokens, spec, progress=progress, cancel=cancel)
