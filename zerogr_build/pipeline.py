"""`zerogr build`, `inspect` and `verify` as library calls: build_bundle (read_catalog -> build_index ->
publish_bundle -> optionally the caller's load_to_device), inspect_bundle and verify_with_catalog, plus
the per-step summary rows that build and inspect report.

Library code: never prints. Inferred codebook sizes are reported with `warnings.warn` (the CLI shows it on
stderr as soon as the catalog is read); long work reports through `progress`.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from .base.compile_notice import on_first_compile
from .base.device import check_device
from .base.errors import InputError
from .base.memlimit import memory_limit, physical_memory_bytes  # noqa: F401 - physical_memory_bytes: public here
from .base.progress import NULL_PROGRESS, Progress
from .config import INFER_CODEBOOK_SIZES, BuildSettings, load_settings
from .cuda.cache import bundle_kernel_files

if TYPE_CHECKING:
    from .bundle.files import HashCache
    from .bundle.witness import BuildWitness, KeepWitness
    from .catalog import Catalog
    from .index import SidIndex


class KernelsSkippedWarning(UserWarning):
    """nvcc is missing or failed: the bundle ships no compiled kernels (serving compiles with NVRTC)."""


class KernelCompileWarning(UserWarning):
    """The build's numba kernels are being compiled (first run on this machine or after an upgrade; they
    are cached on disk afterwards), so this run's time and items/s include compiling."""


def _warn_compiling(kernel: str) -> None:
    warnings.warn(
        f"compiling the build kernels (numba, first run here: {kernel} ...); they are cached for later runs, "
        "so this run's time and items/s include the compile",
        KernelCompileWarning,
        stacklevel=4,
    )


class CodebookInferredWarning(UserWarning):
    """Codebook sizes were inferred from the data (max token + 1); dense steps may not line up with the
    model's output layers."""


def step_rows(index: Any) -> list[dict[str, Any]]:
    """One JSON-ready dict per step table of a SidIndex: step, format, codebook_size, rows, nnz, max_slots,
    valid_share, bytes."""
    return [
        {
            "step": t.step,
            "format": t.format,
            "codebook_size": t.codebook_size,
            "rows": t.rows,
            "nnz": t.nnz,
            "max_slots": t.max_slots,
            "valid_share": t.valid_share,
            "bytes": t.nbytes,
        }
        for t in index.steps
    ]


def leaf_sharing(leaf_offsets: Any) -> dict[str, int]:
    """How many items share a SID (leaf_offsets int [n_leaves + 1]): `collisions` = items beyond the first
    of each SID; `shared_sids` = SIDs holding more than one item; `items_in_shared_sids` = items on those."""
    offsets = np.asarray(leaf_offsets)  # in its own dtype: no int64 copy of a 100M-entry map
    collisions = int(offsets[-1]) - (offsets.shape[0] - 1)
    if collisions == 0:  # one item per SID
        return {"collisions": 0, "shared_sids": 0, "items_in_shared_sids": 0}
    per_leaf = np.diff(offsets)
    shared = per_leaf > 1
    return {
        "collisions": collisions,
        "shared_sids": int(shared.sum()),
        "items_in_shared_sids": int(per_leaf[shared].sum(dtype=np.int64)),
    }


def _read_catalog(
    path: str, settings: BuildSettings, codebook_sizes: Any, progress: Progress, pack: bool = False
) -> Catalog:
    """read_catalog with the column settings of `settings` (pack: SIDs as sort keys, for a build)."""
    from .catalog import read_catalog

    return read_catalog(
        path,
        sid_column=settings.sid_column,
        sid_columns=settings.sid_columns or None,
        item_column=settings.item_column,
        codebook_sizes=codebook_sizes,
        progress=progress,
        pack=pack,
        workers=settings.workers or None,
    )


def check_codebook_sizes_given(settings: BuildSettings) -> tuple[int, ...] | None:
    """The codebook sizes a build reads the catalog with: the sizes given, or None when inference was asked
    for (codebook_sizes = "infer"). Not set at all raises InputError saying what to pass, so a cron job that
    forgot --codebook-sizes fails (exit 2) instead of building with sizes guessed from the data."""
    if settings.codebook_sizes == INFER_CODEBOOK_SIZES:
        return None
    if not settings.codebook_sizes:
        raise InputError(
            "codebook sizes not given: pass --codebook-sizes V0,V1,... (your model's output layer size per "
            "step), or --infer-codebook-sizes (config: codebook_sizes = "
            f'"{INFER_CODEBOOK_SIZES}") to use max token + 1 per step'
        )
    return tuple(settings.codebook_sizes)


DeviceLoad = Callable[["SidIndex", str], dict]


def build_bundle(
    catalog_path: str,
    settings: BuildSettings,
    *,
    progress: Progress = NULL_PROGRESS,
    load_to_device: DeviceLoad | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    keep_witness: KeepWitness | None = None,
) -> dict[str, Any]:
    """_build_bundle (settings.engine "ray": build_bundle_partitioned), warning once with
    KernelCompileWarning when numba compiles (a cold first run). manifest_extra: more manifest fields
    (e.g. the `rebuild_run` of a rebuild's version). keep_witness: the local engine stores in it what
    verify_with_catalog(witness=...) needs to check this version against the catalog as it was read
    (bundle/witness.py); the ray engine leaves it empty."""
    extra = dict(manifest_extra or {})
    with on_first_compile(_warn_compiling):
        if settings.engine == "ray":
            return _build_partitioned(catalog_path, settings, progress, extra)
        return _build_bundle(
            catalog_path,
            settings,
            progress=progress,
            load_to_device=load_to_device,
            manifest_extra=extra,
            keep_witness=keep_witness,
        )


def _build_partitioned(
    catalog_path: str, settings: BuildSettings, progress: Progress, manifest_extra: Mapping[str, Any]
) -> dict[str, Any]:
    """settings.engine = "ray": build_partitioned.build_bundle_partitioned, with the local build's checks
    before the read, its warnings and its kernel files."""
    from .build_partitioned import build_bundle_partitioned
    from .index import check_step_formats, parse_step_formats

    if settings.device != "cpu":
        raise InputError(
            f"--device {settings.device} needs the index in this process: build with the local engine, or "
            "build with --engine ray and load the published bundle on the GPU"
        )
    check_step_formats(settings.step_formats)
    given_sizes = check_codebook_sizes_given(settings)
    if given_sizes:
        parse_step_formats(settings.step_formats, len(given_sizes))
    return build_bundle_partitioned(
        catalog_path,
        settings,
        given_sizes,
        kernel_files=lambda: _kernel_files(settings),
        on_inferred=_warn_inferred,
        policy=_format_policy(settings),
        progress=progress,
        manifest_extra=manifest_extra,
    )


def _warn_inferred(sizes: tuple[int, ...]) -> None:
    warnings.warn(
        f"codebook sizes inferred from the data as asked: {','.join(map(str, sizes))} (max token + 1 per "
        "step). If the model's output layers are larger, dense steps will not line up with them: pass "
        "--codebook-sizes or set codebook_sizes in the config.",
        CodebookInferredWarning,
        stacklevel=4,
    )


def _format_policy(settings: BuildSettings) -> Any:
    """The FormatPolicy of `settings`, a forced dense table bounded by this machine's memory limit."""
    from .index import FormatPolicy

    limit = memory_limit()  # physical memory, ulimit -v and the cgroup's limit: a forced dense table must fit
    return FormatPolicy(
        settings.dense_min_share,
        settings.dense_max_bytes,
        limit.bytes if limit else None,
        limit.what if limit else "this machine's memory",
    )


def _kernel_files(settings: BuildSettings) -> tuple[dict[str, bytes], str | None]:
    """(the compiled kernels the bundle ships, why none were compiled or None), warning with
    KernelsSkippedWarning when nvcc is missing or failed."""
    kernel_files, kernels_skipped = bundle_kernel_files(settings.kernel_archs)
    if kernels_skipped:
        warnings.warn(
            f"no compiled kernels in this bundle: {kernels_skipped}", KernelsSkippedWarning, stacklevel=4
        )
    return kernel_files, kernels_skipped


def _build_bundle(
    catalog_path: str,
    settings: BuildSettings,
    *,
    progress: Progress = NULL_PROGRESS,
    load_to_device: DeviceLoad | None = None,
    manifest_extra: Mapping[str, Any] | None = None,
    keep_witness: KeepWitness | None = None,
) -> dict[str, Any]:
    """Read and validate the catalog, build every step table, publish the next version under
    settings.out (and, with settings.device = cuda:N, stream the tables to that GPU).

    With settings.promote False, LATEST is left alone (bundle.promote_bundle moves it later).

    Returns the JSON-ready summary `zerogr build --json` prints: bundle, version, promoted, items,
    distinct_sids, leaf_sharing counts, index_bytes, seconds, items_per_second, timings per stage,
    codebook_sizes, codebook_inferred, catalog, model_version, steps (step_rows), device_load (None on cpu).
    Bad input raises InputError before anything is published. settings.codebook_sizes must be given: the
    sizes, or "infer" (then the sizes inferred from the data warn with CodebookInferredWarning); not set
    raises InputError before the catalog is read.
    """
    from .bundle import publish_bundle
    from .index import build_index, check_step_formats, parse_step_formats
    from .index.build import build_index_packed

    check_device(settings.device)
    check_step_formats(settings.step_formats)  # a bad --step-formats fails before the read
    given_sizes = check_codebook_sizes_given(settings)
    if given_sizes:  # its steps' range too when L is already known
        parse_step_formats(settings.step_formats, len(given_sizes))
    started = time.perf_counter()
    timings: dict[str, float] = {}
    t = time.perf_counter()
    catalog = _read_catalog(catalog_path, settings, given_sizes, progress, pack=True)
    timings["read"] = time.perf_counter() - t
    if catalog.codebook_inferred:
        _warn_inferred(catalog.codebook_sizes)
    parse_step_formats(settings.step_formats, catalog.num_steps)  # bad spec: InputError before the build
    t = time.perf_counter()
    progress.stage("sort/tables")
    policy = _format_policy(settings)
    workers = settings.workers or None
    witness = _witness_of(catalog, keep_witness)  # before the sort consumes the packed SIDs
    if catalog.packed is not None:
        index = build_index_packed(
            catalog.packed,
            step_formats=settings.step_formats,
            policy=policy,
            workers=workers,
            consume=True,
        )
    else:
        index = build_index(
            catalog.sids,
            catalog.codebook_sizes,
            step_formats=settings.step_formats,
            policy=policy,
            workers=workers,
        )
    timings["build"] = time.perf_counter() - t
    if witness is not None and keep_witness is not None:
        witness.item_order = index.item_order
        keep_witness.witness = witness
    catalog_info = {
        "path": catalog.path,
        "fingerprint": catalog.fingerprint,
        "rows": catalog.rows,
        "distinct_sids": index.num_leaves,
        "files": len(catalog.files),
        "codebook_inferred": catalog.codebook_inferred,
    }
    # Catalog order: publish gathers each row group of items.parquet as it writes it, so the ids exist once.
    item_ids = catalog.item_ids
    del catalog  # the SIDs (packed or [N, L]) go; the build already released the packed words
    t = time.perf_counter()
    kernel_files, kernels_skipped = _kernel_files(settings)
    timings["kernels"] = time.perf_counter() - t
    t = time.perf_counter()
    published = publish_bundle(
        index,
        item_ids,
        settings.out,
        manifest_fields={
            "model_version": settings.model_version or None,
            "catalog": catalog_info,
            "settings": settings.manifest_dict(),
            # what this build took before its publish (the report's build durations)
            "build_timings": {k: round(v, 3) for k, v in timings.items()},
            **(manifest_extra or {}),
        },
        keep=settings.keep or None,
        promote=settings.promote,
        progress=progress,
        extra_files=kernel_files,
    )
    timings["publish"] = time.perf_counter() - t
    del item_ids
    device_load = None
    if settings.device != "cpu" and load_to_device is not None:
        t = time.perf_counter()
        progress.stage(f"to {settings.device}")
        device_load = load_to_device(index, settings.device)
        timings["to_device"] = time.perf_counter() - t
    seconds = time.perf_counter() - started
    return {
        "bundle": str(published.path),
        "version": published.version,
        "promoted": published.promoted,
        "items": index.num_items,
        "distinct_sids": index.num_leaves,
        **leaf_sharing(index.leaf_offsets),
        "index_bytes": index.index_bytes,
        "seconds": round(seconds, 3),
        "items_per_second": round(index.num_items / seconds) if seconds > 0 else None,
        "timings": {k: round(v, 3) for k, v in timings.items()},
        "codebook_sizes": list(index.codebook_sizes),
        "codebook_inferred": catalog_info["codebook_inferred"],
        "catalog": catalog_info,
        "model_version": settings.model_version or None,
        "steps": step_rows(index),
        "device_load": device_load,
        "kernels": {"files": sorted(kernel_files), "skipped": kernels_skipped},
    }


def _witness_of(catalog: Catalog, keep: KeepWitness | None) -> BuildWitness | None:
    """The BuildWitness of `catalog` when `keep` asks for one (its SIDs copied, spilled to keep.spill_dir;
    item_order filled in once the index is built), else None."""
    if keep is None:
        return None
    from .bundle.witness import BuildWitness, witness_sids

    return BuildWitness(
        codebook_sizes=tuple(catalog.codebook_sizes),
        **witness_sids(catalog.packed, catalog.sids, keep.spill_dir),
        item_ids=catalog.item_ids,
        item_order=np.zeros(0, np.int64),
    )


def inspect_bundle(path: str | Path | None = None) -> dict[str, Any]:
    """The JSON-ready report `zerogr inspect --json` prints for a bundle (a version dir, or an OUT dir via
    LATEST): manifest facts, step_rows, leaf_sharing, index bytes, and STATIC's bytes for the same catalog
    (static_bytes / ratio_to_static None for 1-token SIDs, which STATIC has no layout for). Checksums are
    not read (`verify` does that). What an availability file keeps is runtime's
    (runtime.items.constraints.available_prefixes)."""
    from .bundle import open_bundle
    from .index.static_layout import static_layout_bytes

    opened = open_bundle(path, verify_checksums=False)
    index, manifest = opened.index, opened.manifest
    try:
        static = static_layout_bytes(index)
    except ValueError:
        static = None
    report: dict[str, Any] = {
        "bundle": str(opened.path),
        "version": opened.version,
        "created_at": manifest.get("created_at"),
        "model_version": manifest.get("model_version"),
        "catalog": manifest.get("catalog"),
        "codebook_sizes": list(index.codebook_sizes),
        "items": index.num_items,
        "distinct_sids": index.num_leaves,
        **leaf_sharing(index.leaf_offsets),
        "steps": step_rows(index),
        "index_bytes": index.index_bytes,
        "leaf_offsets_bytes": int(index.leaf_offsets.nbytes),
        "static_bytes": static,
        "ratio_to_static": (index.index_bytes / static["total"]) if static else None,
    }
    report["quality"] = quality_rows(opened)
    return report


def quality_rows(opened: Any) -> list[dict[str, Any]]:
    """The quality gate's decisions recorded in an opened bundle, one row per quality/<key>.json: {file,
    model_version, order, passed, min_overlap, max_recall_gap, worst_overlap}, or {file, error} for a
    record that breaks the format (order="auto" ignores such a record: filter_first)."""
    from .base.errors import BundleError
    from .bundle.quality import load_quality, quality_files, quality_row

    rows: list[dict[str, Any]] = []
    for key, name in sorted(quality_files(opened).items()):
        try:
            record = load_quality(opened.file(name), expect_key=key)
        except BundleError as exc:
            rows.append({"file": name, "error": str(exc)})
            continue
        rows.append(quality_row(name, record))
    return rows


def verify_with_catalog(
    path: str | Path,
    catalog_path: str | None = None,
    *,
    config_file: str | Path | None = None,
    overrides: Mapping[str, Any] | None = None,
    progress: Progress = NULL_PROGRESS,
    hash_cache: HashCache | None = None,
    witness: BuildWitness | None = None,
) -> dict[str, Any]:
    """`zerogr verify`: bundle.verify_bundle of a version dir (or an OUT dir via LATEST; `hash_cache`: a
    run's HashCache, passed on). `witness` (a rebuild's, from build_bundle's keep_witness): the
    comparison with the catalog as that build read it, instead of reading `catalog_path` again. Else with
    `catalog_path` exact equality with that catalog, read with the bundle's own codebook sizes and the
    catalog columns the bundle was built with (its manifest's settings), unless `config_file`'s [build]
    table or `overrides` name others (config.load_settings with `recorded`). Returns verify_bundle's
    report."""
    from .bundle import load_manifest, resolve_bundle, verify_bundle

    version_dir = resolve_bundle(path)
    if witness is not None:
        progress.stage("verify")
        return verify_bundle(version_dir, witness=witness, hash_cache=hash_cache)
    catalog = None
    if catalog_path is not None:
        manifest = load_manifest(version_dir)
        recorded = manifest.get("settings")
        settings = load_settings(
            config_file, overrides, recorded=recorded if isinstance(recorded, Mapping) else None
        )
        catalog = _read_catalog(catalog_path, settings, manifest["codebook_sizes"], progress)
        progress.stage("verify")
    return verify_bundle(version_dir, catalog=catalog, hash_cache=hash_cache)
