"""Rollbacks that stick, against a real S3 API server (moto's server mode, tests/conftest.py):

- one host: `zerogr promote OUT/vOLD` on a pulled host is left alone by the next pulls (one line on
  stderr, exit 0, zerogr_pull_held 1) until `zerogr pull --follow-remote`;
- the fleet: `zerogr promote s3://.../vOLD` moves the remote LATEST backwards by compare-and-swap, logged in
  the metrics, and hosts follow on their next pull; a version that is missing or incomplete is refused;
- the races of a rollback with a concurrent `push --keep` prune and a concurrent push, and a pull killed
  between its writes of LATEST and of its record.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_fleet import delete, put, remote_keys, samples, zerogr
from zerogr_build.fleet import pull as pull_module
from zerogr_build.fleet.pull import pull_version
from zerogr_build.fleet.pull_record import RECORD_NAME, held_latest
from zerogr_build.fleet.push import prune_remote
from zerogr_build.fleet.remote import RefusedRemoteVersion, RemoteOut, S3Store
from zerogr_build.fleet.rollback import move_remote_latest
from zerogr_build.fleet.signing import Trust
from zerogr_build.testing import publish_catalog, random_catalog

UNSIGNED = "--allow-unsigned"


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
    # The move is done: the record no longer names the version pull left (v1 is now a rollback target).
    assert "previous" not in json.loads((host / RECORD_NAME).read_text())

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
    move = move_remote_latest(f"{remote}/v000001", trust=Trust.unsigned(), store=racing)
    assert move.moved and move.previous == "v000003"
    assert remote_latest(remote) == b"v000001\n"


def test_a_version_pruned_during_the_rollback_puts_latest_back(build_out, remote):
    for name in ("v000001", "v000002"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0
    pruned = RacingStore(remote, lambda: delete(remote, "v000001/manifest.json"))
    with pytest.raises(RefusedRemoteVersion, match="pruned while LATEST was moved"):
        move_remote_latest(f"{remote}/v000001", trust=Trust.unsigned(), store=pruned)
    assert remote_latest(remote) == b"v000002\n"


# ------------------------------------------------------------------------- races with prune and push


class HookedStore(S3Store):
    """The real store; `hook(kind, name)` runs after each small read ("got"), and before each delete
    ("delete", each name) and head ("head") of this store, so a test can make something happen at an
    exact step of a prune or a rollback."""

    def __init__(self, url: str, hook) -> None:
        super().__init__(RemoteOut.parse(url))
        self.hook = hook

    def get_small(self, name, limit):
        got = super().get_small(name, limit)
        self.hook("got", name)
        return got

    def delete(self, names):
        for name in names:
            self.hook("delete", name)
        return super().delete(names)

    def head(self, name):
        self.hook("head", name)
        return super().head(name)


def three_pushed(build_out: Path, remote: str) -> None:
    publish_catalog(random_catalog(seed=3), build_out)
    for name in ("v000001", "v000002", "v000003"):
        assert zerogr("push", str(build_out / name), remote)[0] == 0


def once(action):
    """A hook that runs `action()` the first time `when(kind, name)` holds."""

    def make(when):
        done = []

        def hook(kind, name):
            if not done and when(kind, name):
                done.append(True)
                action()

        return hook

    return make


def test_a_prune_that_listed_before_a_rollback_keeps_the_version_latest_now_names(
    tmp_path, build_out, remote
):
    """`push --keep 1` lists v1..v3 and reads LATEST = v3, then a fleet rollback moves LATEST to v1 and
    checks v1, then the prune deletes: it reads LATEST again and keeps v1 (and v2, above the new LATEST)."""
    three_pushed(build_out, remote)
    rollback = once(lambda: move_remote_latest(f"{remote}/v000001", trust=Trust.unsigned()))
    store = HookedStore(remote, rollback(lambda kind, name: kind == "got" and name == "LATEST"))
    assert prune_remote(store, 1) == []
    assert remote_latest(remote) == b"v000001\n"
    assert {"v000001/manifest.json", "v000002/manifest.json"} <= set(remote_keys(remote))
    host = tmp_path / "host"
    assert pull(remote, host)[0] == 0 and latest(host) == "v000001"


def test_a_rollback_between_the_prunes_check_and_its_delete_gets_the_manifest_back(
    tmp_path, build_out, remote
):
    """The rollback lands after the prune read LATEST for v1 and before it deletes v1's manifest: the
    prune reads LATEST once more after the delete, puts the manifest back and deletes nothing else."""
    three_pushed(build_out, remote)
    before = remote_keys(remote)
    rollback = once(lambda: move_remote_latest(f"{remote}/v000001", trust=Trust.unsigned()))
    store = HookedStore(remote, rollback(lambda kind, name: name == "v000001/manifest.json"))
    assert prune_remote(store, 1) == []
    after = remote_keys(remote)
    assert after["LATEST"] == b"v000001\n"
    assert {k: v for k, v in after.items() if k.startswith("v000001/")} == {
        k: v for k, v in before.items() if k.startswith("v000001/")
    }
    host = tmp_path / "host"
    assert pull(remote, host)[0] == 0 and latest(host) == "v000001"


def test_a_rollback_that_finds_its_version_gone_never_deletes_a_concurrent_pushs_latest(build_out, remote):
    """No LATEST before the rollback; between its move and its check, v1 loses its manifest and a push
    promotes v2: the rollback is refused and leaves the push's LATEST alone."""
    assert zerogr("push", str(build_out / "v000001"), remote, "--no-promote")[0] == 0

    def meanwhile() -> None:
        delete(remote, "v000001/manifest.json")
        assert zerogr("push", str(build_out / "v000002"), remote)[0] == 0

    racing = once(meanwhile)
    store = HookedStore(remote, racing(lambda kind, name: kind == "head" and name == "v000001/manifest.json"))
    with pytest.raises(RefusedRemoteVersion, match="pruned while LATEST was moved"):
        move_remote_latest(f"{remote}/v000001", trust=Trust.unsigned(), store=store)
    assert remote_latest(remote) == b"v000002\n"


# ----------------------------------------------------------------------- a pull killed half-way


class Killed(BaseException):
    """Stands for SIGTERM/SIGKILL at one step of a pull."""


@pytest.mark.parametrize("when", ["before", "after"])
def test_a_pull_killed_around_its_move_of_latest_is_not_taken_for_a_local_rollback(
    tmp_path, build_out, remote, monkeypatch, when
):
    """The pull of v2 is killed just before or just after it replaces LATEST. Either way the host's
    LATEST is pull's own: the next pull follows the remote (now v3) instead of holding."""
    host = tmp_path / "host"
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert pull(remote, host)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote)[0] == 0
    real = pull_module.replace_latest

    def killed(out, name):
        if when == "after":
            real(out, name)
        raise Killed

    with monkeypatch.context() as patch:
        patch.setattr(pull_module, "replace_latest", killed)
        with pytest.raises(Killed):
            pull_version(remote, host, trust=Trust.unsigned())
    assert latest(host) == ("v000002" if when == "after" else "v000001")
    record = json.loads((host / RECORD_NAME).read_text())

    publish_catalog(random_catalog(seed=3), build_out)
    assert zerogr("push", str(build_out / "v000003"), remote)[0] == 0
    code, out, err = pull(remote, host)
    assert code == 0 and "stays at" not in err, err
    assert latest(host) == "v000003"
    # The record named both versions while LATEST moved, and only the new one once it had.
    assert (record["latest"], record.get("previous")) == ("v000002", "v000001")
    assert "previous" not in json.loads((host / RECORD_NAME).read_text())


def test_a_pull_record_names_the_versions_pull_set_old_and_new_forms(tmp_path):
    """held_latest on records written by hand: the old form (only "latest"), and one cut short between
    its two writes ("previous" too). A LATEST naming neither is an operator's: held."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "LATEST").write_text("v000002\n")
    record = out / RECORD_NAME
    record.write_text(json.dumps({"latest": "v000002", "url": "s3://b/p", "at": "x"}) + "\n")
    assert held_latest(out, "v000003") is None
    (out / "LATEST").write_text("v000001\n")
    assert held_latest(out, "v000003") == "v000001"  # old form: a rollback to v1 is held
    record.write_text(json.dumps({"latest": "v000002", "previous": "v000001", "url": "s3://b/p"}) + "\n")
    assert held_latest(out, "v000003") is None  # pull was moving away from v1: its own
    (out / "LATEST").write_text("v000004\n")
    assert held_latest(out, "v000003") == "v000004"
    record.write_text(json.dumps({"latest": "v000002", "previous": "../x"}) + "\n")
    (out / "LATEST").write_text("v000001\n")
    assert held_latest(out, "v000003") == "v000001"  # a "previous" that is no version dir is ignored
