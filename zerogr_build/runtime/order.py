"""order="auto": the filter-first decision the quality gate recorded in a bundle for one model version.

    order, record = auto_order(bundle, model_version)   # ("filter_first" | "score_first", record or None)

The record is quality/<key>.json (docs/bundle-format.md, section 11.3), written by `zerogr compare
--record`. With no bundle or no record, "auto" means filter_first (no warning: that is the documented
default). With no model version at all (none given, none in the bundle's manifest), the records the bundle
holds decide: the gate filed them under the model's tag or hash, and an untagged bundle was gated for the
model that serves it, so one record (or several that agree) is followed, and records that disagree give
score_first, which is exact for every model. A record that breaks the format is skipped with one warning
naming the file, never an error: the valid records beside it decide, and when no record can be read (the
tag's own record is broken, or every record of an untagged bundle is), "auto" means score_first, the exact
order, since the broken record may have been the one that said so.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..base.errors import BundleError
from ..bundle.quality import QualityRecord, find_quality, load_quality, quality_files

DEFAULT_ORDER = "filter_first"
#: "auto" when the record that decides cannot be read: the exact order, right for every model.
BROKEN_ORDER = "score_first"


def auto_order(bundle: Any, model_version: str | None) -> tuple[str, QualityRecord | None]:
    """(order, record) for order="auto". model_version: the tag the record is filed under (None: the
    bundle's own model_version, the tag `zerogr build --model-version` recorded)."""
    if bundle is None or not hasattr(bundle, "files"):
        return DEFAULT_ORDER, None
    tag = model_version if model_version is not None else bundle.model_version
    if tag:
        try:
            record = find_quality(bundle, tag)
        except BundleError as exc:
            _warn_broken(exc, f"using {BROKEN_ORDER} (exact for every model)")
            return BROKEN_ORDER, None
        return (DEFAULT_ORDER, None) if record is None else (record.order, record)
    return _untagged_order(bundle)


def _untagged_order(bundle: Any) -> tuple[str, QualityRecord | None]:
    """For a bundle without a model version: its only valid record, or the most cautious of several (a
    score_first record wins, since score-first is exact whatever the model); filter_first when it holds
    none; score_first when it holds records and none of them can be read. Every record is read and
    validated once, in file-name order; a broken one is skipped with its warning."""
    files = sorted(quality_files(bundle).items(), key=lambda key_name: key_name[1])
    records = []
    for key, name in files:
        try:
            records.append(load_quality(bundle.file(name), expect_key=key))
        except BundleError as exc:
            _warn_broken(exc, f"skipped (the valid records decide; with none, {BROKEN_ORDER})")
    if not records:
        return (BROKEN_ORDER if files else DEFAULT_ORDER), None
    cautious = [r for r in records if r.order == "score_first"]
    chosen = cautious[0] if cautious else records[0]
    return chosen.order, chosen


def _warn_broken(exc: BundleError, then: str) -> None:
    warnings.warn(f"order='auto': a broken quality record: {exc}; {then}", stacklevel=4)


__all__ = ["BROKEN_ORDER", "DEFAULT_ORDER", "auto_order"]
