"""Bundle I/O: the on-disk format (docs/bundle-format.md) and its local protocol: publishing, opening,
verifying.

format.py (schema, names), files.py + lock.py (durable files, OUT locks), versions.py (the OUT dir's
versions and LATEST), reader.py (open), publish.py (publish, promote), amend.py (add files), verify.py,
quality.py (the gate's record). Object storage and transfer are zerogr_build.fleet's.
"""

from .amend import add_bundle_files
from .format import FORMAT_NAME, FORMAT_VERSION
from .publish import PublishedBundle, promote_bundle, publish_bundle
from .reader import Bundle, load_manifest, open_bundle
from .verify import verify_bundle
from .versions import list_versions, prune_versions, resolve_bundle

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
