"""Rollbacks that stick, against a real S3 API server (moto's server mode, tests/conftest.py):

- one host: `zerogr promote OUT/vOLD` on a pulled host is left alone by the next pulls (one line on
  stderr, exit 0, zerogr_pull_held 1) until `zerogr pull --follow-remote`;
- the fleet: `zerogr promote s3://.../vOLD` moves the remote LATEST backwards by compare-and-swap, logged in
  the metrics, and hosts follow on their next pull; a version that is missing or incomplete is refused.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests import test_fleet
from tests.test_fleet import delete, put, remote_keys, samples, zerogr
from zerogr_build.fleet.pull_record import RECORD_NAME
from zerogr_build.fleet.remote import RefusedRemoteVersion, RemoteOut, S3Store
from zerogr_build.fleet.rollback import move_remote_latest
from zerogr_build.testing import publish_catalog, random_catalog

UNSIGNED = "--allow-unsigned"
build_out = test_fleet.build_out  # the fixtures: a build box OUT with v1 and v2, and a remote OUT URL
remote = test_fleet.remote


def pull(remote_url: str, host: Path, *args: str) -> tuple[int, str, str]:
    return zerogr("pull", remote_url, str(host), "--keep", "3", UNSIGNED, *args)


def latest(out: Path) -> str:
    return (out / "LATEST").read_text().strip()


def remote_latest(url: str) -> bytes:
    return remote_keys(url)["LATEST"]


def metric(path: Path, name: str, job: str) -> float:
    return samples(path)[(name, (("job", job),))]


def test_a_local_rollback_sticks_until_the_host_follows_the_remote_again(tmp_path, build_out, remote):
    host = tmp_path / "host"
    prom = tmp_path / "pull.prom"
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert pull(remote, host)[0] == 0
    assert json.loads((host / RECORD_NAME).read_text())["latest"] == "v000001"
    assert zerogr("push", str(build_out / "v000002"), remote)[0] == 0
    assert pull(remote, host)[0] == 0 and latest(host) == "v000002"

    code, out, err = zerogr("promote", str(host / "v000001"))
    assert code == 0 and latest(host) == "v000001"
    assert "--follow-remote" in err  # promote says that pull will leave it there

    code, out, err = pull(remote, host, "--metrics-file", str(prom))
    assert code == 0, err
    assert latest(host) == "v000001"  # the rollback stuck
    assert len(err.strip().splitlines()) == 1 and "stays at v000001" in err and "--follow-remote" in err
    assert metric(prom, "zerogr_pull_held", "pull") == 1
    assert metric(prom, "zerogr_bundle_version", "pull") == 1

    publish_catalog(random_catalog(seed=3), build_out)  # a newer version reaches the store
    assert zerogr("push", str(build_out / "v000003"), remote)[0] == 0
    code, out, err = pull(remote, host, "--quiet")
    assert code == 0 and latest(host) == "v000001" and out.strip() == str(host / "v000001")
    assert not (host / "v000003").exists()  # held: nothing downloaded

    code, out, err = pull(remote, host, "--follow-remote", "--metrics-file", str(prom))
    assert code == 0, err
    assert latest(host) == "v000003" and "LATEST -> v000003" in out
    assert metric(prom, "zerogr_pull_held", "pull") == 0
    assert json.loads((host / RECORD_NAME).read_text())["latest"] == "v000003"
    code, out, err = pull(remote, host)  # following again: nothing held, nothing to do
    assert code == 0 and "already there" in out and "stays at" not in err


def test_a_host_without_a_pull_record_follows_the_remote(tmp_path, build_out, remote):
    """An OUT that pull never recorded (installed before records existed) follows the remote as before."""
    host = tmp_path / "host"
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
        assert pull(remote, host)[0] == 0
    (host / RECORD_NAME).unlink()
    assert zerogr("promote", str(host / "v000001"))[0] == 0
    assert pull(remote, host)[0] == 0 and latest(host) == "v000002"


def test_a_fleet_rollback_moves_the_remote_latest_back_and_hosts_follow(tmp_path, build_out, remote):
    host = tmp_path / "host"
    prom = tmp_path / "promote.prom"
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    assert pull(remote, host)[0] == 0 and latest(host) == "v000002"

    code, out, err = zerogr("promote", f"{remote}/v000001", "--metrics-file", str(prom))
    assert code == 0, err
    assert out == f"{remote}/LATEST: v000002 -> v000001 (backwards: a rollback)\n"
    assert remote_latest(remote) == b"v000001\n"
    assert metric(prom, "zerogr_job_exit_status", "promote") == 0
    assert metric(prom, "zerogr_bundle_version", "promote") == 1
    assert metric(prom, "zerogr_promote_previous_version", "promote") == 2

    code, out, err = pull(remote, host)  # the host follows backwards: pull set v000002, nobody else did
    assert code == 0 and latest(host) == "v000001" and "stays at" not in err
    assert zerogr("promote", f"{remote}/v000001")[1].endswith("(already)\n")

    publish_catalog(random_catalog(seed=3), build_out)
    code, out, _ = zerogr("push", str(build_out / "v000003"), remote)  # a new version moves it forwards
    assert code == 0 and "LATEST -> v000003" in out and remote_latest(remote) == b"v000003\n"


def test_a_fleet_rollback_refuses_a_version_that_is_not_complete(build_out, remote):
    """No such version (exit 5), a claimed version without its manifest, a version missing an object
    (exit 4): one line naming it, and LATEST untouched."""
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    put(remote, "v000003/.claim", b"{}")  # a push that died before its manifest
    delete(remote, "v000001/items.parquet")
    before = remote_keys(remote)
    for target, code, words in (
        ("v000009", 5, "v000009: no such version"),
        ("v000003", 4, "v000003/manifest.json: missing"),
        ("v000001", 4, "v000001/items.parquet: missing"),
    ):
        got, out, err = zerogr("promote", f"{remote}/{target}")
        assert got == code, err
        assert words in err and len(err.strip().splitlines()) == 1 and not out
        assert remote_keys(remote) == before


def test_a_fleet_rollback_needs_a_version_url(remote):
    code, _, err = zerogr("promote", remote)
    assert code == 2 and "expected s3://bucket/prefix/vNNNNNN" in err


class RacingStore(S3Store):
    """An S3Store on which something happens to the remote OUT just before the first write of LATEST."""

    def __init__(self, url: str, before_first_put) -> None:
        super().__init__(RemoteOut.parse(url))
        self.before_first_put = before_first_put

    def put(self, name, data, **kwargs):
        if name == "LATEST" and self.before_first_put is not None:
            action, self.before_first_put = self.before_first_put, None
            action()
        return super().put(name, data, **kwargs)


def test_a_fleet_rollback_is_a_compare_and_swap(build_out, remote):
    """A push that moves LATEST between the rollback's read and its write makes the write fail (If-Match);
    the rollback reads again and names the LATEST it really replaced."""
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    publish_catalog(random_catalog(seed=3), build_out)
    racing = RacingStore(remote, lambda: zerogr("push", str(build_out / "v000003"), remote))
    move = move_remote_latest(f"{remote}/v000001", store=racing)
    assert move.moved and move.previous == "v000003"
    assert remote_latest(remote) == b"v000001\n"


def test_a_version_pruned_during_the_rollback_puts_latest_back(build_out, remote):
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    pruned = RacingStore(remote, lambda: delete(remote, "v000001/manifest.json"))
    with pytest.raises(RefusedRemoteVersion, match="pruned while LATEST was moved"):
        move_remote_latest(f"{remote}/v000001", store=pruned)
    assert remote_latest(remote) == b"v000002\n"
