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
# context the prompt is read as in "sparse" (dense attention would meet positions never trained).

# K per mode. sparse-decode reads 64 blocks (an answer token reads 4,480 cached tokens): on two
# real manuals its answers were right as often as dense attention's with 64, less often with 16
# (README, "Sparse attention"). sparse keeps 16, which its speed and pass key figures beyond the
# trained context were measured with.
TOP_K = {"dense": 16, "sparse": 16, "sparse-decode": 64}


@dataclass(frozen=True)
class SparseConfig:
    """Sparse attention options; defaults chosen by measurement (README, "Sparse attention")."""

    mode: str = "sparse"      # "dense": every block, true positions
    sinks: int = 64           # S: first tokens always attended
    window: int = 256         # W: last tokens always attended
    top_k: int | None = None  # K: retrieved blocks per KV head (None: the mode's, TOP_K)
    dense_layers: int = 0     # leading layers attending densely (inside the trained context)
    reselect: int = 1         # decode: choose blocks every this many tokens
    observe: int = 32         # last prompt tokens whose attention chooses decode's blocks (0: bounds)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name in ("sinks", "window", "k", "dense_layers", "observe"):
            if getattr(self, name) < 0:
                raise ValueError(f"sparse attention: {'top_k' if name == 'k' else name} must be >= 0")
        if self.reselect < 1:
            raise ValueError("sparse attention: reselect must be >= 1")

    @property
    def k(self) -> int:
        """K, the blocks retrieved per KV head: ``top_k`` when given, else the mode's."""
        return TOP_K[self.mode] if self.top_k is None else self.top_k

    @property
    def sparse(self) -> bool:
        """Some steps read only the chosen blocks (the modes but "dense")."""
        return self.mode != "dense"

    @property
    def dense_prompt(self) -> bool:
        """Prompt chunks inside the trained context attend densely ("sparse-decode")."""
        return self.mode == "sparse-decode"

    def prompt_config(self, n_ctx: int, trained: int) -> SparseConfig:
        """The attention a context of ``n_ctx`` tokens reads its prompt with, which is what its
        persisted prefixes depend on. Dense reading ignores the sparse options, and
        "sparse-decode" within the trained context reads as "dense" does: one cache file."""
        dense = self.mode == "dense" or (self.dense_prompt and n_ctx <= trained)
        return SparseConfig(mode="dense") if dense else self

    def in_mode(self, mode: str) -> SparseConfig:
        """These options in ``mode``; dense reads no sparse option, so it gets none of them (and
        its persisted caches one signature)."""
        return SparseConfig(mode="dense") if mode == "dense" else replace(self, mode=mode)

    def options(self) -> dict:
        """The tunable options (every field but the mode), as reports list them."""
        return {name: self.k if name == "top_k" else getattr(self, name) for name in SPARSE_OPTIONS}

    def budget_tokens(self, block: int) -> int:
        """Tokens a decode step attends at most (whole blocks)."""
        return (-(-self.sinks // block) + self.k + -(-self.window // block) + 1) * block


SPARSE_OPTIONS = tuple(f.name for f in fields(SparseConfig) if f.name != "mode")   # what --sinks ... set
