"""Secrets kept out of every message: URL credentials and the values of the standard credential variables.

`redact` is the one function every message that may show a URL goes through (catalog URIs, remote OUTs,
error lines, log lines, metrics labels). `has_credentials` says whether a URL carries any, so the
commands that take one can refuse it.
"""

from __future__ import annotations

import os
import re

#: Everything between `scheme://` and the last @ of the URL (user-info, whatever characters it holds:
#: an AWS secret key may contain `/`, a password `?` or `#`).
_USERINFO = re.compile(r"(?<=://)\S*@")
#: A query `name=value` whose name would carry a secret (access keys, session and security tokens,
#: signatures).
_SECRET_QUERY = re.compile(
    r"([?&;][^=&;\s/]*(?:key|secret|token|passw|credential|sig|auth)[^=&;\s/]*=)[^&;\s]*",
    re.IGNORECASE,
)
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")

#: Environment variables whose values are never shown (replaced by *** in any redacted text).
SECRET_ENV = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AZURE_STORAGE_ACCOUNT_KEY",
    "AZURE_STORAGE_SAS_TOKEN",
    "GOOGLE_OAUTH_ACCESS_TOKEN",
)


def redact(text: str) -> str:
    """`text` with URL user-info (`user:secret@`), secret-looking query values (`?secret_key=`,
    `&x-amz-security-token=`) and the values of the standard credential variables replaced by ***."""
    text = _USERINFO.sub("***@", str(text))
    text = _SECRET_QUERY.sub(r"\1***", text)
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def has_credentials(url: str) -> bool:
    """True when `url` (scheme://...) carries user-info or a query key that looks like a secret."""
    if not _URL.match(url):
        return False
    # a secret-looking `name=` after a ? or &: a glob's `?` (`dt=?/key_events.parquet`) names no value
    return "@" in url or _SECRET_QUERY.search(url) is not None
