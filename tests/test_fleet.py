"""push / pull / status against a real S3 API server (moto's server mode, tests/conftest.py).

Every refusal test hashes the whole local OUT tree before and after: a refused pull leaves it
byte-identical. The concurrency and kill tests run the real CLI in separate processes.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from zerogr_build.base.errors import InputError
from zerogr_build.bundle import verify_bundle
from zerogr_build.cli import app
from zerogr_build.fleet.push import _claim, promote_remote
from zerogr_build.fleet.remote import RefusedRemoteVersion, RemoteOut, S3Store, list_versions
from zerogr_build.fleet.signing import Trust
from zerogr_build.testing import publish_catalog, random_catalog

ROOT = Path(__file__).resolve().parents[1]
CLI = [sys.executable, str(ROOT / "cli.py")]


def tree(path: Path) -> dict[str, str]:
    """{relative path: sha256 of a file, or "dir"} of everything under `path` (dotfiles included)."""
    out = {}
    for p in sorted(path.rglob("*")):
        rel = p.relative_to(path).as_posix()
        out[rel] = "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def served(path: Path) -> dict[str, str]:
    """tree(path) without OUT/.tuf/, the fleet metadata a host trusts: what the host serves. A pull that
    refreshed newer signed metadata and then refused the version it names changes only .tuf/."""
    return {k: v for k, v in tree(path).items() if k != ".tuf" and not k.startswith(".tuf/")}


def zerogr(*args: str) -> tuple[int, str, str]:
    """Run the CLI in-process: (exit code, stdout, stderr). The fleet of these tests is an unsigned one:
    `pull`, a remote `status` and a remote `promote` get --allow-unsigned (signed fleets:
    test_fleet_signing.py)."""
    args = unsigned(args)
    result = CliRunner().invoke(app, list(args), catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def unsigned(args: tuple[str, ...]) -> tuple[str, ...]:
    """`args` with --allow-unsigned added to a pull, or a status or promote of an s3:// OUT, that names no
    trust."""
    if {"--trusted-keys", "--trusted-root", "--allow-unsigned", "--signing-key"} & set(args):
        return args
    remote = args[:1] in (("status",), ("promote",)) and any(a.startswith("s3://") for a in args)
    reads_remote = args[:1] == ("pull",) or remote
    return (*args, "--allow-unsigned") if reads_remote else args


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    args = unsigned(args)
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env={**os.environ, **env}, timeout=300
    )


def samples(path: Path) -> dict:
    found = {}
    for family in text_string_to_metric_families(path.read_text()):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def client():
    import boto3

    return boto3.client("s3")


def remote_keys(url: str) -> dict[str, bytes]:
    r = RemoteOut.parse(url)
    c = client()
    keys = {}
    for page in c.get_paginator("list_objects_v2").paginate(Bucket=r.bucket, Prefix=r.key("")):
        for item in page.get("Contents", []):
            keys[item["Key"][len(r.key("")) :]] = c.get_object(Bucket=r.bucket, Key=item["Key"])[
                "Body"
            ].read()
    return keys


def put(url: str, name: str, data: bytes) -> None:
    r = RemoteOut.parse(url)
    client().put_object(Bucket=r.bucket, Key=r.key(name), Body=data)


def delete(url: str, name: str) -> None:
    r = RemoteOut.parse(url)
    client().delete_object(Bucket=r.bucket, Key=r.key(name))


# ------------------------------------------------------------------------------------ push, then pull


def test_push_then_pull_into_two_hosts(tmp_path, build_out, remote):
    code, out, err = zerogr("push", str(build_out / "v000001"), remote)
    assert code == 0, err
    assert "LATEST -> v000001" in out
    objects = remote_keys(remote)
    assert objects["LATEST"] == b"v000001\n"
    local_manifest = json.loads((build_out / "v000001" / "manifest.json").read_text())
    pushed = json.loads(objects["v000001/manifest.json"])
    assert pushed["version"] == 1 and pushed["files"] == local_manifest["files"]
    assert (
        pushed["pushed_from"]["manifest_sha256"]
        == hashlib.sha256((build_out / "v000001" / "manifest.json").read_bytes()).hexdigest()
    )
    for name in local_manifest["files"]:
        assert objects[f"v000001/{name}"] == (build_out / "v000001" / name).read_bytes()

    hosts = [tmp_path / "host-a" / "bundles", tmp_path / "host-b" / "bundles"]
    for host in hosts:
        code, out, err = zerogr("pull", remote, str(host))
        assert code == 0, err
        assert "installed" in out
        assert (host / "LATEST").read_text() == "v000001\n"
        assert (host / "v000001" / "manifest.json").read_bytes() == objects["v000001/manifest.json"]
        assert verify_bundle(host)["version"] == 1
        assert not [p.name for p in host.iterdir() if p.name.startswith(".tmp-")]

    # The build box's LATEST (v2) by its OUT dir; both hosts follow it, the second pull of each is a no-op.
    assert zerogr("push", str(build_out), remote)[0] == 0
    assert remote_keys(remote)["LATEST"] == b"v000002\n"
    for host in hosts:
        assert zerogr("pull", remote, str(host), "--keep", "1")[0] == 0
        assert (host / "LATEST").read_text() == "v000002\n"
        assert sorted(p.name for p in host.iterdir() if p.name.startswith("v")) == ["v000002"]
        before = tree(host)
        code, out, _ = zerogr("pull", remote, str(host))
        assert code == 0 and "already there" in out
        assert tree(host) == before


def test_repush_is_a_no_op_and_a_host_copy_is_recognised(tmp_path, build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    before = remote_keys(remote)
    code, out, _ = zerogr("push", str(build_out / "v000001"), remote, "--json")
    assert code == 0
    result = json.loads(out)
    assert result["version"] == 1 and result["uploaded"] is False
    # A version pulled onto a host and pushed back from there is the same version too.
    host = tmp_path / "host"
    assert zerogr("pull", remote, str(host))[0] == 0
    assert zerogr("push", str(host / "v000001"), remote)[0] == 0
    assert remote_keys(remote) == before


def test_keep_prunes_remote_versions_but_never_the_one_latest_names(build_out, remote, tmp_path):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote, "--no-promote")[0] == 0
    assert remote_keys(remote)["LATEST"] == b"v000001\n"  # --no-promote left it
    publish_catalog(random_catalog(seed=3), build_out)
    code, out, _ = zerogr("push", str(build_out / "v000003"), remote, "--no-promote", "--keep", "1")
    assert code == 0, out
    names = {k.split("/")[0] for k in remote_keys(remote)}
    # v1: LATEST names it; v2 and v3 are newer, so a concurrent push may promote them: kept
    assert names == {"LATEST", "v000001", "v000002", "v000003"} and "pruned" not in out
    publish_catalog(random_catalog(seed=4), build_out)
    code, out, _ = zerogr("push", str(build_out / "v000004"), remote, "--keep", "1")
    assert code == 0, out
    assert {k.split("/")[0] for k in remote_keys(remote)} == {"LATEST", "v000004"}
    assert "pruned v000001, v000002, v000003" in out


def test_prune_never_deletes_a_version_a_concurrent_push_is_promoting(build_out, remote):
    """LATEST = v1; v2 complete but not promoted. A `--no-promote --keep 1` push used to delete v2 while
    another push was promoting it, leaving LATEST naming nothing: versions above LATEST are never pruned."""
    from zerogr_build.fleet.push import prune_remote

    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote, "--no-promote")[0] == 0
    publish_catalog(random_catalog(seed=3), build_out)
    assert zerogr("push", str(build_out / "v000003"), remote, "--no-promote")[0] == 0
    store = S3Store(RemoteOut.parse(remote))
    assert prune_remote(store, keep=1) == []  # v2, v3 are newer than LATEST's v1, v1 is LATEST's
    store.put("LATEST", b"v000002\n")  # the other push promotes v2
    assert remote_keys(remote)["v000002/manifest.json"]
    assert prune_remote(store, keep=1) == ["v000001"]


def test_latest_never_moves_backwards(build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote)[0] == 0
    store = S3Store(RemoteOut.parse(remote))
    assert promote_remote(store, 1) == (False, "v000002")
    assert remote_keys(remote)["LATEST"] == b"v000002\n"


def test_push_refuses_a_local_version_that_fails_verification(build_out, remote):
    victim = build_out / "v000001" / "step0.next.npy"
    if not victim.exists():
        victim = next(p for p in (build_out / "v000001").glob("step*.npy"))
    data = bytearray(victim.read_bytes())
    data[-1] ^= 0xFF
    victim.write_bytes(bytes(data))
    code, _, err = zerogr("push", str(build_out / "v000001"), remote)
    assert code == 4
    assert victim.name in err and len(err.strip().splitlines()) == 1
    assert remote_keys(remote) == {}


# ------------------------------------------------------------------------------ concurrency and kills


def test_two_concurrent_pushes_of_one_version_from_two_processes(build_out, remote):
    """Both claim the version's own number: the second finds the first's claim of the same manifest and
    carries on; whichever writes the manifest first completes it, the other takes it as its own."""
    procs = [
        subprocess.Popen(
            [*CLI, "push", str(build_out / "v000002"), remote, "--json"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
        results.append(json.loads(out))
    assert [r["version"] for r in results] == [2, 2]  # the local number, for both
    objects = remote_keys(remote)
    assert objects["LATEST"] == b"v000002\n"
    local = build_out / "v000002"
    manifest = json.loads(objects["v000002/manifest.json"])
    assert (
        manifest["pushed_from"]["manifest_sha256"]
        == hashlib.sha256((local / "manifest.json").read_bytes()).hexdigest()
    )
    for name in manifest["files"]:  # complete
        assert objects[f"v000002/{name}"] == (local / name).read_bytes()


def test_a_push_killed_mid_upload_leaves_latest_and_the_next_push_succeeds(tmp_path, build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    killed = run_cli("push", str(build_out / "v000002"), remote, ZEROGR_BUNDLE_KILL_AT="push_file_uploaded")
    assert killed.returncode == -9
    objects = remote_keys(remote)
    assert objects["LATEST"] == b"v000001\n"
    assert "v000002/.claim" in objects and "v000002/manifest.json" not in objects

    host = tmp_path / "host"
    assert zerogr("pull", remote, str(host))[0] == 0
    assert (host / "LATEST").read_text() == "v000001\n"
    code, _, err = zerogr("pull", remote, str(host), "--version", "2")
    assert code == 4 and "v000002/manifest.json" in err

    code, out, _ = zerogr("status", remote, "--json")
    status = {v["name"]: v for v in json.loads(out)["versions"]}
    assert status["v000002"]["complete"] is False and "incomplete" in status["v000002"]["error"]

    code, out, err = zerogr("push", str(build_out / "v000002"), remote, "--json")
    assert code == 0, err
    assert json.loads(out)["version"] == 2  # the dead push's own claim, taken over: one number
    assert remote_keys(remote)["LATEST"] == b"v000002\n"
    assert zerogr("pull", remote, str(host))[0] == 0
    assert verify_bundle(host)["version"] == 2


def test_a_claim_is_the_local_number_and_never_another_versions(remote):
    store = S3Store(RemoteOut.parse(remote))
    stale = list_versions(store)  # empty: both claimers below believe v1 is free
    assert _claim(store, stale, "a" * 64, 1, True) == 1
    with pytest.raises(InputError, match="v000001: holds another version"):
        _claim(store, stale, "b" * 64, 1, True)  # v1's create-only write lost, to another version
    assert _claim(store, stale, "a" * 64, 1, True) == 1  # its own claim (a push of it that died)
    assert _claim(store, list_versions(store), "c" * 64, 3, True) == 3
    with pytest.raises(InputError, match="v000003: the fleet already holds a version above this one"):
        _claim(store, list_versions(store), "d" * 64, 2, True)  # LATEST would never name it
    assert _claim(store, list_versions(store), "d" * 64, 2, False) == 2  # --no-promote: a free number


class RacingStore(S3Store):
    """The real store; just before our first conditional write of LATEST, another publisher moves LATEST
    to `rival` (a real write on the server), so our compare-and-swap holds a stale ETag."""

    def __init__(self, remote: RemoteOut, rival: bytes):
        super().__init__(remote)
        self.rival = rival

    def put(self, name, data, **kwargs):
        if name == "LATEST" and self.rival is not None:
            super().put("LATEST", self.rival)
            self.rival = None
        return super().put(name, data, **kwargs)


def test_latest_compare_and_swap_never_loses_a_newer_update(build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote, "--no-promote")[0] == 0
    publish_catalog(random_catalog(seed=3), build_out)
    assert zerogr("push", str(build_out / "v000003"), remote, "--no-promote")[0] == 0
    store = RacingStore(RemoteOut.parse(remote), rival=b"v000003\n")
    assert promote_remote(store, 2) == (False, "v000003")  # the rival's newer LATEST stands
    assert remote_keys(remote)["LATEST"] == b"v000003\n"


# -------------------------------------------------------------------------------- hostile remotes


def _copy_as_v2(remote: str, mutate) -> None:
    """Remote v000002 = a copy of v000001 (manifest version 2) passed through mutate(objects), then LATEST
    -> v000002, written directly with boto3 (the way a broken or hostile publisher could)."""
    objects = {k[len("v000001/") :]: v for k, v in remote_keys(remote).items() if k.startswith("v000001/")}
    manifest = json.loads(objects["manifest.json"])
    manifest["version"] = 2
    objects["manifest.json"] = manifest
    mutate(objects)
    objects["manifest.json"] = json.dumps(objects["manifest.json"]).encode()
    for name, data in objects.items():
        put(remote, f"v000002/{name}", data)
    put(remote, "LATEST", b"v000002\n")


def _data_file(objects: dict) -> str:
    return next(n for n in sorted(objects) if n.endswith(".npy"))


def _flip(objects):
    name = _data_file(objects)
    data = bytearray(objects[name])
    data[len(data) // 2] ^= 0x01
    objects[name] = bytes(data)
    return name


def _missing(objects):
    name = _data_file(objects)
    del objects[name]
    return name


def _truncated(objects):
    name = _data_file(objects)
    objects[name] = objects[name][:-7]
    return name


def _escaping(objects):
    manifest = objects["manifest.json"]
    manifest["files"]["../x"] = {"bytes": 3, "sha256": hashlib.sha256(b"pwn").hexdigest()}
    objects["../x"] = b"pwn"
    return "manifest.json"


def _absolute(objects):
    manifest = objects["manifest.json"]
    manifest["files"]["/tmp/zerogr-pwned"] = {"bytes": 3, "sha256": hashlib.sha256(b"pwn").hexdigest()}
    return "manifest.json"


def _huge(objects):
    name = _data_file(objects)
    objects["manifest.json"]["files"][name]["bytes"] = 10**15
    return name


@pytest.mark.parametrize(
    "mutate",
    [_flip, _missing, _truncated, _escaping, _absolute, _huge],
    ids=[
        "flipped-byte",
        "missing-object",
        "truncated-object",
        "manifest-names-dotdot",
        "absolute-name",
        "huge",
    ],
)
def test_pull_refuses_a_bad_remote_version_and_leaves_out_byte_identical(tmp_path, build_out, remote, mutate):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    host = tmp_path / "srv" / "bundles"
    assert zerogr("pull", remote, str(host))[0] == 0
    before = tree(tmp_path / "srv")
    culprit = {}
    _copy_as_v2(remote, lambda objects: culprit.setdefault("name", mutate(objects)))

    code, out, err = zerogr("pull", remote, str(host))
    assert code == 4, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and f"{remote}/v000002/" in lines[0]
    assert culprit["name"].split("/")[-1] in lines[0] or "manifest.json" in lines[0]
    assert tree(tmp_path / "srv") == before
    assert not (tmp_path / "srv" / "x").exists() and not Path("/tmp/zerogr-pwned").exists()
    assert (host / "LATEST").read_text() == "v000001\n"


def test_pull_refuses_a_latest_that_is_not_a_version_name(tmp_path, build_out, remote):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    host = tmp_path / "host"
    assert zerogr("pull", remote, str(host))[0] == 0
    before = tree(host)
    put(remote, "LATEST", b"../../etc\n")
    code, _, err = zerogr("pull", remote, str(host))
    assert code == 4 and f"{remote}/LATEST" in err
    assert tree(host) == before


def test_pull_refuses_when_the_disk_cannot_hold_the_version(tmp_path, build_out, remote, monkeypatch):
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    host = tmp_path / "host"
    host.mkdir()
    before = tree(host)
    import zerogr_build.fleet.local_disk as disk_module

    real = shutil.disk_usage
    monkeypatch.setattr(
        disk_module.shutil, "disk_usage", lambda p: real(p)._replace(free=10_000)
    )  # a nearly full disk
    code, _, err = zerogr("pull", remote, str(host))
    assert code == 3 and "free" in err
    assert tree(host) == before


def test_an_object_longer_than_declared_is_refused_and_not_written_past(tmp_path, build_out, remote):
    # Two defences: the announced Content-Length, then a read capped at the declared size + 1 byte.
    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    store = S3Store(RemoteOut.parse(remote))
    name = "v000001/items.parquet"
    size = store.head(name)
    sink = tmp_path / "sink"
    with open(sink, "wb") as f, pytest.raises(RefusedRemoteVersion, match="items.parquet"):
        store.stream_to(name, f, size - 10)
    assert sink.stat().st_size <= size - 10


def test_nothing_published_and_no_such_version_exit_5(tmp_path, remote):
    code, _, err = zerogr("pull", remote, str(tmp_path / "host"))
    assert code == 5 and "LATEST" in err
    code, _, err = zerogr("pull", remote, str(tmp_path / "host"), "--version", "7")
    assert code == 5 and "v000007" in err


def test_bad_urls_and_a_missing_bucket_are_usage_errors_and_never_print_credentials(
    tmp_path, build_out, s3_env
):
    code, _, err = zerogr("pull", "http://bucket/x", str(tmp_path / "h"))
    assert code == 2 and "s3://" in err
    code, _, err = zerogr("push", str(build_out), "s3://bucket-one/a/../b")
    assert code == 2
    code, _, err = zerogr("push", str(build_out), "s3://zerogr-no-such-bucket/x")
    assert code == 2 and "NoSuchBucket" in err
    for secret in (s3_env["AWS_SECRET_ACCESS_KEY"], s3_env["AWS_ACCESS_KEY_ID"]):
        assert secret not in err


def test_an_unreachable_store_is_exit_3(tmp_path, build_out, s3_env, monkeypatch):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    code, _, err = zerogr("pull", "s3://zerogr-demo/x", str(tmp_path / "h"))
    assert code == 3, err
    assert not (tmp_path / "h").exists() or tree(tmp_path / "h") == {}


def test_without_boto3_the_error_says_how_to_install_it(tmp_path, monkeypatch, s3_env):
    monkeypatch.setitem(sys.modules, "boto3", None)
    code, _, err = zerogr("pull", "s3://zerogr-demo/x", str(tmp_path / "h"))
    assert code == 2 and "zerogr[s3]" in err


# ------------------------------------------------------------------------------------- status, metrics


def test_status_of_a_local_and_a_remote_out(build_out, remote):
    code, out, _ = zerogr("status", str(build_out), "--json")
    assert code == 0
    local = json.loads(out)
    assert local["latest"] == "v000002" and local["check"] == "full"
    assert [(v["name"], v["latest"], v["ok"]) for v in local["versions"]] == [
        ("v000001", False, True),
        ("v000002", True, True),
    ]
    assert local["versions"][0]["model_version"] == "m-1" and local["versions"][0]["age_s"] >= 0
    code, out, _ = zerogr("status", str(build_out))
    assert code == 0 and "LATEST" in out and "verified" in out

    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote)[0] == 0
    # Corrupt remote v1 without changing its size: the cheap check passes, --verify does not.
    objects = remote_keys(remote)
    name = next(k for k in sorted(objects) if k.startswith("v000001/") and k.endswith(".npy"))
    data = bytearray(objects[name])
    data[-1] ^= 0x01
    put(remote, name, bytes(data))
    code, out, _ = zerogr("status", remote, "--json")
    assert code == 0
    cheap = json.loads(out)
    assert cheap["check"] == "sizes" and cheap["latest"] == "v000002"
    assert [v["ok"] for v in cheap["versions"]] == [True, True]
    assert cheap["versions"][1]["bytes"] == local["versions"][1]["bytes"]
    code, out, _ = zerogr("status", remote, "--json", "--verify")
    assert code == 4
    full = json.loads(out)
    assert full["versions"][0]["ok"] is False and name.split("/")[1] in full["versions"][0]["error"]
    assert full["versions"][1]["ok"] is True

    # A local version that fails verification makes status exit 4 and names it.
    victim = next((build_out / "v000001").glob("step*.npy"))
    victim.write_bytes(victim.read_bytes()[:-1] + b"\x00")
    code, out, _ = zerogr("status", str(build_out), "--json")
    assert code == 4 and json.loads(out)["versions"][0]["ok"] is False


def test_metrics_files_of_push_and_pull(tmp_path, build_out, remote):
    push_prom, pull_prom = tmp_path / "m" / "push.prom", tmp_path / "m" / "pull.prom"
    assert zerogr("push", str(build_out), remote, "--metrics-file", str(push_prom))[0] == 0
    got = samples(push_prom)
    job = (("job", "push"),)
    assert got[("zerogr_job_exit_status", job)] == 0
    # build_out's LATEST is its v2: the fleet holds it as v2 too (one number), both in the metrics
    assert got[("zerogr_bundle_version", job)] == got[("zerogr_bundle_remote_version", job)] == 2
    assert got[("zerogr_bundle_items", job)] == 1500
    assert ("zerogr_job_stage_duration_seconds", (("job", "push"), ("stage", "upload"))) in got

    host = tmp_path / "host"
    assert zerogr("pull", remote, str(host), "--metrics-file", str(pull_prom))[0] == 0
    got = samples(pull_prom)
    job = (("job", "pull"),)
    assert got[("zerogr_job_exit_status", job)] == 0 and got[("zerogr_bundle_version", job)] == 2
    ok_at = got[("zerogr_job_last_success_timestamp_seconds", job)]
    assert ("zerogr_job_stage_duration_seconds", (("job", "pull"), ("stage", "download"))) in got

    put(remote, "LATEST", b"v000009\n")  # names a version that does not exist: refused
    assert zerogr("pull", remote, str(host), "--metrics-file", str(pull_prom))[0] == 4
    got = samples(pull_prom)
    assert got[("zerogr_job_exit_status", job)] == 4
    assert got[("zerogr_job_last_success_timestamp_seconds", job)] == ok_at


def test_bench_transfer_smoke(s3_env):
    """The signed push and pull, this checkout beside a baseline checkout (here HEAD's, which exists in
    any clone) in the same run."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_transfer.py"), "--smoke", "--baseline-ref", "HEAD"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 0, proc.stderr
    rows = [line for line in proc.stdout.splitlines() if line.startswith("20k")]
    assert [row.split()[1:3] for row in rows] == [["this", "checkout"], ["baseline", "HEAD"]], proc.stdout
    assert "push RSS" in proc.stdout and "MB/s" in proc.stdout


def test_an_upload_the_store_refuses_is_a_zerogr_error_not_a_crash(s3_env, tmp_path):
    """boto3's upload_file wraps the store's error in S3UploadFailedError, which is no botocore error: it
    used to escape as exit 1 ("anything else") instead of the store error's own exit code."""
    from zerogr_build.fleet.remote import RemoteAccessError

    path = tmp_path / "f.bin"
    path.write_bytes(b"x" * 100)
    store = S3Store(RemoteOut.parse("s3://zerogr-no-such-bucket-here/p"))
    with pytest.raises(RemoteAccessError, match="NoSuchBucket") as caught:
        store.upload_file(str(path), "v000001/f.bin")
    assert caught.value.exit_code == 2


class PruningStore(S3Store):
    """The real store; just before pull's GET of v1's manifest, a publisher promotes v2 and prunes v1 (real
    writes on the server): the ordinary race of a pull with a `push --keep 1`."""

    def get_small(self, name, limit):
        if name == "v000001/manifest.json":
            super().put("LATEST", b"v000002\n")
            self.delete([f"v000001/{n}" for n in self.list_under("v000001/")])
        return super().get_small(name, limit)


def test_a_version_pruned_before_its_manifest_is_read_is_a_retry_not_a_refusal(tmp_path, build_out, remote):
    """Exit 3 (retry) rather than 4 (refused: alert a human): LATEST moved on while the pull started."""
    from zerogr_build.fleet.pull import pull_version
    from zerogr_build.fleet.remote import RemoteError

    assert zerogr("push", str(build_out / "v000001"), remote)[0] == 0
    assert zerogr("push", str(build_out / "v000002"), remote, "--no-promote")[0] == 0
    host = tmp_path / "host"
    with pytest.raises(RemoteError, match="moved from v000001 to v000002"):
        pull_version(remote, host, trust=Trust.unsigned(), store=PruningStore(RemoteOut.parse(remote)))
    assert not host.exists() or not any(host.glob("v*"))
    assert pull_version(remote, host, trust=Trust.unsigned()).version == 2  # the retry gets the new version


def test_a_failed_transfer_cancels_the_files_not_started_yet():
    """The first failing object ends the transfer: the rest of the bundle is not moved first."""
    from zerogr_build.fleet.remote import RemoteError
    from zerogr_build.fleet.transfer import for_each_on_threads

    done = []

    def work(name):
        if name == "a":
            raise RemoteError("a: refused")
        done.append(name)

    with pytest.raises(RemoteError, match="a: refused"):
        for_each_on_threads(work, [chr(c) for c in range(ord("a"), ord("z") + 1)], threads=1)
    assert done == []
