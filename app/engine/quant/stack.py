"""One input times several weight matrices, as one kernel call where their format allows:
a decode step's q, k and v (one input, the normed residual) and its gate and up.

Why: at one token a product's fixed costs (the call from Python, quantizing the activations,
starting the threads, the first lines of its weights from memory) do not shrink with the matrix.
Measured inside Qwen2.5-Coder-1.5B's decode steps at 512 tokens (two threads, AMD EPYC): k and v
(256 x 1536 Q4_K, 221 KB) took 18-20 us a call where their bytes stream in ~6, q and the attention
output (1536 x 1536) 54-60 us for ~35; gate and up streamed at 33-34 GB/s against the kernels' 37-39.
Stacked, the threads share out the groups of all of them and pay those costs once.

Stacked here: Q4_K matrices on the AVX2 kernels (their 8-row groups are independent, so each row
keeps the bits of its own product: kquants_avx2.matvec_q4_k_x8_stack), up to three; any other
matrix of the stack (Qwen2.5's attn_v is Q6_K in half the layers of a Q4_K_M file) is multiplied
on its own.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from . import kquants_avx2
from .layout import num_threads
from .q4k_x8 import ROWS_X8
from .qmatrix import QMatrix

MAX_STACKED = 3   # matrices one stacked call takes (its kernel's arguments)


class ProductStack:
    """The products W_i x of one input x (n_in,) with the matrices ``mats``, all (n_i, n_in)."""

    def __init__(self, mats: Sequence[QMatrix]):
        self.mats = tuple(mats)
        n_in = {m.shape[1] for m in self.mats}
        if len(n_in) != 1:
            raise ValueError(f"a product stack needs one input width, not {sorted(n_in)}: "
                             + ", ".join(m.name for m in self.mats))
        self.n_in = n_in.pop()
        stackable = [i for i, m in enumerate(self.mats) if m.x8_planes is not None][:MAX_STACKED]
        self.stacked = tuple(stackable) if len(stackable) >= 2 else ()   # indices into mats
        self.alone = tuple(i for i in range(len(self.mats)) if i not in self.stacked)
        self._n_groups = sum(-(-self.mats[i].shape[0] // ROWS_X8) for i in self.stacked)   # 8-row groups
        self._no_rows = np.empty((1, 0), np.float32)   # (1, 0) the output of an absent third matrix

    def matvec(self, x: np.ndarray) -> list[np.ndarray]:
        """x (n_in,) float32 -> [W_i x (n_i,) float32 for each matrix, in order]."""
        if x.shape != (self.n_in,):
            raise ValueError(f"{', '.join(m.name for m in self.mats)}: expected activations ({self.n_in},), "
                             f"got {x.shape}")
        if x.dtype != np.float32 or not x.flags.c_contiguous:
            x = np.ascontiguousarray(x, dtype=np.float32)
        outs: list[np.ndarray | None] = [None] * len(self.mats)
        if self.stacked:
            mats = [self.mats[i] for i in self.stacked]
            rows = [np.empty((1, m.shape[0]), np.float32) for m in mats]   # (1, n_i) float32 each
            if len(mats) == 2:
                mats.append(mats[1])
                rows.append(self._no_rows)
                n_c = 0
            else:
                n_c = mats[2].shape[0]
            kquants_avx2.matvec_q4_k_x8_stack(
                mats[0].x8_planes, mats[0].shape[0], mats[1].x8_planes, mats[1].shape[0], mats[2].x8_planes, n_c,
                min(self._n_groups, num_threads()), x.reshape(1, self.n_in), rows[0], rows[1], rows[2])
            for i, r in zip(self.stacked, rows):
                outs[i] = r[0]
        for i in self.alone:
            outs[i] = self.mats[i].matvec(x)
        return outs

    def __repr__(self) -> str:
        return (f"ProductStack({', '.join(m.name for m in self.mats)}; stacked "
                f"{[self.mats[i].name for i in self.stacked]})")
