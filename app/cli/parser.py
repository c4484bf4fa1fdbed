"""The ``ellm`` command line: subcommands, options and their help. Global options are accepted
before or after the subcommand."""
from __future__ import annotations

import argparse

from app import __version__
from app.cli.batch_command import cmd_batch
from app.cli.chat_commands import cmd_chat, cmd_serve, cmd_threads
from app.cli.bench_commands import cmd_bench, cmd_eval, cmd_kv_probe
from app.cli.commands import (cmd_ask, cmd_cache, cmd_complete, cmd_docs, cmd_doctor, cmd_gui, cmd_hw, cmd_ingest, cmd_models,
                              cmd_read, cmd_summarize)
from app.settings import ATTENTION, ENGINES, KV_SETTINGS


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
                       help="KV cache precision for this call (default: settings, auto)")
        p.add_argument("--attention", choices=ATTENTION, default=None,
                       help="attention for this call (default: settings, auto); llama.cpp is always dense")

    def target_opts(p: argparse.ArgumentParser, required: bool = True) -> None:
        """What is asked about: documents, a folder or everything (qa/targets.py resolves them)."""
        target = p.add_mutually_exclusive_group(required=required)
        target.add_argument("--doc", action="append", metavar="ID_OR_TITLE_OR_FILENAME",
                            help="the document (repeat for several)")
        target.add_argument("--folder", metavar="PATH", help="every ingested document under this folder")
        target.add_argument("--all", action="store_true", help="every ingested document")

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
    target_opts(p, required=False)
    p.add_argument("--thread", type=int, default=None, metavar="ID",
                   help="add the question as the next turn of this conversation (`ellm threads` lists them)")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.add_argument("--greedy", action="store_true", help="always pick the most likely token")
    p.add_argument("--whole", action="store_true",
                   help="answer from the whole documents, reading them first if they are not read yet "
                        "(default: a document not read yet is answered at once from its best passages)")
    kv_opts(p)
    p.add_argument("-v", "--verbose", action="store_true")
    p.set_defaults(func=cmd_ask)

    p = sub.add_parser("chat", parents=[common], help="a conversation about documents at a line-editing prompt")
    target_opts(p, required=False)
    p.add_argument("--thread", type=int, default=None, metavar="ID", help="continue this conversation")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.add_argument("--greedy", action="store_true", help="always pick the most likely token")
    kv_opts(p)
    p.set_defaults(func=cmd_chat)

    p = sub.add_parser("threads", parents=[common], help="list, search, show, rename or delete conversations")
    p.add_argument("--search", metavar="TEXT", help="only threads whose title or turns match TEXT")
    p.add_argument("--show", type=int, metavar="ID", help="print one thread's turns")
    p.add_argument("--rename", nargs=2, metavar=("ID", "TITLE"), help="give a thread another title")
    p.add_argument("--delete", type=int, metavar="ID", help="delete a thread and its turns")
    p.set_defaults(func=cmd_threads)

    p = sub.add_parser("serve", parents=[common], help="a local OpenAI-compatible API over the documents")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; any other needs "
                                                       "--api-key)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080; 0: any free port)")
    p.add_argument("--api-key", default=None, metavar="KEY", help="every request must send Authorization: Bearer KEY")
    p.add_argument("--cors", action="append", metavar="ORIGIN", help="allow browser pages from ORIGIN (repeatable)")
    engine_opts(p)
    kv_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N", help="answer length when a request gives none")
    p.set_defaults(func=cmd_serve)

    p = sub.add_parser("read", parents=[common], help="read documents into their KV caches ahead of the questions")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("docs", nargs="*", default=[], metavar="DOC", help="documents (id, title or file name)")
    which.add_argument("--all", action="store_true", help="every ingested document")
    engine_opts(p)
    kv_opts(p)
    p.set_defaults(func=cmd_read)

    p = sub.add_parser("cache", parents=[common],
                       help="document caches on disk against their budget; set the budget, clear caches")
    p.add_argument("--budget", default=None, metavar="SIZE",
                   help="store the disk budget of document caches (bytes, or with K/M/G/T; \"auto\": a share "
                        "of the disk) and delete the least recently used until they fit")
    clear = p.add_mutually_exclusive_group()
    clear.add_argument("--clear", nargs="+", default=None, metavar="DOC",
                       help="delete these documents' caches (id, title or file name)")
    clear.add_argument("--all", action="store_true", help="delete every document cache")
    p.set_defaults(func=cmd_cache)

    p = sub.add_parser("batch", parents=[common],
                       help="ask many documents many questions on Ray workers; resumable, results in the store")
    target_opts(p)
    tasks = p.add_mutually_exclusive_group(required=True)
    tasks.add_argument("--ask", nargs="+", metavar="QUESTION", help="the questions asked of every document")
    tasks.add_argument("--questions", metavar="FILE", help="a file of questions, one a line")
    tasks.add_argument("--summarize", action="store_true", help="summarize every document")
    p.add_argument("--out", required=True, metavar="FILE.csv|.jsonl|.md",
                   help="the batch's results (all of them, earlier runs' too), format by suffix")
    p.add_argument("--ray-address", default=None, metavar="ADDR",
                   help="a Ray cluster (HOST:PORT of `ray start --head`); default: a local runtime")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="workers, each with its own engine (default: cores / threads here, CPUs / threads on a "
                        "cluster)")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.add_argument("--greedy", action="store_true", help="always pick the most likely token")
    kv_opts(p)
    p.add_argument("-v", "--verbose", action="store_true", help="the workers' logs too")
    p.set_defaults(func=cmd_batch)

    p = sub.add_parser("summarize", parents=[common], help="summarize a whole document and export it")
    p.add_argument("doc", metavar="DOC")
    p.add_argument("--out", metavar="FILE")
    p.add_argument("--format", choices=("md", "pdf", "docx"), default=None,
                   help="export format (default: from the file's suffix)")
    p.add_argument("--again", action="store_true",
                   help="summarize anew even if a summary with the same model and settings is stored")
    engine_opts(p)
    p.add_argument("--max-tokens", type=int, default=None, metavar="N")
    p.set_defaults(func=cmd_summarize)

    p = sub.add_parser("models", parents=[common],
                       help="list the models; `available` lists the catalogue, `install NAME` installs one")
    p.add_argument("action", nargs="?", choices=("available", "install"),
                   help="available: the installable models; install: download and verify one")
    p.add_argument("name", nargs="?", metavar="NAME", help="install: the model's name (see `ellm models available`)")
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
    p.add_argument("--no-probe", action="store_true", help="skip the read-bandwidth and weight-streaming probes")
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
                   help="comma-separated context lengths in tokens (default: inside the model's trained window, "
                        "4096, half the window and its last round figure: 4096,16384,30000 for a 32K model; "
                        "with --passkey, 4096)")
    p.add_argument("--kv", dest="kv_list", default="f16", metavar="SPEC[,SPEC...]",
                   help="KV cache formats: f16, k8v8, k8v4, k4v4 (llama.cpp: f16 always, plus those asked)")
    p.add_argument("--attention", dest="attention_list", default=None, metavar="dense,sparse",
                   help="attention modes of eLLM, llama.cpp is always dense (default: auto, what a question about "
                        "a document of that many tokens runs; with --passkey, dense,sparse)")
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
    p.add_argument("--pin", default="on", help="both engines' threads pinned one per CPU: on, off, or on,off to compare")
    p.add_argument("--llamacpp-best", action="store_true",
                   help="llama.cpp with f16 and q8_0 KV, flash attention on and off; ratios also against its fastest")
    p.add_argument("--llamacpp-kv", default=None, metavar="LIST",
                   help="--llamacpp-best: the KV caches llama.cpp runs: f16, k8v8 (its q8_0) or both")
    p.add_argument("--no-states", action="store_true",
                   help="prefill every context anew and keep nothing (default: prefilled contexts are kept in "
                        "the data directory's bench-states folder and loaded by later runs)")
    p.add_argument("--passkey", action="store_true",
                   help="pass key retrieval accuracy instead of speed (a number hidden in long prose)")
    p.add_argument("--trials", type=int, default=5, metavar="N",
                   help="--passkey: trials per context and mode; --needle-folder, --accuracy-at: trials")
    p.add_argument("--needle-folder", type=int, default=0, metavar="N",
                   help="one fact planted in one of N filler documents, asked across all of them")
    p.add_argument("--tokens", type=int, default=200_000, metavar="T",
                   help="--needle-folder: tokens of all the documents together")
    p.add_argument("--baseline-tokens", type=int, default=4096, metavar="T",
                   help="--needle-folder, --accuracy-at: tokens of the single document dense attention is "
                        "asked about beside it (default 4096)")
    p.add_argument("--accuracy-at", type=int, default=0, metavar="T",
                   help="after the speed rows, in the same run: pass key and needle-across-a-folder accuracy "
                        "at T tokens with sparse attention, beside dense f16 at --baseline-tokens (--trials each)")
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

    p = sub.add_parser("eval", parents=[data_only],
                       help="answer quality on a question set: right, cited, whole document, seconds, per mode")
    p.add_argument("questions", metavar="QUESTIONS.json", help="the question set (tests/data/eval/questions.json)")
    p.add_argument("--modes", default=None, metavar="MODE[,MODE...]",
                   help="comma-separated modes (docs/benchmarks.md, \"Measuring answer quality\"; default: the "
                        "comparison of its tables)")
    p.add_argument("--model", default=None, help="GGUF file path or name in the models folder (default: the default model)")
    p.add_argument("--engine", choices=ENGINES, default=None,
                   help="engine for the modes that do not choose one (default: settings, auto)")
    p.add_argument("--threads", type=int, default=None, metavar="N")
    p.add_argument("--doc", action="append", metavar="NAME", help="only this document (file name; repeat for several)")
    p.add_argument("--half", default=None, metavar="HALF",
                   help="only the documents of this half of the set: tuning or held-out (default: both)")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="only the first N questions of each document")
    p.add_argument("--max-tokens", type=int, default=None, metavar="N", help="answer tokens (default 160)")
    p.add_argument("--docs-dir", default=None, metavar="DIR",
                   help="where the documents are (default ~/.cache/ellm-eval; python -m app.bench.eval_docs fetches them)")
    p.add_argument("--folder-trials", type=int, default=0, metavar="N",
                   help="instead of the questions: N trials of a fact planted in one of eight documents cut from "
                        "the set's documents, asked across all of them")
    p.add_argument("--folder-docs", type=int, default=8, metavar="N", help="--folder-trials: documents (default 8)")
    p.add_argument("--folder-doc-tokens", type=int, default=3000, metavar="T",
                   help="--folder-trials: tokens per document (default 3000)")
    p.add_argument("--json", dest="json_file", metavar="FILE", help="write every row and the summary as JSON to FILE")
    p.set_defaults(func=cmd_eval)
    return parser
