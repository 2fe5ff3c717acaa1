"""The whole path from the build box to two serving hosts, as one test against the moto S3 server:
build -> verify -> push (signed with the build box's key) -> two hosts pull (trusting its public key) -> a
follower on each swaps -> a new good version travels the same way and is swapped in while searches run -> a
bad version is pushed (one object corrupted on the store after the push) and another one rewritten as an
attacker with write access to the bucket would (a file swapped, the manifest's sha256 updated to match) ->
both hosts' pulls refuse both (exit 4, one line naming the object, or the manifest the fleet's signed
metadata does not match), what each host serves byte-identical, the followers keep serving the last good
version -> `zerogr status` (local and remote) and the --metrics-file files of build / verify / push /
pull show all of it.

The CLI runs in subprocesses as on a real build box and cron; the followers run in this process, as in a
serving process.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from prometheus_client.parser import text_string_to_metric_families

import zerogr_build as zg
from zerogr_build.bundle import open_bundle

from .test_fleet import served

ROOT = Path(__file__).resolve().parents[1]
SIZES = (8, 32, 64)
D = 16
BATCH, BEAM = 4, 8


def zerogr(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, str(ROOT / "cli.py"), *args], capture_output=True, text=True, env=env, timeout=120
    )


def ok(*args: str) -> str:
    proc = zerogr(*args)
    assert proc.returncode == 0, (args, proc.stdout, proc.stderr)
    return proc.stdout


def metrics(path: Path) -> dict[str, float]:
    """{sample name: value} of a metrics file (each file holds one job, so the job label is implied)."""
    return {
        s.name: s.value
        for family in text_string_to_metric_families(path.read_text())
        for s in family.samples
        if "stage" not in s.labels
    }


def write_catalog(path: Path, seed: int, n: int = 1500) -> None:
    rng = np.random.default_rng(seed)
    sids = rng.integers(0, SIZES, size=(n, len(SIZES))).astype(np.uint16)
    items = rng.permutation(10 * n)[:n].astype(np.int64) + seed * 100_000
    pq.write_table(pa.table({"sid": pa.array(sids.tolist(), pa.list_(pa.uint16())), "item_id": items}), path)


# The "model": per-step output layers [V_t, d] and a step function giving hidden states [rows, d].
_gen = torch.Generator().manual_seed(0)
WEIGHTS = [torch.randn(v, D, generator=_gen) for v in SIZES]
EMB = [torch.randn(v, D, generator=_gen) for v in SIZES]
USER = torch.randn(BATCH, D, generator=_gen)


def step_fn(step: int, prefixes: torch.Tensor, batch: torch.Tensor) -> torch.Tensor:
    h = USER[batch].clone()
    for j in range(step):
        h += EMB[j][prefixes[:, j]]
    return h


def search(decoder) -> list:
    return decoder.items(decoder.search(step_fn, batch_size=BATCH, beam_width=BEAM))


def reference(version_dir: Path) -> list:
    """A search on exactly one version, opened on its own."""
    return search(zg.Decoder(open_bundle(version_dir), WEIGHTS, device="cpu", plan=None))


class Searcher(threading.Thread):
    """A serving loop: one read of follower.decoder per request; records (version, items) per search."""

    def __init__(self, follower) -> None:
        super().__init__(daemon=True)
        self.follower, self.results, self.errors = follower, [], []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                decoder = self.follower.decoder
                self.results.append((decoder.bundle.version, search(decoder)))
            except Exception as exc:  # noqa: BLE001 - a failed search is what the test counts
                self.errors.append(repr(exc))
            time.sleep(0.01)


def wait_for(predicate, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_build_push_pull_follow_and_refuse_a_bad_version_on_two_hosts(tmp_path, s3_bucket):
    remote = f"s3://{s3_bucket}/recs/bundles"
    build, m = tmp_path / "build", tmp_path / "metrics"
    hosts = {"a": tmp_path / "host-a", "b": tmp_path / "host-b"}
    signing_key = tmp_path / "keys" / "build-box"
    signing_key.parent.mkdir()
    ok("keys", "new", str(signing_key))
    trusted = ("--trusted-keys", f"{signing_key}.pub")

    def build_verify_push(seed: int, tag: str) -> str:
        catalog = tmp_path / f"catalog-{seed}.parquet"
        write_catalog(catalog, seed)
        sizes = ",".join(map(str, SIZES))
        built = ["--codebook-sizes", sizes, "--out", str(build), "--model-version", tag, "--kernel-archs", ""]
        path = ok("build", str(catalog), *built, "--quiet", "--metrics-file", str(m / "build.prom")).strip()
        ok("verify", path, "--catalog", str(catalog), "--metrics-file", str(m / "verify.prom"))
        pushed = ["--signing-key", str(signing_key), "--quiet", "--metrics-file", str(m / "push.prom")]
        return ok("push", path, remote, *pushed).strip()

    def pull(host: str) -> subprocess.CompletedProcess:
        return zerogr("pull", remote, str(hosts[host]), "--keep", "3", "--quiet", *trusted,
                      "--metrics-file", str(m / f"pull-{host}.prom"))  # fmt: skip

    # Version 1: build box -> store -> both hosts -> a follower on each.
    assert build_verify_push(1, "m-1") == f"{remote}/v000001"
    for host in hosts:
        assert pull(host).returncode == 0
    followers = {
        h: zg.follow(out, WEIGHTS, device="cpu", poll_seconds=0.05, plan=None, timeout=60)
        for h, out in hosts.items()
    }
    searchers: dict[str, Searcher] = {}
    try:
        refs = {1: reference(hosts["a"] / "v000001")}
        for follower in followers.values():
            assert follower.version == 1 and search(follower.decoder) == refs[1]
        searchers.update((h, Searcher(f)) for h, f in followers.items())
        for searcher in searchers.values():
            searcher.start()

        # Version 2 (a good one): the same path; each follower swaps while its searches keep running.
        assert build_verify_push(2, "m-2") == f"{remote}/v000002"
        for host in hosts:
            assert pull(host).returncode == 0
        wait_for(lambda: all(f.version == 2 for f in followers.values()))
        refs[2] = reference(hosts["a"] / "v000002")
        assert refs[2] != refs[1]
        assert reference(hosts["b"] / "v000002") == refs[2]

        # Version 3 is pushed, then one of its objects is corrupted on the store (same size).
        assert build_verify_push(3, "m-3") == f"{remote}/v000003"
        import boto3

        s3 = boto3.client("s3")
        listed = s3.list_objects_v2(Bucket=s3_bucket, Prefix="recs/bundles/v000003/step")["Contents"]
        key = max(obj["Key"] for obj in listed)  # the last step's table
        name = key.removeprefix("recs/bundles/")
        body = bytearray(s3.get_object(Bucket=s3_bucket, Key=key)["Body"].read())
        body[-1] ^= 0x01
        s3.put_object(Bucket=s3_bucket, Key=key, Body=bytes(body))

        for host, out in hosts.items():
            before = served(out)
            proc = pull(host)
            assert proc.returncode == 4, (proc.stdout, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and name in lines[0], proc.stderr
            assert served(out) == before
            assert (out / "LATEST").read_text().strip() == "v000002"

        # Version 4 is pushed, then rewritten on the store: items.parquet swapped and the manifest's size
        # and sha256 updated to match. Only the signature shows it.
        assert build_verify_push(4, "m-4") == f"{remote}/v000004"
        prefix = "recs/bundles/v000004/"
        items = bytearray(s3.get_object(Bucket=s3_bucket, Key=prefix + "items.parquet")["Body"].read())
        items[-1] ^= 0x01
        manifest = json.loads(s3.get_object(Bucket=s3_bucket, Key=prefix + "manifest.json")["Body"].read())
        entry = {"bytes": len(items), "sha256": hashlib.sha256(items).hexdigest()}
        manifest["files"]["items.parquet"] = entry
        s3.put_object(Bucket=s3_bucket, Key=prefix + "items.parquet", Body=bytes(items))
        s3.put_object(Bucket=s3_bucket, Key=prefix + "manifest.json", Body=json.dumps(manifest).encode())
        for host, out in hosts.items():
            before = served(out)
            proc = pull(host)
            assert proc.returncode == 4, (proc.stdout, proc.stderr)
            lines = proc.stderr.strip().splitlines()
            assert len(lines) == 1 and "v000004/manifest.json" in lines[0], proc.stderr
            assert "changed after it was signed" in lines[0]
            assert served(out) == before
            assert (out / "LATEST").read_text().strip() == "v000002"
        time.sleep(0.5)  # ten polls of the followers: nothing to swap to, nothing fails

        for follower in followers.values():
            assert follower.version == 2 and follower.failures == 0 and follower.last_error is None
            assert follower.swaps == 2 and search(follower.decoder) == refs[2]
        for searcher in searchers.values():
            searcher.halt.set()
            searcher.join(30)
        for host, searcher in searchers.items():
            assert searcher.errors == [], host
            assert {v for v, _ in searcher.results} == {1, 2}, host
            assert all(items == refs[version] for version, items in searcher.results), host
    finally:
        for searcher in searchers.values():
            searcher.halt.set()
            searcher.join(30)
        for follower in followers.values():
            follower.stop()

    # Status of a host: two good versions, LATEST the last good one.
    for out in hosts.values():
        local = json.loads(ok("status", str(out), "--json"))
        assert local["latest"] == "v000002" and local["ok"] is True
        assert [(v["name"], v["model_version"], v["ok"]) for v in local["versions"]] == [
            ("v000001", "m-1", True),
            ("v000002", "m-2", True),
        ]
    # Status of the store: LATEST names v4; the full check names v3's corrupt object, and even the cheap
    # one finds v4's signature broken.
    proc = zerogr("status", remote, "--json", "--verify", *trusted)
    assert proc.returncode == 4
    report = json.loads(proc.stdout)
    assert report["latest"] == "v000004"
    assert [(v["name"], v["ok"]) for v in report["versions"]] == [
        ("v000001", True),
        ("v000002", True),
        ("v000003", False),
        ("v000004", False),
    ]
    assert name in report["versions"][2]["error"]
    assert "changed after it was signed" in report["versions"][3]["error"]
    cheap = json.loads(zerogr("status", remote, "--json", *trusted).stdout)
    assert [v["ok"] for v in cheap["versions"]] == [True, True, True, False]
    table = zerogr("status", remote, "--verify", *trusted).stdout
    assert "LATEST -> v000004" in table and "sha256 mismatch" in table

    # Metrics: every build / verify / push succeeded (the last one handled v3); each host's last pull
    # failed with exit 4, and its last success is the pull of v2.
    for job in ("build", "verify", "push"):
        got = metrics(m / f"{job}.prom")
        assert got["zerogr_job_exit_status"] == 0, job
        assert got["zerogr_job_last_success_timestamp_seconds"] > 0, job
    assert metrics(m / "build.prom")["zerogr_bundle_version"] == 4
    assert metrics(m / "push.prom")["zerogr_bundle_version"] == 4
    for host in hosts:
        got = metrics(m / f"pull-{host}.prom")
        assert got["zerogr_job_exit_status"] == 4
        assert got["zerogr_job_last_success_timestamp_seconds"] < got["zerogr_job_last_run_timestamp_seconds"]
        assert got["zerogr_bundle_version"] == 2  # the version the host still serves, not the refused one
