"""Bad luck on the fleet path, against the real S3 API server (moto's server mode, tests/conftest.py): a
`push --keep` prune that lands while `status` reads the versions it listed, and a host disk that fills
while `pull` downloads."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from zerogr_build.fleet.push import prune_remote
from zerogr_build.fleet.remote import RemoteError, RemoteOut, S3Store
from zerogr_build.fleet.signing import Trust
from zerogr_build.fleet.status import out_status
from zerogr_build.testing import publish_catalog, random_catalog

from .test_fleet import put, remote_keys, served, zerogr


def change_manifest(remote: str, version: str) -> None:
    """Change a pushed version's manifest on the store (its model tag): no longer what was signed."""
    manifest = json.loads(remote_keys(remote)[f"{version}/manifest.json"])
    manifest["model_version"] = "changed on the store"
    put(remote, f"{version}/manifest.json", json.dumps(manifest).encode())


@pytest.fixture()
def three_pushed(tmp_path, remote) -> str:
    """Three versions pushed (v1..v3, LATEST = v3), signed with a fresh key; returns the public key file."""
    out = tmp_path / "build"
    key = tmp_path / "key"
    assert zerogr("keys", "new", str(key))[0] == 0
    for seed in (1, 2, 3):
        publish_catalog(random_catalog(seed=seed), out)
        assert zerogr("push", str(out), remote, "--signing-key", str(key))[0] == 0
    return f"{key}.pub"


class PruneAt(S3Store):
    """The real store; the first time status reads an object of kind `when` ("manifest": a manifest,
    "stream": any file, --verify), a concurrent `push --keep 1` prunes (real deletes on the server)."""

    def __init__(self, remote: RemoteOut, when: str) -> None:
        super().__init__(remote)
        self.when, self.pruned = when, []

    def _maybe_prune(self, kind: str) -> None:
        if kind == self.when and not self.pruned:
            self.pruned = prune_remote(S3Store(self.remote), 1) or ["nothing"]

    def get_small(self, name, limit):
        if name.endswith("/manifest.json"):
            self._maybe_prune("manifest")
        return super().get_small(name, limit)

    def stream_to(self, name, sink, size, on_chunk=None):
        self._maybe_prune("stream")
        return super().stream_to(name, sink, size, on_chunk)


@pytest.mark.parametrize("when, verify", [("manifest", False), ("manifest", True), ("stream", True)])
def test_status_leaves_out_versions_pruned_while_it_reads_them(remote, three_pushed, when, verify):
    store = PruneAt(RemoteOut.parse(remote), when)
    trust = Trust.from_files([three_pushed])
    report = out_status(remote, verify=verify, store=store, trust=trust)
    assert store.pruned == ["v000001", "v000002"]
    assert report["ok"] is True, report
    assert [(v["name"], v["ok"]) for v in report["versions"]] == [("v000003", True)]
    # A version that still exists and fails is still a failure (exit 4 from the CLI).
    change_manifest(remote, "v000003")
    code, out, _ = zerogr("status", remote, "--json", "--trusted-keys", three_pushed)
    assert code == 4 and json.loads(out)["versions"][0]["ok"] is False


class DeleteAt(S3Store):
    """The real store; the first time status reads `manifest` (a remote object name), that manifest is
    deleted on the server first (a prune, or someone with write access, removing it mid-read)."""

    def __init__(self, remote: RemoteOut, manifest: str) -> None:
        super().__init__(remote)
        self.manifest, self.deleted = manifest, False

    def get_small(self, name, limit):
        if name == self.manifest and not self.deleted:
            self.deleted = True
            self.delete([name])
        return super().get_small(name, limit)


def test_status_keeps_a_row_for_the_version_latest_names_when_it_vanishes_mid_read(remote, three_pushed):
    trust = Trust.from_files([three_pushed])
    store = DeleteAt(RemoteOut.parse(remote), "v000003/manifest.json")
    report = out_status(remote, store=store, trust=trust)
    assert store.deleted and report["ok"] is False
    rows = {v["name"]: v for v in report["versions"]}
    assert sorted(rows) == ["v000001", "v000002", "v000003"]
    assert rows["v000003"]["latest"] and not rows["v000003"]["ok"]
    assert "removed while it was read" in rows["v000003"]["error"] and "LATEST" in rows["v000003"]["error"]
    code, out, _ = zerogr("status", remote, "--json", "--trusted-keys", three_pushed)
    assert code == 4 and json.loads(out)["versions"][-1]["name"] == "v000003"


def test_status_keeps_a_failing_version_when_the_store_cannot_say_if_it_is_still_there(remote, three_pushed):
    """A version fails its check, and the HEAD that would tell a concurrent prune from a real failure
    fails too: the row keeps its error, and status goes on with the other versions."""
    change_manifest(remote, "v000002")

    class HeadFails(S3Store):
        def head(self, name):
            raise RemoteError(f"{self.remote.name_url(name)}: SlowDown (try again)")

    report = out_status(
        remote, store=HeadFails(RemoteOut.parse(remote)), trust=Trust.from_files([three_pushed])
    )
    assert [(v["name"], v["ok"]) for v in report["versions"]] == [
        ("v000001", True),
        ("v000002", False),
        ("v000003", True),
    ]
    assert "changed after it was signed" in report["versions"][1]["error"] and report["ok"] is False


def test_a_disk_that_fills_during_the_download_is_exit_3_naming_the_out(
    tmp_path, remote, three_pushed, monkeypatch
):
    """The free-space check passed, then another writer filled the disk: each write of the download
    fails with ENOSPC (fault injection into the real pull's file writes)."""
    host = tmp_path / "host"
    host.mkdir()
    real = S3Store.stream_to

    class FullDisk:
        def write(self, data: bytes) -> int:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def stream_to(self, name, sink, size, on_chunk=None):
        return real(self, name, None if sink is None else FullDisk(), size, on_chunk)

    with monkeypatch.context() as patch:
        patch.setattr(S3Store, "stream_to", stream_to)
        code, out, err = zerogr("pull", remote, str(host), "--trusted-keys", three_pushed)
    assert code == 3, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and str(host) in lines[0] and "disk filled" in lines[0] and ".tmp-" not in lines[0]
    assert set(served(host)) == {".lock"}  # the temp dir is gone: no version, no temp file
    assert zerogr("pull", remote, str(host), "--trusted-keys", three_pushed)[0] == 0
    assert (Path(host) / "LATEST").read_text() == "v000003\n"
