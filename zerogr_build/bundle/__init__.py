"""Bundle I/O: the on-disk format v1 (docs/bundle-format.md), publishing, opening, verifying.

format.py (schema, names), files.py + lock.py (durable files, OUT locks), versions.py (the OUT dir's
versions and LATEST), reader.py (open), publish.py (publish, promote), amend.py (add files), verify.py;
remote.py (an OUT on S3), push.py / pull.py (a version to / from it), status.py (the versions of either).
"""

from .amend import add_bundle_files
from .format import FORMAT_NAME, FORMAT_VERSION
from .publish import PublishedBundle, promote_bundle, publish_bundle
from .pull import pull_version
from .push import push_version
from .reader import Bundle, load_manifest, open_bundle
from .status import out_status
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
    "out_status",
    "promote_bundle",
    "prune_versions",
    "publish_bundle",
    "pull_version",
    "push_version",
    "resolve_bundle",
    "verify_bundle",
]
