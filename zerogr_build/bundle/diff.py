"""`zerogr diff`: what changed from one version to another, exactly: the items added, removed and whose SID
changed (matched by item id), and each version's shape (items, distinct SIDs, items in shared SIDs,
fan-out per step, the first token's largest share, model tag).

Streaming, each version's items read once: the item files are read in batches, never whole; each item's
id is hashed (with a seed drawn per comparison) and its SID rebuilt from the rows above its leaves only
(the step tables and leaf offsets are memory-mapped). When both versions' hashes and packed SIDs fit the
matching budget (`memory_bytes`; by default half of what a build of the larger version holds at its
peak), they are matched in memory. Otherwise each batch is split into 2^k parts by the top bits of the
hash and appended to that part's spill files (a temporary dir, removed at the end), and then the parts
are matched one at a time: the same id lands in the same part in both versions. Matching a part groups
each side into slots by the hash's low bits and walks the two sides' slots in step (linear time). The
arithmetic is diff_math's and id_match's.
"""

from __future__ import annotations

import contextlib
import math
import secrets
import tempfile
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..base.errors import BundleError
from ..base.progress import NULL_PROGRESS, Progress
from . import diff_math as dm
from . import id_match as im
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
    counts, each version's items read once. The matching holds about `memory_bytes` (None:
    matching_budget of the larger version); more items than that are spilled, split into parts, to a
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
        part_bits = _part_bits(old, new, layout, kind, budget)
        sides = (old, new)
        match = _Match(layout, kind, part_bits, secrets.randbits(64), batch_rows, progress)
        if part_bits == 0:
            progress.stage("diff", old.items + new.items)
            counts = match.join(*(match.in_memory(side) for side in sides))
        else:
            with tempfile.TemporaryDirectory(prefix=SPILL_PREFIX, dir=spill_dir) as tmp:
                progress.stage(f"diff: spill {1 << part_bits} parts", old.items + new.items)
                spilled = [
                    match.spill(side, Path(tmp) / name) for side, name in zip(sides, "ab", strict=True)
                ]
                progress.stage("diff: match", 1 << part_bits)
                counts = im.MatchCounts(0, 0)
                for k in range(1 << part_bits):
                    got = match.join(*(match.load(where, k) for where in spilled))
                    counts = im.MatchCounts(counts.common + got.common, counts.changed + got.changed)
                    progress.advance(1)
        common, changed = counts.common, counts.changed
        if layout is None:
            changed = common  # SIDs of different lengths: every common item's SID changed
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


def _part_bits(old: _Version, new: _Version, layout: dm.KeyLayout | None, kind: str, budget: int) -> int:
    """log2 of the parts needed for one part's arrays to fit `budget`: per item its hash (8 bytes) and
    packed SID (8 per word), twice while grouped into slots, plus the slot starts (8); string ids their
    bytes, offsets and positions too."""
    words = layout.words if layout is not None else 0
    per_item = 2 * (8 + 8 * words) + 8
    if kind == "bytes":
        per_item += 2 * max(old.id_bytes(), new.id_bytes()) + 24
    need = (old.items + new.items) * per_item
    parts = max(1, math.ceil(need / max(int(budget), 1)))
    return min((parts - 1).bit_length(), MAX_PART_BITS)


@dataclass
class _Part:
    """One version's ids of one part: hashes uint64 [n], packed SIDs uint64 [n, W] (W = 0: not
    compared), and for string ids their (offsets int64 [n+1], data uint8)."""

    hashes: np.ndarray
    keys: np.ndarray
    strings: tuple[np.ndarray, np.ndarray] | None


class _Match:
    """How both versions' ids are hashed, split into parts, spilled and joined (the same for both)."""

    def __init__(
        self, layout: dm.KeyLayout | None, kind: str, part_bits: int, seed: int, rows: int, progress: Progress
    ) -> None:
        self.layout, self.kind, self.part_bits, self.seed = layout, kind, part_bits, seed
        self.rows, self.progress = rows, progress
        self.words = layout.words if layout is not None else 0

    def batches(self, side: _Version) -> Iterator[_Part]:
        """Every batch of `side`'s items as a _Part (ids hashed, SIDs rebuilt from the step tables)."""
        for first, ids in side.item_batches(self.rows):
            strings = None
            if self.kind == "bytes":
                strings = _byte_buffers(ids.cast(pa.large_binary()))
                hashes = im.hash_byte_ids(*strings, self.seed)
            else:
                hashes = im.hash_int_ids(_int_values(ids, self.kind), self.seed)
            if self.layout is not None:
                keys = dm.item_keys(
                    side.starts, side.tokens, side.offsets, self.layout, first, first + len(ids)
                )
            else:
                keys = np.zeros((len(ids), 0), dtype=np.uint64)
            yield _Part(hashes, keys, strings)
            self.progress.advance(len(ids))

    def in_memory(self, side: _Version) -> _Part:
        """All of `side`'s ids as one part."""
        return _concat(list(self.batches(side)), self.words)

    def spill(self, side: _Version, where: Path) -> Path:
        """Write `side`'s ids into one set of files per part under `where` (created): hashes, SIDs, and
        for string ids their lengths and bytes. Returns `where`."""
        where.mkdir()
        parts = 1 << self.part_bits
        names = ("hashes", "keys", "lengths", "data") if self.kind == "bytes" else ("hashes", "keys")
        with contextlib.ExitStack() as stack:
            files = [
                [stack.enter_context(open(where / f"{k}.{n}", "wb")) for n in names] for k in range(parts)
            ]
            for batch in self.batches(side):
                part = im.part_of(batch.hashes, self.part_bits)
                order = np.argsort(part, kind="stable")
                bounds = np.searchsorted(part[order], np.arange(parts + 1), side="left")
                hashes, keys = batch.hashes[order], batch.keys[order]
                if batch.strings is not None:
                    offsets, data = batch.strings
                    lengths = np.diff(offsets)[order]
                    data = _gather_bytes(offsets, data, order)
                    ends = np.concatenate([[0], np.cumsum(lengths)])
                for k in range(parts):
                    lo, hi = bounds[k], bounds[k + 1]
                    if lo == hi:
                        continue
                    files[k][0].write(memoryview(hashes[lo:hi]).cast("B"))
                    if self.words:
                        files[k][1].write(memoryview(np.ascontiguousarray(keys[lo:hi])).cast("B"))
                    if batch.strings is not None:
                        files[k][2].write(memoryview(lengths[lo:hi]).cast("B"))
                        files[k][3].write(memoryview(data[ends[lo] : ends[hi]]).cast("B"))
        return where

    def load(self, where: Path, k: int) -> _Part:
        """Part k of the ids spilled to `where`."""
        hashes = np.fromfile(where / f"{k}.hashes", dtype=np.uint64)
        keys = np.fromfile(where / f"{k}.keys", dtype=np.uint64).reshape(hashes.shape[0], self.words)
        strings = None
        if self.kind == "bytes":
            lengths = np.fromfile(where / f"{k}.lengths", dtype=np.int64)
            offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
            strings = (offsets, np.fromfile(where / f"{k}.data", dtype=np.uint8))
        return _Part(hashes, keys, strings)

    def join(self, a: _Part, b: _Part) -> im.MatchCounts:
        """The two versions' ids of one part matched (id_match.match_part)."""
        return im.match_part(a.hashes, a.keys, b.hashes, b.keys, a_bytes=a.strings, b_bytes=b.strings)


def _concat(batches: list[_Part], words: int) -> _Part:
    """One _Part of several (string ids: their offsets joined)."""
    hashes = np.concatenate([b.hashes for b in batches]) if batches else np.zeros(0, dtype=np.uint64)
    keys = np.concatenate([b.keys for b in batches]) if batches else np.zeros((0, words), dtype=np.uint64)
    strings = None
    if batches and batches[0].strings is not None:
        lengths = np.concatenate([np.diff(b.strings[0]) for b in batches if b.strings is not None])
        offsets = np.concatenate([np.zeros(1, dtype=np.int64), np.cumsum(lengths)])
        data = np.concatenate(
            [b.strings[1][b.strings[0][0] : b.strings[0][-1]] for b in batches if b.strings]
        )
        strings = (offsets, data)
    return _Part(hashes, keys, strings)


def _gather_bytes(offsets: np.ndarray, data: np.ndarray, order: np.ndarray) -> np.ndarray:
    """uint8: the strings offsets/data in `order`, end to end."""
    strings = pa.LargeBinaryArray.from_buffers(
        pa.large_binary(), offsets.shape[0] - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    )
    taken_offsets, taken_data = _byte_buffers(strings.take(pa.array(order)))
    return taken_data[taken_offsets[0] : taken_offsets[-1]]


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
