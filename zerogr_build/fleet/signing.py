"""Whom a host trusts: the build box's public keys (--trusted-keys), or nobody on an unsigned fleet
(--allow-unsigned). The checks themselves are the fleet's signed metadata's (signed_view.py): the trusted
keys anchor the fleet's root metadata, which says which keys sign its versions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from .keys import load_trusted_keys


@dataclass(frozen=True)
class Trust:
    """Whom a host trusts: Ed25519 public keys by key id (several while keys rotate), or, with no keys,
    nobody: `allow_unsigned` then says the fleet is unsigned and nothing is checked."""

    keys: Mapping[str, Any] = field(default_factory=dict)
    allow_unsigned: bool = False

    @classmethod
    def unsigned(cls) -> Trust:
        """An unsigned fleet: versions are installed without a signature check."""
        return cls({}, allow_unsigned=True)

    @classmethod
    def from_files(cls, paths: Sequence[str | Path]) -> Trust:
        """The keys of the trusted-keys files `paths` (keys.load_trusted_keys)."""
        return cls(load_trusted_keys(tuple(paths)))


def host_trust(
    trusted_keys: Sequence[str | Path] | None, allow_unsigned: bool, *, required: bool, what: str
) -> Trust | None:
    """The Trust of a command's --trusted-keys FILE... and --allow-unsigned. Giving both is a usage error.
    With neither: None where `required` is False (a local OUT), else InputError (exit 2) naming `what`:
    a host must say whom it trusts before it reads a remote OUT."""
    trusted_keys = list(trusted_keys or ())
    if trusted_keys and allow_unsigned:
        raise InputError("--trusted-keys and --allow-unsigned contradict each other; give one")
    if trusted_keys:
        return Trust.from_files(trusted_keys)
    if allow_unsigned:
        return Trust.unsigned()
    if not required:
        return None
    raise _no_trust(what)


def _no_trust(what: str) -> InputError:
    return InputError(
        f"{what}: no trusted signing keys: give --trusted-keys FILE (the build box's public keys), or "
        "--allow-unsigned for an unsigned fleet (whoever can write the store then decides what is installed)"
    )


def require_trust(trust: Trust | None, what: str) -> Trust:
    """`trust`, or InputError (exit 2) when a remote OUT is read without saying whom to trust."""
    if trust is None:
        raise _no_trust(what)
    return trust
