"""The per-step index: one immutable table per decoding step (see docs/bundle-format.md).

Definitions (DESIGN.md, "The per-step index"): sort the distinct SIDs lexicographically. Row r of step t
is the r-th distinct length-t prefix; its children are the tokens v with prefix_r + (v) a prefix of some
SID, ascending; the next row of child (r, v) is the rank of prefix_r + (v) among distinct length-(t+1)
prefixes (a leaf, i.e. the rank of the SID among distinct SIDs, at the last step).

Both formats number next rows identically: rows of step t+1 are ordered exactly as the flattened children
of step t, so a sparse step needs no next-row array (child at flat position j *is* row j of step t+1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

StepFormat = Literal["sparse", "dense"]


@dataclass(frozen=True, eq=False)
class StepTable:
    """The table of one decoding step.

    sparse: `indptr` int32|int64 [rows+1], `tokens` uint16 (V <= 65536) | int32 [nnz];
            children of row r are tokens[indptr[r]:indptr[r+1]], next row of the j-th flat child is j.
    dense:  `next` int32 [rows, V]; next[r, v] is the next row (leaf at the last step) or -1.
    """

    step: int
    codebook_size: int
    rows: int
    nnz: int
    max_slots: int
    indptr: np.ndarray | None = None
    tokens: np.ndarray | None = None
    next: np.ndarray | None = None

    @property
    def format(self) -> StepFormat:
        return "dense" if self.next is not None else "sparse"

    @property
    def valid_share(self) -> float:
        """Mean children per row divided by V_t (0..1)."""
        return self.nnz / (self.rows * self.codebook_size) if self.rows else 0.0

    @property
    def nbytes(self) -> int:
        return sum(int(a.nbytes) for a in self.arrays().values())

    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays that make up this step, by role name ("indptr", "tokens" or "next")."""
        if self.next is not None:
            return {"next": self.next}
        assert self.indptr is not None and self.tokens is not None
        return {"indptr": self.indptr, "tokens": self.tokens}

    def children(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int64 [k], next_rows int64 [k]) of one row, tokens ascending. For tests and tools."""
        if self.next is not None:
            line = np.asarray(self.next[row])
            tokens = np.flatnonzero(line >= 0)
            return tokens.astype(np.int64), line[tokens].astype(np.int64)
        assert self.indptr is not None and self.tokens is not None
        lo, hi = int(self.indptr[row]), int(self.indptr[row + 1])
        return np.asarray(self.tokens[lo:hi], dtype=np.int64), np.arange(lo, hi, dtype=np.int64)


@dataclass(frozen=True, eq=False)
class SidIndex:
    """All step tables of one catalog plus the leaf -> items mapping.

    `leaf_offsets` int64 [n_leaves+1]: items of leaf j are positions leaf_offsets[j]:leaf_offsets[j+1] of
    the items table in leaf order. `item_order` int64 [n_items] (in-memory builds only, else None): the
    catalog row of the i-th item in leaf order; items of one leaf keep their catalog order.
    """

    codebook_sizes: tuple[int, ...]
    steps: tuple[StepTable, ...]
    leaf_offsets: np.ndarray
    item_order: np.ndarray | None = None

    @property
    def num_steps(self) -> int:
        return len(self.steps)

    @property
    def num_leaves(self) -> int:
        return int(self.leaf_offsets.shape[0]) - 1

    @property
    def num_items(self) -> int:
        return int(self.leaf_offsets[-1])

    @property
    def index_bytes(self) -> int:
        """Bytes of the step tables: what constrained decoding reads (STATIC's layout is compared to this)."""
        return sum(s.nbytes for s in self.steps)

    @property
    def leaf_map_bytes(self) -> int:
        """Bytes of leaf_offsets, the leaf -> items map (STATIC has no counterpart; reported separately)."""
        return int(self.leaf_offsets.nbytes)

    def leaf_sids(self) -> np.ndarray:
        """int64 [n_leaves, L]: the distinct SIDs in leaf (lexicographic) order, rebuilt from the tables."""
        return expand_leaf_sids(self)


def expand_leaf_sids(index: SidIndex) -> np.ndarray:
    """Walk the step tables top-down and return int64 [n_leaves, L], row j = SID of leaf j.

    prefixes [rows_t, t] holds the distinct length-t prefixes in row order. Children are emitted row by row
    in ascending token order, which is the row order of step t+1, so concatenating (parent prefix, token)
    in flat-child order yields the next step's prefixes already sorted.
    """
    prefixes = np.zeros((1, 0), dtype=np.int64)
    for table in index.steps:
        if table.next is not None:
            nxt = np.asarray(table.next)
            parent, token = np.nonzero(nxt >= 0)
            order = np.argsort(nxt[parent, token], kind="stable")
            parent, token = parent[order], token[order]
        else:
            assert table.indptr is not None and table.tokens is not None
            counts = np.diff(np.asarray(table.indptr, dtype=np.int64))
            parent = np.repeat(np.arange(table.rows), counts)
            token = np.asarray(table.tokens, dtype=np.int64)
        prefixes = np.concatenate([prefixes[parent], token[:, None].astype(np.int64)], axis=1)
    return prefixes
