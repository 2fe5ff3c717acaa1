"""The fleet's signed metadata (TUF, python-tuf) against the real S3 API server (moto's server mode), with
real `zerogr` processes where the build box or a host runs one:

- a replay of an earlier state (every object put back as it was) is exit 4 with the host unchanged, and
  the next push recovers the fleet; a signed rollback is followed;
- 40 days without a signature (a faked clock: faketime) is exit 4 naming the expiry, with the expiry in
  the metrics; the build box's next signed run renews it;
- a key rotation is followed by hosts that remember the fleet, and the retired key is refused by them and
  by push;
- mixed metadata (a file from another state under the name the newer metadata signs) is refused;
- a fleet signed the old way (a signature per version) moves over on its first signed push;
- concurrent commits lose no change; a rebuild renews the timestamp even when it builds nothing.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import threading
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

try:  # Python >= 3.11
    import tomllib
except ModuleNotFoundError:  # pragma: no cover - Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from zerogr_build.config import FleetSettings
from zerogr_build.fleet import renew_freshness
from zerogr_build.fleet.keys import load_signing_key
from zerogr_build.fleet.metadata import (
    LATEST_TARGET,
    latest_entry,
    manifest_entry,
    manifest_target,
    sign_with,
    to_bytes,
    tuf,
)
from zerogr_build.fleet.migrate import OLD_PREFIX
from zerogr_build.fleet.remote import RemoteOut, S3Store
from zerogr_build.fleet.repository import TIMESTAMP_EXPIRY_DAYS, commit
from zerogr_build.testing import publish_catalog, random_catalog

from .test_fleet import CLI, delete, put, remote_keys, samples, served, tree, zerogr

DAY = 86400.0


def sh(*args: str | Path, faketime: str | None = None) -> subprocess.CompletedProcess:
    """`zerogr ARGS` in its own process (under `faketime OFFSET` when given), as cron runs it."""
    command = [*CLI, *map(str, args)]
    if faketime is not None:
        command = ["faketime", faketime, *command]
    return subprocess.run(command, capture_output=True, text=True, env=dict(os.environ), timeout=300)


def ok(*args: str | Path, faketime: str | None = None) -> str:
    proc = sh(*args, faketime=faketime)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def latest(out: Path) -> str:
    return (out / "LATEST").read_text().strip()


# --------------------------------------------------------------------------- replay, recovery, rollback


def test_a_replay_is_refused_the_next_push_recovers_and_a_signed_rollback_is_followed(
    tmp_path, keys, build_out, remote
):
    signing, trusted = ("--signing-key", keys["a"]), ("--trusted-keys", keys["a.pub"])
    host, m = tmp_path / "host", tmp_path / "pull.prom"
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    ok("pull", remote, host, "--keep", "3", *trusted)
    after_v1 = remote_keys(remote)
    ok("push", build_out / "v000002", remote, *signing)
    ok("pull", remote, host, "--keep", "3", *trusted)
    assert latest(host) == "v000002"

    # Whoever can write the bucket (no key) puts every object back as it was after v1.
    for name in set(remote_keys(remote)) - set(after_v1):
        delete(remote, name)
    for name, data in after_v1.items():
        put(remote, name, data)
    before = tree(host)  # .tuf/ included: the host's memory of the fleet is not rolled back either
    proc = sh("pull", remote, host, "--keep", "3", *trusted, "--metrics-file", m)
    assert proc.returncode == 4, proc.stderr
    line = one_line(proc.stderr)
    assert f"{remote}/tuf/timestamp.json" in line and "a replay of an earlier state" in line
    assert tree(host) == before and latest(host) == "v000002"
    assert samples(m)[("zerogr_job_exit_status", (("job", "pull"),))] == 4

    # The build box's next push is signed past anything the hosts have seen: the fleet recovers.
    publish_catalog(random_catalog(seed=3), build_out)
    ok("push", build_out, remote, *signing)
    ok("pull", remote, host, "--keep", "3", *trusted, "--metrics-file", m)
    assert latest(host) == "v000003"
    assert samples(m)[("zerogr_fleet_latest_version", (("job", "pull"),))] == 3

    # A signed rollback (to v1: v2 is gone from the store) is new signed metadata; hosts follow it.
    out = ok("promote", f"{remote}/v000001", *signing)
    assert out.startswith(f"{remote}/LATEST: v000003 -> v000001 (backwards: a rollback), signed by SHA256:")
    ok("pull", remote, host, "--keep", "3", *trusted, "--metrics-file", m)
    assert latest(host) == "v000001"
    assert samples(m)[("zerogr_fleet_latest_version", (("job", "pull"),))] == 1
    # Moving the plain LATEST (no key) is not a rollback of a signed fleet.
    proc = sh("promote", f"{remote}/v000003", *trusted)
    assert proc.returncode == 2 and "--signing-key KEY" in one_line(proc.stderr)


# ------------------------------------------------------------------------------------------- freshness


@pytest.mark.skipif(shutil.which("faketime") is None, reason="needs faketime (apt-get install faketime)")
def test_forty_days_without_a_signature_is_exit_4_naming_the_expiry(tmp_path, keys, build_out, remote):
    signing, trusted = ("--signing-key", str(keys["a"])), ("--trusted-keys", str(keys["a.pub"]))
    host, m = tmp_path / "host", tmp_path / "pull.prom"
    assert zerogr("push", str(build_out), remote, *signing)[0] == 0
    code, out, err = zerogr("pull", remote, str(host), *trusted, "--json")
    assert code == 0, err
    expires = json.loads(out)["expires"]
    assert abs(expires - (time.time() + TIMESTAMP_EXPIRY_DAYS * DAY)) < 600
    when = datetime.fromtimestamp(expires, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")

    before = tree(host)
    proc = sh("pull", remote, host, *trusted, "--metrics-file", m, faketime="+40 days")
    assert proc.returncode == 4, proc.stderr
    line = one_line(proc.stderr)
    assert f"{remote}/tuf/timestamp.json" in line and f"expired at {when}" in line
    assert tree(host) == before
    got = samples(m)
    assert got[("zerogr_job_exit_status", (("job", "pull"),))] == 4
    assert got[("zerogr_fleet_metadata_expires_timestamp_seconds", (("job", "pull"),))] == expires
    proc = sh("status", remote, *trusted, faketime="+40 days")
    assert proc.returncode == 4 and f"expired at {when}" in one_line(proc.stderr)

    # The build box's next signed run (here a push of the version it has) renews it; hosts go on.
    ok("push", build_out, remote, *signing, faketime="+40 days")
    ok("pull", remote, host, *trusted, faketime="+40 days")


def test_renewal_config_and_metrics(tmp_path, keys, build_out, remote):
    config = tmp_path / "zerogr.toml"
    config.write_text("[fleet]\ntimestamp_expiry_days = 0.5\n")
    m = tmp_path / "push.prom"
    code, out, err = zerogr(
        "push", str(build_out), remote, "--signing-key", str(keys["a"]), "--config", str(config),
        "--metrics-file", str(m), "--json",
    )  # fmt: skip
    assert code == 0, err
    expires = json.loads(out)["expires"]
    assert abs(expires - (time.time() + DAY / 2)) < 600
    assert samples(m)[("zerogr_fleet_metadata_expires_timestamp_seconds", (("job", "push"),))] == expires
    assert samples(m)[("zerogr_fleet_latest_version", (("job", "push"),))] == 2

    before = remote_keys(remote)["tuf/timestamp.json"]
    renewed = renew_freshness(remote, keys["a"])
    assert abs(renewed - (time.time() + TIMESTAMP_EXPIRY_DAYS * DAY)) < 600
    assert remote_keys(remote)["tuf/timestamp.json"] != before
    m = tmp_path / "status.prom"
    code, out, _ = zerogr("status", remote, "--trusted-keys", str(keys["a.pub"]), "--metrics-file", str(m))
    assert code == 0 and "signed metadata expires" in out
    got = samples(m)
    assert got[("zerogr_fleet_metadata_expires_timestamp_seconds", (("job", "status"),))] == renewed
    assert got[("zerogr_fleet_latest_version", (("job", "status"),))] == 2

    defaults = tomllib.loads(zerogr("config", "--show-defaults")[1])
    assert defaults["fleet"] == {"timestamp_expiry_days": TIMESTAMP_EXPIRY_DAYS}
    assert FleetSettings().timestamp_expiry_days == TIMESTAMP_EXPIRY_DAYS
    config.write_text("[fleet]\ntimestamp_expiry_days = -1\n")
    code, _, err = zerogr(
        "push", str(build_out), remote, "--signing-key", str(keys["a"]), "--config", str(config)
    )
    assert code == 2 and "timestamp_expiry_days must be a number of days > 0" in one_line(err)


def test_a_rebuild_renews_the_timestamp_even_when_it_builds_nothing(tmp_path, keys, build_out, remote):
    assert zerogr("push", str(build_out), remote, "--signing-key", str(keys["a"]))[0] == 0
    before = remote_keys(remote)["tuf/timestamp.json"]
    m = tmp_path / "rebuild.prom"
    proc = sh(
        "rebuild", tmp_path / "missing.parquet", "--out", tmp_path / "out", "--codebook-sizes", "8,8,8",
        "--push", remote, "--push-signing-key", keys["a"], "--metrics-file", m,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr  # the build refused its input: nothing built, nothing pushed
    assert "renewed the signed metadata" in proc.stderr
    assert remote_keys(remote)["tuf/timestamp.json"] != before
    got = samples(m)
    expires = got[("zerogr_fleet_metadata_expires_timestamp_seconds", (("job", "rebuild"),))]
    assert abs(expires - (time.time() + TIMESTAMP_EXPIRY_DAYS * DAY)) < 600
    assert got[("zerogr_fleet_latest_version", (("job", "rebuild"),))] == 2


# ----------------------------------------------------------------------------------------- key rotation


def forge(remote: str, key, number: int) -> None:
    """What someone holding a retired key does: new targets, snapshot and timestamp naming vN as LATEST,
    signed by that key alone, numbered past everything on the store."""
    metadata = tuf()
    manifest = remote_keys(remote)[f"v{number:06d}/manifest.json"]
    targets = {manifest_target(number): manifest_entry(number, manifest), LATEST_TARGET: latest_entry(number)}
    version = int(time.time()) + 100_000
    expires = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=3)
    files = {}
    md = metadata.Metadata(metadata.Targets(version=version, expires=expires, targets=targets))
    sign_with(md, [key])
    files[f"{version}.targets.json"] = to_bytes(md)
    meta = {
        "targets.json": metadata.MetaFile.from_data(version, files[f"{version}.targets.json"], ["sha256"])
    }
    md = metadata.Metadata(metadata.Snapshot(version=version, expires=expires, meta=meta))
    sign_with(md, [key])
    files[f"{version}.snapshot.json"] = to_bytes(md)
    snapshot = metadata.MetaFile.from_data(version, files[f"{version}.snapshot.json"], ["sha256"])
    md = metadata.Metadata(metadata.Timestamp(version=version, expires=expires, snapshot_meta=snapshot))
    sign_with(md, [key])
    files["timestamp.json"] = to_bytes(md)
    for name, data in files.items():
        put(remote, f"tuf/{name}", data)


def test_a_key_rotation_is_followed_and_the_retired_key_refused(tmp_path, keys, build_out, remote):
    old, new = load_signing_key(keys["a"]), load_signing_key(keys["b"])
    trusted = ("--trusted-keys", keys["a.pub"])  # the host's file is never edited
    host = tmp_path / "host"
    assert zerogr("push", str(build_out / "v000001"), remote, "--signing-key", str(keys["a"]))[0] == 0
    assert zerogr("pull", remote, str(host), "--trusted-keys", str(keys["a.pub"]))[0] == 0

    out = ok("keys", "rotate", remote, "--signing-key", keys["a"], "--new-key", keys["b"])
    assert f"{remote}/tuf/2.root.json: the fleet's keys are {new.key_id}" in out
    assert f"retired {old.key_id}" in out
    ok("push", build_out / "v000002", remote, "--signing-key", keys["b"])
    ok("pull", remote, host, *trusted)  # the host followed the new root from the key it trusts
    assert latest(host) == "v000002"
    assert f"signed by {new.key_id}" in ok("verify", host, *trusted)
    ok("pull", remote, tmp_path / "new-host", "--trusted-keys", keys["b.pub"])  # a new host: b alone

    publish_catalog(random_catalog(seed=3), build_out)
    before = remote_keys(remote)
    proc = sh("push", build_out, remote, "--signing-key", keys["a"], "--quiet")
    assert proc.returncode == 2 and f"does not let {old.key_id} sign" in one_line(proc.stderr)
    assert remote_keys(remote) == before  # refused before anything was uploaded
    # Someone who kept the retired key signs metadata naming v3 (uploaded unsigned): refused.
    assert zerogr("push", str(build_out), remote, "--no-promote")[0] == 0
    forge(remote, old, 3)
    before = tree(host)
    proc = sh("pull", remote, host, *trusted)
    assert proc.returncode == 4 and "not signed by the fleet's keys" in one_line(proc.stderr)
    assert tree(host) == before and latest(host) == "v000002"


# ---------------------------------------------------------------------------------------- mixed states


def test_metadata_from_another_state_is_refused(tmp_path, keys, build_out, remote):
    signing, trusted = ("--signing-key", str(keys["a"])), ("--trusted-keys", str(keys["a.pub"]))
    host = tmp_path / "host"
    assert zerogr("push", str(build_out / "v000001"), remote, *signing)[0] == 0
    assert zerogr("pull", remote, str(host), *trusted)[0] == 0
    first = {k: v for k, v in remote_keys(remote).items() if k.endswith(".targets.json")}
    assert zerogr("push", str(build_out / "v000002"), remote, *signing)[0] == 0
    second = sorted(k for k in remote_keys(remote) if k.endswith(".targets.json") and k not in first)
    put(remote, second[-1], next(iter(first.values())))  # the older targets under the newer name
    before = served(host)
    code, _, err = zerogr("pull", remote, str(host), *trusted)
    assert code == 4 and f"{remote}/{second[-1]}" in one_line(err) and "not the file the newer" in err
    assert served(host) == before and latest(host) == "v000001"


# -------------------------------------------------------------------------------------------- migration


def old_signature(key, manifest_raw: bytes) -> bytes:
    """A manifest.json.sig as fleets were signed before they had metadata (one per version)."""
    body = {
        "format": "zerogr-signature",
        "algorithm": "ed25519",
        "key": key.key_id,
        "signature": base64.b64encode(key.sign(OLD_PREFIX + manifest_raw)).decode("ascii"),
    }
    return (json.dumps(body, indent=2) + "\n").encode("ascii")


def test_a_fleet_signed_version_by_version_moves_over_on_its_first_signed_push(
    tmp_path, keys, build_out, remote
):
    a, b = load_signing_key(keys["a"]), load_signing_key(keys["b"])
    trusted = ("--trusted-keys", str(keys["a.pub"]))
    host = tmp_path / "host"
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    publish_catalog(random_catalog(seed=3), build_out)
    assert zerogr("push", str(build_out), remote, "--no-promote")[0] == 0
    objects = remote_keys(remote)
    for number, key in ((1, a), (2, a), (3, b)):  # v3: signed by a key the build box never had
        name = f"v{number:06d}"
        put(remote, f"{name}/manifest.json.sig", old_signature(key, objects[f"{name}/manifest.json"]))
    assert zerogr("pull", remote, str(host), "--allow-unsigned")[0] == 0  # a host of those days
    (host / "v000002" / "manifest.json.sig").write_bytes(old_signature(a, objects["v000002/manifest.json"]))

    code, out, err = zerogr(
        "push", str(build_out / "v000002"), remote, "--signing-key", str(keys["a"]), "--json"
    )
    assert code == 0 and json.loads(out)["uploaded"] is False, err
    code, out, _ = zerogr("status", remote, "--json", *trusted)
    rows = {v["name"]: v for v in json.loads(out)["versions"]}
    assert code == 4 and json.loads(out)["latest"] == "v000002"
    assert rows["v000001"]["ok"] and rows["v000002"]["ok"] and rows["v000001"]["signed_by"] == a.key_id
    assert not rows["v000003"]["ok"] and "not in the fleet's signed metadata" in rows["v000003"]["error"]

    code, _, err = zerogr("verify", str(host), *trusted)  # nothing to check the old signature against
    assert code == 4 and "no fleet metadata signed by the trusted keys" in one_line(err)
    code, out, err = zerogr("pull", remote, str(host), *trusted)
    assert code == 0 and "already there" in out, err
    code, out, err = zerogr("verify", str(host), *trusted)  # its proof renewed by that pull
    assert code == 0 and f"signed by {a.key_id}" in out, err
    assert zerogr("promote", f"{remote}/v000001", "--signing-key", str(keys["a"]))[0] == 0
    assert zerogr("pull", remote, str(host), *trusted)[0] == 0 and latest(host) == "v000001"
    code, _, err = zerogr("promote", f"{remote}/v000003", "--signing-key", str(keys["a"]))
    assert code == 4 and "not in the fleet's signed metadata" in one_line(err)


# ---------------------------------------------------------------------------------------- concurrency


def test_concurrent_commits_lose_no_change(keys, remote):
    key = load_signing_key(keys["a"])
    store = S3Store(RemoteOut.parse(remote))
    commit(store, [key])  # the fleet's first root and metadata
    errors = []

    def add(number: int) -> None:
        entry = manifest_entry(number, f"manifest {number}".encode())
        try:
            commit(store, [key], lambda targets: targets.update({manifest_target(number): entry}))
        except Exception as exc:  # noqa: BLE001 - collected, asserted below
            errors.append(exc)

    threads = [threading.Thread(target=add, args=(n,)) for n in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == [] and commit(store, [key]).versions == [1, 2, 3, 4]
