"""A partitioned build, driven from one process on any engine (docs/scaling.md, "When one machine is not
enough"): map tasks read the catalog's row groups, the driver cuts first-token ranges into partitions,
split tasks route every row to its partition through the engine's object store (never through the
driver), one task per partition builds it with the local builder, and the driver writes the version
partition by partition through the local publish protocol. The engine is anything with `Engine`'s
methods (distributed.ray_engine adapts Ray); the task bodies are distributed.tasks'.

The driver holds counts (first-token counts, P x L prefix counts) and one array of one partition at a
time; every error is the local build's, from the same row (the first bad row group in catalog order,
then the lowest row whose item id repeats a lower one).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pyarrow as pa

from ..base.errors import InputError, ZerogrError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle.files import _crash_point
from ..bundle.publish import PublishedBundle, bundle_manifest, publish_version
from ..catalog.files import file_digest, locate_catalog
from ..catalog.plan import check_codebook_sizes, read_footers, sid_layout
from ..catalog.reader import describe_row
from ..catalog.row_groups import plan_row_groups
from ..catalog.storage import changed_error
from ..config import BuildSettings
from ..index.formats import FormatPolicy, parse_step_formats
from ..index.pack import packable, word_bits
from ..index.partition import cut_bounds, heavy_first_tokens, partition_shifts, partition_sizes, second_size
from . import tasks
from .assemble import index_shape, place_partitions, write_version_files

#: Bytes a partition's build holds per item at its peak (pieces 18, sort words 8, first-diff 1, tables
#: ~8, item order 4, items in leaf order 8, allocator slack): what a partition task asks the engine for.
PARTITION_BYTES_PER_ITEM = 56


class ClusterError(ZerogrError):
    """The cluster could not be reached or failed during the build: retry (CLI exit code 3)."""

    exit_code = 3


class Engine(Protocol):
    """What the driver needs from an engine. Handles (`refs`) are the engine's own futures."""

    name: str

    def cpus(self) -> int:
        """CPUs the cluster offers (the default partition count)."""

    def largest_node_memory(self) -> int | None:
        """Bytes the largest worker node offers to tasks, or None when unknown."""

    def submit(self, fn: Callable[..., Any], *args: Any, num_returns: int = 1, memory: int = 0) -> Any:
        """Run fn(*args) as a task (handles among args are resolved to their values); returns one handle,
        or a list of num_returns handles, one per element of the list fn returns."""

    def get(self, ref: Any) -> Any:
        """The value behind a handle (blocks). Engine failures raise ZerogrError subclasses."""


@dataclass
class PartitionedBuild:
    """What a partitioned build published and measured (pipeline turns it into the build summary)."""

    published: PublishedBundle
    rows: int
    distinct_sids: int
    shared_sids: int
    items_in_shared_sids: int
    codebook_sizes: tuple[int, ...]
    codebook_inferred: bool
    catalog: dict[str, Any]
    timings: dict[str, float]
    engine: dict[str, Any]


def build_partitioned(
    catalog_path: str,
    settings: BuildSettings,
    codebook_sizes: Sequence[int] | None,
    engine: Engine,
    *,
    manifest_fields: dict[str, Any],
    kernel_files: Callable[[], dict[str, bytes]],
    on_inferred: Callable[[tuple[int, ...]], None] = lambda sizes: None,
    policy: FormatPolicy | None = None,
    progress: Progress = NULL_PROGRESS,
) -> PartitionedBuild:
    """Read, validate and index `catalog_path` on `engine` in settings.partitions partitions (0: one per
    CPU of the cluster) and publish the version under settings.out, byte for byte the local build's.

    codebook_sizes: the sizes given, or None to infer them (on_inferred is called with them).
    manifest_fields: model_version and settings for the manifest (the catalog facts are added here).
    kernel_files: the compiled kernels the version ships, asked for once the catalog is known good.
    Raises InputError (exit 2) for bad input, naming the lowest bad row as the local build does; nothing
    is published then."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    sizes = check_codebook_sizes(codebook_sizes)
    layout = sid_layout(settings.sid_column, settings.sid_columns or None)
    store, files = locate_catalog(catalog_path)
    facts = read_footers(
        store, files, layout, settings.sid_column, settings.item_column, settings.workers or None
    )
    total_rows = facts.total_rows
    if total_rows == 0:
        raise InputError(f"{catalog_path}: empty catalog (no rows in {len(files)} file(s))")
    groups, footer_error = plan_row_groups(files, facts.file_rows, facts.group_rows)
    digests = [engine.submit(file_digest, name, store) for name in files]
    spec = tasks.ReadSpec(store, facts.layout, settings.item_column, facts.item_type, sizes)
    stamp_of = dict(zip(files, facts.stamps, strict=True))

    # 1. Map: read, validate and count every row group (the first ones alone until the SID length is known).
    progress.stage("read", total=total_rows)
    num_steps = facts.layout.fixed_length
    summaries: list[tasks.BlockSummary] = []
    blocks: list[Any] = []
    first = 0
    while first < len(groups) and num_steps is None:
        summary_ref, block_ref = engine.submit(
            tasks.read_block, spec, groups[first], stamp_of[groups[first].name], None, num_returns=2
        )
        summary = _checked(engine.get(summary_ref))
        summaries.append(summary)
        blocks.append(block_ref)
        num_steps = summary.num_steps
        progress.advance(summary.rows)
        first += 1
    pending = [
        engine.submit(tasks.read_block, spec, g, stamp_of[g.name], num_steps, num_returns=2)
        for g in groups[first:]
    ]
    for summary_ref, block_ref in pending:
        summary = _checked(engine.get(summary_ref))
        summaries.append(summary)
        blocks.append(block_ref)
        progress.advance(summary.rows)
    del pending
    if footer_error is not None:
        raise footer_error
    if num_steps is None:
        raise InputError(f"{catalog_path}: empty catalog (no SIDs)")
    inferred = sizes is None
    if sizes is None:
        maxima = np.max([s.step_max for s in summaries if s.step_max is not None], axis=0)
        sizes = tuple(int(m) + 1 for m in maxima)
        on_inferred(sizes)
    formats = parse_step_formats(settings.step_formats, len(sizes))
    _crash_point("ray_read")
    timings["read"] = time.perf_counter() - t

    # 2. Cut first-token ranges (two-token ranges inside first tokens heavier than one partition).
    t = time.perf_counter()
    parts = max(1, settings.partitions or engine.cpus())
    first_tokens, first_counts = _sum_counts(summaries)
    heavy = heavy_first_tokens(first_tokens, first_counts, parts, len(sizes))
    heavy_counts = None
    if heavy.size:
        v1 = second_size(sizes)
        refs = [
            engine.submit(tasks.second_counts, block, heavy, v1)
            for block, s in zip(blocks, summaries, strict=True)
            if s.rows
        ]
        heavy_counts = sum((engine.get(ref) for ref in refs), np.zeros((heavy.shape[0], v1), dtype=np.int64))
    bounds = cut_bounds(first_tokens, first_counts, parts, sizes, heavy_counts)
    rows_per_partition = partition_sizes(first_tokens, first_counts, bounds, sizes, heavy_counts)
    largest = int(rows_per_partition.max())
    one_word = packable(largest, sizes, word_bits())
    _check_memory(engine, largest, parts, int(rows_per_partition.sum()))

    # 3. Shuffle: every block split into P partition pieces and P duplicate-check buckets.
    shifts = partition_shifts(rows_per_partition, sizes) if one_word else None
    split_refs: list[list[Any]] = []
    row0 = 0
    for block, summary in zip(blocks, summaries, strict=True):
        if summary.rows:
            split_refs.append(
                engine.submit(
                    tasks.split_block, block, row0, bounds, sizes, shifts, parts, num_returns=2 * parts
                )
            )
        row0 += summary.rows
    del blocks
    item_type = facts.item_type
    if pa.types.is_string(item_type) and sum(s.id_bytes for s in summaries) > 2**31 - 1:
        item_type = pa.large_string()  # as the local read's concatenation falls back to it

    # 4. Build every non-empty partition; check duplicate ids meanwhile.
    kill_marker = os.environ.get(tasks.KILL_WORKER_ENV, "")
    built: list[list[Any] | None] = []
    for p in range(parts):
        if rows_per_partition[p] == 0:
            built.append(None)
            continue
        pieces = [refs[p] for refs in split_refs]
        memory = PARTITION_BYTES_PER_ITEM * int(rows_per_partition[p])
        built.append(
            engine.submit(
                tasks.build_partition,
                sizes,
                item_type,
                kill_marker,
                *pieces,
                num_returns=2 * len(sizes) + 2,
                memory=memory,
            )
        )
    repeats = [
        engine.submit(tasks.find_repeat, *[refs[parts + d] for refs in split_refs]) for d in range(parts)
    ]
    del split_refs
    checked = [engine.get(ref) for ref in repeats]
    _raise_first_repeat([hit for hit, _ in checked], files, facts.file_rows, settings.item_column)
    fingerprint = _fingerprint(engine, digests, files, facts.stamps)
    partition_summaries = [None if refs is None else engine.get(refs[0]) for refs in built]
    _crash_point("ray_built")
    timings["build"] = time.perf_counter() - t

    # 5. Assemble and publish, partition by partition.
    t = time.perf_counter()
    placement = place_partitions(partition_summaries, len(sizes))
    shape = index_shape(partition_summaries, placement, sizes, formats, policy or FormatPolicy())
    catalog_info = {
        "path": str(catalog_path),
        "fingerprint": fingerprint,
        "rows": total_rows,
        "distinct_sids": shape.num_leaves,
        "files": len(files),
        "codebook_inferred": inferred,
    }
    fields = {**manifest_fields, "catalog": catalog_info}
    extra_files = kernel_files()

    def fetch(p: int, k: int) -> Any:
        refs = built[p]
        assert refs is not None
        ref, refs[k] = refs[k], None  # fetched once: dropping the handle lets the engine free the object
        return engine.get(ref)

    published = publish_version(
        settings.out,
        lambda tmp: write_version_files(
            tmp, shape, placement, partition_summaries, fetch, item_type, progress
        ),
        lambda written: bundle_manifest(shape, item_type, fields, written),
        keep=settings.keep or None,
        promote=settings.promote,
        extra_files=extra_files,
    )
    timings["publish"] = time.perf_counter() - t
    present = [s for s in partition_summaries if s is not None]
    return PartitionedBuild(
        published=published,
        rows=total_rows,
        distinct_sids=shape.num_leaves,
        shared_sids=sum(s.shared_sids for s in present),
        items_in_shared_sids=sum(s.items_in_shared_sids for s in present),
        codebook_sizes=sizes,
        codebook_inferred=inferred,
        catalog=catalog_info,
        timings=timings,
        engine={
            "name": engine.name,
            "partitions": parts,
            "partition_rows": [int(n) for n in rows_per_partition],
            "one_word_keys": bool(one_word),
            "cut_inside_first_token": bool(placement.continues.any()),
            "shuffle_bytes": sum(s.received_bytes for s in present) + sum(size for _, size in checked),
        },
    )


def _checked(summary: tasks.BlockSummary) -> tasks.BlockSummary:
    if summary.error is not None:
        raise InputError(summary.error)
    return summary


def _sum_counts(summaries: Sequence[tasks.BlockSummary]) -> tuple[np.ndarray, np.ndarray]:
    """(first tokens present int64 [U] ascending, their item counts int64 [U]) over every block."""
    tokens = np.concatenate([s.first_tokens for s in summaries])
    counts = np.concatenate([s.first_counts for s in summaries])
    present, where = np.unique(tokens, return_inverse=True)
    return present, np.bincount(where, weights=counts, minlength=present.shape[0]).astype(np.int64)


def _check_memory(engine: Engine, largest: int, parts: int, total: int) -> None:
    """InputError (exit 2) when the largest partition needs more memory than any node offers."""
    available = engine.largest_node_memory()
    need = PARTITION_BYTES_PER_ITEM * largest
    if available is None or need <= available:
        return
    enough = max(parts + 1, -(-PARTITION_BYTES_PER_ITEM * total // max(available, 1)))
    raise InputError(
        f"the largest partition holds {largest:,} items, about {need / 2**30:.2f} GiB to build, but the "
        f"largest node of the {engine.name} cluster offers {available / 2**30:.2f} GiB to tasks: raise "
        f"--partitions (now {parts}) to at least {enough}, or add memory"
    )


def _raise_first_repeat(found: list[Any], files: list[str], file_rows: list[int], item_column: str) -> None:
    """The local build's duplicate-id error for the lowest repeated row over all buckets, if any."""
    hits = [hit for hit in found if hit is not None]
    if not hits:
        return
    row, first_row, item = min(hits, key=lambda hit: hit[0])
    starts = np.cumsum([0, *file_rows])

    def locate(global_row: int) -> tuple[str, int]:
        k = int(np.searchsorted(starts, global_row, side="right")) - 1
        return files[k], global_row - int(starts[k])

    name, file_row = locate(row)
    first_name, first_file_row = locate(first_row)
    raise InputError(
        f"{name}: column {item_column!r}, {describe_row(file_row, item)}: duplicate item id "
        f"(first seen at row {first_file_row} of {first_name})"
    )


def _fingerprint(engine: Engine, digests: list[Any], files: list[str], stamps: list[Any]) -> str:
    """The catalog fingerprint from the per-file digest tasks; a file hashed with another stamp than its
    footer was read with changed during the build (InputError)."""
    inner = []
    for name, ref, stamp in zip(files, digests, stamps, strict=True):
        digest, seen = engine.get(ref)
        if seen != stamp:
            raise changed_error(name)
        inner.append(digest)
    return tasks.fingerprint_from_digests(inner)
