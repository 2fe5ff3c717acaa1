"""order="auto": the filter-first decision the quality gate recorded in a bundle for one model version.

    order, record = auto_order(bundle, model_version)   # ("filter_first" | "score_first", record or None)

The record is quality/<key>.json (docs/bundle-format.md, section 11.3), written by `zerogr compare
--record`. With no bundle, no model version or no record, "auto" means filter_first (no warning: that is
the documented default). A record that breaks the format is ignored with one warning naming the file, and
the default applies - never an error, as for plans.
"""

from __future__ import annotations

import warnings
from typing import Any

from ..bundle.quality import QualityRecord, find_quality
from ..errors import BundleError

DEFAULT_ORDER = "filter_first"


def auto_order(bundle: Any, model_version: str | None) -> tuple[str, QualityRecord | None]:
    """(order, record) for order="auto". model_version: the tag the record is filed under (None: the
    bundle's own model_version, the tag `zerogr build --model-version` recorded)."""
    if bundle is None or not hasattr(bundle, "files"):
        return DEFAULT_ORDER, None
    tag = model_version if model_version is not None else bundle.model_version
    if not tag:
        return DEFAULT_ORDER, None
    try:
        record = find_quality(bundle, tag)
    except BundleError as exc:
        message = f"order='auto': ignoring a broken quality record: {exc}; using {DEFAULT_ORDER}"
        warnings.warn(message, stacklevel=3)
        return DEFAULT_ORDER, None
    if record is None:
        return DEFAULT_ORDER, None
    return record.order, record


__all__ = ["DEFAULT_ORDER", "auto_order"]
