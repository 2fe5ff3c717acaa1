"""Untrusted text made safe for a terminal: control characters escaped, never interpreted.

Text that zerogr did not write itself (a remote LATEST, a manifest's model tag or file names, record
fields, error text quoting them) may hold escape sequences that clear the screen, move the cursor or
retitle the terminal. `printable` is applied at the output edges (tables, error and log lines): every C0
control but tab, DEL, every C1 control, and the invisible characters that reorder or break lines (bidi
overrides, line and paragraph separators) become their Python escape (``\\x1b``, ``\\u202e``).
"""

from __future__ import annotations

import re

from .redact import redact

_CONTROL = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def printable(text: object) -> str:
    """`str(text)` with its control characters replaced by visible escapes (tab kept)."""
    return _CONTROL.sub(_escape, str(text))


def safe_text(text: object) -> str:
    """`text` as it may be shown anywhere (a message, a log line, a metrics label): secrets redacted
    (base.redact), then control characters escaped."""
    return printable(redact(str(text)))
