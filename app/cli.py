"""The ``ellm`` command. Its subcommands, options and JSON keys are a contract
documented in README.md; change them only by adding."""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from app import __version__
from app.config import ATTENTION, ENGINES, KV_SETTINGS, Paths


class CliError(Exception):
    """An error a person can act on; printed without a traceback, exit status 1."""


# ---- Shared state of one invocation ------------------------------------------


@dataclass
class Context:
    args: argparse.Namespace

    @property
    def json(self) -> bool:
        return bool(getattr(self.args, "json", False))

    @cached_property
    def session(self):
        from app.session import Session

        a = self.args
        overrides = {"engine": getattr(a, "engine", None), "model": getattr(a, "model", None),
                     "n_ctx": getattr(a, "ctx", None), "max_tokens": getattr(a, "max_tokens", None),
                     "threads": getattr(a, "threads", None), "kv": getattr(a, "kv", None),
                     "attention": getattr(a, "attention", None)}
        return Session(Paths.resolve(getattr(a, "data_dir", None)), overrides)

    @property
    def paths(self) -> Paths:
        return self.session.paths

    @property
    def store(self):
        return self.session.store

    @property
    def model_path(self) -> Path:
        return self.session.model_path

    def backend(self):
        return self.session.backend()

    def print_json(self, obj) -> None:
        print(json.dumps(obj, indent=2, ensure_ascii=False))

    def sampling(self, greedy: bool = False, max_tokens: int | None = None):
        return self.session.sampling(greedy, max_tokens)

    def resolve_doc(self, ref: str) -> dict:
        matches = self.store.find_documents(ref)
        if not matches:
            raise CliError(f"no document matches '{ref}'; `ellm docs` lists them (use an id, title or file name)")
        if len(matches) > 1:
            listing = "; ".join(f"{d['id']}: {d['title']} ({d['path']})" for d in matches[:8])
            raise CliError(f"'{ref}' matches {len(matches)} documents, use an id: {listing}")
        doc = matches[0]
        if doc["status"] == "failed" and not doc["pages"]:
            raise CliError(f"{doc['path']}: this document failed to ingest: {doc['error']}")
        return doc


def err(*parts) -> None:
    print(*parts, file=sys.stderr, flush=True)


# ---- Commands ------------------------------------------------------------------


def cmd_gui(ctx: Context) -> int:
    from app.ui.app import run_gui

    return run_gui(ctx.paths, screenshot=ctx.args.screenshot)


def cmd_ingest(ctx: Context) -> int:
    from app.ingest import ingest

    count = ctx.session.token_counter()

    def show(event) -> None:
        if not ctx.json:
            print(f"[{event.index}/{event.total}] {event.line()}", flush=True)

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


def _ask_targets(ctx: Context) -> list[dict]:
    """The documents of --doc, --folder or --all (ingested ones; a folder with none is an error)."""
    a = ctx.args
    if a.doc:
        return [ctx.resolve_doc(ref) for ref in a.doc]
    if a.folder:
        folder = str(Path(a.folder).expanduser().resolve())
        docs = [d for d in ctx.store.documents(folder) if d["status"] == "ingested"]
        if not docs:
            raise CliError(f"{a.folder}: no ingested documents under this folder; `ellm ingest {a.folder}` first")
        return docs
    docs = [d for d in ctx.store.documents() if d["status"] == "ingested"]
    if not docs:
        raise CliError("no ingested documents; `ellm ingest FOLDER` first")
    return docs


def cmd_ask(ctx: Context) -> int:
    from app.ask import AskError
    from app.folder_ask import ask_many

    docs = _ask_targets(ctx)
    backend = ctx.backend()
    params = ctx.sampling(greedy=ctx.args.greedy, max_tokens=ctx.args.max_tokens)
    streaming = not ctx.json
    if streaming and ctx.args.verbose:
        err(f"engine {backend.name}, model {ctx.model_path.name}, context {backend.n_ctx} tokens")

    def show(piece: str) -> None:
        if streaming:
            sys.stdout.write(piece)
            sys.stdout.flush()

    try:
        answer = ask_many(ctx.store, backend, ctx.args.question, [d["id"] for d in docs], params,
                          model_name=ctx.model_path.name, on_text=show,
                          progress=lambda what: err(f"ask: {what}"))
    except (AskError, ValueError) as e:
        raise CliError(str(e)) from e
    if ctx.json:
        ctx.print_json(answer.as_dict())
        return 0
    print()
    if answer.plan.note:
        print(f"\nNote: {answer.plan.note}")
    if answer.extra.get("note"):
        print(f"\nNote: {answer.extra['note']}")
    titles = {d["id"]: d["title"] for d in docs}
    if answer.citations:
        print("\nSources:")
        for c in answer.citations:
            print(f"  - {titles.get(c['doc'], c['doc'])}, p. {c['page']}: \"{c['text'][:160]}\"")
    attended = answer.extra.get("attended") or []
    if attended:
        print("\nAttended (where the model looked while answering): " + ", ".join(
            f"{titles.get(a['doc'], a['doc'])} p. {a['page']} ({a['weight']:.0%})" for a in attended))
    t = answer.timings
    print(f"\n[{t['prompt_tokens']} prompt tokens, first token after {t['ttft_s']:.2f} s, "
          f"{t['decode_tok_s']:.1f} tokens/s, engine {answer.engine}]")
    return 0


def cmd_summarize(ctx: Context) -> int:
    from app.export import ExportError, export, format_for
    from app.summarize import SummaryError, summarize

    doc = ctx.resolve_doc(ctx.args.doc)
    fmt = None
    if ctx.args.out:
        try:
            fmt = format_for(ctx.args.out, ctx.args.format)
        except ExportError as e:
            raise CliError(str(e)) from e
    backend = ctx.backend()
    params = ctx.sampling(max_tokens=ctx.args.max_tokens)

    def progress(step: int, steps: int, what: str) -> None:
        if not ctx.json:
            err(f"[{step}/{steps}] {what}")

    try:
        s = summarize(ctx.store, backend, doc["id"], params, model_name=ctx.model_path.name, progress=progress)
    except SummaryError as e:
        raise CliError(str(e)) from e
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
    from app.models import list_models

    models = list_models(ctx.paths.models_dir)
    if ctx.json:
        ctx.print_json([m.as_dict() for m in models])
        return 0
    print(f"Models folder: {ctx.paths.models_dir} (drop .gguf files here)")
    for m in models:
        mark = " (default)" if m.default else ""
        if m.error:
            print(f"- {m.name}{mark}: unusable: {m.error}")
            continue
        print(f"- {m.name}{mark}\n    {m.path}\n    {m.architecture}, {m.parameters / 1e6:.0f}M parameters, "
              f"{m.quantization}, context {m.context_length}, {m.file_size / 2**20:.1f} MiB")
    return 0


def cmd_complete(ctx: Context) -> int:
    backend = ctx.backend()
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
    from app.doctor import format_doctor, run_doctor

    # Paths.resolve, not ctx.paths: checking a data directory must not create one.
    report = run_doctor(Paths.resolve(getattr(ctx.args, "data_dir", None)), repair=not ctx.args.no_repair)
    if ctx.json:
        ctx.print_json(report)
    else:
        print(format_doctor(report))
    return 0 if report["ok"] else 1


def cmd_bench(ctx: Context) -> int:
    a = ctx.args
    engines = comma_list(a.engines or ("ellm" if a.passkey else "ellm,llamacpp"))
    for e in engines:
        if e not in ("ellm", "llamacpp"):
            raise CliError(f"unknown engine '{e}' in --engines; choose from ellm, llamacpp")
    contexts_text = a.contexts or ("4096" if a.passkey else "512")
    try:
        contexts = tuple(int(c) for c in comma_list(contexts_text))
    except ValueError as e:
        raise CliError(f"--contexts takes numbers separated by commas, not '{contexts_text}'") from e
    if not contexts or min(contexts) < 1:
        raise CliError(f"--contexts takes positive numbers separated by commas, not '{contexts_text}'")
    kvs = kv_names(a.kv_list)
    attentions = comma_list(a.attention_list or ("dense,sparse" if a.passkey else "dense"))
    if not attentions:
        raise CliError("--attention takes dense, sparse or dense,sparse")
    for m in attentions:
        if m not in ("dense", "sparse"):
            raise CliError(f"unknown attention '{m}' in --attention; choose from dense, sparse")
    sparse = sparse_config(a)
    if a.needle_folder:
        return bench_needle_folder(ctx, kvs, attentions, sparse)
    if a.passkey:
        return bench_passkey(ctx, engines, contexts, kvs, attentions, sparse)
    from app.bench.speed import BenchConfig, format_table, plot, run_bench

    pins = {"on": (True,), "off": (False,), "on,off": (True, False), "off,on": (False, True)}.get(a.pin)
    if pins is None:
        raise CliError(f"--pin takes on, off or on,off, not '{a.pin}'")
    cfg = BenchConfig(model_path=ctx.model_path, engines=engines, contexts=contexts, decode_steps=a.steps,
                      threads=a.threads or 0, kvs=kvs, attentions=attentions, sparse=sparse, pinning=pins)
    try:
        report = run_bench(cfg, progress=lambda what: err(f"bench: {what}"))
    except ValueError as e:   # a backend refused a combination (its message names it)
        raise CliError(str(e)) from e
    print(format_table(report))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(report, indent=2))
        err(f"bench: results written to {a.json_file}")
    if a.plot:
        plot(report, a.plot)
        err(f"bench: chart written to {a.plot}")
    return 0


def bench_needle_folder(ctx: Context, kvs, attentions, sparse) -> int:
    from app.engine.attention.config import SparseConfig
    from app.needle import NeedleConfig, run_needle_folder

    a = ctx.args
    if a.needle_folder < 1 or a.tokens < 1024 * a.needle_folder:
        raise CliError("--needle-folder N --tokens T needs N >= 1 and at least 1024 tokens per document")
    mode = attentions[0] if attentions else "sparse"
    attention = sparse if (mode == "sparse" and sparse is not None) else SparseConfig(mode=mode)
    cfg = NeedleConfig(ctx.model_path, n_docs=a.needle_folder, tokens=a.tokens, trials=a.trials, kv=kvs[0],
                       attention=attention, threads=a.threads or 0, decode_steps=a.steps)
    report = run_needle_folder(cfg, progress=lambda what: err(f"needle: {what}")).as_dict()
    base, lc = report["baseline"], report["llamacpp"]
    print(f"{a.needle_folder} documents, {a.tokens} tokens, KV {kvs[0]}, {mode} attention: "
          f"found {report['accuracy']:.0%} of {a.trials} trials, time to first token {report['ttft_s_median']:.2f} s "
          f"(warm caches, median), decode {report['decode_tok_s']:.1f} tok/s, "
          f"{report['kv_read_bytes_per_token'] / 1e6:.1f} MB of KV read per token")
    print(f"reference: dense attention in one {base['tokens']}-token document found {base['accuracy']:.0%}; "
          f"llama.cpp dense decode at {lc.get('context', 0)} tokens: {lc.get('decode_tok_s', 0):.1f} tok/s")
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(report, indent=2))
        err(f"needle: results written to {a.json_file}")
    return 0


def bench_passkey(ctx: Context, engines, contexts, kvs, attentions, sparse) -> int:
    from app.passkey import PasskeyConfig, depth_detail, format_passkey, run_passkey

    a = ctx.args
    if a.plot:
        raise CliError("--plot draws the speed benchmark; --passkey writes a table (and --json FILE)")
    if a.trials < 1:
        raise CliError(f"--trials must be at least 1, not {a.trials}")
    cfg = PasskeyConfig(model_path=ctx.model_path, contexts=contexts, engines=engines, kvs=kvs,
                        attentions=attentions, sparse=sparse, trials=a.trials, threads=a.threads or 0)
    try:
        report = run_passkey(cfg, progress=lambda what: err(f"passkey: {what}"))
    except ValueError as e:
        raise CliError(str(e)) from e
    print(format_passkey(report))
    print()
    print("\n".join(depth_detail(report)))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(report, indent=2))
        err(f"passkey: results written to {a.json_file}")
    return 0


def comma_list(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


def kv_names(text: str) -> tuple[str, ...]:
    """The KV formats of a comma list, by their canonical names; an unknown one is an error."""
    from app.engine.kv.formats import KVSpec

    names = []
    for name in comma_list(text):
        try:
            names.append(KVSpec.parse(name).name)
        except ValueError as e:
            raise CliError(f"--kv: {e}") from e
    if not names:
        raise CliError("--kv takes KV formats separated by commas (f16, k8v8, k8v4, k4v4)")
    return tuple(dict.fromkeys(names))


def sparse_config(a):
    """The SparseConfig of --sinks --window --top-k --dense-layers --reselect --observe (engine defaults
    for those not given)."""
    from app.engine.attention.config import SPARSE_OPTIONS, SparseConfig

    given = {k: getattr(a, k) for k in SPARSE_OPTIONS
             if getattr(a, k) is not None}
    try:
        return SparseConfig(mode="sparse", **given)
    except ValueError as e:
        raise CliError(str(e)) from e


def cmd_kv_probe(ctx: Context) -> int:
    from app.bench.speed import PROBE_TOKENS, ProbeError, probe_document

    a = ctx.args
    limit = PROBE_TOKENS if a.tokens is None else a.tokens
    if limit < 2:
        raise CliError(f"--tokens must be at least 2, not {limit}")
    doc = ctx.resolve_doc(a.doc)
    s = ctx.session.settings
    model = ctx.model_path
    err(f"kv-probe: {a.probe_kv} against f16 on '{doc['title']}' with {model.name} (first {limit} tokens)")

    def progress(done: int, total: int) -> None:
        err(f"kv-probe: [{done}/{total}] tokens")

    try:
        result = probe_document(ctx.store, doc, model, a.probe_kv, limit, s.threads, s.numa, progress)
    except ProbeError as e:
        raise CliError(str(e)) from e
    if ctx.json:
        ctx.print_json(result.as_dict())
        return 0
    used = ("the whole document" if result.tokens < limit
            else f"the first {result.tokens} tokens (--tokens changes it)")
    print(f"KV {result.kv} against f16 on '{doc['title']}' ({doc['path']}), {result.tokens} tokens: {used}")
    print(f"  mean KL divergence   {result.mean_kl:.6f} nats")
    print(f"  max KL divergence    {result.max_kl:.6f} nats")
    print(f"  top-1 agreement      {result.top1_agreement:.2%}")
    return 0


def cmd_hw(ctx: Context) -> int:
    from app.hardware import format_report, hardware_report

    a = ctx.args
    root = getattr(a, "sysfs_root", None) or os.environ.get("ELLM_SYSFS_ROOT")
    if root and not Path(root).is_dir():
        raise CliError(f"{root}: no such sysfs folder (--sysfs-root / ELLM_SYSFS_ROOT)")
    s = ctx.session.settings
    docs = [d["tokens"] for d in ctx.store.documents() if d["status"] == "ingested"]
    report = hardware_report(sysfs_root=root,
                             model_path=ctx.model_path, kv=a.kv or s.kv, doc_tokens=docs,
                             threads=a.threads if a.threads is not None else s.threads,
                             numa_policy=a.numa or s.numa, probe_bandwidth=not a.no_probe, context=a.context)
    if ctx.json:
        ctx.print_json(report)
    else:
        print(format_report(report))
    return 0


# ---- Parser ----------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    # Global options are accepted before or after the subcommand.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR",
                        help="where the store, models folder and caches live (env ELLM_DATA_DIR)")
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="machine-readable output")
    common.add_argument("--sysfs-root", default=argparse.SUPPRESS, metavar="DIR",
                        help="read the CPU topology from another sysfs tree (env ELLM_SYSFS_ROOT)")

    def engine_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--engine", choices=ENGINES, default=None, help="inference engine (default: settings, auto)")
        p.add_argument("--model", default=None, help="GGUF file path or name in the models folder")
        p.add_argument("--ctx", type=int, default=None, metavar="N", help="context length in tokens")
        p.add_argument("--threads", type=int, default=None, metavar="N", help="threads (default: physical cores)")

    def kv_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--kv", choices=KV_SETTINGS, default=None,
                       help="KV cache precision for this call (default: settings, f16)")
        p.add_argument("--attention", choices=ATTENTION, default=None,
                       help="attention for this call (default: settings, dense); llama.cpp is always dense")

    parser = argparse.ArgumentParser(prog="ellm", parents=[common],
                                     description="Ask questions about whole documents with a local LLM.")
    parser.add_argument("--version", action="version", version=f"ellm {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser("gui", parents=[common], help="the desktop window (default)")
    p.add_argument("--screenshot", metavar="FILE", help="render the main window to a PNG and exit")
    p.set_defaults(func=cmd_gui)

    p = sub.add_parser("ingest", parents=[common], help="add files and folders to the library")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--model", default=None, help="model whose tokenizer counts tokens")
    p.set_defaults(func=cmd_ingest)

    p = sub.add_parser("docs", parents=[common], help="list the documents")
    p.set_defaults(func=cmd_docs)

    p = sub.add_parser("ask", parents=[common], help="ask a question about a document")
    p.add_argument("question")
    target = p.add_mutually_exclusive_group(required=True)
    target.add_argument("--doc", action="append", metavar="ID_OR_TITLE_OR_FILENAME",
                        help="the document (repeat for several)")
    target.add_argument("--folder", metavar="PATH", help="every ingested document under this folder")
    target.add_argument("--all", action="store_true", help="every ingested document")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.add_argument("--greedy", action="store_true", help="always pick the most likely token")
    kv_opts(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("summarize", parents=[common], help="summarize a whole document and export it")
    p.add_argument("doc", metavar="DOC")
    p.add_argument("--out", metavar="FILE")
    p.add_argument("--format", choices=("md", "pdf", "docx"), default=None,
                   help="export format (default: from the file's suffix)")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("models", parents=[common], help="list the models")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("complete", parents=[common], help="raw completion of a prompt (no chat template)")
    p.add_argument("prompt")
    engine_opts(p)
    p.add_argument("-n", type=int, default=64, metavar="N", help="tokens to generate")
    p.add_argument("--greedy", action="store_true")
    kv_opts(p)
    p.set_defaults(func=cmd_complete)

    p = sub.add_parser("hw", parents=[common], help="CPU topology, thread plan, bandwidth and KV budget")
    p.add_argument("--threads", type=int, default=None, metavar="N", help="threads to plan (0: physical cores)")
    p.add_argument("--numa", choices=("distribute", "isolate", "none"), default=None, help="NUMA policy")
    p.add_argument("--kv", default=None, help="KV cache precision for the calculator (f16, k8v8, k8v4, k4v4)")
    p.add_argument("--context", type=int, default=None, metavar="N", help="context length to check against free RAM")
    p.add_argument("--model", default=None, help="GGUF file path or name in the models folder")
    p.add_argument("--no-probe", action="store_true", help="skip the bandwidth probe")
    p.set_defaults(func=cmd_hw)

    p = sub.add_parser("doctor", parents=[common], help="check the data directory and repair what is safe to repair")
    p.add_argument("--no-repair", action="store_true", help="only check and report; change nothing")
    p.set_defaults(func=cmd_doctor)

    # bench has its own --json FILE, so it takes only --data-dir from the common options.
    data_only = argparse.ArgumentParser(add_help=False)
    data_only.add_argument("--data-dir", default=argparse.SUPPRESS, metavar="DIR")
    p = sub.add_parser("bench", parents=[data_only],
                       help="prefill/decode speed of both engines side by side; --passkey: long-context retrieval")
    p.add_argument("--engines", default=None,
                   help="comma-separated: ellm,llamacpp (default: both; with --passkey, ellm)")
    p.add_argument("--contexts", default=None,
                   help="comma-separated context lengths in tokens (default: 512; with --passkey, 4096)")
    p.add_argument("--kv", dest="kv_list", default="f16", metavar="SPEC[,SPEC...]",
                   help="KV cache formats: f16, k8v8, k8v4, k4v4 (llama.cpp: f16 always, plus those asked)")
    p.add_argument("--attention", dest="attention_list", default=None, metavar="dense,sparse",
                   help="attention modes of eLLM, llama.cpp is always dense (default: dense; with --passkey, both)")
    p.add_argument("--sinks", type=int, default=None, metavar="S", help="sparse: first tokens always attended")
    p.add_argument("--window", type=int, default=None, metavar="W", help="sparse: last tokens always attended")
    p.add_argument("--top-k", type=int, default=None, metavar="K", help="sparse: blocks retrieved per KV head")
    p.add_argument("--dense-layers", type=int, default=None, metavar="N",
                   help="sparse: leading layers that attend densely")
    p.add_argument("--reselect", type=int, default=None, metavar="N",
                   help="sparse: choose blocks every N tokens (when not chosen by the prompt's end)")
    p.add_argument("--observe", type=int, default=None, metavar="N",
                   help="sparse: the prompt's last N tokens choose the blocks decoding reads (0: key bounds)")
    p.add_argument("--steps", type=int, default=32, help="decode steps per measurement")
    p.add_argument("--pin", default="on", help="ellm threads pinned one per CPU: on, off, or on,off to compare")
    p.add_argument("--passkey", action="store_true",
                   help="pass key retrieval accuracy instead of speed (a number hidden in long prose)")
    p.add_argument("--trials", type=int, default=5, metavar="N",
                   help="--passkey: trials per context and mode; --needle-folder: trials")
    p.add_argument("--needle-folder", type=int, default=0, metavar="N",
                   help="one fact planted in one of N filler documents, asked across all of them")
    p.add_argument("--tokens", type=int, default=200_000, metavar="T",
                   help="--needle-folder: tokens of all the documents together")
    p.add_argument("--model", default=None, help="GGUF file path or name in the models folder")
    p.add_argument("--threads", type=int, default=None, metavar="N")
    p.add_argument("--json", dest="json_file", metavar="FILE", help="write the results as JSON to FILE")
    p.add_argument("--plot", metavar="FILE", help="write a PNG chart to FILE")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("kv-probe", parents=[common],
                       help="how much a smaller KV cache changes the model's predictions on a document")
    p.add_argument("--doc", required=True, metavar="ID_OR_TITLE_OR_FILENAME", help="the document")
    p.add_argument("--kv", dest="probe_kv", required=True, metavar="SPEC",
                   help="KV format compared with f16: k8v8, k8v4, k4v4 (or f16)")
    p.add_argument("--tokens", type=int, default=None, metavar="N",
                   help="probe the document's first N tokens (default 4096)")
    p.add_argument("--model", default=None, help="GGUF file path or name in the models folder")
    p.set_defaults(func=cmd_kv_probe)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "command", None):
        args = parser.parse_args([*(argv if argv is not None else sys.argv[1:]), "gui"])
    ctx = Context(args)
    from app.session import SessionError

    try:
        return int(args.func(ctx) or 0)
    except (CliError, SessionError) as e:
        err(f"ellm: error: {e}")
        return 1
    except KeyboardInterrupt:
        err("ellm: interrupted")
        return 130
    except BrokenPipeError:
        os._exit(0)
