"""What the report shows of each version of an OUT dir, read from the version's own files: the manifest
(items, distinct SIDs, steps, build timings, the catalog guards' verdict when recorded), the leaf map
(items in shared SIDs), the tuning plans (how long tune measured, or which version's plan was reused) and
the quality records (overlap@K of the gate).

A version is untrusted input: it is opened with every structural check (checksums are not read: the report
describes versions, `zerogr verify` judges them), and a version, plan or record that breaks a rule becomes
an `error` string on its row, never an exception that loses the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..base.errors import ZerogrError
from ..base.numbers import finite
from ..bundle.versions import read_latest, version_dirs


@dataclass(frozen=True)
class StepFacts:
    """One decoding step: its table format, prefixes (rows), children (nnz) and widest row (max_slots).
    fan_out = nnz / rows, the mean number of valid next tokens per prefix."""

    step: int
    format: str
    rows: int
    nnz: int
    max_slots: int

    @property
    def fan_out(self) -> float:
        return self.nnz / self.rows if self.rows else 0.0


@dataclass(frozen=True)
class PlanFacts:
    """One device's tuning plan: tune_seconds as measured (None when not recorded), or reused_from, the
    version whose plan was copied (then no measurement ran)."""

    device_key: str
    tune_seconds: float | None = None
    reused_from: int | None = None
    error: str | None = None


@dataclass(frozen=True)
class GateFacts:
    """One quality record: the model tag, the decision, the threshold and overlap {K: share}."""

    model_version: str
    order: str
    passed: bool
    min_overlap: float
    overlap: Mapping[int, float]

    @property
    def worst_overlap(self) -> float:
        return min(self.overlap.values())


@dataclass(frozen=True)
class GuardFacts:
    """One catalog guard as the manifest records it: whether it fired, what it measured, its threshold."""

    name: str
    fired: bool
    value: float | None = None
    threshold: float | None = None


@dataclass(frozen=True)
class VersionFacts:
    """Everything the report shows of one version (None / empty where the version does not record it).
    error: why the version could not be read (the other fields are then empty)."""

    name: str
    number: int
    latest: bool = False
    created_at: str | None = None
    model_version: str | None = None
    items: int | None = None
    distinct_sids: int | None = None
    items_in_shared_sids: int | None = None
    index_bytes: int | None = None
    steps: tuple[StepFacts, ...] = ()
    build_timings: Mapping[str, float] = field(default_factory=dict)
    plans: tuple[PlanFacts, ...] = ()
    gates: tuple[GateFacts, ...] = ()
    guards: tuple[GuardFacts, ...] = ()
    change_accepted: str | None = None
    error: str | None = None

    @property
    def shared_sid_share(self) -> float | None:
        """Share of the items whose SID another item has as well."""
        if self.items_in_shared_sids is None or not self.items:
            return None
        return self.items_in_shared_sids / self.items


def shared_items(leaf_offsets: np.ndarray, chunk: int = 1 << 22) -> int:
    """Items on SIDs that hold more than one item. leaf_offsets int [n_leaves + 1] (items of leaf j are
    offsets[j]:offsets[j+1]); read `chunk` leaves at a time, so a memory-mapped map of 100M leaves is never
    copied whole."""
    total = 0
    for start in range(0, max(len(leaf_offsets) - 1, 0), chunk):
        per_leaf = np.diff(np.asarray(leaf_offsets[start : start + chunk + 1], dtype=np.int64))
        total += int(per_leaf[per_leaf > 1].sum())
    return total


def out_versions(out: str | Path, last: int) -> list[VersionFacts]:
    """The facts of the newest `last` versions of OUT (a version dir: that one alone), oldest first."""
    out = Path(out)
    if (out / "manifest.json").is_file():
        return [version_facts(out, latest=False)]
    try:
        latest = read_latest(out)
    except ZerogrError:
        latest = None
    found = version_dirs(out)[-last:] if last > 0 else []
    return [version_facts(path, latest=path.name == latest) for _, path in found]


def version_facts(version_dir: Path, *, latest: bool = False) -> VersionFacts:
    """The facts of one version dir; a version that fails to open, or whose files break any rule while
    they are read (whatever the exception), has only `error` set."""
    from ..bundle.format import parse_version_dir

    number = parse_version_dir(version_dir.name)
    try:
        return _read_version(version_dir, latest)
    except Exception as exc:  # noqa: BLE001 - untrusted files: one version's error, never the page's
        why = str(exc) if isinstance(exc, (ZerogrError, OSError)) else f"{type(exc).__name__}: {exc}"
        return VersionFacts(version_dir.name, number or 0, latest, error=why[:500])


def _read_version(version_dir: Path, latest: bool) -> VersionFacts:
    from ..bundle import open_bundle

    bundle = open_bundle(version_dir, verify_checksums=False)
    manifest = bundle.manifest
    return VersionFacts(
        name=version_dir.name,
        number=bundle.version,
        latest=latest,
        created_at=_text(manifest.get("created_at")),
        model_version=_text(manifest.get("model_version")),
        items=bundle.index.num_items,
        distinct_sids=bundle.index.num_leaves,
        items_in_shared_sids=shared_items(bundle.index.leaf_offsets),
        index_bytes=finite(manifest.get("index_bytes")),
        steps=tuple(
            StepFacts(s["step"], s["format"], s["rows"], s["nnz"], s["max_slots"]) for s in manifest["steps"]
        ),
        build_timings=_seconds(manifest.get("build_timings")),
        plans=tuple(plan_facts(bundle, key) for key in sorted(bundle.plans())),
        gates=gate_facts(bundle),
        guards=guard_facts(manifest.get("guards")),
        change_accepted=_accepted(manifest.get("accept_change")),
    )


def plan_facts(bundle: Any, device_key: str) -> PlanFacts:
    """How the plan of `device_key` came about: measured (tune_seconds) or reused (reused_from)."""
    from ..runtime.plan import load_plan

    try:
        plan = load_plan(bundle.file(bundle.plans()[device_key]), expect_key=device_key)
    except (ZerogrError, OSError) as exc:
        return PlanFacts(device_key, error=str(exc))
    reused = plan.data.get("reused_from")
    source = reused.get("bundle_version") if isinstance(reused, Mapping) else None
    return PlanFacts(
        device_key,
        tune_seconds=None if source is not None else finite(plan.data.get("tune_seconds")),
        reused_from=source
        if isinstance(source, int) and not isinstance(source, bool) and 0 < source < 10**9
        else None,
    )


def gate_facts(bundle: Any) -> tuple[GateFacts, ...]:
    """The version's quality records that pass the format, by model tag."""
    from ..bundle.quality import load_quality, quality_files

    facts = []
    for key, name in sorted(quality_files(bundle).items()):
        try:
            record = load_quality(bundle.file(name), expect_key=key)
        except (ZerogrError, OSError):
            continue
        facts.append(
            GateFacts(record.model_version, record.order, record.passed, record.min_overlap, record.overlap)
        )
    return tuple(facts)


def guard_facts(recorded: Any) -> tuple[GuardFacts, ...]:
    """The guards a manifest records, either {name: {fired, value, threshold}} or a list of
    {name|guard, fired, value, threshold}; entries of any other shape are left out."""
    if isinstance(recorded, Mapping):
        entries = [{"name": name, **entry} for name, entry in recorded.items() if isinstance(entry, Mapping)]
    elif isinstance(recorded, Sequence) and not isinstance(recorded, str):
        entries = [dict(e) for e in recorded if isinstance(e, Mapping)]
    else:
        return ()
    facts = []
    for entry in entries:
        name = _text(entry.get("name", entry.get("guard")))
        if name is None:
            continue
        fired = entry.get("fired") is True
        facts.append(GuardFacts(name, fired, finite(entry.get("value")), finite(entry.get("threshold"))))
    return tuple(facts)


def _version_number(value: Any) -> bool:
    """A version number as docs/bundle-format.md bounds them: an int of 1 to 9 digits."""
    return isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**9


def _accepted(recorded: Any) -> str | None:
    """The reason given with --accept-change, when the manifest records one."""
    if isinstance(recorded, Mapping):
        return _text(recorded.get("reason")) or "accepted"
    if recorded is True:
        return "accepted"
    return _text(recorded)


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _seconds(value: Any) -> dict[str, float]:
    """{stage: seconds} of a recorded timings object, finite non-negative numbers only."""
    if not isinstance(value, Mapping):
        return {}
    return {str(k): float(v) for k, v in value.items() if (n := finite(v)) is not None and n >= 0}
