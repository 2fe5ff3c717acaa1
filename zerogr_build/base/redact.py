"""Secrets kept out of every message: URL credentials and the values of the standard credential variables.

`redact` is the one function every message that may show a URL goes through (catalog URIs, remote OUTs,
error lines, log lines, metrics labels). `has_credentials` says whether a URL carries any, so the
commands that take one can refuse it, showing it through `redact_url` (no user-info, query or fragment).
"""

from __future__ import annotations

import os
import re

#: User-info: everything between `scheme://` and the last @ on the line, whatever characters it holds (an
#: AWS secret key may contain `/`, a password `?`, `#` or spaces). Text after a URL on the same line that
#: holds an @ is redacted with it: never a secret shown for want of knowing where a URL ends.
_USERINFO = re.compile(r"(?<=://)[^\r\n]*@")
#: A query or fragment `name=value` whose name would carry a secret (access keys, session and security
#: tokens, signatures): `?secret_key=`, `&X-Amz-Security-Token=`, `#access_token=`. The value ends at the
#: next parameter, fragment or blank; punctuation that ends the URL in a message (`: `, `)`) is kept.
_SECRET_PARAM = re.compile(
    r"([?&;#][^=&;#\s/]*(?:key|secret|token|passw|credential|sig|auth)[^=&;#\s/]*=)"
    r"[^&;#\s]*?(?=[&;#\s]|[:)\]'\",.]*(?:\s|$))",
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
    """`text` with URL user-info (`user:secret@`), secret-looking query and fragment values
    (`?secret_key=`, `&x-amz-security-token=`, `#access_token=`) and the values of the standard credential
    variables replaced by ***."""
    text = _USERINFO.sub("***@", str(text))
    text = _SECRET_PARAM.sub(r"\1***", text)
    for name in SECRET_ENV:
        value = os.environ.get(name, "")
        if len(value) >= 4:
            text = text.replace(value, "***")
    return text


def redact_url(url: str) -> str:
    """`url` as a refusal may show it: scheme, host and path only, whatever else it carries. User-info (up
    to the last @) becomes `***@`, a query `?***` and a fragment `#***`, so a secret in any of them, named
    or not, is never shown: `s3://KEY:SECRET@bucket/p?token=T#x` -> `s3://***@bucket/p?***#***`."""
    url = str(url)
    scheme = _URL.match(url)
    head = scheme.group() if scheme else ""
    rest = url[len(head) :]
    at = rest.rfind("@")
    if at >= 0:
        head, rest = head + "***@", rest[at + 1 :]
    query, fragment = rest.find("?"), rest.find("#")
    if fragment >= 0 and (query < 0 or fragment < query):
        return redact(head + rest[:fragment] + "#***")
    if query >= 0:
        return redact(head + rest[:query] + "?***" + ("#***" if fragment > query else ""))
    return redact(head + rest)


def has_credentials(url: str) -> bool:
    """True when `url` (scheme://...) carries user-info, or a query or fragment name that looks like a
    secret's."""
    if not _URL.match(url):
        return False
    # a secret-looking `name=` after a ?, & or #: a glob's `?` (`dt=?/key_events.parquet`) names no value
    return "@" in url or _SECRET_PARAM.search(url) is not None
