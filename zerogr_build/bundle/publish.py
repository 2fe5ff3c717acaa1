"""Publishing bundles: write a version under a temp name, rename it into place, replace LATEST, prune;
and `promote_bundle`, which points LATEST at a version published without promoting it (after the
caller's checks). The OUT dir's versions are versions.py's; adding files to a published version is
amend.py's.

Protocol (docs/bundle-format.md, "Publishing"):
  1. under the OUT lock: remove stale temps, claim OUT/.tmp-<tag>/ (a flock'd claim file beside it)
  2. without the lock: write every array and items.parquet into it, hashing while writing, fsync each
  3. under the OUT lock: allocate the version (1 + max of counter, version dirs, LATEST), write
     manifest.json, fsync, rename .tmp-<tag> -> vNNNNNN, fsync OUT, record the counter, replace LATEST
     (temp + rename; skipped with promote=False), prune beyond `keep`, release the claim.
Only a rename makes anything visible, so a crash at any point leaves complete versions only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..base.threads import prefetched
from ..index.tables import leaf_map_dtype
from .amend import recover_journal, recover_journals
from .files import HashingFile, _crash_point, atomic_replace_bytes, fsync_dir, write_bytes_durable, write_npy
from .format import (
    COUNTER_NAME,
    FORMAT_NAME,
    FORMAT_VERSION,
    ITEM_COLUMN,
    ITEMS_NAME,
    LEAF_OFFSETS_NAME,
    MANIFEST_NAME,
    check_relpath,
    dtype_str,
    manifest_bytes,
    parse_version_dir,
    step_file_name,
    validate_manifest,
    version_dir_name,
)
from .lock import BuildClaim, out_lock, remove_stale_temps
from .reader import open_bundle
from .versions import next_version, prune_versions, replace_latest

# Manifest keys the writer owns; manifest_fields may not set them.
RESERVED_FIELDS = frozenset(
    {
        "format",
        "format_version",
        "version",
        "created_at",
        "num_steps",
        "codebook_sizes",
        "steps",
        "leaves",
        "files",
    }
)
WRITE_THREADS = 4

#: Rows per row group of items.parquet: pyarrow's default for pq.write_table, kept so bundles written
#: before and after the row-group-at-a-time writer are byte-identical.
ITEMS_ROW_GROUP_ROWS = 1024 * 1024


@dataclass(frozen=True)
class PublishedBundle:
    """A version that is now visible: its dir, version number and manifest, and whether LATEST names it."""

    path: Path
    version: int
    manifest: dict
    promoted: bool = True


def publish_bundle(
    index,
    item_ids,
    out_dir: str | Path,
    *,
    manifest_fields: Mapping[str, Any] | None = None,
    keep: int | None = None,
    promote: bool = True,
    progress: Progress = NULL_PROGRESS,
    extra_files: Mapping[str, bytes] | None = None,
) -> PublishedBundle:
    """Write `index` and its items as the next version under `out_dir` and (with promote) make it LATEST.

    index: SidIndex from build_index (item_order required: catalog row of each leaf-order item).
    item_ids: pyarrow Array or ChunkedArray [N] in catalog row order; stored in leaf order, type kept.
        items.parquet is written one row group at a time, each gathered as it is written
        (write_items_in_leaf_order), so no leaf-order copy of all ids is ever held.
    manifest_fields: model_version (str|None), catalog {path, fingerprint, rows, distinct_sids},
        settings (dict or dataclass, JSON-serialisable; Paths become strings), and any extra
        non-reserved keys, copied into manifest.json.
    keep: prune to the newest `keep` versions afterwards (never the one LATEST names); None keeps all.
    promote: False publishes the complete version dir (same numbering and crash safety) but leaves LATEST
        alone, so readers following LATEST never see it until promote_bundle(path) after your own checks.
    extra_files: {bundle-relative name: bytes} written into the version with the index and listed with
        checksums in its manifest before it becomes visible (the build's compiled ``kernels/<arch>/*``).
    """
    if index.item_order is None:
        raise ValueError("publish_bundle needs an index with item_order (one built by build_index)")
    if len(item_ids) != index.num_items:
        raise InputError(f"{len(item_ids)} item ids given for an index of {index.num_items} items")
    if keep is not None and (isinstance(keep, bool) or int(keep) < 1):
        raise InputError(f"--keep must be >= 1, got {keep}")
    fields = dict(manifest_fields or {})
    clash = RESERVED_FIELDS & set(fields)
    if clash:
        raise ValueError(f"manifest_fields may not set {sorted(clash)}")

    if isinstance(item_ids, pa.ChunkedArray):
        item_ids = item_ids.combine_chunks()
    return publish_version(
        out_dir,
        lambda tmp: _write_body(tmp, index, item_ids, progress),
        lambda files: bundle_manifest(index, item_ids.type, fields, files),
        keep=keep,
        promote=promote,
        extra_files=extra_files,
    )


def publish_version(
    out_dir: str | Path,
    write_files: Callable[[Path], dict[str, dict]],
    manifest_for: Callable[[dict[str, dict]], dict],
    *,
    keep: int | None = None,
    promote: bool = True,
    extra_files: Mapping[str, bytes] | None = None,
) -> PublishedBundle:
    """The publish protocol (module docstring) around any writer of a version's data files.

    write_files(tmp): writes every data file into the claimed temp dir `tmp` and returns {name: {bytes,
        sha256}}. manifest_for(files): the manifest without format, format_version and version
        (bundle_manifest), given every file written (extra_files included).
    keep, promote, extra_files: as publish_bundle takes them.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with out_lock(out):
        remove_stale_temps(out)
        recover_journals(out)
        claim = BuildClaim(out)
    try:
        _crash_point("claimed")
        files = write_files(claim.dir)
        files = dict(sorted({**files, **_write_extra(claim.dir, extra_files or {})}.items()))
        _crash_point("files_written")
        manifest = manifest_for(files)
        with out_lock(out):
            version = next_version(out)
            manifest = {
                "format": FORMAT_NAME,
                "format_version": FORMAT_VERSION,
                "version": version,
                **manifest,
            }
            validate_manifest(manifest, "manifest being written")
            write_bytes_durable(claim.dir / MANIFEST_NAME, manifest_bytes(manifest))
            fsync_dir(claim.dir)
            _crash_point("manifest_written")
            final = out / version_dir_name(version)
            os.rename(claim.dir, final)
            fsync_dir(out)
            _crash_point("renamed")
            atomic_replace_bytes(out / COUNTER_NAME, f"{version}\n".encode())
            if promote:
                replace_latest(out, final.name)
                _crash_point("latest_replaced")
            if keep is not None:
                # The new version has the highest number in OUT (allocated in this same lock hold), so
                # keep >= 1 never prunes it, promoted or not; prune_versions spares LATEST's version.
                prune_versions(out, int(keep))
            claim.release()
    except BaseException:
        with out_lock(out):
            claim.release()
        raise
    return PublishedBundle(path=final, version=version, manifest=manifest, promoted=bool(promote))


def write_items_in_leaf_order(
    sink: Any, item_ids: pa.Array, item_order: np.ndarray, rows_per_group: int = ITEMS_ROW_GROUP_ROWS
) -> None:
    """Write items.parquet (one column, ITEM_COLUMN) into `sink`: item_ids [N] (catalog row order, any
    type) in leaf order, i.e. item_ids.take(item_order), one row group of `rows_per_group` at a time.

    item_order: int32|int64 [N], the catalog row of each leaf-order position (SidIndex.item_order).

    Why per row group: a whole-array take holds a second copy of every id (8 bytes per item for int64, all
    the string bytes for strings), and permuting in place instead follows the permutation's cycles, a chain
    of dependent cache misses (10x slower at 20M items). A take of one row group's positions is a gather
    whose loads are independent, and only that group's ids exist twice. The row groups are the ones
    pq.write_table makes by default, so the file is the same as writing the whole leaf-order array.
    """
    groups = (
        item_ids.take(pa.array(item_order[start : start + rows_per_group]))
        for start in range(0, len(item_order), rows_per_group)
    )
    with (
        contextlib.closing(prefetched(groups, name="zerogr-items-gather")) as gathered,
        ItemsWriter(sink, item_ids.type, rows_per_group) as writer,
    ):
        for group in gathered:  # the next group's gather (Arrow, GIL released) overlaps this one's write
            writer.append(group)


class ItemsWriter:
    """items.parquet (one column, ITEM_COLUMN, of `item_type`) written into `sink` from its ids in leaf
    order, appended in pieces of any length: every `rows_per_group` ids become one row group, the last one
    the rest; no ids at all, an empty items table. So the same ids give the same bytes however they were
    cut into pieces (a local build's row groups, a partitioned build's partitions)."""

    def __init__(self, sink: Any, item_type: pa.DataType, rows_per_group: int = ITEMS_ROW_GROUP_ROWS) -> None:
        schema = pa.schema([pa.field(ITEM_COLUMN, item_type)])
        # Item ids are mostly unique: dictionary pages would only cost time.
        self._writer = pq.ParquetWriter(sink, schema, use_dictionary=False, compression="snappy")
        self.item_type, self.rows_per_group = item_type, rows_per_group
        self._pending: list[pa.Array] = []
        self._pending_rows = 0
        self.rows = 0

    def append(self, ids: pa.Array) -> None:
        """Add the next ids (leaf order); full row groups are written at once, and no view of `ids` is kept
        afterwards (the caller may release its memory)."""
        start = 0
        while self._pending_rows + len(ids) - start >= self.rows_per_group:
            take = self.rows_per_group - self._pending_rows
            self._write([*self._pending, ids.slice(start, take)])
            start += take
        if start < len(ids):  # the tail waits for the next ids: copied, so no view of `ids` is kept
            self._pending.append(pa.concat_arrays([ids.slice(start), ids.slice(0, 0)]))
            self._pending_rows += len(ids) - start

    def _write(self, pieces: list[pa.Array]) -> None:
        group = pieces[0] if len(pieces) == 1 else pa.concat_arrays(pieces)
        self._writer.write_table(pa.table({ITEM_COLUMN: group}), row_group_size=self.rows_per_group)
        self.rows += len(group)
        self._pending, self._pending_rows = [], 0

    def close(self) -> None:
        """Write the last row group (or the empty table) and the footer."""
        if self._pending_rows or self.rows == 0:
            self._write(self._pending or [pa.array([], type=self.item_type)])
        self._writer.close()

    def __enter__(self) -> ItemsWriter:
        return self

    def __exit__(self, kind: object, *exc: object) -> None:
        if kind is None:
            self.close()
        else:
            self._writer.close()


def _write_body(tmp: Path, index, items: pa.Array, progress: Progress) -> dict[str, dict]:
    """Write every data file into `tmp` on a few threads (numpy writes and sha256 release the GIL).
    items: the item ids [N] in catalog row order (items.parquet stores them in leaf order).

    Returns {name: {bytes, sha256}} of every file written."""
    jobs: list[tuple[str, Any]] = []
    for table in index.steps:
        for role, array in table.arrays().items():
            jobs.append((step_file_name(table.step, role), array))
    offsets_dtype = leaf_map_dtype(index.num_leaves, index.num_items)
    if offsets_dtype is not None:  # None: leaf j is item j, nothing to store
        jobs.append((LEAF_OFFSETS_NAME, np.asarray(index.leaf_offsets, dtype=offsets_dtype)))

    def write_items() -> tuple[int, str]:
        sink = HashingFile(tmp / ITEMS_NAME)
        try:
            write_items_in_leaf_order(sink, items, np.asarray(index.item_order))
        finally:
            sink.close()
        return sink.bytes, sink.hexdigest()

    total = sum(int(np.asarray(a).nbytes) for _, a in jobs) + int(items.nbytes)
    progress.stage("write", total)
    files: dict[str, dict] = {}
    with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, os.cpu_count() or 1)) as pool:
        futures = {pool.submit(write_items): (ITEMS_NAME, int(items.nbytes))}
        for name, array in jobs:
            futures[pool.submit(write_npy, tmp / name, array)] = (name, int(np.asarray(array).nbytes))
        for future, (name, nbytes) in futures.items():
            size, digest = future.result()
            files[name] = {"bytes": size, "sha256": digest}
            progress.advance(nbytes)
            _crash_point("file_written")
    return dict(sorted(files.items()))


def _write_extra(tmp: Path, files: Mapping[str, bytes]) -> dict[str, dict]:
    """Write extra files (names check_relpath'd, never an index file's name) durably into `tmp`."""
    entries: dict[str, dict] = {}
    for rel, data in files.items():
        name = check_relpath(rel, "publish_bundle extra_files")
        target = tmp / name
        if target.exists():
            raise ValueError(f"extra file {name} would replace a file of the index")
        target.parent.mkdir(parents=True, exist_ok=True)
        size, digest = write_bytes_durable(target, bytes(data))
        entries[name] = {"bytes": size, "sha256": digest}
    return entries


def bundle_manifest(index, item_type: pa.DataType, fields: Mapping[str, Any], files: dict[str, dict]) -> dict:
    """The manifest of a version without format, format_version and version (publish_version adds them
    under the OUT lock).

    index: a SidIndex, or any object with the same shape attributes (codebook_sizes, num_steps,
        num_leaves, num_items, index_bytes, and steps with step, format, codebook_size, rows, nnz,
        max_slots, valid_share, nbytes and dtypes()), such as a version assembled from partitions.
    item_type: the type of the item ids stored in items.parquet. fields: manifest_fields (publish_bundle).
    files: {name: {bytes, sha256}} of every file of the version.
    """
    fields = dict(fields)
    offsets_dtype = leaf_map_dtype(index.num_leaves, index.num_items)
    leaf_files = {"items": ITEMS_NAME} if offsets_dtype is None else {"offsets": LEAF_OFFSETS_NAME}
    leaf_files.setdefault("items", ITEMS_NAME)  # v1 order kept: offsets first when present
    steps = []
    for table in index.steps:
        dtypes = table.dtypes()
        steps.append(
            {
                "step": table.step,
                "format": table.format,
                "codebook_size": int(table.codebook_size),
                "rows": int(table.rows),
                "nnz": int(table.nnz),
                "max_slots": int(table.max_slots),
                "valid_share": float(table.valid_share),
                "bytes": int(table.nbytes),
                "dtypes": {role: dtype_str(dtype) for role, dtype in dtypes.items()},
                "files": {role: step_file_name(table.step, role) for role in dtypes},
            }
        )
    catalog = {"path": None, "fingerprint": None, "rows": index.num_items, "distinct_sids": index.num_leaves}
    catalog.update(fields.pop("catalog", None) or {})
    settings = fields.pop("settings", None) or {}
    if dataclasses.is_dataclass(settings):
        settings = dataclasses.asdict(settings)
    manifest = {
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        "model_version": fields.pop("model_version", None),
        "catalog": catalog,
        "num_steps": index.num_steps,
        "codebook_sizes": [int(v) for v in index.codebook_sizes],
        "steps": steps,
        "leaves": {
            "count": index.num_leaves,
            "items": index.num_items,
            "dtype": offsets_dtype,
            "item_id_type": str(item_type),
            "files": leaf_files,
        },
        "index_bytes": int(index.index_bytes),
        "settings": json.loads(json.dumps(settings, default=str)),
        **fields,
        "files": files,
    }
    return manifest


def promote_bundle(version_dir: str | Path) -> Path:
    """Point OUT/LATEST at `version_dir`, a published version OUT/vNNNNNN (e.g. one published with
    promote=False and checked since). Returns the version dir.

    Under the OUT lock an interrupted add_bundle_files in it is rolled forward, the version is opened
    without hashing (manifest valid, every listed file present with its size and array header) and
    LATEST is replaced atomically as publish_bundle replaces it, so readers see the old or the new
    LATEST. Any version may be named, an older one included (pinning).
    Raises InputError when `version_dir` is not a version dir with a manifest (or has been pruned),
    BundleError when it is incomplete or corrupt; LATEST is unchanged then.
    """
    vdir = Path(version_dir)
    if parse_version_dir(vdir.name) is None or not vdir.is_dir() or not (vdir / MANIFEST_NAME).is_file():
        raise InputError(f"{vdir}: not a version dir of an OUT dir (OUT/vNNNNNN with a {MANIFEST_NAME})")
    out = vdir.parent
    with out_lock(out):
        if not (vdir / MANIFEST_NAME).is_file():  # pruned or deleted since the check above
            raise InputError(f"{vdir}: no longer a version dir (pruned or deleted)")
        recover_journal(vdir)  # an interrupted add_bundle_files (tune) is completed first, as writers do
        open_bundle(vdir, verify_checksums=False)
        replace_latest(out, vdir.name)
    return vdir
