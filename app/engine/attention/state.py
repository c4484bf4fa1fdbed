"""What attention remembers for one sequence between forward passes, kept apart from the KV
cache: llama.cpp separates its ``llama_kv_cache`` (what the tokens are) from the context that
attends over it, and so do we. The blocked cache (kv/blocked.py) holds keys and values only;
this holds how the current question reads them.

  config      the SparseConfig attention runs with
  observe     prompt positions [start, end) whose queries vote for the blocks decoding reads
              (attention/votes.py), or None
  votes       layer -> (KVH, end block) float32: the votes decoding ranks blocks by
  vote_top    layer -> (votes, (KVH, K) int64 their top blocks): ranked once per question
  focus       (F,) int64 blocks each single query of the question and its answer reads besides
              the ones it chooses, best first (the passages the caller's own relevance ranking
              found, app/qa/focus.py)
  view        None, or (head, first) blocks: every query of the question and its answer reads
              the first ``head`` blocks (the prompt's header, at least the sinks) and the blocks
              from ``first`` on only (copies of the passages a relevance ranking found laid
              after the document, then the question), laid out from position 0 as a short prompt
  read_from   None, or the block from which every single query of the question and its answer
              reads everything (copies of the passages laid beside the question, the question,
              the answer so far): the votes rank only the blocks before it
  focus_read  how many of them the last single query read (select() decides: those among its
              candidates, fewer beyond the trained context), counted in the bytes read per token
  selection   layer -> (step, Selection): a decode step's blocks, kept for ``config.reselect`` steps
  block_mass  (NB,) float64: attention mass each block received while an answer was generated,
              summed over layers and heads (the answer's attention-grounded citations)

The choices depend on the cache's contents: when the cache forgets tokens or is refilled
(``BlockKVCache.generation`` changes), the votes and selections made for the old contents are
dropped the next time attention looks (``follow``).
"""
from __future__ import annotations

import numpy as np

from .config import SparseConfig


class AttentionState:
    """The per-question state of attention over one blocked KV cache."""

    def __init__(self, config: SparseConfig | None = None):
        self.config = config or SparseConfig(mode="dense")
        self.observe: tuple[int, int] | None = None
        self.votes: dict[int, np.ndarray] = {}
        self.vote_top: dict[int, tuple] = {}
        self.focus = np.zeros(0, np.int64)            # (F,) int64
        self.focus_read = 0                           # focus blocks the last decode step read on top of K
        self.view: tuple[int, int] | None = None
        self.read_from: int | None = None
        self.selection: dict[int, tuple] = {}
        self.block_mass = np.zeros(0, np.float64)     # (NB,) float64
        self._generation: int | None = None

    def follow(self, cache) -> None:
        """Drop what was chosen for contents the cache no longer holds; size block_mass to it."""
        if cache.generation != self._generation:
            self._generation = cache.generation
            self.votes.clear()
            self.vote_top.clear()
            self.selection.clear()
        if self.block_mass.shape[0] < cache.n_blocks_cap:
            mass = np.zeros(cache.n_blocks_cap, np.float64)
            mass[:self.block_mass.shape[0]] = self.block_mass
            self.block_mass = mass

    def start_question(self, observe: tuple[int, int] | None, focus=(), view: tuple[int, int] | None = None,
                       read_from: int | None = None) -> None:
        """A new prompt: no votes yet; ``observe`` = the positions that will cast them,
        ``focus`` = blocks its decoding reads whatever the votes say, ``view`` = the only blocks
        it reads, (head, first) as above (None: all of them), ``read_from`` = the block from
        which it reads everything (None: the window's)."""
        self.observe = observe
        self.view = view
        self.read_from = read_from
        self.focus = np.array(list(dict.fromkeys(int(b) for b in focus)), np.int64)   # (F,) in order
        self.focus_read = 0
        self.selection.clear()
        self.votes.clear()
        self.vote_top.clear()

    def reset_mass(self) -> None:
        """Count the attention mass of the next answer only."""
        self.block_mass[:] = 0.0
