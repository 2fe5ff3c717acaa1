"""order="auto": the filter-first decision the quality gate recorded in a bundle for one model version.

    order, record = auto_order(bundle, model_version)   # ("filter_first" | "score_first", record or None)

The record is quality/<key>.json (docs/bundle-format.md, section 11.3), written by `zerogr compare
--record`. With no bundle or no record, "auto" means filter_first (no warning: that is the documented
default). With no model version at all (none given, none in the bundle's manifest), the records the bundle
holds decide: the gate filed them under the model's tag or hash, and an untagged bundle was gated for the
model that serves it, so one record (or several that agree) is followed, and records that disagree give
score_first, which is exact for every model. A record that breaks the format is ignored with one warning
naming the file, and the default applies - never an error, as for plans.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..base.errors import BundleError
from ..bundle.quality import QualityRecord, find_quality, load_quality, quality_files

DEFAULT_ORDER = "filter_first"


def auto_order(bundle: Any, model_version: str | None) -> tuple[str, QualityRecord | None]:
    """(order, record) for order="auto". model_version: the tag the record is filed under (None: the
    bundle's own model_version, the tag `zerogr build --model-version` recorded)."""
    if bundle is None or not hasattr(bundle, "files"):
        return DEFAULT_ORDER, None
    tag = model_version if model_version is not None else bundle.model_version
    try:
        record = find_quality(bundle, tag) if tag else _untagged_record(bundle)
    except BundleError as exc:
        message = f"order='auto': ignoring a broken quality record: {exc}; using {DEFAULT_ORDER}"
        warnings.warn(message, stacklevel=3)
        return DEFAULT_ORDER, None
    if record is None:
        return DEFAULT_ORDER, None
    return record.order, record


def _untagged_record(bundle: Any) -> QualityRecord | None:
    """For a bundle without a model version: its only record, or the most cautious of several (a
    score_first record wins, since score-first is exact whatever the model). None when it holds none.
    Every record is read and validated once, in file-name order."""
    files = sorted(quality_files(bundle).items(), key=lambda key_name: key_name[1])
    records = [load_quality(bundle.file(name), expect_key=key) for key, name in files]
    if not records:
        return None
    cautious = [r for r in records if r.order == "score_first"]
    return cautious[0] if cautious else records[0]


__all__ = ["DEFAULT_ORDER", "auto_order"]
