"""The bundle facts of the version an OUT dir's LATEST names, for the metrics file of a run that did not
promote or install one (a refused, failed or interrupted rebuild, a failed pull): its
zerogr_bundle_version / _items / _distinct_sids / _index_bytes then describe what OUT serves, never a
version that was built or downloaded and is not live."""

from __future__ import annotations

from pathlib import Path


def live_facts(out: Path) -> dict[str, float | int | None]:
    """{"version", "items", "distinct_sids", "index_bytes"} of the version OUT/LATEST names; {} when OUT
    has no LATEST, or LATEST or its manifest cannot be read (the gauges are then left out: unknown)."""
    from ..bundle import load_manifest
    from ..bundle.format import parse_version_dir
    from ..bundle.versions import read_latest

    try:
        name = read_latest(out)
        if name is None:
            return {}
        manifest = load_manifest(out / name)
        leaves = manifest["leaves"]
        return {
            "version": parse_version_dir(name),
            "items": leaves["items"],
            "distinct_sids": leaves["count"],
            "index_bytes": manifest.get("index_bytes"),
        }
    except Exception:  # noqa: BLE001 - these gauges only describe OUT; the run's own outcome stands
        return {}
