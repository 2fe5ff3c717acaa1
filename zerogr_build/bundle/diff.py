"""`zerogr diff`: what changed from one version to another, exactly: the items added, removed and whose SID
changed (matched by item id), and each version's shape (items, distinct SIDs, items in shared SIDs,
fan-out per step, the first token's largest share, model tag).

Streaming, each version's items read once: the item files are read in batches, never whole, cut at leaf
boundaries, each version on its own helper thread; each item's id is hashed (with a seed drawn per
comparison) and its SID rebuilt from the rows above its leaves only (the step tables and leaf offsets are
memory-mapped), packed into words that compare in SID order. Both versions store their items in leaf order
(SIDs ascending), so the two streams are merged like two sorted lists (leaf_merge): an id under the same SID
in both versions is common with its SID unchanged; every other item is a leftover. The leftovers (after a
normal churn a few percent of the items, after a model update nearly all) are matched by id: an id left over
in both versions changed its SID, the others were added or removed. They are held in memory while their
matching fits the budget (`memory_bytes`; by default half of what a build of the larger version holds at its
peak); past it, split into 2^k parts by the top bits of the hash and appended to that part's spill files (a
temporary dir, removed at the end), then matched one part at a time: the same id lands in the same part in
both versions. Matching a part groups each side into slots by the hash's low bits and walks the two sides'
slots in step (linear time), its groups shared by threads. When the versions' SIDs have different lengths,
no SID can be equal and every item is a leftover. The arithmetic is diff_math's, leaf_merge's and
id_match's; the leftovers' arrays and files are diff_parts'.
"""

from __future__ import annotations

import contextlib
import math
import os
import secrets
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..base.errors import BundleError
from ..base.progress import NULL_PROGRESS, Progress
from ..base.threads import prefetched
from . import diff_math as dm
from . import diff_parts as dp
from . import id_match as im
from . import leaf_merge as lm
from .format import ITEM_COLUMN, TEMP_PREFIX
from .reader import Bundle, open_bundle

SPILL_PREFIX = TEMP_PREFIX + "diff-"  # a spill dir in OUT is a temp the stale-temp sweep knows

#: What an in-memory build holds at its peak per item (docs/scaling.md: 26-27 B/item at 100M items, L=4).
#: The matching takes half of that for the larger version (matching_budget), so a diff or the guards never
#: need more memory than the build that made the version.
BUILD_PEAK_BYTES_PER_ITEM = 26
#: The smallest matching budget (below it, the interpreter and one batch dominate anyway).
MIN_MEMORY_BYTES = 256 << 20
#: At most 2^this parts (each part takes up to 4 open files per version while spilling).
MAX_PART_BITS = 7
#: Threads sharing the matching of the leftovers (the kernels release the GIL).
MATCH_WORKERS = min(len(os.sched_getaffinity(0)), 8)
#: Items read per batch of items.parquet (each version has about three batches in flight: read ahead,
#: merged, and carried over to the next merge).
DEFAULT_BATCH_ROWS = 1 << 18


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
            # No pre-buffering: it keeps every row group's bytes it read until the file is closed (the
            # whole id column, 8 B per item, for each version being read).
            parquet = pq.ParquetFile(self.items_file, pre_buffer=False)
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


def matching_budget(items: int) -> int:
    """The matching's memory for versions of up to `items` items: half of what an in-memory build of
    that many items holds at its peak (BUILD_PEAK_BYTES_PER_ITEM), at least MIN_MEMORY_BYTES."""
    return max(MIN_MEMORY_BYTES, BUILD_PEAK_BYTES_PER_ITEM * int(items) // 2)


def diff_versions(
    old_dir: str | Path,
    new_dir: str | Path,
    *,
    memory_bytes: int | None = None,
    batch_rows: int = DEFAULT_BATCH_ROWS,
    spill_dir: str | Path | None = None,
    progress: Progress = NULL_PROGRESS,
) -> VersionDiff:
    """Compare version `new_dir` with `old_dir` (each a version dir, or an OUT dir: its LATEST). Exact
    counts, each version's items read once. The matching of the leftovers holds about `memory_bytes`
    (None: matching_budget of the larger version); more than that are spilled, split into parts, to a
    temporary dir in `spill_dir` (None: the system's temporary dir, $TMPDIR), removed before this
    returns. Its name is SPILL_PREFIX + random: in an OUT dir, one a killed process left is a stale temp
    that the next writer holding the OUT lock removes (lock.remove_stale_temps, after an hour). Raises
    BundleError for a damaged version, InputError for a path that is not one."""
    old, new = _Version(old_dir), _Version(new_dir)
    layout = dm.KeyLayout.common(old.sizes, new.sizes)
    kind = _id_kind(old.id_type(), new.id_type())
    common = changed = 0
    if kind is not None:
        budget = matching_budget(max(old.items, new.items)) if memory_bytes is None else memory_bytes
        match = _Match(layout, kind, secrets.randbits(64), batch_rows, progress)
        match.part_bits = _part_bits(old, new, kind, budget)
        progress.stage("diff", old.items + new.items)
        with contextlib.ExitStack() as stack:
            leftovers = dp.Leftovers(match, budget, stack, SPILL_PREFIX, spill_dir)
            same = match.merge(old, new, leftovers)
            moved = leftovers.matched()
        common, changed = same + moved, moved
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


def _per_item(kind: str, id_bytes: float = 0.0) -> float:
    """Matching memory per leftover id: its hash (8 bytes) twice while grouped into slots, plus its slot
    start (8); string ids their bytes, offsets and positions too."""
    return 2 * 8 + 8 + (2 * id_bytes + 24 if kind == "bytes" else 0)


def _part_bits(old: _Version, new: _Version, kind: str, budget: int) -> int:
    """log2 of the parts needed for one part's arrays to fit `budget` were every item a leftover."""
    id_bytes = max(old.id_bytes(), new.id_bytes()) if kind == "bytes" else 0.0
    need = (old.items + new.items) * _per_item(kind, id_bytes)
    parts = max(1, math.ceil(need / max(int(budget), 1)))
    return min((parts - 1).bit_length(), MAX_PART_BITS)


class _Match:
    """How both versions' items are streamed (ids hashed with one seed, SIDs packed with one layout),
    merged in leaf order, and their leftovers spilled into parts and joined."""

    def __init__(
        self, layout: dm.KeyLayout | None, kind: str, seed: int, rows: int, progress: Progress
    ) -> None:
        self.layout, self.kind, self.seed = layout, kind, seed
        self.rows, self.progress = rows, progress
        self.words = layout.words if layout is not None else 0
        self.part_bits = 0

    def batches(self, side: _Version) -> Iterator[dp.Part]:
        """Every batch of `side`'s items as a Part (ids hashed, SIDs rebuilt from the step tables), cut at
        leaf boundaries: the items of a leaf a batch of the file ends in go with the next batch."""
        pending: tuple[int, pa.Array] | None = None
        for first, ids in side.item_batches(self.rows):
            if pending is not None:
                first, ids = pending[0], pa.concat_arrays([pending[1], ids])
            cut = self._leaf_cut(side, first, len(ids))
            pending = (first + cut, ids.slice(cut)) if cut < len(ids) else None
            if cut:
                yield self._part(side, first, ids.slice(0, cut))
        if pending is not None:
            yield self._part(side, *pending)

    def _leaf_cut(self, side: _Version, first: int, count: int) -> int:
        """Where the leaf that items first .. first+count-1 end in starts, relative to `first` (count when
        leaves are not compared or hold one item each)."""
        if self.layout is None or side.offsets is None:
            return count
        start = int(side.offsets[dm.rank_right(side.offsets, first + count - 1) - 1])
        return max(start - first, 0)

    def _part(self, side: _Version, first: int, ids: pa.Array) -> dp.Part:
        hashes, strings = dp.hash_ids(ids, self.kind, self.seed)
        if self.layout is not None:
            keys = dm.item_keys(side.starts, side.tokens, side.offsets, self.layout, first, first + len(ids))
        else:
            keys = np.zeros((len(ids), 0), dtype=np.uint64)
        return dp.Part(hashes, keys, strings)

    def merge(self, old: _Version, new: _Version, leftovers: dp.Leftovers) -> int:
        """Walk both versions' items in leaf order (leaf_merge.merge_leaves), batch by batch, each version
        read, hashed and keyed on its own helper thread: returns how many ids are under the same SID in
        both, and hands every other item to `leftovers`. Without a common layout (SIDs of different
        lengths), every item is a leftover."""
        streams = [prefetched(self.batches(side), name="zerogr-diff-read") for side in (old, new)]
        try:
            return self._merge(streams, leftovers, f"{old.items_file} / {new.items_file}")
        finally:
            for stream in streams:
                stream.close()

    def _next(self, stream: Iterator[dp.Part]) -> dp.Part | None:
        batch = next(stream, None)
        if batch is not None:
            self.progress.advance(len(batch))
        return batch

    def _merge(self, streams: list[Iterator[dp.Part]], leftovers: dp.Leftovers, where: str) -> int:
        if self.layout is None:
            for side in (0, 1):
                while (batch := self._next(streams[side])) is not None:
                    leftovers.add(side, batch)
            return 0
        empty = dp.Part(np.zeros(0, np.uint64), np.zeros((0, self.words), np.uint64), None)
        if self.kind == "bytes":
            empty.strings = (np.zeros(1, np.int64), np.zeros(0, np.uint8))
        held, final = [empty, empty], [False, False]
        last: list[tuple[int, ...] | None] = [None, None]
        same = 0
        while True:
            for s in (0, 1):
                if not len(held[s]) and not final[s]:  # used up: its next batch
                    batch = self._next(streams[s])
                    if batch is None:
                        final[s] = True
                        continue
                    if last[s] is not None and tuple(batch.keys[0]) <= last[s]:
                        raise BundleError(f"{where}: items not in leaf order (SIDs not ascending)")
                    held[s], last[s] = batch, tuple(batch.keys[-1])
            a, b = held
            try:
                got = lm.merge_leaves(
                    a.keys, a.hashes, b.keys, b.hashes, a_final=final[0], b_final=final[1],
                    a_bytes=a.strings, b_bytes=b.strings,
                )  # fmt: skip
            except ValueError as exc:
                raise BundleError(f"{where}: {exc}") from exc
            same += got.same
            leftovers.add(0, a.take(got.a_left, 0))
            leftovers.add(1, b.take(got.b_left, 0))
            if final[0] and final[1]:
                return same
            held = [a.tail(got.a_stop), b.tail(got.b_stop)]

    def spill(self, parts: list[dp.Part], where: Path) -> Path:
        """Append `parts` (one version's leftovers) to its part files under `where`. Returns `where`."""
        dp.spill(parts, where, self.part_bits)
        return where

    def load(self, where: Path, k: int) -> dp.Part:
        """Part k of the ids spilled to `where`."""
        return dp.load(where, k, 0, self.kind == "bytes")

    def join(self, a: dp.Part, b: dp.Part) -> int:
        """How many ids of the two versions' leftovers of one part are in both (id_match.match_part)."""
        return im.match_part(
            a.hashes, a.keys, b.hashes, b.keys, a_bytes=a.strings, b_bytes=b.strings, workers=MATCH_WORKERS
        ).common
