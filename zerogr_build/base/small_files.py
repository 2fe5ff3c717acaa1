"""Small files read whole (configs, plans, SID maps, quality records): a regular file of bounded size, JSON
without NaN or Infinity, TOML. A FIFO, a device or an oversized file is refused before it is read."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

from .errors import InputError

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]


def read_small_bytes(
    path: str | Path,
    limit: int,
    what: str,
    error: type[Exception] = InputError,
    *,
    follow_symlinks: bool = True,
) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them. Opened non-blocking, so a FIFO cannot
    hang the read; with follow_symlinks=False a symlink at `path` is refused too. Raises FileNotFoundError
    when it is missing, else `error` naming the file and `what` it should be for a special file, an
    unreadable one or one over `limit` bytes."""
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | (0 if follow_symlinks else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise error(f"{path}: not a regular file (a {what} must be a regular file)")
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(limit + 1)
    except OSError as exc:
        raise error(f"{path}: cannot read {what} ({exc.strerror or exc})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        raise error(f"{path}: {what} larger than {limit} bytes")
    return data


def parse_small_json(
    raw: bytes, where: str, what: str, limit: int, error: type[Exception] = InputError
) -> Any:
    """`raw` (a file's or an object's bytes, at most `limit`) as JSON; NaN and Infinity are not JSON.
    Raises `error` naming `where` and `what` otherwise."""
    if len(raw) > limit:
        raise error(f"{where}: {what} larger than {limit} bytes")
    try:
        return json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        raise error(f"{where}: {what} is not valid JSON ({type(exc).__name__}: {exc})") from None


def read_small_json(
    path: str | Path,
    limit: int,
    what: str,
    error: type[Exception] = InputError,
    *,
    follow_symlinks: bool = True,
) -> Any:
    """The JSON document in the regular file `path` of at most `limit` bytes (read_small_bytes, then
    parse_small_json); a missing file raises `error` too."""
    try:
        raw = read_small_bytes(path, limit, what, error, follow_symlinks=follow_symlinks)
    except FileNotFoundError:
        raise error(f"{path}: cannot read {what} (file not found)") from None
    return parse_small_json(raw, str(path), what, limit, error)


def read_small_toml(path: str | Path, limit: int, what: str) -> dict[str, Any]:
    """The TOML document in the regular file `path` of at most `limit` bytes; InputError naming the file and
    `what` it should be when it is missing, unreadable or not TOML."""
    try:
        return tomllib.loads(read_small_bytes(path, limit, what).decode("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"{path}: cannot read {what} ({exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{path}: invalid TOML ({exc})") from None
    except RecursionError:
        raise InputError(f"{path}: invalid TOML (nested too deep)") from None


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
