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
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import BundleError
from ..index.pack import PackedSids
from .format import ITEM_COLUMN, MANIFEST_NAME
from .witness_math import (
    check_keys,
    check_tokens,
    key_bits,
    leaf_keys,
    leaf_tokens,
    packed_keys,
    steps_as_csr,
    unpack_keys,
)

#: Item ids checked per batch (and leaf SIDs rebuilt per batch): a few MB of temporaries.
BATCH_ROWS = 1 << 20

#: Threads checking batches at once: the check is scattered reads of the catalog's keys and ids by the
#: witness's rows, so it scales with cores (its kernels release the GIL).
CHECK_WORKERS = min(len(os.sched_getaffinity(0)), 8)


@dataclass(eq=False)
class BuildWitness:
    """What one build read and how it ordered it (every array in catalog row order unless said).

    codebook_sizes  V_t the catalog was read with.
    keys            uint64 [N]: SID keys (witness_math.key_bits fields, most significant first) when a SID
                    fits 64 bits, else None.
    packed          PackedSids [N] of the catalog (index/pack.py) when a SID does not fit 64 bits but the
                    build packed it, else None.
    sids            int [N, L] tokens of a catalog that could not be packed, else None.
    item_ids        pyarrow Array or ChunkedArray [N] of the item ids.
    item_order      int32|int64 [N]: the build's SidIndex.item_order, catalog row at each leaf position.
    """

    codebook_sizes: tuple[int, ...]
    keys: np.ndarray | None
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

        if self.keys is not None:
            sids = unpack_keys(np.asarray(self.keys), key_bits(self.codebook_sizes))
        else:
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
    if spill_dir is None or not array.size:
        return array.copy()
    flat = np.ascontiguousarray(array).reshape(-1)
    chunk = max(1, (64 << 20) // max(1, flat.itemsize))
    spilled = _spill_chunks(
        (flat[i : i + chunk] for i in range(0, flat.shape[0], chunk)), flat.shape[0], spill_dir
    )
    return spilled.reshape(array.shape)


def _spill_chunks(chunks: Any, n: int, spill_dir: Path) -> np.ndarray:
    """The concatenation of 1-d arrays (one dtype, n values in all) written to an unlinked file in
    spill_dir and mapped read-only."""
    dtype = None
    with tempfile.TemporaryFile(dir=spill_dir, prefix=".tmp-witness-") as f:
        for part in chunks:
            dtype = part.dtype
            view = memoryview(np.ascontiguousarray(part).view(np.uint8))
            written = 0
            while written < len(view):
                written += os.write(f.fileno(), view[written:])
        return np.memmap(f, dtype=dtype, mode="r", shape=(n,))


def witness_sids(packed: PackedSids | None, sids: Any, spill_dir: Path | None) -> dict[str, Any]:
    """BuildWitness's keys, packed and sids fields for a catalog read as `packed` (or as `sids` int [N, L]
    when it was not packed), copied (spilled_copy): the keys when a SID fits 64 bits."""
    if packed is None:
        return {"keys": None, "packed": None, "sids": spilled_copy(np.asarray(sids), spill_dir)}
    bits = key_bits(packed.codebook_sizes)
    if sum(bits) > 64:
        first, words = spilled_copy(packed.first, spill_dir), spilled_copy(packed.words, spill_dir)
        return {"keys": None, "packed": PackedSids(first, words, packed.codebook_sizes), "sids": None}
    n, tail = packed.num_items, sum(bits[1:])
    keys = np.empty(0, np.uint64)
    if spill_dir is None:
        keys = packed_keys(packed.first, packed.words, packed.row_bits, tail)
    elif n:
        keys = _spill_chunks(
            (
                packed_keys(
                    packed.first[i : i + BATCH_ROWS], packed.words[i : i + BATCH_ROWS], packed.row_bits, tail
                )
                for i in range(0, n, BATCH_ROWS)
            ),
            n,
            spill_dir,
        )
    return {"keys": keys, "packed": None, "sids": None}


def witness_report(bundle: Any, witness: BuildWitness) -> dict | None:
    """check_against_catalog's report for the catalog `witness` holds, proven through its item order:
    {"rows", "distinct_sids", "matched": True, "item_order_matches"}; None where the witness does not
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
    in_order = witness_order(index, vdir / manifest["leaves"]["files"]["items"], witness)
    if in_order is None:
        return None
    return {"rows": n, "distinct_sids": index.num_leaves, "matched": True, "item_order_matches": in_order}


def witness_order(
    index: Any, items_path: Path, witness: BuildWitness, *, batch_rows: int = BATCH_ROWS,
    workers: int = CHECK_WORKERS,
) -> bool | None:  # fmt: skip
    """None unless every position of the version passes witness_math.check_keys (check_tokens) and its
    item is the catalog id of the witness's row there; else whether every leaf holds its items in
    catalog order. items.parquet is read in batches of `batch_rows`, checked on `workers` threads at
    once (at most workers + 1 batches held)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = witness.num_items
    order = np.asarray(witness.item_order)
    if order.shape != (n,):
        return None
    check = _BatchCheck(index, witness, order)
    backwards = False
    try:
        parquet = pq.ParquetFile(str(items_path), memory_map=True)
        if (
            parquet.metadata.num_rows != n
            or parquet.schema_arrow.field(ITEM_COLUMN).type != check.item_ids.type
        ):
            return None
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="zerogr-witness") as pool:
            running: deque = deque()
            lo = 0
            for batch in parquet.iter_batches(batch_size=batch_rows, columns=[ITEM_COLUMN]):
                hi, got = lo + batch.num_rows, batch.column(0)
                if hi > n or got.null_count:
                    return None
                running.append(pool.submit(check, lo, hi, got))
                lo = hi
                while len(running) > workers:
                    if (outcome := running.popleft().result()) is None:
                        return None
                    backwards |= outcome
            for future in running:
                if (outcome := future.result()) is None:
                    return None
                backwards |= outcome
    except (OSError, KeyError, pa.ArrowException):
        return None
    if lo != n or not check.seen.all():  # n positions naming every row, each once: a permutation
        return None
    return not backwards


class _BatchCheck:
    """witness_order's check of positions lo..hi-1 against `got` (the version's item ids there), safe to
    run on several batches at once: each batch has its own catalog-order state, started from the position
    before it, and `seen` only ever has bytes set to 1."""

    def __init__(self, index: Any, witness: BuildWitness, order: np.ndarray) -> None:
        sizes = witness.codebook_sizes
        self.order, self.csr = order, steps_as_csr(index.steps)
        self.offsets = np.asarray(index.leaf_offsets)
        self.bits = key_bits(sizes)
        self.keys, self.sids = witness.keys, witness.sids
        if witness.packed is not None:
            packed = witness.packed
            self.first, self.words, self.shifts = packed.first, packed.words, packed.shifts.astype(np.uint64)
            self.sids = np.zeros((0, len(sizes)), np.int64)
        else:
            self.first, self.words = np.zeros(0, np.uint16), np.zeros(0, np.uint64)
            self.shifts = np.zeros(len(sizes), np.uint64)
        self.masks = np.array([(1 << b) - 1 for b in self.bits], dtype=np.uint64)
        self.seen = np.zeros(witness.num_items, dtype=np.uint8)
        self.item_ids = witness.item_ids
        self.ids = _integer_ids(self.item_ids)  # compared in check_keys; otherwise by Arrow
        self.fused = self.keys is not None and self.ids.shape[0] > 0

    def __call__(self, lo: int, hi: int, got: Any) -> bool | None:
        """None where a position fails; else whether a leaf's rows went backwards in lo-1..hi-1."""
        import pyarrow as pa

        offsets, order = self.offsets, self.order
        at = offsets.dtype.type
        first_leaf = int(np.searchsorted(offsets, at(lo), side="right")) - 1
        end_leaf = int(np.searchsorted(offsets, at(hi - 1), side="right"))
        state = np.array([-1, -1, 0], dtype=np.int64)
        if lo > 0:
            state[0] = int(np.searchsorted(offsets, at(lo - 1), side="right")) - 1
            state[1] = order[lo - 1]
        if self.keys is not None:
            leaf_key = leaf_keys(self.csr, self.bits, first_leaf, end_leaf)
            got_ids = got.to_numpy() if self.fused else self.ids
            bad = check_keys(
                order, lo, hi, offsets, first_leaf, leaf_key, self.keys, self.seen, state, self.ids, got_ids
            )
        else:
            tokens = leaf_tokens(self.csr, first_leaf, end_leaf)
            bad = check_tokens(
                order, lo, hi, offsets, first_leaf, tokens, self.first, self.words, self.shifts,
                self.masks, self.sids, self.seen, state,
            )  # fmt: skip
        if bad >= 0:
            return None
        if not self.fused and not pa.chunked_array([got]).equals(_take(self.item_ids, order[lo:hi])):
            return None
        return bool(state[2])


def _integer_ids(item_ids: Any) -> np.ndarray:
    """The catalog's item ids as a NumPy view when they are integers in one chunk without nulls, else
    an empty int64 array."""
    import pyarrow as pa

    if isinstance(item_ids, pa.ChunkedArray) and item_ids.num_chunks == 1:
        item_ids = item_ids.chunk(0)
    if isinstance(item_ids, pa.Array) and pa.types.is_integer(item_ids.type) and not item_ids.null_count:
        return item_ids.to_numpy(zero_copy_only=True)
    return np.zeros(0, np.int64)


def _take(item_ids: Any, rows: np.ndarray) -> Any:
    """item_ids[rows] as a ChunkedArray (rows already checked to be in range)."""
    import pyarrow as pa

    taken = item_ids.take(pa.array(rows))
    return taken if isinstance(taken, pa.ChunkedArray) else pa.chunked_array([taken])
