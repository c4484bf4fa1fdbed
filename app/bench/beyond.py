"""``ellm bench --accuracy-at T``: accuracy beyond the trained window, in the same run as speed.

A long-context claim has three parts that only mean something together: decode and prefill
speed at long contexts (app/bench/speed.py), and that the fast mode still finds one fact when
the context is past the model's trained window. After the speed rows this runs, with the
sparse attention the speed rows used:

- the pass key (app/bench/passkey.py) at T tokens with sparse attention, and the same trials
  with dense f16 attention at ``baseline_tokens`` (inside the window): the reference;
- the needle across a folder (app/bench/needle.py): one pass key planted in one of ``n_docs``
  documents totalling T tokens, their caches laid side by side, sparse attention. Its own
  dense reference would be a pass key prompt at ``baseline_tokens`` again, so the pass key's
  dense row serves both (the same wording: HEADER, NEEDLE, QUESTION).

``as_accurate`` says whether sparse at T found at least as many keys as dense at the baseline,
in each test.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.engine.attention.config import SparseConfig

NEEDLE_DOCS = 8   # the documents of the folder test (as `ellm eval --folder-trials` lays out)


@dataclass(frozen=True)
class BeyondConfig:
    model_path: Path
    tokens: int                  # T: the long context, usually past the trained window
    baseline_tokens: int         # dense attention's reference context, inside it
    trials: int
    kv: str = "f16"
    sparse: SparseConfig | None = None   # the speed rows' sparse options (None: the engine's defaults)
    threads: int = 0
    n_docs: int = NEEDLE_DOCS
    decode_steps: int = 16       # the needle's decode speed at T


def run_beyond(cfg: BeyondConfig, progress: Callable[[str], None] = lambda what: None) -> dict:
    """{"tokens", "baseline_tokens", "trained_context", "trials", "passkey": {"sparse", "dense"},
    "needle", "as_accurate": {"passkey", "needle"}}."""
    from app.bench.needle import NeedleConfig, run_needle_folder
    from app.bench.passkey import PasskeyConfig, run_passkey
    from app.engine.attention.config import SparseConfig
    from app.engine.header.gguf_file import scan_gguf

    sparse = cfg.sparse or SparseConfig()
    said = lambda part: (lambda what: progress(f"{part}: {what}"))  # noqa: E731

    def passkey(context: int, kv: str, attention: str) -> dict:
        pk = PasskeyConfig(model_path=cfg.model_path, contexts=(context,), kvs=(kv,), attentions=(attention,),
                           sparse=sparse, trials=cfg.trials, threads=cfg.threads)
        report = run_passkey(pk, progress=said(f"pass key, {attention} at {context}"))
        if not report["results"]:   # this model or engine cannot run it: the reason, not an empty row
            raise ValueError("; ".join(s["reason"] for s in report.get("skipped", ())))
        return report["results"][0]

    long_key = passkey(cfg.tokens, cfg.kv, "sparse")
    short_key = passkey(cfg.baseline_tokens, "f16", "dense")
    needle = run_needle_folder(
        NeedleConfig(cfg.model_path, n_docs=cfg.n_docs, tokens=cfg.tokens, trials=cfg.trials, kv=cfg.kv,
                     attention=sparse.in_mode("sparse"), threads=cfg.threads, decode_steps=cfg.decode_steps,
                     baseline_tokens=0, llamacpp_context=0),
        progress=said(f"needle across {cfg.n_docs} documents at {cfg.tokens}")).as_dict()
    needle["baseline"] = {"tokens": cfg.baseline_tokens, "attention": "dense", "kv": "f16",
                          "accuracy": short_key["accuracy"], "from": "passkey"}
    trained = scan_gguf(cfg.model_path).context_length
    # counts, not accuracies (the pass key rounds its own): every test ran cfg.trials trials
    found = sum(t["found"] for t in needle["trials"])
    return {"tokens": cfg.tokens, "baseline_tokens": cfg.baseline_tokens, "trained_context": trained,
            "trials": cfg.trials, "passkey": {"sparse": long_key, "dense": short_key}, "needle": needle,
            "as_accurate": {"passkey": long_key["correct"] >= short_key["correct"],
                            "needle": found >= short_key["correct"]}}


def format_beyond(report: dict) -> str:
    """The accuracy lines printed under the speed table."""
    pk, needle = report["passkey"], report["needle"]
    long_key, short_key = pk["sparse"], pk["dense"]
    yes = {True: "yes", False: "NO"}
    return "\n".join([
        f"Accuracy at {report['tokens']} tokens ({_times(report['tokens'], report['trained_context'])} the "
        f"{report['trained_context']} the model was trained for), {report['trials']} trials each:",
        f"  pass key, sparse {long_key['kv']} at {report['tokens']}: found {long_key['correct']}/{long_key['trials']}; "
        f"dense f16 at {report['baseline_tokens']}: found {short_key['correct']}/{short_key['trials']} "
        f"-> as accurate: {yes[report['as_accurate']['passkey']]}",
        f"  needle across {needle['config']['n_docs']} documents, sparse {needle['config']['kv']} at "
        f"{report['tokens']}: found {sum(t['found'] for t in needle['trials'])}/{len(needle['trials'])} "
        f"(time to first token {needle['ttft_s_median']:.2f} s median, decode {needle['decode_tok_s']:.1f} tok/s, "
        f"{needle['kv_read_bytes_per_token'] / 1e6:.1f} MB of KV a token); dense f16 at "
        f"{report['baseline_tokens']} (the pass key's): {short_key['accuracy']:.0%} "
        f"-> as accurate: {yes[report['as_accurate']['needle']]}",
    ])


def _times(tokens: int, trained: int) -> str:
    return f"{tokens / trained:.1f}x" if trained else "? x"
