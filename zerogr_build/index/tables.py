"""The per-step index: one immutable table per decoding step (see docs/bundle-format.md), and the CSR
helpers every layer shares (`csr_gather`, `csr_parents`).

Definitions (docs/bundle-format.md, section 2): sort the distinct SIDs lexicographically. Row r of step t
is the r-th distinct length-t prefix; its children are the tokens v with prefix_r + (v) a prefix of some
SID, ascending; the next row of child (r, v) is the rank of prefix_r + (v) among distinct length-(t+1)
prefixes (a leaf, i.e. the rank of the SID among distinct SIDs, at the last step).

Both formats number next rows identically: rows of step t+1 are ordered exactly as the flattened children
of step t, so a sparse step needs no next-row array (child at flat position j *is* row j of step t+1).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

StepFormat = Literal["sparse", "dense"]


def csr_gather(offsets: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Flat positions of the members of `rows` in a CSR layout, row after row.

    offsets: int [n+1], ascending (row r owns positions offsets[r] .. offsets[r+1]-1); an indptr or
        leaf_offsets, memory-mapped is fine (only 2k entries are read).
    rows: int [k] (any shape, flattened), each in 0..n-1, or negative for "no row" (a padded beam:
        no members, count 0). A row >= n raises IndexError.
    Returns (positions int64 [counts.sum()], counts int64 [k]): the members of rows[0] in order, then
    those of rows[1], ...; members of rows[j] are positions[ends[j] - counts[j] : ends[j]] with
    ends = cumsum(counts).
    """
    offsets = np.asarray(offsets)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    real = rows >= 0
    starts = np.zeros(rows.shape[0], dtype=np.int64)
    counts = np.zeros(rows.shape[0], dtype=np.int64)
    starts[real] = offsets[rows[real]]
    counts[real] = offsets[rows[real] + 1] - starts[real]
    ends = np.cumsum(counts)
    # Output slot i belongs to the row j with ends[j] - counts[j] <= i < ends[j], and must hold
    # starts[j] + (i - (ends[j] - counts[j])): i plus a shift that is constant within row j's run.
    # np.repeat lays that shift over exactly the counts[j] slots of the run (empty rows get none).
    shift = np.repeat(starts - (ends - counts), counts)
    return np.arange(shift.shape[0], dtype=np.int64) + shift, counts


def leaf_map_dtype(num_leaves: int, num_items: int) -> str | None:
    """How a bundle (format v2) stores the leaf -> items map of `num_leaves` leaves over `num_items` items:
    None (no offsets at all) when every leaf holds exactly one item, so leaf j *is* item j of the leaf-order
    items table; else "<i4" offsets when num_items fits int32, else "<i8"."""
    if num_leaves == num_items:
        return None
    return "<i4" if num_items < 2**31 else "<i8"


def identity_leaf_offsets(num_leaves: int) -> np.ndarray:
    """The leaf offsets [n_leaves + 1] of a catalog whose leaves hold one item each (0, 1, ..., n_leaves),
    int32 while they fit (what a v2 bundle without an offsets file stands for)."""
    return np.arange(num_leaves + 1, dtype=np.int32 if num_leaves < 2**31 else np.int64)


def csr_parents(offsets: np.ndarray) -> np.ndarray:
    """int64 [offsets[-1]]: the row owning each flat position of CSR `offsets` int [n+1] (ascending)."""
    counts = np.diff(np.asarray(offsets, dtype=np.int64))
    return np.repeat(np.arange(counts.shape[0], dtype=np.int64), counts)


@dataclass(frozen=True, eq=False)
class StepMeta:
    """What a step table is, apart from its arrays: shared by the host `StepTable` and the runtime's
    on-device copy (`runtime.device_tables.DeviceStep`), so neither repeats the other's fields."""

    step: int
    codebook_size: int
    rows: int
    nnz: int
    max_slots: int

    def meta(self) -> dict[str, int]:
        """The StepMeta fields by name, to build another view of one step: DeviceStep(**t.meta(), ...)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(StepMeta)}


@dataclass(frozen=True, eq=False)
class StepTable(StepMeta):
    """The table of one decoding step (the fields of StepMeta, then its arrays).

    sparse: `indptr` int32|int64 [rows+1], `tokens` uint16 (V <= 65536) | int32 [nnz];
            children of row r are tokens[indptr[r]:indptr[r+1]], next row of the j-th flat child is j.
    dense:  `next` int32 [rows, V]; next[r, v] is the next row (leaf at the last step) or -1.
    """

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

    def dtypes(self) -> dict[str, np.dtype]:
        """The dtype of each array of this step, by role name (what the bundle manifest records)."""
        return {role: array.dtype for role, array in self.arrays().items()}

    def children(self, row: int) -> tuple[np.ndarray, np.ndarray]:
        """(tokens int64 [k], next_rows int64 [k]) of one row, tokens ascending. For tests and tools."""
        if self.next is not None:
            line = np.asarray(self.next[row])
            tokens = np.flatnonzero(line >= 0)
            return tokens.astype(np.int64), line[tokens].astype(np.int64)
        assert self.indptr is not None and self.tokens is not None
        lo, hi = int(self.indptr[row]), int(self.indptr[row + 1])
        return np.asarray(self.tokens[lo:hi], dtype=np.int64), np.arange(lo, hi, dtype=np.int64)

    def child_parents(self) -> np.ndarray:
        """int64 [nnz]: the row of every child, in flat child order (the row order of step t+1).

        Dense: the valid cells in row-major order, which is flat child order by the row numbering rule
        (next[r, v] counts up row by row, tokens ascending)."""
        if self.next is not None:
            return np.nonzero(np.asarray(self.next) >= 0)[0].astype(np.int64)
        assert self.indptr is not None
        return csr_parents(self.indptr)


@dataclass(frozen=True, eq=False)
class SidIndex:
    """All step tables of one catalog plus the leaf -> items mapping.

    `leaf_offsets` int32|int64 [n_leaves+1]: items of leaf j are positions
    leaf_offsets[j]:leaf_offsets[j+1] of the items table in leaf order. `item_order` int64 [n_items]
    (in-memory builds only, else None): the catalog row of the i-th item in leaf order; items of one leaf
    keep their catalog order.
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
        """Bytes a bundle (format v2) stores for the leaf -> items map (leaf_map_dtype): 0 when every leaf
        holds one item, else 4 or 8 per leaf + 1. STATIC has no counterpart; reported separately."""
        dtype = leaf_map_dtype(self.num_leaves, self.num_items)
        return 0 if dtype is None else np.dtype(dtype).itemsize * (self.num_leaves + 1)

    def leaf_items(self, leaves: np.ndarray, item_ids: Any = None) -> tuple[Any, np.ndarray]:
        """The items of each leaf, concatenated: the one leaf -> items mapping (Decoder.items and
        Bundle.item_ids_for_leaves both resolve through it).

        leaves: int [k] leaf ids (any shape, flattened); negative = padding (no items).
        item_ids: the items table in *leaf order* (a bundle's items: pyarrow Array, numpy array, or a
            list), or None: then values are the catalog rows item_order[position] (in-memory index), or
            the leaf-order positions themselves (no item_order).
        Returns (values [n], list_offsets int64 [k+1]): items of leaves[j] are
        values[list_offsets[j] : list_offsets[j+1]]; values is `item_ids.take(...)`'s type (a pyarrow
        Array for a bundle), a list for a list, else an int64 numpy array.
        """
        positions, counts = csr_gather(self.leaf_offsets, leaves)
        list_offsets = np.zeros(counts.shape[0] + 1, dtype=np.int64)
        np.cumsum(counts, out=list_offsets[1:])
        if item_ids is None:
            values = positions if self.item_order is None else np.asarray(self.item_order)[positions]
        elif hasattr(item_ids, "take"):
            values = item_ids.take(positions)
        else:
            values = [item_ids[i] for i in positions.tolist()]
        return values, list_offsets

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
            assert table.tokens is not None
            parent = table.child_parents()
            token = np.asarray(table.tokens, dtype=np.int64)
        prefixes = np.concatenate([prefixes[parent], token[:, None].astype(np.int64)], axis=1)
    return prefixes
