"""One input times several weight matrices, as one kernel call where their format allows:
a decode step's q, k and v (one input, the normed residual) and its gate and up.

Why: at one token a product's fixed costs (the call from Python, quantizing the activations,
starting the threads, the first lines of its weights from memory) do not shrink with the matrix,
so small matrices such as k and v (256 x 1536 Q4_K, 221 KB, in Qwen2.5-1.5B) take several times
the time their bytes need to stream, and even gate and up stream below the kernels' rate.
Stacked, the threads share out the groups of all of them and pay those costs once.

Stacked here: Q4_K matrices on the AVX2 kernels (their 8-row groups are independent, so each row
keeps the bits of its own product: kquants_avx2.matvec_q4_k_x8_stack), up to three; any other
matrix of the stack (Qwen2.5's attn_v is Q6_K in half the layers of a Q4_K_M file) is multiplied
on its own.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from ..cpu.threads import num_threads
from . import kquants_avx2
from .q4k_x8 import ROWS_X8
from .qmatrix import QMatrix, token_activations

MAX_STACKED = 3   # matrices one stacked call takes (its kernel's arguments)


class ProductStack:
    """The products W_i x of one input x (n_in,) with the matrices ``mats``, all (n_i, n_in)."""

    def __init__(self, mats: Sequence[QMatrix]):
        self.mats = tuple(mats)
        self._names = ", ".join(m.name for m in self.mats)
        n_in = {m.shape[1] for m in self.mats}
        if len(n_in) != 1:
            raise ValueError(f"a product stack needs one input width, not {sorted(n_in)}: {self._names}")
        self.n_in = n_in.pop()
        stackable = [i for i, m in enumerate(self.mats) if m.x8_planes is not None][:MAX_STACKED]
        self.stacked = tuple(stackable) if len(stackable) >= 2 else ()   # indices into mats
        self.alone = tuple(i for i in range(len(self.mats)) if i not in self.stacked)
        self._kernel_args = self._bind() if self.stacked else None
        self._n_groups = sum(-(-self.mats[i].shape[0] // ROWS_X8) for i in self.stacked)   # 8-row groups
        self._no_rows = np.empty((1, 0), np.float32)   # (1, 0) the output of an absent third matrix

    def _bind(self) -> tuple:
        """matvec_q4_k_x8_stack's leading arguments (x8a, na, x8b, nb, x8c, nc), chosen once (the
        thread count is asked at each call, as QMatrix does): a stack of two passes its second matrix
        again as the third, with no rows."""
        mats = [self.mats[i] for i in self.stacked]
        n_c = mats[2].shape[0] if len(mats) == 3 else 0
        planes_c = mats[2].x8_planes if len(mats) == 3 else mats[1].x8_planes
        return mats[0].x8_planes, mats[0].shape[0], mats[1].x8_planes, mats[1].shape[0], planes_c, n_c

    def matvec(self, x: np.ndarray) -> list[np.ndarray]:
        """x (n_in,) float32 -> [W_i x (n_i,) float32 for each matrix, in order]."""
        x = token_activations(x, self.n_in, self._names)
        outs: list[np.ndarray | None] = [None] * len(self.mats)
        if self.stacked:
            rows = [np.empty((1, self.mats[i].shape[0]), np.float32) for i in self.stacked]   # (1, n_i) each
            if len(rows) == 2:
                rows.append(self._no_rows)
            kquants_avx2.matvec_q4_k_x8_stack(*self._kernel_args, min(self._n_groups, num_threads()),
                                              x.reshape(1, self.n_in), *rows)
            for i, r in zip(self.stacked, rows):
                outs[i] = r[0]
        for i in self.alone:
            outs[i] = self.mats[i].matvec(x)
        return outs

    def __repr__(self) -> str:
        return (f"ProductStack({self._names}; stacked "
                f"{[self.mats[i].name for i in self.stacked]})")
