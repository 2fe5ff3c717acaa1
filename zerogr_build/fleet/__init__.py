"""The fleet: a bundle OUT dir on object storage and the transfer to and from it (docs/fleet.md).

remote.py (an OUT on S3: the store, conditional writes, listing), remote_version.py (one remote version
read as untrusted input: LATEST, its manifest, its objects), push.py / pull.py (a version to / from it,
with one result type in transfer.py; prune.py: push --keep), status.py (the versions of a local or remote
OUT), pull_record.py (what pull last installed, so a host's own rollback sticks), rollback.py (the remote
LATEST moved to a named version, backwards included), keys.py (the build box's Ed25519 keys, the keys a
host trusts), signing.py (whom a host trusts), local_disk.py (will a pulled version fit the host's disk).

The fleet's signed metadata (The Update Framework, python-tuf): metadata.py (layout, keys, targets, what
both sides share), repository.py (the build box commits it: pushes, rollbacks, renewals), roots.py (root
metadata and key rotation), signed_view.py (a host reads it through tuf.ngclient and checks a pulled
version), migrate.py (fleets signed before they had metadata). The on-disk format itself is bundle/'s.
"""

from .pull import pull_version
from .push import push_version
from .repository import renew_freshness
from .rotate import rotate_keys
from .status import out_status

__all__ = ["out_status", "pull_version", "push_version", "renew_freshness", "rotate_keys"]
