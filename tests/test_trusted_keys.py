"""A trusted-keys file trusts exactly the keys `ssh-keygen -lf` lists for it, and only while no other user
can change it.

- Lines end at `\\n` only (an `\\r` before it dropped); a line that holds any other control or separator
  character (`\\x1c`, `\\x0b`, `\\x85`, U+2028, a no-break space...) is refused naming the file and line,
  so no second key hides inside a comment. A property test draws files of key lines, comments and blank
  lines and compares the keys trusted with the real `ssh-keygen -lf`.
- The file, each directory on its path and each symlink followed must belong to root or the running user,
  and neither the file nor a directory without the sticky bit may be writable by group or others (real
  files, modes and owners; the owner cases need root).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.fleet.keys import check_trusted_keys_mode, load_trusted_keys, new_key

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs OpenSSH's ssh-keygen")

#: Characters that break a line for str.splitlines, or split fields for str.split, where OpenSSH sees none.
HIDDEN = ["\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\x85", "\u2028", "\u2029", "\r", "\xa0", "\u202e", "\x00"]


@pytest.fixture(scope="module")
def key_lines(tmp_path_factory) -> list[str]:
    """Three public key lines made by `zerogr keys new` (without their comments)."""
    folder = tmp_path_factory.mktemp("keys")
    made = [new_key(folder / name, comment="") for name in "abc"]
    return [key.public_line for key in made]


def ssh_keygen_fingerprints(path: Path) -> set[str] | None:
    """The SHA256 fingerprints `ssh-keygen -lf path` prints, or None when it refuses the file."""
    result = subprocess.run(["ssh-keygen", "-lf", str(path)], capture_output=True, text=True)
    if result.returncode != 0:
        return None
    return set(re.findall(r"SHA256:[A-Za-z0-9+/]{43}", result.stdout))


def write(folder: Path, text: str) -> Path:
    path = folder / "trusted.pub"
    path.write_bytes(text.encode("utf-8"))
    path.chmod(0o644)
    return path


def test_a_second_key_hidden_behind_a_separator_in_a_comment_is_refused_naming_the_line(key_lines, tmp_path):
    for hidden in HIDDEN:
        path = write(tmp_path, f"# fleet keys\n{key_lines[0]} build box{hidden}{key_lines[1]}\n")
        assert len(ssh_keygen_fingerprints(path) or ()) <= 1  # what a reviewer of the file sees
        with pytest.raises(InputError, match=re.escape(f"{path}:2: holds the control or separator")):
            load_trusted_keys([path])


def test_crlf_line_ends_tabs_and_leading_blanks_read_as_openssh_reads_them(key_lines, tmp_path):
    text = f"# two keys\r\n\r\n  {key_lines[0]} a\r\n\t{key_lines[1].replace(' ', chr(9))}\tb c\n"
    path = write(tmp_path, text)
    assert set(load_trusted_keys([path])) == ssh_keygen_fingerprints(path)
    assert len(ssh_keygen_fingerprints(path)) == 2


COMMENTS = st.text(st.characters(codec="utf-8", exclude_categories=("C", "Z")) | st.sampled_from(" \t"))


@st.composite
def trusted_files(draw, keys: list[str]) -> tuple[str, int | None]:
    """(a trusted-keys file's text, the 1-based line a hidden character was put in, or None)."""
    lines = []
    for _ in range(draw(st.integers(1, 5))):
        kind = draw(st.sampled_from(["key", "key", "comment", "blank"]))
        if kind == "key":
            sep = draw(st.sampled_from([" ", "\t", "  "]))
            key_type, blob = draw(st.sampled_from(keys)).split()
            comment = draw(COMMENTS)
            lines.append(draw(st.sampled_from(["", " ", "\t"])) + f"{key_type}{sep}{blob}{sep}{comment}")
        elif kind == "comment":
            lines.append("#" + draw(COMMENTS))
        else:
            lines.append(draw(st.sampled_from(["", " ", "\t "])))
    hidden_at = None
    ends = [draw(st.sampled_from(["\n", "\r\n"])) for _ in lines]
    if draw(st.booleans()):
        hidden_at = draw(st.integers(0, len(lines) - 1))
        line = lines[hidden_at]
        cut = draw(st.integers(0, len(line)))
        hidden = draw(st.sampled_from(HIDDEN))
        lines[hidden_at] = line[:cut] + hidden + line[cut:]
        if hidden == "\r" and cut == len(line):  # "\r\n" alone is a line end; "\r\r\n" hides one
            ends[hidden_at] = "\r\n"
        hidden_at += 1
    return "".join(line + end for line, end in zip(lines, ends, strict=True)), hidden_at


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_the_keys_trusted_are_the_ones_ssh_keygen_lists(key_lines, data):
    text, hidden_at = data.draw(trusted_files(key_lines))
    with tempfile.TemporaryDirectory() as folder:
        path = write(Path(folder), text)
        try:
            trusted = set(load_trusted_keys([path]))
        except InputError as refused:
            trusted = None
            reason = str(refused)
        if hidden_at is not None:
            assert trusted is None and reason.startswith(f"{path}:{hidden_at}: holds the control"), reason
        elif trusted is not None:
            assert trusted == ssh_keygen_fingerprints(path)
        else:  # refused for holding no key: ssh-keygen lists none either
            assert "holds no ssh-ed25519" in reason and not ssh_keygen_fingerprints(path)


# ------------------------------------------------------------------------- who may change the file


def refusal(path: Path) -> str:
    with pytest.raises(InputError) as refused:
        check_trusted_keys_mode(path)
    return str(refused.value)


@pytest.fixture()
def trusted(key_lines, tmp_path) -> Path:
    """A root-or-user-owned 0644 trusted-keys file in a 0755 directory: accepted."""
    folder = tmp_path / "keys"
    folder.mkdir(mode=0o755)
    path = write(folder, key_lines[0] + "\n")
    check_trusted_keys_mode(path)
    return path


def test_a_file_or_directory_on_its_path_others_may_write_is_refused(trusted, tmp_path):
    for mode in (0o664, 0o646):
        trusted.chmod(mode)
        assert f"mode {mode:04o}" in refusal(trusted) and "chmod go-w" in refusal(trusted)
    trusted.chmod(0o644)
    folder = trusted.parent
    for mode in (0o775, 0o777):
        folder.chmod(mode)
        expected = f"directory {folder} on its path is writable by other users (mode {mode:04o})"
        assert expected in refusal(trusted)
    # the sticky bit (as /tmp has): others cannot rename or remove root's or this user's entries
    folder.chmod(0o1777)
    check_trusted_keys_mode(trusted)
    # a directory above it counts the same, and so does one a symlink on the way leads through
    folder.chmod(0o755)
    tmp_path.chmod(0o777)
    assert f"directory {tmp_path} on its path" in refusal(trusted)
    tmp_path.chmod(0o755)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o777)
    (shared / "keys").symlink_to(folder)
    link = tmp_path / "link.pub"
    link.symlink_to(shared / "keys" / "trusted.pub")
    assert f"directory {shared} on its path" in refusal(link)
    assert f"directory {shared} on its path" in refusal(shared / "keys" / "trusted.pub")
    (tmp_path / "direct.pub").symlink_to(trusted)
    check_trusted_keys_mode(tmp_path / "direct.pub")


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_file_directory_or_symlink_owned_by_another_user_is_refused(trusted, tmp_path):
    nobody = 65534
    os.chown(trusted, nobody, nobody)
    assert "trusted-keys file is owned by" in refusal(trusted) and "uid 65534" in refusal(trusted)
    os.chown(trusted, 0, 0)
    os.chown(trusted.parent, nobody, nobody)
    assert f"directory {trusted.parent} on its path is owned by" in refusal(trusted)
    os.chown(trusted.parent, 0, 0)
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    link = sticky / "trusted.pub"
    link.symlink_to(trusted)
    check_trusted_keys_mode(link)
    os.lchown(link, nobody, nobody)  # its owner may replace a link in a sticky directory
    assert f"symlink {link} on its path is owned by" in refusal(link)
