"""What sparse attention is asked to do: the options of SparseConfig and the attention modes.

Light on purpose (no numba): the settings, the command line and the benchmarks read it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

MODES = ("dense", "sparse")


@dataclass(frozen=True)
class SparseConfig:
    """Sparse attention options; defaults chosen by measurement (README, "Sparse attention")."""

    mode: str = "sparse"      # "dense": every block, true positions
    sinks: int = 64           # S: first tokens always attended
    window: int = 256         # W: last tokens always attended
    top_k: int = 16           # K: retrieved blocks per KV head
    dense_layers: int = 0     # leading layers attending densely (inside the trained context)
    reselect: int = 1         # decode: choose blocks every this many tokens
    observe: int = 32         # last prompt tokens whose attention chooses decode's blocks (0: bounds)

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"attention must be one of {', '.join(MODES)}, not {self.mode!r}")
        for name in ("sinks", "window", "top_k", "dense_layers", "observe"):
            if getattr(self, name) < 0:
                raise ValueError(f"sparse attention: {name} must be >= 0")
        if self.reselect < 1:
            raise ValueError("sparse attention: reselect must be >= 1")

    def options(self) -> dict:
        """The tunable options (every field but the mode), as reports list them."""
        return {name: getattr(self, name) for name in SPARSE_OPTIONS}

    def budget_tokens(self, block: int) -> int:
        """Tokens a decode step attends at most (whole blocks)."""
        return (-(-self.sinks // block) + self.top_k + -(-self.window // block) + 1) * block


SPARSE_OPTIONS = tuple(f.name for f in fields(SparseConfig) if f.name != "mode")   # what --sinks ... set
