"""Ed25519 key files for signed versions (docs/fleet.md, "Signed versions"): `zerogr keys new`, the build
box's private key that push signs with, and the public keys a serving host trusts.

Formats (the ones OpenSSH uses, so `ssh-keygen -lf KEY.pub` shows the same fingerprint):
- a private key file: PEM PKCS#8, unencrypted, mode 0600 (an OpenSSH private key file is read too);
- a public key: one line `ssh-ed25519 <base64> [comment]` (the comment printable ASCII); a trusted-keys
  file holds one or more such lines, blank lines and `#` comments ignored. Lines end at `\n` (an `\r`
  before it is dropped) and fields are split at spaces and tabs, as OpenSSH reads them; a line holding any
  other control or separator character is refused, so the keys trusted are the ones `ssh-keygen -lf`
  lists for the file. The file is refused when another user could change or replace it
  (check_trusted_keys_mode);
- a key id: `SHA256:` + the unpadded base64 of the SHA-256 of the key's OpenSSH wire blob.

The cryptography package (zerogr[s3]) is imported only when a key is used.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import os
import pwd
import re
import stat
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..base.errors import InputError
from ..base.small_files import read_small_bytes

PUBLIC_SUFFIX = ".pub"
MAX_KEY_FILE_BYTES = 64 << 10
KEY_TYPE = "ssh-ed25519"
KEY_ID_RE = re.compile(r"SHA256:[A-Za-z0-9+/]{43}\Z")
#: What a public key line's comment may hold: printable ASCII (no newline, no control character).
COMMENT_RE = re.compile(r"[\x20-\x7e]*\Z")
MAX_COMMENT_CHARS = 1024
#: A trusted-keys file's line end, and the blanks between a line's fields (OpenSSH's).
LINE_END_RE = re.compile(r"\r?\n")
FIELD_SEP_RE = re.compile(r"[ \t]+")
#: Symlinks followed on a trusted-keys file's path before it counts as a loop (the kernel's limit).
MAX_SYMLINKS = 40


def crypto() -> Any:
    """The cryptography package's Ed25519 and serialization modules; InputError (exit 2) without it."""
    try:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise InputError(
            "signed versions need the cryptography package: pip install 'zerogr[s3]' (or pip install "
            "cryptography)"
        ) from None
    return ed25519, serialization


def _public_blob(public: Any) -> bytes:
    """The OpenSSH wire blob of an Ed25519 public key (the base64 field of its `ssh-ed25519` line)."""
    _, serialization = crypto()
    line = public.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    return base64.b64decode(line.split()[1])


def key_id(public: Any) -> str:
    """`SHA256:<base64>`: the public key's fingerprint, as `ssh-keygen -l` prints it."""
    digest = hashlib.sha256(_public_blob(public)).digest()
    return "SHA256:" + base64.b64encode(digest).decode("ascii").rstrip("=")


def public_line(public: Any, comment: str = "") -> str:
    """`ssh-ed25519 <base64> [comment]`: the line a trusted-keys file holds."""
    blob = base64.b64encode(_public_blob(public)).decode("ascii")
    return f"{KEY_TYPE} {blob}" + (f" {comment}" if comment else "")


@dataclass(frozen=True)
class SigningKey:
    """The build box's private key, its key id, and the file it came from."""

    private: Any
    key_id: str
    path: str

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of `message`."""
        return self.private.sign(message)


@dataclass(frozen=True)
class NewKey:
    """What `zerogr keys new` wrote: the private and public key files, the key id and the public line."""

    private_path: str
    public_path: str
    key_id: str
    public_line: str


def new_key(path: str | Path, *, comment: str | None = None) -> NewKey:
    """Generate an Ed25519 key pair: the private key into `path` (created with mode 0600; a missing parent
    dir is created with mode 0700) and its public line into `path`.pub. Neither file may exist: a key is
    never overwritten (InputError, exit 2)."""
    check_comment(comment)
    ed25519, serialization = crypto()
    private_path = Path(path)
    public_path = private_path.with_name(private_path.name + PUBLIC_SUFFIX)
    for existing in (private_path, public_path):
        if existing.exists() or existing.is_symlink():
            raise InputError(f"{existing}: exists; a key file is never overwritten (choose another name)")
    try:
        private_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(
            f"{private_path.parent}: cannot create the key dir ({exc.strerror or exc})"
        ) from None
    private = ed25519.Ed25519PrivateKey.generate()
    pem = private.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public = private.public_key()
    ident = key_id(public)
    line = public_line(public, comment if comment is not None else f"zerogr {ident}")
    _write_new(private_path, pem, 0o600)
    try:
        _write_new(public_path, (line + "\n").encode("ascii"), 0o644)
    except BaseException:
        private_path.unlink(missing_ok=True)
        raise
    return NewKey(str(private_path), str(public_path), ident, line)


def check_comment(comment: str | None) -> None:
    """InputError (exit 2) unless `comment` (None: the default one) fits on its public key line: printable
    ASCII, no newline (which would add a line, a second key, to the .pub), at most MAX_COMMENT_CHARS."""
    if comment is None:
        return
    if len(comment) > MAX_COMMENT_CHARS:
        raise InputError(f"--comment: longer than {MAX_COMMENT_CHARS} characters")
    if not COMMENT_RE.match(comment):
        bad = next(c for c in comment if not COMMENT_RE.match(c))
        raise InputError(
            f"--comment: only printable ASCII is allowed on a public key line (found {ascii(bad)})"
        )


def _write_new(path: Path, data: bytes, mode: int) -> None:
    """Create `path` (never replacing anything, never through a symlink) with `mode` and write `data`."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags, mode)
    except FileExistsError:
        raise InputError(f"{path}: exists; a key file is never overwritten (choose another name)") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot create ({exc.strerror or exc})") from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(os.dup(fd), "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        with contextlib.suppress(OSError):
            path.unlink()
        raise
    finally:
        os.close(fd)


def load_signing_key(path: str | Path) -> SigningKey:
    """The Ed25519 private key in `path`. InputError (exit 2) naming the file when it is missing, readable
    by other users (group or world bits set), encrypted, or not an Ed25519 private key."""
    ed25519, serialization = crypto()
    from cryptography.exceptions import UnsupportedAlgorithm

    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputError(f"{path}: signing key not found") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read signing key ({exc.strerror or exc})") from None
    if stat.S_ISREG(mode) and stat.S_IMODE(mode) & 0o077:
        raise InputError(
            f"{path}: signing key is readable by other users (mode {stat.S_IMODE(mode):04o}); chmod 600 it"
        )
    data = read_small_bytes(path, MAX_KEY_FILE_BYTES, "signing key")
    try:
        if data.lstrip().startswith(b"-----BEGIN OPENSSH PRIVATE KEY-----"):
            private = serialization.load_ssh_private_key(data, password=None)
        else:
            private = serialization.load_pem_private_key(data, password=None)
    except TypeError:
        raise InputError(f"{path}: signing key is encrypted; zerogr reads unencrypted keys") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise InputError(f"{path}: not a private key file ({type(exc).__name__})") from None
    if not isinstance(private, ed25519.Ed25519PrivateKey):
        raise InputError(f"{path}: not an Ed25519 private key (make one with zerogr keys new)")
    return SigningKey(private, key_id(private.public_key()), str(path))


def load_trusted_keys(paths: list[str | Path] | tuple[str | Path, ...]) -> dict[str, Any]:
    """{key id: Ed25519 public key} of every `ssh-ed25519` line in the files `paths`. InputError (exit 2)
    naming the file and line for anything else (a line holding a control or separator character other
    than space and tab included), for a file that holds no key, and for one other users could change
    (check_trusted_keys_mode)."""
    _, serialization = crypto()
    keys: dict[str, Any] = {}
    for path in paths:
        check_trusted_keys_mode(path)
        try:
            text = read_small_bytes(path, MAX_KEY_FILE_BYTES, "trusted-keys file").decode("utf-8")
        except FileNotFoundError:
            raise InputError(f"{path}: trusted-keys file not found") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: trusted-keys file is not UTF-8 text") from None
        found = 0
        for number, line in enumerate(LINE_END_RE.split(text), start=1):
            where = f"{path}:{number}"
            hidden = next((c for c in line if _is_control_or_separator(c)), None)
            if hidden is not None:
                raise InputError(
                    f"{where}: holds the control or separator character {ascii(hidden)[1:-1]}; a "
                    f"trusted-keys line is `{KEY_TYPE} <base64> [comment]` in printable text"
                )
            fields = FIELD_SEP_RE.split(line.strip(" \t"))
            if not fields[0] or fields[0].startswith("#"):
                continue
            if fields[0] != KEY_TYPE or len(fields) < 2:
                raise InputError(f"{where}: not a public key line ({KEY_TYPE} <base64> [comment])")
            try:
                public = serialization.load_ssh_public_key(f"{fields[0]} {fields[1]}".encode("ascii"))
            except (ValueError, UnicodeEncodeError) as exc:
                raise InputError(f"{where}: not a valid {KEY_TYPE} key ({type(exc).__name__})") from None
            keys[key_id(public)] = public
            found += 1
        if not found:
            raise InputError(f"{path}: holds no {KEY_TYPE} public key")
    return keys


def _is_control_or_separator(char: str) -> bool:
    """True for every character but space and tab whose Unicode category is a control, format, private-use,
    unassigned or separator one (\\x1c, \\x0b, \\x85, U+2028, U+00A0, U+202E ...): the ones that break a
    line, hide text or split fields where a reader of the file sees none."""
    return char not in " \t" and unicodedata.category(char)[0] in "CZ"


def check_trusted_keys_mode(path: str | Path, what: str = "trusted-keys file") -> None:
    """InputError (exit 2) naming `path` when another user than root and the running user could change the
    trusted-keys file (or another file the host's trust rests on, `what`: a trusted root file) or put
    another file in its place: whoever can decides which signatures the host
    accepts. Like sshd's StrictModes, checked with lstat on every entry the path goes through (each
    directory from /, each symlink followed, the file itself):

    - each is owned by root or the running user;
    - the file is a regular file that neither its group nor others may write;
    - no directory on the way may be written by its group or others, unless it has the sticky bit (as /tmp
      has): then they cannot rename or remove the entries of root or the running user in it.

    The sticky-bit exception is the one difference from sshd, which refuses any such directory. A path that
    does not resolve (missing, a loop, no access) is left to the read that follows."""
    try:
        entries = _entries_on_path(path)
    except OSError:
        return
    owners = (0, os.geteuid())
    *on_the_way, (_, final) = entries
    for entry, info in on_the_way:
        mode = stat.S_IMODE(info.st_mode)
        if info.st_uid not in owners:
            raise InputError(
                f"{path}: {_kind(info.st_mode)} {entry} on its path is owned by {_user(info.st_uid)}, not by "
                f"root or the user running zerogr ({_user(os.geteuid())}), who could replace what it leads to"
            )
        if stat.S_ISDIR(info.st_mode) and mode & 0o022 and not mode & stat.S_ISVTX:
            raise InputError(
                f"{path}: directory {entry} on its path is writable by other users (mode {mode:04o}), who "
                f"can put another {what} in its place; chmod go-w {entry}"
            )
    mode = stat.S_IMODE(final.st_mode)
    if not stat.S_ISREG(final.st_mode):
        raise InputError(f"{path}: {what} is a {_kind(final.st_mode)}, not a regular file")
    if final.st_uid not in owners:
        raise InputError(
            f"{path}: {what} is owned by {_user(final.st_uid)}, not by root or the user running "
            f"zerogr ({_user(os.geteuid())}), so that user can change which keys are trusted; chown it"
        )
    if mode & 0o022:
        raise InputError(f"{path}: {what} is writable by other users (mode {mode:04o}); chmod go-w it")


def _entries_on_path(path: str | Path) -> list[tuple[str, os.stat_result]]:
    """(entry, lstat) of every directory entry opening `path` goes through, in order: /, each directory
    below it, each symlink (its target's entries follow it), the file last. OSError where it does not
    resolve (ELOOP after MAX_SYMLINKS links)."""
    absolute = os.path.join(os.getcwd(), os.fspath(path))
    entries = [("/", os.lstat("/"))]
    current = "/"
    pending = list(reversed(absolute.split("/")))
    links = 0
    while pending:
        name = pending.pop()
        if name in ("", "."):
            continue
        if name == "..":
            current = os.path.dirname(current)
            continue
        entry = os.path.join(current, name)
        info = os.lstat(entry)
        entries.append((entry, info))
        if stat.S_ISLNK(info.st_mode):
            links += 1
            if links > MAX_SYMLINKS:
                raise OSError(f"{path}: more than {MAX_SYMLINKS} symlinks")
            target = os.readlink(entry)
            if target.startswith("/"):
                current = "/"
            pending.extend(reversed(target.split("/")))
        else:
            current = entry
    return entries


def _kind(mode: int) -> str:
    kinds = ((stat.S_ISDIR, "directory"), (stat.S_ISLNK, "symlink"), (stat.S_ISREG, "file"))
    return next((name for test, name in kinds if test(mode)), "special file")


def _user(uid: int) -> str:
    """`name (uid N)`, or `uid N` for a uid with no name."""
    try:
        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"
