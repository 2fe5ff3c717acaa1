"""Signed versions against the real S3 API server (moto's server mode, tests/conftest.py) and real Ed25519
keys: `zerogr keys new`, `push --signing-key` (the fleet's signed metadata), and `pull` / `status` /
`verify` with --trusted-keys.

A host installs only bytes the build box vouched for, whoever else can write the bucket: a version that is
unsigned, signed by an unknown key, or changed after signing (the manifest rewritten with matching
sha256s) is refused with exit 4 and one line, and what the host serves stays byte-identical. Replays,
expiry, rollbacks, rotation and migration: test_fleet_tuf.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from pathlib import Path

import pytest

from zerogr_build.bundle.format import manifest_bytes
from zerogr_build.fleet.keys import load_signing_key
from zerogr_build.fleet.metadata import manifest_entry, manifest_target
from zerogr_build.fleet.remote import RemoteOut, S3Store
from zerogr_build.fleet.repository import commit

from .test_fleet import put, remote_keys, served, tree, zerogr


def remote_json(url: str, name: str) -> dict:
    return json.loads(remote_keys(url)[name])


def rewrite_with_matching_sha256(url: str, version: str, name: str) -> bytes:
    """What an attacker with write access to the prefix does: change one file of a pushed version and
    update its size and sha256 in the remote manifest. Returns the new manifest bytes."""
    objects = remote_keys(url)
    data = bytearray(objects[f"{version}/{name}"])
    data[-1] ^= 0x01
    put(url, f"{version}/{name}", bytes(data))
    manifest = json.loads(objects[f"{version}/manifest.json"])
    manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(bytes(data)).hexdigest()}
    raw = manifest_bytes(manifest)
    put(url, f"{version}/manifest.json", raw)
    return raw


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


# ------------------------------------------------------------------------------------------- keys new


def test_keys_new_writes_a_0600_private_key_and_its_public_line_and_never_overwrites(tmp_path):
    path = tmp_path / "build-box"
    code, out, err = zerogr("keys", "new", str(path))
    assert code == 0, err
    public = Path(f"{path}.pub").read_text()
    assert public.startswith("ssh-ed25519 ") and public.strip() in out
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    key = load_signing_key(path)
    assert key.key_id in out and key.key_id in public
    before = path.read_bytes(), Path(f"{path}.pub").read_bytes()
    code, _, err = zerogr("keys", "new", str(path))
    assert code == 2 and "never overwritten" in one_line(err)
    assert (path.read_bytes(), Path(f"{path}.pub").read_bytes()) == before
    # A stray .pub alone also stops it, and nothing is written.
    Path(f"{tmp_path / 'other'}.pub").write_text("x\n")
    code, _, err = zerogr("keys", "new", str(tmp_path / "other"))
    assert code == 2 and not (tmp_path / "other").exists()


def test_key_files_that_are_not_safe_or_not_keys_are_usage_errors(tmp_path, keys, build_out, remote):
    os.chmod(keys["a"], 0o644)
    code, _, err = zerogr("push", str(build_out), remote, "--signing-key", str(keys["a"]))
    assert code == 2 and "chmod 600" in one_line(err)
    empty = tmp_path / "empty.pub"
    empty.write_text("# no keys yet\n")
    code, _, err = zerogr("pull", remote, str(tmp_path / "host"), "--trusted-keys", str(empty))
    assert code == 2 and "holds no ssh-ed25519" in one_line(err)
    garbage = tmp_path / "garbage.pub"
    garbage.write_text("ssh-ed25519 bm90IGEga2V5\n")
    code, _, err = zerogr("status", remote, "--trusted-keys", str(garbage))
    assert code == 2 and "garbage.pub:1" in one_line(err)


# ------------------------------------------------------------------------------------ the signed path


def test_a_signed_version_is_pulled_checked_and_recorded_on_the_host(tmp_path, keys, build_out, remote):
    code, out, err = zerogr("push", str(build_out), remote, "--signing-key", str(keys["a"]), "--json")
    assert code == 0, err
    assert "unsigned" not in err
    key_id = load_signing_key(keys["a"]).key_id
    assert json.loads(out)["signed_by"] == key_id
    objects = remote_keys(remote)
    assert {"tuf/1.root.json", "tuf/timestamp.json"} <= set(objects)
    assert not [name for name in objects if name.endswith(".sig")]  # the metadata signs, not a file each

    host = tmp_path / "host"
    code, out, err = zerogr("pull", remote, str(host), "--trusted-keys", str(keys["a.pub"]), "--json")
    assert code == 0, err
    assert json.loads(out)["signed_by"] == key_id and json.loads(out)["fleet_latest"] == 2
    # the version's proof: the signed targets metadata that listed it, as the host's client trusted it
    proof = (host / "v000002" / "manifest.json.sig").read_bytes()
    assert proof == (host / ".tuf" / "targets.json").read_bytes()
    code, out, err = zerogr("verify", str(host), "--trusted-keys", str(keys["a.pub"]))
    assert code == 0 and f"signed by {key_id}" in out and "not listed" not in err

    for target in (remote, str(host)):
        code, out, _ = zerogr("status", target, "--json", "--verify", "--trusted-keys", str(keys["a.pub"]))
        report = json.loads(out)
        assert code == 0 and [v["signed_by"] for v in report["versions"]] == [key_id]
        assert report["latest"] == "v000002"


def test_a_version_rewritten_with_matching_sha256s_is_refused_everywhere(tmp_path, keys, build_out, remote):
    """The attack: a file swapped on the store and the manifest's size and sha256 updated to match."""
    trusted = ("--trusted-keys", str(keys["a.pub"]))
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    hosts = [tmp_path / "host-a", tmp_path / "host-b"]
    for host in hosts:
        assert zerogr("pull", remote, str(host), *trusted)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote, "--signing-key", str(keys["a"]))[0] == 0
    rewrite_with_matching_sha256(remote, "v000002", "items.parquet")

    for host in hosts:
        before = served(host)
        code, out, err = zerogr("pull", remote, str(host), *trusted)
        assert code == 4, (out, err)
        line = one_line(err)
        assert f"{remote}/v000002/manifest.json" in line and "changed after it was signed" in line
        assert served(host) == before and (host / "LATEST").read_text() == "v000001\n"
        code, _, err = zerogr("pull", remote, str(host), *trusted, "--verify", "--version", "2")
        assert code == 4 and served(host) == before

    for flags in ((), ("--verify",)):
        code, out, _ = zerogr("status", remote, "--json", *flags, *trusted)
        report = json.loads(out)
        assert code == 4 and [v["ok"] for v in report["versions"]] == [True, False]
        assert "changed after it was signed" in report["versions"][1]["error"]
    # The same rewrite on a host after its pull: `zerogr verify` with the trusted keys refuses it too.
    local = hosts[0] / "v000001" / "manifest.json"
    manifest = json.loads(local.read_text())
    manifest["model_version"] = "changed"
    local.write_bytes(manifest_bytes(manifest))
    code, _, err = zerogr("verify", str(hosts[0] / "v000001"), *trusted)
    assert code == 4 and "v000001/manifest.json" in one_line(err) and "changed after it was signed" in err


def test_unsigned_and_unknown_key_fleets_are_refused(tmp_path, keys, build_out, remote, s3_bucket):
    trusted = ("--trusted-keys", str(keys["a.pub"]))
    host = tmp_path / "host"
    code, _, err = zerogr("push", str(build_out / "v000001"), remote)
    assert code == 0 and "unsigned" in err
    code, _, err = zerogr("pull", remote, str(host), *trusted)
    assert code == 4 and f"{remote}/tuf/1.root.json" in one_line(err) and "no signed metadata" in err
    assert served(host) == {}

    # A fleet signed by b: nothing of it is signed by the key this host trusts.
    other = f"s3://{s3_bucket}/other"
    assert zerogr("push", str(build_out / "v000001"), other, "--signing-key", str(keys["b"]))[0] == 0
    code, _, err = zerogr("pull", other, str(tmp_path / "h2"), *trusted)
    assert code == 4 and load_signing_key(keys["a"]).key_id in one_line(err) and "no root metadata" in err
    # b's timestamp copied over a's fleet: not signed by a's keys.
    assert zerogr("push", str(build_out / "v000002"), remote, "--signing-key", str(keys["a"]))[0] == 0
    assert zerogr("pull", remote, str(host), *trusted)[0] == 0
    before = tree(host)
    put(remote, "tuf/timestamp.json", remote_keys(other)["tuf/timestamp.json"])
    code, _, err = zerogr("pull", remote, str(host), *trusted)
    assert code == 4 and f"{remote}/tuf/timestamp.json" in one_line(err) and "not signed" in err
    assert tree(host) == before


def test_a_host_must_choose_between_trusted_keys_and_an_unsigned_fleet(tmp_path, keys, build_out, remote):
    from typer.testing import CliRunner

    from zerogr_build.cli import app

    def bare(*args: str) -> tuple[int, str]:  # no --allow-unsigned added by the helper
        result = CliRunner().invoke(app, list(args), catch_exceptions=False)
        return result.exit_code, result.stderr

    assert zerogr("push", str(build_out), remote)[0] == 0
    for args in (("pull", remote, str(tmp_path / "host")), ("status", remote)):
        code, err = bare(*args)
        assert code == 2 and "--trusted-keys" in one_line(err) and "--allow-unsigned" in err
    code, err = bare(
        "pull", remote, str(tmp_path / "host"), "--allow-unsigned", "--trusted-keys", str(keys["a.pub"])
    )
    assert code == 2 and "contradict" in one_line(err)
    assert not (tmp_path / "host").exists()
    code, _ = bare("pull", remote, str(tmp_path / "host"), "--allow-unsigned")
    assert code == 0 and not (tmp_path / "host" / "v000001" / "manifest.json.sig").exists()


def test_a_signed_manifest_naming_a_file_the_local_disk_cannot_hold_is_exit_4_naming_it(
    tmp_path, keys, build_out, remote
):
    """Even a signed version may name a file the host's file system cannot create (a component over its
    NAME_MAX): refused up front, naming the remote object, and nothing is written."""
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    long_name = f"plans/{'x' * 300}.json"
    body = b"{}"
    put(remote, f"v000001/{long_name}", body)
    manifest = remote_json(remote, "v000001/manifest.json")
    manifest["files"][long_name] = {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest()}
    raw = manifest_bytes(manifest)
    put(remote, "v000001/manifest.json", raw)
    store = S3Store(RemoteOut.parse(remote))  # the build box signs it (a test: no attacker can)
    commit(
        store, [load_signing_key(keys["a"])], lambda t: t.update({manifest_target(1): manifest_entry(1, raw)})
    )
    host = tmp_path / "host"
    host.mkdir()
    code, _, err = zerogr("pull", remote, str(host), "--trusted-keys", str(keys["a.pub"]))
    assert code == 4, err
    assert f"{remote}/v000001/{long_name}" in one_line(err) and "too long" in err
    assert served(host) == {}


def test_without_cryptography_key_commands_say_how_to_install_it(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cryptography.hazmat.primitives.asymmetric", None)
    code, _, err = zerogr("keys", "new", str(tmp_path / "k"))
    assert code == 2 and "zerogr[s3]" in one_line(err)
    assert not (tmp_path / "k").exists()


def bare(*args: str) -> tuple[int, str, str]:
    """The CLI in-process with exactly `args` (the zerogr helper adds --allow-unsigned to remote reads)."""
    from typer.testing import CliRunner

    from zerogr_build.cli import app

    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


# --------------------------------------------------------------------- keeping a signed fleet moving


def test_an_unsigned_push_is_not_promoted_on_a_signed_fleet(tmp_path, keys, build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    before = remote_keys(remote)
    code, out, err = bare("push", str(build_out / "v000002"), remote)
    line = one_line(err)
    assert code == 2 and not out
    assert f"{remote}/tuf/timestamp.json" in line and "--signing-key" in line and "--allow-unsigned" in line
    assert remote_keys(remote) == before  # refused before anything was uploaded
    # --no-promote does not move LATEST: allowed; --allow-unsigned then moves the plain LATEST on purpose,
    # and hosts that trust keys keep following the signed metadata.
    assert bare("push", str(build_out / "v000002"), remote, "--no-promote")[0] == 0
    assert remote_keys(remote)["LATEST"] == b"v000001\n"
    code, _, err = bare("push", str(build_out / "v000002"), remote)  # pushed before: still not promoted
    assert code == 2 and "signed" in one_line(err)
    code, out, err = bare("push", str(build_out / "v000002"), remote, "--allow-unsigned")
    assert code == 0 and "LATEST -> v000002" in out and "unsigned" in err
    host = tmp_path / "host"
    code, out, err = bare("pull", remote, str(host), "--trusted-keys", str(keys["a.pub"]))
    assert code == 0 and (host / "LATEST").read_text() == "v000001\n", err
    # Signed later, it is listed (pushed before, with this box's content), and the hosts follow.
    code, out, err = bare("push", str(build_out / "v000002"), remote, "--signing-key", str(keys["a"]))
    assert code == 0 and "nothing uploaded" in out, err
    assert bare("pull", remote, str(host), "--trusted-keys", str(keys["a.pub"]))[0] == 0
    assert (host / "LATEST").read_text() == "v000002\n"


def test_a_trusted_keys_file_others_may_write_is_refused(tmp_path, keys, build_out, remote):
    assert zerogr("push", str(build_out), remote, "--signing-key", str(keys["a"]))[0] == 0
    trusted = tmp_path / "trusted.pub"
    trusted.write_bytes(keys["a.pub"].read_bytes())
    for mode in (0o664, 0o646, 0o666):
        os.chmod(trusted, mode)
        for args in (("pull", remote, str(tmp_path / "host")), ("status", remote)):
            code, _, err = zerogr(*args, "--trusted-keys", str(trusted))
            assert code == 2 and f"mode {mode:04o}" in one_line(err) and "chmod go-w" in err, (mode, err)
    assert not (tmp_path / "host").exists()
    os.chmod(trusted, 0o644)
    assert zerogr("pull", remote, str(tmp_path / "host"), "--trusted-keys", str(trusted))[0] == 0


@pytest.mark.parametrize(
    "comment", ["two\nssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIExtra x", "caf\u00e9", "tab\there"]
)
def test_keys_new_refuses_a_comment_that_is_not_one_line_of_printable_ascii(tmp_path, comment):
    path = tmp_path / "k"
    code, out, err = zerogr("keys", "new", str(path), "--comment", comment)
    assert code == 2 and not out and "--comment" in one_line(err) and "printable ASCII" in err
    assert not path.exists() and not Path(f"{path}.pub").exists()
    code, _, err = zerogr("keys", "new", str(path), "--comment", "build box 7 <ops@example.com>")
    assert code == 0, err
    assert Path(f"{path}.pub").read_text().endswith(" build box 7 <ops@example.com>\n")


# ------------------------------------------------------------------- the proof travels with the version


def test_a_host_that_pulled_unsigned_gets_proofs_on_its_first_pull_with_keys(
    tmp_path, keys, build_out, remote
):
    """A host on --allow-unsigned stores no proof; its first pull with --trusted-keys downloads nothing
    but gives every installed version the fleet lists its proof: `verify --trusted-keys` then works."""
    trusted = ("--trusted-keys", str(keys["a.pub"]))
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    host = tmp_path / "host"
    assert bare("pull", remote, str(host), "--allow-unsigned")[0] == 0
    proof = host / "v000001" / "manifest.json.sig"
    assert not proof.exists()
    code, _, err = zerogr("verify", str(host), *trusted)
    assert code == 4 and "no fleet metadata" in one_line(err)

    code, out, err = bare("pull", remote, str(host), *trusted)
    assert code == 0 and "already there" in out, err
    assert proof.read_bytes() == (host / ".tuf" / "targets.json").read_bytes()
    assert not [p.name for p in host.iterdir() if p.name.startswith(".tmp-")]
    code, out, err = zerogr("verify", str(host), *trusted)
    assert code == 0 and "signed by" in out, err
