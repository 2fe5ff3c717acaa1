"""Quality records: `quality/<key>.json`, the filter-first decision of the quality gate for one model
version (docs/bundle-format.md, section 11.3). No torch here: the bundle layer reads and writes the file,
`compare.gate` decides what goes in it, `runtime.order` follows it.

    name = quality_file_name("ml1m-t5@2026-01")     # "quality/<key>.json" (the tag itself when file-safe)
    record = find_quality(bundle, "ml1m-t5@2026-01") # QualityRecord or None; BundleError when broken
    record.order                                     # "filter_first" or "score_first"
    data = quality_bytes(document)                   # canonical JSON bytes to add with add_bundle_files

A record is untrusted input like a plan: `load_quality` checks every rule and raises BundleError naming the
file and the first rule it breaks.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ..base.errors import BundleError
from ..base.small_files import parse_small_json, read_small_bytes

QUALITY_FORMAT = "zerogr-quality"
QUALITY_FORMAT_VERSION = 1
QUALITY_DIR = "quality/"
QUALITY_ORDERS = ("filter_first", "score_first")
MAX_QUALITY_BYTES = 1 << 20  # a record is a few KiB; a bigger file is refused unread
_SAFE_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


@dataclass(frozen=True)
class QualityRecord:
    """A validated quality record.

    model_version: the tag (or model hash) the gate measured; order: the decision ("filter_first" when
    the gate passed, else "score_first"); passed: the gate's verdict; min_overlap / max_recall_gap: the
    thresholds (max_recall_gap None when not set); overlap {K: share} as measured; data: the whole
    document as read; path: its file, if any.
    """

    model_version: str
    order: str
    passed: bool
    min_overlap: float
    max_recall_gap: float | None
    overlap: Mapping[int, float]
    data: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)
    path: Path | None = None


def quality_key(model_version: str) -> str:
    """File stem of a model version's record: the tag itself when it is file-name safe
    ([A-Za-z0-9][A-Za-z0-9._-]{0,127}), else "tag-" + the first 32 hex digits of its sha256."""
    if not isinstance(model_version, str) or not model_version:
        raise ValueError(f"a model version must be a non-empty string, got {model_version!r}")
    if _SAFE_KEY.match(model_version):
        return model_version
    return "tag-" + hashlib.sha256(model_version.encode("utf-8")).hexdigest()[:32]


def quality_file_name(model_version: str) -> str:
    """ "quality/<key>.json" (quality_key) of one model version."""
    return f"{QUALITY_DIR}{quality_key(model_version)}.json"


def quality_bytes(document: Mapping[str, Any]) -> bytes:
    """Canonical bytes of a record (checked against the format first; ValueError when it breaks it)."""
    try:
        validate_quality(document, "quality record being written")
    except BundleError as exc:
        raise ValueError(str(exc)) from None
    return (json.dumps(document, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n").encode(
        "utf-8"
    )


def load_quality(path: str | Path, *, expect_key: str | None = None) -> QualityRecord:
    """A validated QualityRecord from a file; with expect_key, its model version must map to that key.
    BundleError naming the file and the first broken rule."""
    path = Path(path)
    try:
        raw = read_small_bytes(path, MAX_QUALITY_BYTES, "quality record", BundleError)
    except FileNotFoundError:
        raise BundleError(f"{path}: cannot read quality record (file not found)") from None
    record = parse_quality(raw, str(path), expect_key=expect_key)
    return replace(record, path=path)


def parse_quality(raw: bytes, where: str, *, expect_key: str | None = None) -> QualityRecord:
    """A validated QualityRecord from a record's bytes (a local file's or a remote object's), by the
    same rules as load_quality: over MAX_QUALITY_BYTES, not JSON (NaN/Infinity included) or breaking the
    format raises BundleError naming `where`."""
    data = parse_small_json(raw, where, "quality record", MAX_QUALITY_BYTES, BundleError)
    return validate_quality(data, where, expect_key=expect_key)


def quality_row(name: str, record: QualityRecord) -> dict[str, Any]:
    """What inspect and status show of one record: {file, model_version, order, passed, min_overlap,
    max_recall_gap, worst_overlap}."""
    return {
        "file": name,
        "model_version": record.model_version,
        "order": record.order,
        "passed": record.passed,
        "min_overlap": record.min_overlap,
        "max_recall_gap": record.max_recall_gap,
        "worst_overlap": min(record.overlap.values()),
    }


def quality_key_of(name: str) -> str | None:
    """The key of a manifest file name that is a quality record ("quality/<key>.json"), else None."""
    if not (name.startswith(QUALITY_DIR) and name.endswith(".json")):
        return None
    stem = name[len(QUALITY_DIR) : -len(".json")]
    return stem if stem and "/" not in stem else None


def quality_files(bundle: Any) -> dict[str, str]:
    """{key: file name} of the quality records an opened Bundle lists."""
    return {
        name[len(QUALITY_DIR) : -len(".json")]: name
        for name in bundle.files(QUALITY_DIR)
        if name.count("/") == 1 and name.endswith(".json")
    }


def find_quality(bundle: Any, model_version: str) -> QualityRecord | None:
    """The record of `model_version` in an opened Bundle, or None when it has none. BundleError naming
    the file when the record breaks the format."""
    key = quality_key(model_version)
    name = quality_files(bundle).get(key)
    if name is None:
        return None
    record = load_quality(bundle.file(name), expect_key=key)
    if record.model_version != model_version:
        raise BundleError(
            f"{bundle.path / name}: records model version {record.model_version!r}, not {model_version!r}"
        )
    return record


def validate_quality(data: Any, where: str, *, expect_key: str | None = None) -> QualityRecord:
    """Every rule of the quality format (docs/bundle-format.md, section 11.3), in order; the first broken
    one raises BundleError naming `where`."""

    def fail(rule: str) -> BundleError:
        return BundleError(f"{where}: {rule}")

    if not isinstance(data, Mapping):
        raise fail(f"a quality record must be a JSON object, got {type(data).__name__}")
    for name, want in (("format", QUALITY_FORMAT), ("format_version", QUALITY_FORMAT_VERSION)):
        got = data.get(name)
        if type(got) is not type(want) or got != want:
            raise fail(f"{name} must be {want!r}, got {got!r} (not a zerogr quality record of this version)")
    model_version = data.get("model_version")
    if not (isinstance(model_version, str) and model_version):
        raise fail(f"model_version must be a non-empty string, got {model_version!r}")
    if expect_key is not None and quality_key(model_version) != expect_key:
        raise fail(f"model_version {model_version!r} does not belong in {expect_key}.json")
    order, passed = data.get("order"), data.get("passed")
    if order not in QUALITY_ORDERS:
        raise fail(f"order must be one of {', '.join(QUALITY_ORDERS)}, got {order!r}")
    if type(passed) is not bool:
        raise fail(f"passed must be true or false, got {passed!r}")
    if passed != (order == "filter_first"):
        raise fail(f"order {order!r} contradicts passed {passed!r} (a passed gate means filter_first)")
    thresholds = data.get("thresholds")
    if not isinstance(thresholds, Mapping):
        raise fail(f"thresholds must be an object, got {type(thresholds).__name__}")
    min_overlap = thresholds.get("min_overlap")
    if not _is_number(min_overlap) or not 0.0 <= min_overlap <= 1.0:
        raise fail(f"thresholds.min_overlap must be a number in [0, 1], got {min_overlap!r}")
    gap = thresholds.get("max_recall_gap")
    if gap is not None and (not _is_number(gap) or not 0.0 <= gap <= 1.0):
        raise fail(f"thresholds.max_recall_gap must be null or a number in [0, 1], got {gap!r}")
    overlap = data.get("overlap")
    if not isinstance(overlap, Mapping) or not overlap:
        raise fail("overlap must be a non-empty object of K -> share")
    parsed: dict[int, float] = {}
    for k, share in overlap.items():
        if not (isinstance(k, str) and k.isascii() and k.isdigit() and int(k) >= 1 and str(int(k)) == k):
            raise fail(f"overlap key {k!r} is not an integer K >= 1")
        if not _is_number(share) or not 0.0 <= share <= 1.0:
            raise fail(f"overlap[{k}] must be a number in [0, 1], got {share!r}")
        parsed[int(k)] = float(share)
    return QualityRecord(
        model_version=model_version,
        order=order,
        passed=passed,
        min_overlap=float(min_overlap),
        max_recall_gap=None if gap is None else float(gap),
        overlap=dict(sorted(parsed.items())),
        data=dict(data),
    )


def _is_number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value)


__all__ = [
    "MAX_QUALITY_BYTES",
    "QUALITY_DIR",
    "QUALITY_FORMAT",
    "QUALITY_FORMAT_VERSION",
    "QUALITY_ORDERS",
    "QualityRecord",
    "find_quality",
    "load_quality",
    "parse_quality",
    "quality_bytes",
    "quality_file_name",
    "quality_files",
    "quality_key",
    "quality_key_of",
    "quality_row",
    "validate_quality",
]
