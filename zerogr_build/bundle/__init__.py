"""Bundle I/O: the on-disk format v1 (docs/bundle-format.md), publishing, opening, verifying."""

from .format import FORMAT_NAME, FORMAT_VERSION
from .reader import Bundle, load_manifest, open_bundle, resolve_bundle
from .verify import verify_bundle
from .writer import (
    PublishedBundle,
    add_bundle_files,
    list_versions,
    promote_bundle,
    prune_versions,
    publish_bundle,
)

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "Bundle",
    "PublishedBundle",
    "add_bundle_files",
    "list_versions",
    "load_manifest",
    "open_bundle",
    "promote_bundle",
    "prune_versions",
    "publish_bundle",
    "resolve_bundle",
    "verify_bundle",
]
