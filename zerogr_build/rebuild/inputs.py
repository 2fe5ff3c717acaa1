"""Whether a rebuild's inputs changed since the version LATEST names: the catalog's content (its
fingerprint, docs/bundle-format.md section 5), the model tag, and every build setting that decides the
version's bytes (codebook sizes, the catalog's columns, step formats, the dense thresholds, the kernel
architectures), and the bundle format. Unchanged inputs would build the same version again, so a
rebuild publishes nothing (`zerogr rebuild --force` builds anyway).

Settings that change how a build runs but not what it writes (workers, device, engine, OUT, --keep) are
not inputs. The catalog is read once for its fingerprint (sha256 of every file's bytes), which costs a
read of the files, far less than a build.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ..bundle.format import FORMAT_VERSION
from ..config import BuildSettings

#: The build settings recorded in a manifest that decide the version's bytes.
CONTENT_SETTINGS = (
    "sid_column",
    "sid_columns",
    "item_column",
    "codebook_sizes",
    "step_formats",
    "dense_min_share",
    "dense_max_bytes",
    "kernel_archs",
)


@dataclass(frozen=True)
class Inputs:
    """What a version is built from: the catalog's fingerprint, the model tag, the content settings (as a
    manifest records them) and the bundle format version."""

    catalog: str | None
    model_version: str | None
    settings: tuple[tuple[str, Any], ...]
    format_version: int

    def changes(self, other: Inputs) -> list[str]:
        """What differs from `other`, in words (empty: the same inputs)."""
        changed = []
        if self.catalog != other.catalog or self.catalog is None:
            changed.append("catalog")
        if self.model_version != other.model_version:
            changed.append("model tag")
        mine, theirs = dict(self.settings), dict(other.settings)
        changed += [f"setting {key}" for key in CONTENT_SETTINGS if mine.get(key) != theirs.get(key)]
        if self.format_version != other.format_version:
            changed.append("bundle format")
        return changed


def _content(settings: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    def frozen(value: Any) -> Any:
        return tuple(value) if isinstance(value, list | tuple) else value

    return tuple((key, frozen(settings.get(key))) for key in CONTENT_SETTINGS)


def recorded_inputs(manifest: Mapping[str, Any]) -> Inputs:
    """The inputs a (validated) manifest records."""
    settings = manifest.get("settings")
    return Inputs(
        catalog=manifest["catalog"]["fingerprint"],
        model_version=manifest["model_version"],
        settings=_content(settings if isinstance(settings, Mapping) else {}),
        format_version=manifest["format_version"],
    )


def request_inputs(catalog: str, settings: BuildSettings) -> Inputs:
    """The inputs a build of `catalog` with `settings` would record: the catalog's files are found and
    hashed here (InputError, exit 2, for a catalog that is missing or changes while it is read)."""
    from ..catalog.files import fingerprint_files, locate_catalog

    store, files = locate_catalog(catalog)
    return Inputs(
        catalog=fingerprint_files(files, store=store),
        model_version=settings.model_version or None,
        settings=_content(settings.manifest_dict()),
        format_version=FORMAT_VERSION,
    )
