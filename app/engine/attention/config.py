"""What sparse attention is asked to do: the options of SparseConfig and the attention modes.

Light on purpose (no numba): the settings, the command line and the benchmarks read it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields, replace

MODES = ("dense", "sparse", "sparse-decode")
# dense: every token reads every earlier one. sparse: the prompt's chunks and each decoded token
# read the sinks, the window and the top-K blocks. sparse-decode: the prompt is read densely
# while it lies inside the model's trained context (its cache is dense attention's, token for
# token) and only the answer's tokens read the blocks the question voted for; beyond the trained
# context the prompt is read as in "sparse" (dense attention would meet positions never trained;
# the same cache file) and the answer reads ANSWER_K_BEYOND voted blocks (``for_context``).

# K per mode. sparse-decode reads 64 blocks (an answer token reads 4,480 cached tokens): on two
# real manuals its answers were right as often as dense attention's with 64, less often with 16
# (docs/benchmarks.md). sparse keeps 16, which its speed and pass key figures beyond the
# trained context were measured with.
TOP_K = {"dense": 16, "sparse": 16, "sparse-decode": 64}
# The answer's K of "sparse-decode" beyond the trained context, whose prompt reads sparse's 16:
# on two manuals past Qwen2.5-1.5B's trained 32K the right answer's words were likelier read
# from 64 voted blocks than from 16 (docs/benchmarks.md).
ANSWER_K_BEYOND = 64


@dataclass(frozen=True)
class SparseConfig:
    """Sparse attention options; defaults chosen by measurement (docs/benchmarks.md)."""

    mode: str = "sparse"      # "dense": every block, true positions
    sinks: int = 64           # S: first tokens always attended
    window: int = 256         # W: last tokens always attended
    top_k: int | None = None  # K: retrieved blocks per KV head (None: the mode's, TOP_K)
    dense_layers: int = 0     # leading layers attending densely (inside the trained context)
    reselect: int = 1         # decode: choose blocks every this many tokens
    observe: int = 32         # last prompt tokens whose attention chooses decode's blocks (0: bounds)
    answer_k: int | None = None   # K of single queries (the answer's tokens) where not K (for_context)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention must be one of {', '.join(MODES)}, not {self.mode!r}")
        if self.answer_k is not None and self.answer_k < 0:
            raise ValueError("sparse attention: answer_k must be >= 0")
        for name in ("sinks", "window", "k", "dense_layers", "observe"):
            if getattr(self, name) < 0:
                raise ValueError(f"sparse attention: {'top_k' if name == 'k' else name} must be >= 0")
        if self.reselect < 1:
            raise ValueError("sparse attention: reselect must be >= 1")

    @property
    def k(self) -> int:
        """K, the blocks retrieved per KV head: ``top_k`` when given, else the mode's."""
        return TOP_K[self.mode] if self.top_k is None else self.top_k

    def k_for(self, n_tok: int) -> int:
        """K of a query chunk of ``n_tok`` tokens: ``answer_k`` for a single query where set."""
        return self.answer_k if n_tok == 1 and self.answer_k is not None else self.k

    @property
    def sparse(self) -> bool:
        """Some steps read only the chosen blocks (the modes but "dense")."""
        return self.mode != "dense"

    @property
    def dense_prompt(self) -> bool:
        """Prompt chunks inside the trained context attend densely ("sparse-decode")."""
        return self.mode == "sparse-decode"

    def for_context(self, n_ctx: int, trained: int) -> SparseConfig:
        """What attention runs with in a context of ``n_ctx`` tokens: these options, but
        "sparse-decode" beyond the ``trained`` context reads its prompt as "sparse" does (K = 16,
        or the K given) and its answer from ANSWER_K_BEYOND voted blocks (or the K given)."""
        if self.mode != "sparse-decode" or n_ctx <= trained:
            return self
        return replace(self, mode="sparse", answer_k=ANSWER_K_BEYOND if self.top_k is None else self.top_k)

    def prompt_config(self, n_ctx: int, trained: int) -> SparseConfig:
        """The attention a context of ``n_ctx`` tokens reads its prompt with, which is what its
        persisted prefixes depend on. Dense reading ignores the sparse options, and
        "sparse-decode" reads as "dense" does within the trained context and as "sparse" beyond
        it: one cache file each."""
        c = self.for_context(n_ctx, trained)
        dense = c.mode == "dense" or (c.dense_prompt and n_ctx <= trained)
        return SparseConfig(mode="dense") if dense else replace(c, answer_k=None)

    def in_mode(self, mode: str) -> SparseConfig:
        """These options in ``mode``; dense reads no sparse option, so it gets none of them (and
        its persisted caches one signature)."""
        return SparseConfig(mode="dense") if mode == "dense" else replace(self, mode=mode)

    def options(self) -> dict:
        """The tunable options (every field but the mode), as reports list them."""
        return {name: self.k if name == "top_k" else getattr(self, name) for name in SPARSE_OPTIONS}

    def window_blocks(self, block: int) -> int:
        """Blocks the local window spans at most (it need not start on a block boundary)."""
        return -(-self.window // block) + 1

    def budget_tokens(self, block: int) -> int:
        """Tokens a decode step attends at most (whole blocks)."""
        return (-(-self.sinks // block) + self.k_for(1) + self.window_blocks(block)) * block


# what --sinks ... set (answer_k follows from the mode: for_context)
SPARSE_OPTIONS = tuple(f.name for f in fields(SparseConfig) if f.name not in ("mode", "answer_k"))
