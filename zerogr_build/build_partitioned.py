"""`zerogr build --engine ray` as a library call: distributed.driver.build_partitioned on a Ray cluster
(distributed.ray_process), summarised like the local build (pipeline.build_bundle's dict)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from .base.progress import NULL_PROGRESS, Progress
from .config import BuildSettings
from .index.formats import FormatPolicy

#: The per-step summary keys (pipeline.step_rows), read back from the published manifest.
STEP_ROW_KEYS = ("step", "format", "codebook_size", "rows", "nnz", "max_slots", "valid_share", "bytes")


def build_bundle_partitioned(
    catalog_path: str,
    settings: BuildSettings,
    codebook_sizes: Sequence[int] | None,
    *,
    kernel_files: Callable[[], tuple[dict[str, bytes], str | None]],
    on_inferred: Callable[[tuple[int, ...]], None],
    policy: FormatPolicy,
    progress: Progress = NULL_PROGRESS,
) -> dict[str, Any]:
    """Build and publish `catalog_path` on the Ray cluster settings.ray_address in settings.partitions
    partitions; returns the summary pipeline.build_bundle returns, plus "engine" (name, partitions, rows
    per partition, whether every partition packed its keys into one word, bytes shuffled)."""
    from .distributed.driver import build_partitioned
    from .distributed.ray_process import ray_engine

    started = time.perf_counter()
    shipped: dict[str, Any] = {}

    def kernels() -> dict[str, bytes]:
        files, skipped = kernel_files()
        shipped.update(files=sorted(files), skipped=skipped)
        return files

    with ray_engine(settings.ray_address) as engine:
        result = build_partitioned(
            catalog_path,
            settings,
            codebook_sizes,
            engine,
            manifest_fields={
                "model_version": settings.model_version or None,
                "settings": settings.manifest_dict(),
            },
            kernel_files=kernels,
            on_inferred=on_inferred,
            policy=policy,
            progress=progress,
        )
    seconds = time.perf_counter() - started
    manifest = result.published.manifest
    return {
        "bundle": str(result.published.path),
        "version": result.published.version,
        "promoted": result.published.promoted,
        "items": result.rows,
        "distinct_sids": result.distinct_sids,
        "collisions": result.rows - result.distinct_sids,
        "shared_sids": result.shared_sids,
        "items_in_shared_sids": result.items_in_shared_sids,
        "index_bytes": manifest["index_bytes"],
        "seconds": round(seconds, 3),
        "items_per_second": round(result.rows / seconds) if seconds > 0 else None,
        "timings": {k: round(v, 3) for k, v in result.timings.items()},
        "codebook_sizes": list(result.codebook_sizes),
        "codebook_inferred": result.codebook_inferred,
        "catalog": result.catalog,
        "model_version": settings.model_version or None,
        "steps": [{key: step[key] for key in STEP_ROW_KEYS} for step in manifest["steps"]],
        "device_load": None,
        "kernels": shipped,
        "engine": result.engine,
    }
