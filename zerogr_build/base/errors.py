"""Error types. Every error a user can cause by their input is an `InputError` (CLI exit code 2)."""

from __future__ import annotations


class ZerogrError(Exception):
    """Base class of every error zerogr raises on purpose (CLI exit code 1 unless a subclass says 2)."""

    exit_code = 1


class InputError(ZerogrError):
    """Bad input or usage: a catalog, option or file the user gave breaks a rule (CLI exit code 2).

    The message is one line naming the file, column, row (and item id) where they apply.
    """

    exit_code = 2


class BundleError(ZerogrError):
    """A bundle on disk is missing, corrupt, or disagrees with its manifest. Names the offending file."""

    exit_code = 1


def one_line(exc: BaseException) -> str:
    """An exception's message on one line (whitespace collapsed), or its type name when it has none."""
    return " ".join(str(exc).split()) or type(exc).__name__
