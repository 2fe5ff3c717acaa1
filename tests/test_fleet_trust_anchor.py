"""Where a host without fleet memory starts trusting (a new, re-imaged or Kubernetes host: OUT/.tuf/ empty),
against the real S3 API server (moto's server mode), real Ed25519 keys and real push, rotate and pull:

- a host given the fleet's current root (`keys rotate --root-out`, `push --root-out` -> `pull --trusted-root`)
  never starts from an older root, and refuses a store whose roots stop short of it: whoever holds a
  retired key and can write the bucket cannot make it install anything, nor a host that remembers an older
  root than the one it was given;
- without a given root, a host starts from the newest root its keys sign, and refuses a store whose chain
  of roots from there has a gap;
- a trusted root file that is not the fleet's, or that other users could change, is a usage error (exit 2).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from zerogr_build.fleet.keys import load_signing_key, new_key
from zerogr_build.testing import publish_catalog, random_catalog

from .test_fleet import delete, put, remote_keys, served, tree, zerogr


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def ok(*args: str | Path) -> str:
    code, out, err = zerogr(*map(str, args))
    assert code == 0, (args, out, err)
    return out


def attacker_pushes_with(
    key: Path, remote: str, tmp_path: Path, keep_roots: set[str], put_back: set[str] = frozenset()
) -> None:
    """What someone holding a retired key and write access to the bucket does: delete the fleet's
    metadata but the roots in `keep_roots`, push a version of their own, numbered past the fleet's, with
    plain `zerogr push --signing-key` (the only roots left name their key), then put the roots in
    `put_back` back as they were."""
    saved = remote_keys(remote)
    for name in saved:
        if name.startswith("tuf/") and name.removeprefix("tuf/") not in keep_roots:
            delete(remote, name)
    evil = tmp_path / "attacker"
    for seed in (11, 12, 13):  # v1..v3: v3 is past the fleet's v2
        publish_catalog(random_catalog(seed=seed), evil)
    ok("push", evil, remote, "--signing-key", key, "--quiet")
    assert json.loads(remote_keys(remote)["v000003/manifest.json"])["version"] == 3
    for name in put_back:
        put(remote, f"tuf/{name}", saved[f"tuf/{name}"])


def test_a_retired_key_cannot_reach_a_host_set_up_as_the_docs_say(tmp_path, keys, build_out, remote):
    old, new = keys["a"], keys["b"]
    root_file = tmp_path / "handed" / "root.json"
    ok("push", build_out / "v000001", remote, "--signing-key", old, "--root-out", root_file)
    first_root = json.loads(root_file.read_bytes())
    assert first_root["signed"]["_type"] == "root" and first_root["signed"]["version"] == 1
    stale = tmp_path / "stale-host"  # pulled before the rotation: remembers root 1 only
    ok("pull", remote, stale, "--trusted-keys", keys["a.pub"], "--trusted-root", root_file)

    out = ok("keys", "rotate", remote, "--signing-key", old, "--new-key", new, "--root-out", root_file)
    assert f"hand {root_file} to every host" in out
    assert json.loads(root_file.read_bytes()) == json.loads(remote_keys(remote)["tuf/2.root.json"])
    ok("push", build_out / "v000002", remote, "--signing-key", new)
    # The hosts' trust after the rotation, as docs/fleet.md says: the new key's .pub and the new root.
    host_trust = ("--trusted-keys", str(keys["b.pub"]), "--trusted-root", str(root_file))
    follower = tmp_path / "follower"
    ok("pull", remote, follower, *host_trust)
    assert (follower / "LATEST").read_text().strip() == "v000002"

    attacker_pushes_with(old, remote, tmp_path, keep_roots={"1.root.json"})

    fresh = tmp_path / "fresh-host"
    code, _, err = zerogr("pull", remote, str(fresh), *host_trust)
    assert code == 4, err
    assert "the fleet's root metadata stops at version 1, older than the root this host was given" in (
        one_line(err)
    )
    assert f"({root_file}: version 2)" in err
    assert not (fresh / "LATEST").exists() and not list(fresh.glob("v0*"))
    code, _, err = zerogr("pull", remote, str(tmp_path / "fresh-2"), "--trusted-root", str(root_file))
    assert code == 4 and "stops at version 1" in one_line(err)  # the root alone: its keys are trusted
    code, _, err = zerogr("status", remote, *host_trust)  # a remote status is a host without memory too
    assert code == 4 and "stops at version 1" in one_line(err)

    for host in (follower, stale):  # with memory: the newest root it trusted, or the one it was given
        before = served(host)
        code, _, err = zerogr("pull", remote, str(host), *host_trust)
        assert code == 4, err
        assert served(host) == before and "v000003" not in tree(host)
    # Without the root, the new key alone finds no root it signs on the store.
    code, _, err = zerogr("pull", remote, str(tmp_path / "keys-only"), "--trusted-keys", str(keys["b.pub"]))
    assert code == 4 and "no root metadata is signed by the trusted keys" in one_line(err)
    # A host still configured with the retired key and the new root is told so before anything is read.
    code, _, err = zerogr(
        "pull", remote, str(tmp_path / "mixed"), "--trusted-keys", str(keys["a.pub"]), "--trusted-root",
        str(root_file),
    )  # fmt: skip
    assert code == 2 and "root version 2 is not signed by the trusted keys" in one_line(err)


def test_a_host_without_memory_starts_from_the_newest_root_and_refuses_a_broken_chain(
    tmp_path, keys, build_out, remote
):
    third = Path(new_key(tmp_path / "keys" / "c").private_path)
    ok("push", build_out / "v000001", remote, "--signing-key", keys["a"])
    ok("keys", "rotate", remote, "--signing-key", keys["a"], "--new-key", keys["b"])
    ok("push", build_out / "v000002", remote, "--signing-key", keys["b"])
    trusted = tmp_path / "trusted.pub"  # the old key and the current one, as while a rotation rolls out
    trusted.write_text(keys["a.pub"].read_text() + keys["b.pub"].read_text())
    host = tmp_path / "host"
    ok("pull", remote, host, "--trusted-keys", trusted)
    assert sorted(p.name for p in (host / ".tuf" / "root_history").iterdir()) == ["2.root.json"]

    ok("keys", "rotate", remote, "--signing-key", keys["b"], "--new-key", third)
    # Root 2 deleted: a host anchored on root 1 would stop there (its successor missing) and take what
    # key a signs; the store still lists root 3, so the chain has a gap.
    attacker_pushes_with(keys["a"], remote, tmp_path, {"1.root.json"}, put_back={"3.root.json"})
    fresh = tmp_path / "fresh"
    code, _, err = zerogr("pull", remote, str(fresh), "--trusted-keys", str(keys["a.pub"]))
    assert code == 4, err
    assert f"{remote}/tuf/2.root.json: missing, though the store holds root metadata up to version 3" in (
        one_line(err)
    )
    assert not list(fresh.glob("v0*"))


def test_a_trusted_root_file_must_be_the_fleets_and_safe(tmp_path, keys, build_out, remote):
    root_file = tmp_path / "root.json"
    ok("push", build_out / "v000001", remote, "--signing-key", keys["a"], "--root-out", root_file)
    assert root_file.stat().st_mode & 0o777 == 0o644
    os.chmod(root_file, 0o666)
    code, _, err = zerogr("pull", remote, str(tmp_path / "h"), "--trusted-root", str(root_file))
    assert code == 2 and "trusted root file is writable by other users" in one_line(err)
    os.chmod(root_file, 0o644)

    forged = json.loads(root_file.read_bytes())
    forged["signed"]["version"] = 7  # its signatures no longer match
    bad = tmp_path / "forged.json"
    bad.write_text(json.dumps(forged))
    code, _, err = zerogr("pull", remote, str(tmp_path / "h"), "--trusted-root", str(bad))
    assert code == 2 and "is not signed by its own root keys" in one_line(err)
    notes = tmp_path / "notes.json"
    notes.write_text('{"hello": 1}')
    code, _, err = zerogr("pull", remote, str(tmp_path / "h"), "--trusted-root", str(notes))
    assert code == 2 and "not TUF metadata" in one_line(err)
    code, _, err = zerogr(
        "pull", remote, str(tmp_path / "h"), "--trusted-root", str(root_file), "--allow-unsigned"
    )
    assert code == 2 and "contradict" in one_line(err)
    code, _, err = zerogr("push", str(build_out), remote, "--root-out", str(tmp_path / "x.json"))
    assert code == 2 and "--root-out needs --signing-key" in one_line(err)

    host = tmp_path / "host"  # the root alone, as a pod gets it: its keys are the ones trusted
    out = ok("pull", remote, host, "--trusted-root", root_file)
    assert "installed" in out
    key = load_signing_key(keys["a"])
    assert f"signed by {key.key_id}" in ok("verify", host, "--trusted-keys", keys["a.pub"])


def test_a_host_that_remembers_an_older_root_than_it_is_given_moves_to_the_given_one(
    tmp_path, keys, build_out, remote
):
    """Same trusted keys (the old and the new, as while a rotation rolls out), a memory of root 1 from
    before the rotation, and root 2 handed to the host: the memory does not win over the given root."""
    trusted = tmp_path / "trusted.pub"
    trusted.write_text(keys["a.pub"].read_text() + keys["b.pub"].read_text())
    root_file = tmp_path / "root.json"
    ok("push", build_out / "v000001", remote, "--signing-key", keys["a"], "--root-out", root_file)
    host = tmp_path / "host"
    ok("pull", remote, host, "--trusted-keys", trusted, "--trusted-root", root_file)
    assert sorted(p.name for p in (host / ".tuf" / "root_history").iterdir()) == ["1.root.json"]
    ok("keys", "rotate", remote, "--signing-key", keys["a"], "--new-key", keys["b"], "--root-out", root_file)

    attacker_pushes_with(keys["a"], remote, tmp_path, keep_roots={"1.root.json"})
    before = served(host)
    code, _, err = zerogr(
        "pull", remote, str(host), "--trusted-keys", str(trusted), "--trusted-root", str(root_file)
    )
    assert code == 4 and "stops at version 1, older than the root this host was given" in one_line(err)
    assert served(host) == before and (host / "LATEST").read_text().strip() == "v000001"


def test_a_stray_root_past_a_gap_stops_hosts_until_the_build_box_removes_it(
    tmp_path, keys, build_out, remote
):
    """A root file no writer made (numbered past a gap in the chain): hosts refuse the store, naming the
    missing version; the build box's next signed commit deletes it (one warning) and hosts pull again."""
    ok("push", build_out / "v000001", remote, "--signing-key", keys["a"])
    put(remote, "tuf/9.root.json", remote_keys(remote)["tuf/1.root.json"])
    trusted = ("--trusted-keys", str(keys["a.pub"]))
    code, _, err = zerogr("pull", remote, str(tmp_path / "host"), *trusted)
    assert code == 4 and "tuf/2.root.json: missing, though the store holds root metadata up to version 9" in (
        one_line(err)
    )
    code, _, err = zerogr("push", str(build_out / "v000002"), remote, "--signing-key", str(keys["a"]))
    assert code == 0 and "9.root.json: deleted" in err and "past the missing 2.root.json" in err
    assert "tuf/9.root.json" not in remote_keys(remote)
    ok("pull", remote, tmp_path / "host", *trusted)
    assert (tmp_path / "host" / "LATEST").read_text().strip() == "v000002"
