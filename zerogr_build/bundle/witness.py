"""A build's witness: the catalog as that build read it and the leaf order its sort chose, kept so that
the version it wrote can be checked against that catalog without reading and sorting the catalog again.

`witness_report` proves exact equality of the version's (SID, item) pairs with the catalog's
(bundle/witness_math.py says how); the sort only supplied the order, it is not trusted. Where it does not
hold, verify (bundle/verify.py: check_against_witness) compares in full, so a refusal names the file,
catalog row, item and SID exactly as `zerogr verify --catalog` does.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import BundleError
from ..index.formats import bits_for
from ..index.pack import PackedSids
from .format import ITEM_COLUMN, MANIFEST_NAME
from .witness_math import check_positions, leaf_tokens, steps_as_csr

#: Item ids checked per batch (and leaf SIDs rebuilt per batch): a few MB of temporaries.
BATCH_ROWS = 1 << 20


@dataclass(eq=False)
class BuildWitness:
    """What one build read and how it ordered it (every array in catalog row order unless said).

    codebook_sizes  V_t the catalog was read with.
    packed          PackedSids [N] of the catalog (index/pack.py), or None when `sids` holds them.
    sids            int [N, L] tokens of a catalog that could not be packed, or None.
    item_ids        pyarrow Array or ChunkedArray [N] of the item ids.
    item_order      int32|int64 [N]: the build's SidIndex.item_order, catalog row at each leaf position.
    """

    codebook_sizes: tuple[int, ...]
    packed: PackedSids | None
    sids: np.ndarray | None
    item_ids: Any
    item_order: np.ndarray

    @property
    def num_items(self) -> int:
        return len(self.item_ids)

    def as_catalog(self) -> Any:
        """A Catalog-like object (.sids int [N, L], .item_ids, .codebook_sizes) for check_against_catalog."""
        from types import SimpleNamespace

        sids = self.packed.unpack() if self.packed is not None else self.sids
        return SimpleNamespace(sids=sids, item_ids=self.item_ids, codebook_sizes=self.codebook_sizes)


@dataclass(eq=False)
class KeepWitness:
    """Asks a build to keep its witness: the build stores it in `witness`. spill_dir: where the catalog's
    SIDs are copied to an unlinked file (file pages, not the process's anonymous memory, so the build's
    peak does not grow); None keeps the copy in memory."""

    spill_dir: Path | None = None
    witness: BuildWitness | None = None


def spilled_copy(array: np.ndarray, spill_dir: Path | None) -> np.ndarray:
    """A read-only copy of `array` (any shape): in memory when spill_dir is None, else memory-mapped from an
    unlinked file there (gone when the last reference to the map goes, and after a crash)."""
    if spill_dir is None:
        return array.copy()
    array = np.ascontiguousarray(array)
    with tempfile.TemporaryFile(dir=spill_dir, prefix=".tmp-witness-") as f:
        view = memoryview(array.reshape(-1).view(np.uint8))
        written = 0
        while written < len(view):
            written += os.write(f.fileno(), view[written : written + (64 << 20)])
        if not array.size:
            return array.copy()
        return np.memmap(f, dtype=array.dtype, mode="r", shape=array.shape)


def spilled_packed(packed: PackedSids, spill_dir: Path | None) -> PackedSids:
    """spilled_copy of a PackedSids' arrays."""
    first, words = spilled_copy(packed.first, spill_dir), spilled_copy(packed.words, spill_dir)
    return PackedSids(first, words, packed.codebook_sizes)


def witness_report(bundle: Any, witness: BuildWitness) -> dict | None:
    """check_against_catalog's report for the catalog `witness` holds, proven through its item order:
    {"rows", "distinct_sids", "matched": True, "item_order_matches": True}; None where the witness does not
    hold (the version or the witness is wrong: the caller compares in full, which names the difference).
    The version's structure (tables, leaf offsets) must have been verified first."""
    manifest, vdir = bundle.manifest, bundle.path
    index, n = bundle.index, witness.num_items
    if tuple(index.codebook_sizes) != tuple(witness.codebook_sizes) or n != index.num_items:
        return None
    if index.steps[-1].nnz != index.num_leaves:
        last = index.steps[-1].nnz
        raise BundleError(
            f"{vdir / MANIFEST_NAME}: the last step has {last} children, {index.num_leaves} leaves"
        )
    if not witness_holds(index, vdir / manifest["leaves"]["files"]["items"], witness):
        return None
    return {"rows": n, "distinct_sids": index.num_leaves, "matched": True, "item_order_matches": True}


def witness_holds(index: Any, items_path: Path, witness: BuildWitness) -> bool:
    """Whether every position of the version passes witness_math.check_positions and its item is the
    catalog id of the witness's row there; items.parquet read in batches."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = witness.num_items
    order = np.asarray(witness.item_order)
    if order.shape != (n,):
        return False
    csr = steps_as_csr(index.steps)
    offsets = np.asarray(index.leaf_offsets)
    sizes = witness.codebook_sizes
    packed, sids = witness.packed, witness.sids
    empty_words = np.zeros(0, np.uint64)
    if packed is not None:
        first, words, shifts = packed.first, packed.words, packed.shifts.astype(np.uint64)
        sids = np.zeros((0, len(sizes)), np.int64)
    else:
        first, words, shifts = np.zeros(0, np.uint16), empty_words, np.zeros(len(sizes), np.uint64)
    masks = np.array([(1 << bits_for(int(v))) - 1 for v in sizes], dtype=np.uint64)
    seen = np.zeros(n // 8 + 1, dtype=np.uint8)
    item_ids = witness.item_ids
    try:
        parquet = pq.ParquetFile(str(items_path), memory_map=True)
        if parquet.metadata.num_rows != n or parquet.schema_arrow.field(ITEM_COLUMN).type != item_ids.type:
            return False
        lo = 0
        for batch in parquet.iter_batches(batch_size=BATCH_ROWS, columns=[ITEM_COLUMN]):
            hi = lo + batch.num_rows
            if hi > n:
                return False
            first_leaf = int(np.searchsorted(offsets, lo, side="right")) - 1
            end_leaf = int(np.searchsorted(offsets, hi - 1, side="right"))
            tokens = leaf_tokens(csr, first_leaf, end_leaf)
            bad, _ = check_positions(
                order, lo, hi, offsets, first_leaf, tokens, first, words, shifts, masks, sids, seen
            )
            if bad >= 0:
                return False
            got = batch.column(0)
            if got.null_count or not pa.chunked_array([got]).equals(_take(item_ids, order[lo:hi])):
                return False
            lo = hi
    except (OSError, KeyError, pa.ArrowException):
        return False
    return lo == n


def _take(item_ids: Any, rows: np.ndarray) -> Any:
    """item_ids[rows] as a ChunkedArray (rows already checked to be in range)."""
    import pyarrow as pa

    taken = item_ids.take(pa.array(rows))
    return taken if isinstance(taken, pa.ChunkedArray) else pa.chunked_array([taken])
