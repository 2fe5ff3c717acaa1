"""`zerogr diff`: what changed from one version to another, exactly: the items added, removed and whose SID
changed (matched by item id), and each version's shape (items, distinct SIDs, items in shared SIDs,
fan-out per step, the first token's largest share, model tag).

Streaming: the item files are read in batches, never whole. Items are matched by id in `passes` rounds;
round k keeps only the ids whose hash falls in share k (the same share in both versions), with their
packed SIDs, then sorts and merges them; the number of rounds is chosen so that one round's arrays fit
`memory_bytes`. The step tables and leaf offsets are memory-mapped, and the SIDs of a batch's items are
rebuilt from the rows above its leaves only. The arithmetic is diff_math's.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..base.errors import BundleError
from ..base.progress import NULL_PROGRESS, Progress
from . import diff_math as dm
from .format import ITEM_COLUMN
from .reader import Bundle, open_bundle

#: What one round of matching may hold (both versions' ids and packed SIDs of the round, and the sort's
#: scratch); more items take more rounds, each reading both item files once more.
DEFAULT_MEMORY_BYTES = 512 << 20
#: At most this many rounds (a budget far too small for the items is not a reason to read them forever).
MAX_PASSES = 64
#: Items read per batch of items.parquet.
DEFAULT_BATCH_ROWS = 1 << 20


@dataclass(frozen=True)
class StepStats:
    """One step of a version: its format, rows (prefixes), children (nnz) and children per row."""

    step: int
    format: str
    rows: int
    nnz: int
    fanout_mean: float
    fanout_p99: int
    fanout_max: int


@dataclass(frozen=True)
class VersionStats:
    """The shape of one version. `first_token` is the SID first token that the most items start with, and
    `first_token_items` how many items do."""

    path: str
    version: int
    model_version: str | None
    codebook_sizes: tuple[int, ...]
    items: int
    distinct_sids: int
    items_in_shared_sids: int
    first_token: int
    first_token_items: int
    steps: tuple[StepStats, ...]

    @property
    def shared_sid_items_ratio(self) -> float:
        """Share of the items whose SID also names another item."""
        return self.items_in_shared_sids / self.items

    @property
    def first_token_share(self) -> float:
        """Share of the items under the most common first token."""
        return self.first_token_items / self.items

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["codebook_sizes"] = list(self.codebook_sizes)
        data["steps"] = [asdict(s) for s in self.steps]
        data["shared_sid_items_ratio"] = self.shared_sid_items_ratio
        data["first_token_share"] = self.first_token_share
        return data


@dataclass(frozen=True)
class VersionDiff:
    """Two versions compared. Items are matched by item id: `items_common` are in both, `items_added`
    only in `new`, `items_removed` only in `old`; `items_sid_changed` are common items whose SID differs
    (all of them when the SIDs have different lengths: `sids_comparable` False)."""

    old: VersionStats
    new: VersionStats
    items_added: int
    items_removed: int
    items_sid_changed: int
    items_common: int
    sids_comparable: bool

    @property
    def model_tag_changed(self) -> bool:
        return self.old.model_version != self.new.model_version

    def counts(self) -> dict[str, Any]:
        """items_added, items_removed, items_sid_changed, items_common, sids_comparable, model_tag_changed:
        what the guards record in the new version's manifest (`changes`) and the report shows."""
        return {
            "items_added": self.items_added,
            "items_removed": self.items_removed,
            "items_sid_changed": self.items_sid_changed,
            "items_common": self.items_common,
            "sids_comparable": self.sids_comparable,
            "model_tag_changed": self.model_tag_changed,
        }

    def to_json(self) -> dict[str, Any]:
        """JSON-ready: counts(), and old / new (VersionStats.to_json)."""
        return {**self.counts(), "old": self.old.to_json(), "new": self.new.to_json()}


class _Version:
    """One opened version as the diff reads it: row starts and tokens per step, leaf offsets (None: one
    item per leaf), and its items file."""

    def __init__(self, path: str | Path) -> None:
        self.bundle: Bundle = open_bundle(path, verify_checksums=False)
        manifest = self.bundle.manifest
        self.starts: list[np.ndarray] = []
        self.tokens: list[np.ndarray] = []
        for table in self.bundle.index.steps:
            if table.next is not None:
                starts, tokens = dm.dense_as_sparse(table.next)
            else:
                starts, tokens = table.indptr, table.tokens
            self.starts.append(starts)
            self.tokens.append(tokens)
        leaves = manifest["leaves"]
        self.offsets = self.bundle.index.leaf_offsets if "offsets" in leaves["files"] else None
        self.items: int = leaves["items"]
        self.sizes = tuple(manifest["codebook_sizes"])
        self.items_file = self.bundle.file(leaves["files"]["items"])

    def item_batches(self, rows: int) -> Iterator[tuple[int, pa.Array]]:
        """(first item, ids) of every batch of items.parquet in leaf order, checked as Bundle.items
        checks them (row count, column, type, no nulls)."""
        import pyarrow.parquet as pq

        try:
            parquet = pq.ParquetFile(self.items_file)
            if parquet.metadata.num_rows != self.items:
                raise BundleError(
                    f"{self.items_file}: {parquet.metadata.num_rows} items, manifest says {self.items}"
                )
            expected = self.bundle.manifest["leaves"].get("item_id_type")
            first = 0
            for batch in parquet.iter_batches(batch_size=rows, columns=[ITEM_COLUMN]):
                ids = batch.column(0)
                if ids.null_count:
                    raise BundleError(f"{self.items_file}: null item ids")
                if expected is not None and str(ids.type) != expected:
                    raise BundleError(f"{self.items_file}: item_id type {ids.type}, manifest says {expected}")
                yield first, ids
                first += len(ids)
        except BundleError:
            raise
        except Exception as exc:  # pyarrow raises several types for bad files
            raise BundleError(f"{self.items_file}: cannot read items ({exc})") from exc
        if first != self.items:
            raise BundleError(f"{self.items_file}: {first} items, manifest says {self.items}")

    def id_type(self) -> pa.DataType:
        import pyarrow.parquet as pq

        return pq.read_schema(self.items_file).field(ITEM_COLUMN).type

    def id_bytes(self) -> float:
        """Bytes per id as stored uncompressed (for the memory estimate of string ids)."""
        import pyarrow.parquet as pq

        meta = pq.ParquetFile(self.items_file).metadata
        total = sum(meta.row_group(g).total_byte_size for g in range(meta.num_row_groups))
        return total / max(self.items, 1)


def version_stats(version: str | Path | _Version) -> VersionStats:
    """The shape of one version (a version dir, or an OUT dir: its LATEST)."""
    side = version if isinstance(version, _Version) else _Version(version)
    manifest = side.bundle.manifest
    steps = []
    for t, (table, starts) in enumerate(zip(side.bundle.index.steps, side.starts, strict=True)):
        spread = dm.fanout(starts, table.codebook_size)
        steps.append(StepStats(t, table.format, table.rows, table.nnz, spread.mean, spread.p99, spread.max))
    per_token = dm.first_token_items(side.starts, side.offsets)
    top = int(np.argmax(per_token))
    return VersionStats(
        path=str(side.bundle.path),
        version=manifest["version"],
        model_version=manifest["model_version"],
        codebook_sizes=side.sizes,
        items=side.items,
        distinct_sids=manifest["leaves"]["count"],
        items_in_shared_sids=dm.items_in_shared_sids(side.offsets),
        first_token=int(side.tokens[0][top]),
        first_token_items=int(per_token[top]),
        steps=tuple(steps),
    )


def diff_versions(
    old_dir: str | Path,
    new_dir: str | Path,
    *,
    memory_bytes: int = DEFAULT_MEMORY_BYTES,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    progress: Progress = NULL_PROGRESS,
) -> VersionDiff:
    """Compare version `new_dir` with `old_dir` (each a version dir, or an OUT dir: its LATEST). Exact
    counts; memory stays near `memory_bytes` whatever the item count (module docstring). Raises
    BundleError for a damaged version, InputError for a path that is not one."""
    old, new = _Version(old_dir), _Version(new_dir)
    layout = dm.KeyLayout.common(old.sizes, new.sizes)
    kind = _id_kind(old.id_type(), new.id_type())
    common = changed = 0
    if kind is not None:
        passes = _passes(old, new, layout, kind, memory_bytes)
        for k in range(passes):
            progress.stage(f"diff {k + 1}/{passes}" if passes > 1 else "diff", old.items + new.items)
            a = _collect(old, k, passes, layout, kind, batch_rows, progress)
            b = _collect(new, k, passes, layout, kind, batch_rows, progress)
            counts = _match(kind, a, b)
            common, changed = common + counts.common, changed + counts.changed
    return VersionDiff(
        old=version_stats(old),
        new=version_stats(new),
        items_added=new.items - common,
        items_removed=old.items - common,
        items_sid_changed=changed,
        items_common=common,
        sids_comparable=layout is not None,
    )


def _id_kind(old: pa.DataType, new: pa.DataType) -> str | None:
    """ "int" when both versions' ids are integers ("mixed": uint64 against signed ones), "bytes" when both
    are strings or binary, else None: ids of different kinds never equal each other (every item counts
    as removed and added)."""
    if pa.types.is_integer(old) and pa.types.is_integer(new):
        pair = (old, new)
        if any(pa.types.is_uint64(t) for t in pair) and any(pa.types.is_signed_integer(t) for t in pair):
            return "mixed"
        return "int"
    textual = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary, pa.types.is_large_binary)
    if any(f(old) for f in textual) and any(f(new) for f in textual):
        return "bytes"
    return None


def _passes(old: _Version, new: _Version, layout: dm.KeyLayout | None, kind: str, memory_bytes: int) -> int:
    """Rounds needed for one round's arrays to fit memory_bytes: per item its id (8 bytes) and packed SID
    (8 per word), twice while sorted, plus the sort's order (8); string ids their bytes and offsets."""
    words = layout.words if layout is not None else 0
    per_item = 2 * (8 + 8 * words) + 8
    if kind == "bytes":
        per_item += 2 * max(old.id_bytes(), new.id_bytes()) + 8
    need = (old.items + new.items) * per_item
    return min(max(1, math.ceil(need / max(int(memory_bytes), 1))), MAX_PASSES)


@dataclass
class _Round:
    """One version's items of one round: ids (int64 [n], or large_binary offsets + data) and packed SIDs
    uint64 [n, words] (None: SIDs not comparable)."""

    ids: Any
    keys: np.ndarray | None


def _collect(
    side: _Version, k: int, passes: int, layout: dm.KeyLayout | None, kind: str, rows: int, progress: Progress
) -> _Round:
    ids_parts: list[Any] = []
    key_parts: list[np.ndarray] = []
    for first, ids in side.item_batches(rows):
        if kind == "bytes":
            ids = ids.cast(pa.large_binary())
            offsets, data = _byte_buffers(ids)
            hashes = dm.hash_byte_ids(offsets, data) if passes > 1 else None
        else:
            values = _int_values(ids, kind)
            hashes = dm.hash_int_ids(values) if passes > 1 else None
        keep = None if hashes is None else dm.pass_of(hashes, passes) == k
        if layout is not None:
            keys = dm.item_keys(side.starts, side.tokens, side.offsets, layout, first, first + len(ids))
            key_parts.append(keys if keep is None else keys[keep])
        if kind == "bytes":
            ids_parts.append(ids if keep is None else ids.filter(pa.array(keep)))
        else:
            ids_parts.append(values if keep is None else values[keep])
        progress.advance(len(ids))
    keys = None
    if layout is not None:
        keys = np.concatenate(key_parts) if key_parts else np.zeros((0, layout.words), dtype=np.uint64)
    if kind == "bytes":
        joined = pa.concat_arrays(ids_parts) if ids_parts else pa.array([], type=pa.large_binary())
        return _Round(_byte_buffers(joined), keys)
    return _Round(np.concatenate(ids_parts) if ids_parts else np.zeros(0, dtype=np.int64), keys)


def _int_values(ids: pa.Array, kind: str) -> np.ndarray:
    """int64 [n] of integer ids. "mixed" (uint64 against signed ids): a uint64 id past int64 equals no
    signed id, so it is refused rather than wrapped into one."""
    values = ids.to_numpy(zero_copy_only=False)
    if values.dtype == np.uint64:
        if kind == "mixed" and values.size and values.max() > np.iinfo(np.int64).max:
            raise BundleError("item ids past 2^63-1 (uint64) cannot be compared with signed item ids")
        return values.view(np.int64)
    return values.astype(np.int64, copy=False)


def _byte_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64 [n+1], data uint8) of a large_binary array (its slice offset applied)."""
    buffers = ids.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64)[ids.offset : ids.offset + len(ids) + 1]
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def _match(kind: str, a: _Round, b: _Round) -> dm.MatchCounts:
    if kind == "bytes":
        return dm.match_byte_ids(*a.ids, a.keys, *b.ids, b.keys)
    return dm.match_int_ids(a.ids, a.keys, b.ids, b.keys)
