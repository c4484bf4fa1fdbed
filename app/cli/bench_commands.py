"""The measurement subcommands: ``ellm bench`` (speed, ``--passkey``, ``--needle-folder``) and
``ellm kv-probe``. They import app.bench only when run."""
from __future__ import annotations

import json
from pathlib import Path

from app.cli.context import CliError, Context, err
from app.engine.attention.config import MODES


def cmd_bench(ctx: Context) -> int:
    a = ctx.args
    engines = comma_list(a.engines or ("ellm" if a.passkey else "ellm,llamacpp"))
    for e in engines:
        if e not in ("ellm", "llamacpp"):
            raise CliError(f"unknown engine '{e}' in --engines; choose from ellm, llamacpp")
    speed = not (a.needle_folder or a.passkey)
    contexts_text = a.contexts or ("4096" if a.passkey else "512")   # --needle-folder sizes its own
    if speed and not a.contexts:
        from app.bench.speed import default_contexts

        contexts_text = ",".join(str(c) for c in default_contexts(ctx.model_path, a.steps))
    try:
        contexts = tuple(int(c) for c in comma_list(contexts_text))
    except ValueError as e:
        raise CliError(f"--contexts takes numbers separated by commas, not '{contexts_text}'") from e
    if not contexts or min(contexts) < 1:
        raise CliError(f"--contexts takes positive numbers separated by commas, not '{contexts_text}'")
    kvs = kv_names(a.kv_list)
    attentions = comma_list(a.attention_list or ("dense,sparse" if a.passkey else
                                                 "sparse" if a.needle_folder else "auto"))
    choices = (*MODES, "auto") if speed else MODES
    if not attentions:
        raise CliError(f"--attention takes {', '.join(choices)} separated by commas")
    for m in attentions:
        if m not in choices:
            raise CliError(f"unknown attention '{m}' in --attention; choose from {', '.join(choices)}")
    sparse = sparse_config(a)
    if a.accuracy_at and not speed:
        raise CliError("--accuracy-at adds accuracy to a speed run; --passkey and --needle-folder measure it alone")
    if (not speed or a.accuracy_at) and a.trials < 1:   # --needle-folder, --passkey, --accuracy-at
        raise CliError(f"--trials must be at least 1, not {a.trials}")
    if a.accuracy_at:
        from app.bench.beyond import NEEDLE_DOCS

        if a.accuracy_at < 1024 * NEEDLE_DOCS:
            raise CliError(f"--accuracy-at T needs at least {1024 * NEEDLE_DOCS} tokens "
                           f"({NEEDLE_DOCS} documents of 1024), not {a.accuracy_at}")
    if (a.needle_folder or a.accuracy_at) and a.baseline_tokens < 256:
        raise CliError("--baseline-tokens T needs at least 256 tokens (the dense reference's document)")
    if a.needle_folder:
        return bench_needle_folder(ctx, kvs, attentions, sparse)
    if a.passkey:
        return bench_passkey(ctx, engines, contexts, kvs, attentions, sparse)
    from app.bench.speed import LLAMACPP_BEST_KVS, BenchConfig, format_table, plot, run_bench

    pins = {"on": (True,), "off": (False,), "on,off": (True, False), "off,on": (False, True)}.get(a.pin)
    if pins is None:
        raise CliError(f"--pin takes on, off or on,off, not '{a.pin}'")
    states = None if a.no_states else ctx.paths.cache_dir / "bench-states"
    if a.llamacpp_kv is not None and not a.llamacpp_best:
        raise CliError("--llamacpp-kv chooses the caches of --llamacpp-best; add --llamacpp-best")
    llama_kvs = comma_list(a.llamacpp_kv or ",".join(LLAMACPP_BEST_KVS))
    for kv in llama_kvs:
        if kv not in LLAMACPP_BEST_KVS:
            raise CliError(f"unknown KV cache '{kv}' in --llamacpp-kv; choose from {', '.join(LLAMACPP_BEST_KVS)}")
    if not llama_kvs:
        raise CliError(f"--llamacpp-kv takes {', '.join(LLAMACPP_BEST_KVS)} separated by commas")
    cfg = BenchConfig(model_path=ctx.model_path, engines=engines, contexts=contexts, decode_steps=a.steps,
                      threads=a.threads or 0, kvs=kvs, attentions=attentions, sparse=sparse, pinning=pins,
                      llamacpp_best=a.llamacpp_best, llamacpp_kvs=tuple(llama_kvs), states_dir=states)
    try:
        report = run_bench(cfg, progress=lambda what: err(f"bench: {what}"))
    except ValueError as e:   # a backend refused a combination (its message names it)
        raise CliError(str(e)) from e
    print(format_table(report))
    if a.accuracy_at:
        from app.bench.beyond import BeyondConfig, format_beyond, run_beyond

        if a.json_file:   # the speed rows are kept if the long accuracy part fails or is stopped
            Path(a.json_file).write_text(json.dumps(report, indent=2))
        beyond = BeyondConfig(ctx.model_path, tokens=a.accuracy_at, baseline_tokens=a.baseline_tokens,
                              trials=a.trials, kv=kvs[0], sparse=sparse, threads=a.threads or 0)
        try:
            report["beyond"] = run_beyond(beyond, progress=lambda what: err(f"bench: {what}"))
        except ValueError as e:
            raise CliError(str(e)) from e
        print()
        print(format_beyond(report["beyond"]))
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(report, indent=2))
        err(f"bench: results written to {a.json_file}")
    if a.plot:
        plot(report, a.plot)
        err(f"bench: chart written to {a.plot}")
    return 0



def bench_needle_folder(ctx: Context, kvs, attentions, sparse) -> int:
    from app.engine.attention.config import SparseConfig
    from app.bench.needle import NeedleConfig, run_needle_folder

    a = ctx.args
    if a.needle_folder < 1 or a.tokens < 1024 * a.needle_folder:
        raise CliError("--needle-folder N --tokens T needs N >= 1 and at least 1024 tokens per document")
    mode = attentions[0]
    attention = (sparse or SparseConfig()).in_mode(mode)
    cfg = NeedleConfig(ctx.model_path, n_docs=a.needle_folder, tokens=a.tokens, trials=a.trials, kv=kvs[0],
                       attention=attention, threads=a.threads or 0, decode_steps=a.steps,
                       baseline_tokens=a.baseline_tokens)
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
    from app.bench.passkey import PasskeyConfig, depth_detail, format_passkey, run_passkey

    a = ctx.args
    if a.plot:
        raise CliError("--plot draws the speed benchmark; --passkey writes a table (and --json FILE)")
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
    from app.runtime.kv_probe import PROBE_TOKENS, ProbeError, probe_document

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


def cmd_eval(ctx: Context) -> int:
    """``ellm eval QUESTIONS.json``: the question set asked in each mode, scored side by side."""
    import shutil
    import tempfile

    from app.bench.eval_docs import EvalDocError, cache_dir, document_files
    from app.bench.eval_folder import FolderTrials, format_folder_table, run_folder_trials
    from app.bench.eval_run import (BASELINES, DEFAULT_MODES, FOLDER_MODES, MODE_NAMES, EvalConfig, find_mode,
                                    format_table, run_eval)
    from app.bench.eval_set import QuestionSetError, load_question_set
    from app.qa.answer import AskError
    from app.runtime.model_files import ModelError, resolve_model
    from app.settings import Paths

    a = ctx.args
    try:
        default = FOLDER_MODES if a.folder_trials else DEFAULT_MODES
        modes = tuple(find_mode(m) for m in comma_list(a.modes or ",".join(default)))
    except ValueError as e:
        raise CliError(f"--modes: {e}") from e
    if not modes:
        raise CliError(f"--modes takes {', '.join(MODE_NAMES)} separated by commas")
    baselines = [m.name for m in modes if m.source in BASELINES]
    if a.folder_trials and baselines:
        raise CliError(f"--folder-trials asks across a folder through the answer service: {', '.join(baselines)} "
                       f"answer one document only")
    if a.limit is not None and a.limit < 1:
        raise CliError(f"--limit must be at least 1, not {a.limit}")
    if a.folder_trials < 0 or a.folder_docs < 2 or a.folder_doc_tokens < 256:
        raise CliError("--folder-trials takes a count, --folder-docs at least 2, --folder-doc-tokens at least 256")
    try:
        questions = load_question_set(a.questions).half(a.half).only(a.doc).limited(a.limit)
        files = document_files(questions, cache_dir(a.docs_dir))
        # The model is the product's choice (its data directory's default) unless --model says.
        model = resolve_model(a.model or "", Paths.resolve(None).models_dir)
    except (QuestionSetError, EvalDocError, ModelError) as e:
        raise CliError(str(e)) from e
    given = getattr(a, "data_dir", None)
    data_dir = Path(given).expanduser().absolute() if given else Path(tempfile.mkdtemp(prefix="ellm-eval-"))
    cfg = EvalConfig(data_dir=data_dir, model=model, modes=modes, max_tokens=a.max_tokens or 160,
                     base={"engine": a.engine, "threads": a.threads})
    progress = lambda what: err(f"eval: {what}")  # noqa: E731
    try:
        if a.folder_trials:
            spec = FolderTrials(a.folder_trials, a.folder_docs, a.folder_doc_tokens)
            err(f"eval: {spec.trials} folder trials ({spec.n_docs} documents) x {len(modes)} modes with "
                f"{model.name}, data in {data_dir}")
            report = run_folder_trials(cfg, spec, files, progress)
            table = format_folder_table(report)
        else:
            err(f"eval: {questions.n_questions} questions x {len(modes)} modes with {model.name}, data in {data_dir}")
            report = run_eval(cfg, questions, files, progress)
            table = format_table(report)
    except (AskError, ValueError) as e:
        raise CliError(str(e)) from e
    finally:
        if not given:
            shutil.rmtree(data_dir, ignore_errors=True)
    print(table)
    if a.json_file:
        Path(a.json_file).write_text(json.dumps(report.as_dict(), indent=2, ensure_ascii=False))
        err(f"eval: results written to {a.json_file}")
    return 0
