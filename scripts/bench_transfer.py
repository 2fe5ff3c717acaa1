#!/usr/bin/env python
"""Push and pull throughput and peak memory on a signed fleet, this checkout against an earlier commit's
code in the same run, against a local S3 API server (moto, in its own process).

For each bundle size it builds a synthetic catalog's bundle once, makes one signing key, then in child
processes (so each measures only itself), for this checkout's code and for the baseline's:
`push_version` signed with the key (verify, upload with per-part SHA-256, a read-back check of every
object's size and sha256, then the signature: here the fleet's signed metadata, in the baseline whatever
it did) and `pull_version` with the key trusted into an empty OUT (the signature check, then each file
streamed to disk with its size and sha256 checked as it arrives). Each code pushes to its own prefix,
emptied after its pull (moto keeps objects in memory). With --repeats N the pairs run N times, the order
of the two codes alternating, and each number is the median of its N runs (peak RSS: the largest). It
prints, per code: push and pull MB/s (upload and download stages, the bytes moved), their whole wall
time (the signing and its check included), and each child's peak RSS (VmHWM). The idle row is a child that
imports the modules and opens the S3 client but moves nothing.

The baseline is `git worktree add --detach` of --baseline-ref (default: the last commit before the fleet's
signed metadata), removed at the end; `--baseline-ref none` measures this checkout only.

    PYTHONPATH=. python scripts/bench_transfer.py                 # 1M and 20M items (int64 ids), and a
                                                                  # ~1 GB bundle (25M items, 32-char ids)
    PYTHONPATH=. python scripts/bench_transfer.py --only 25M-long-ids --repeats 4   # the ~1 GB version
    PYTHONPATH=. python scripts/bench_transfer.py --smoke         # tiny
    PYTHONPATH=. python scripts/bench_transfer.py --work /tmp/zg-bench   # keep catalogs and bundles

Needs moto[server] and boto3 (the dev extra), and git for the baseline. Nothing leaves 127.0.0.1.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path
from statistics import median

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "zerogr-bench"
#: The last commit whose fleet signed each version's manifest (no signed metadata): today's code.
DEFAULT_BASELINE = "b5f6051"

SERVER = """
import sys, time
from moto.server import ThreadedMotoServer
server = ThreadedMotoServer(ip_address="127.0.0.1", port=int(sys.argv[1]), verbose=False)
server.start()
print("ready", flush=True)
while True:
    time.sleep(3600)
"""

CHILD = """
import json, sys, time
from zerogr_build.fleet.pull import pull_version
from zerogr_build.fleet.push import push_version
from zerogr_build.fleet.remote import RemoteOut, S3Store
from zerogr_build.fleet.signing import Trust
what, source, target, key = sys.argv[1:5]
timings = {}
t0 = time.perf_counter()
if what == "push":
    result = push_version(source, target, signing_key=key, timings=timings).as_dict()
elif what == "pull":
    result = pull_version(source, target, trust=Trust.from_files([key + ".pub"]), timings=timings).as_dict()
else:  # idle: the same imports and client, no transfer
    S3Store(RemoteOut.parse(source)).head("LATEST")
    result = {}
wall = time.perf_counter() - t0
# VmHWM: this process's peak RSS. (ru_maxrss would do, but Linux carries it over from the parent
# through fork + exec, so a child of a big parent would report the parent's size.)
with open("/proc/self/status") as status:
    rss = next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
print(json.dumps({"wall": wall, "timings": timings, "rss": rss, "bytes": result.get("bytes", 0)}))
"""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(env: dict[str, str]) -> tuple[subprocess.Popen, str]:
    """Start the server process (it imports moto while the bundles are built); wait_ready() before use."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env
    )
    return proc, f"http://127.0.0.1:{port}"


def wait_ready(proc: subprocess.Popen) -> None:
    if proc.stdout.readline().strip() != b"ready":
        proc.kill()
        raise SystemExit("the moto server did not start")


def make_bundle(work: Path, name: str, items: int, long_ids: bool, env: dict[str, str]) -> Path:
    """A bundle of a skewed synthetic catalog (L=3, V=2048), built once per work dir."""
    out = work / f"bundles-{name}"
    if (out / "LATEST").exists():
        return out / (out / "LATEST").read_text().strip()
    if items <= 100_000:  # small: in-process (no catalog file, no extra interpreter start)
        from zerogr_build.testing import publish_catalog, random_catalog

        return publish_catalog(random_catalog(seed=0, n=items, sizes=(64, 256, 256)), out)[1].path
    catalog = work / f"{name}.parquet"
    run([sys.executable, str(ROOT / "scripts/make_catalog.py"), str(catalog), "-n", str(items), "-L", "3",
         "-V", "2048"], env)  # fmt: skip
    if long_ids:
        _long_item_ids(catalog)
    run([sys.executable, str(ROOT / "cli.py"), "build", str(catalog), "--codebook-sizes", "2048,2048,2048",
         "--out", str(out), "--kernel-archs", "", "-q"], env)  # fmt: skip
    catalog.unlink()
    return out / (out / "LATEST").read_text().strip()


def _long_item_ids(path: Path) -> None:
    """Replace the item ids by random 32-hex-digit strings (UUID-like SKUs): a bundle of about 1 GB at 25M."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    n = table.num_rows
    digits = np.frombuffer(b"0123456789abcdef", dtype=np.uint8)
    raw = np.random.default_rng(0).integers(0, 16, size=(n, 32), dtype=np.uint8)
    ids = pa.array(digits[raw].view("S32").reshape(-1)).cast(pa.string())
    table = table.set_column(table.schema.get_field_index("item_id"), "item_id", ids)
    pq.write_table(table, path)


def run(cmd: list[str], env: dict[str, str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd[:3])} failed: {proc.stderr.strip()[-2000:]}")
    return proc.stdout


def child(code: Path, what: str, source: str, target: str, key: Path, env: dict[str, str]) -> dict:
    """CHILD run with `code` (a checkout) first on PYTHONPATH: that checkout's zerogr_build."""
    env = {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(code), env.get("PYTHONPATH", "")]))}
    out = run([sys.executable, "-c", CHILD, what, source, target, str(key)], env)
    return json.loads(out.strip().splitlines()[-1])


def baseline_checkout(ref: str, work: Path) -> Path:
    """A detached `git worktree` of `ref` under `work` (removed by remove_checkout)."""
    path = work / "baseline"
    command = ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref]
    proc = subprocess.run(command, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"no baseline: git worktree add {ref} failed ({proc.stderr.strip()[-400:]}); "
                         "give --baseline-ref REF (a commit of this repository), or none")  # fmt: skip
    return path


def empty_prefix(endpoint: str, prefix: str) -> None:
    """Delete every object under `prefix` of the bench bucket (moto holds them in memory)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                      aws_secret_access_key="bench")  # fmt: skip
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=prefix):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        for start in range(0, len(keys), 1000):
            s3.delete_objects(Bucket=BUCKET, Delete={"Objects": keys[start : start + 1000]})


def remove_checkout(path: Path) -> None:
    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)], capture_output=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny bundles only")
    parser.add_argument("--only", help="one size of the full run (1M, 20M or 25M-long-ids)")
    parser.add_argument("--work", type=Path, help="keep catalogs and bundles here (default: a temp dir)")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each push/pull pair (medians shown)")
    parser.add_argument(
        "--baseline-ref", default=DEFAULT_BASELINE,
        help=f"the commit measured as the baseline in the same run (default {DEFAULT_BASELINE}); none: skip",
    )  # fmt: skip
    args = parser.parse_args(argv)

    work = args.work or Path(tempfile.mkdtemp(prefix="zerogr-bench-transfer-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH", "")])),
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_REGION": "us-east-1",
    }
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN"):
        env.pop(name, None)
    sizes = [("20k", 20_000, False)] if args.smoke else [
        ("1M", 1_000_000, False), ("20M", 20_000_000, False), ("25M-long-ids", 25_000_000, True)]  # fmt: skip
    if args.only:
        sizes = [size for size in sizes if size[0] == args.only]
        if not sizes:
            raise SystemExit(f"--only: no size {args.only!r} (1M, 20M, 25M-long-ids)")
    codes = {"this checkout": ROOT}
    if args.baseline_ref != "none":
        codes[f"baseline {args.baseline_ref}"] = baseline_checkout(args.baseline_ref, work)
    server, endpoint = start_server(env)
    env["AWS_ENDPOINT_URL"] = endpoint
    try:
        from zerogr_build.fleet.keys import new_key

        key = work / "keys" / "bench"
        if not key.exists():
            new_key(key)
        versions = {name: make_bundle(work, name, items, long_ids, env) for name, items, long_ids in sizes}
        wait_ready(server)
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)  # fmt: skip
        idle = child(ROOT, "idle", f"s3://{BUCKET}/none", "-", key, env)
        runs: dict[tuple[str, str], list[tuple[dict, dict]]] = {}
        prefix = 0
        for name, _, _ in sizes:
            for repeat in range(max(1, args.repeats)):
                order = list(codes.items()) if repeat % 2 == 0 else list(reversed(codes.items()))
                for label, code in order:  # each code its own prefix and host; one after the other
                    prefix += 1
                    url = f"s3://{BUCKET}/{name}-{prefix}"
                    pushed = child(code, "push", str(versions[name]), url, key, env)
                    host = work / f"host-{name}"
                    shutil.rmtree(host, ignore_errors=True)
                    pulled = child(code, "pull", url, str(host), key, env)
                    shutil.rmtree(host, ignore_errors=True)
                    empty_prefix(endpoint, f"{name}-{prefix}/")
                    runs.setdefault((name, label), []).append((pushed, pulled))
    finally:
        server.kill()
        for code in codes.values():
            if code != ROOT:
                remove_checkout(code)
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    mb, mib = 1e6, 2**20
    print(f"signed push / pull against a local moto S3 server ({endpoint}); checksums on; MB = 10^6 bytes")
    print(f"{'bundle':<14}{'code':<18}{'bytes':>14}{'push MB/s':>10}{'push s':>8}{'push RSS':>10}"
          f"{'pull MB/s':>10}{'pull s':>8}{'pull RSS':>10}")  # fmt: skip
    print(f"{'idle':<14}{'this checkout':<18}{'-':>14}{'-':>10}{'-':>8}{'-':>10}{'-':>10}{'-':>8}"
          f"{idle['rss'] / mib:>6.0f} MiB")  # fmt: skip
    for (name, label), pairs in runs.items():
        size = pairs[0][1]["bytes"]
        push_rate = median([size / mb / pushed["timings"]["upload"] for pushed, _ in pairs])
        pull_rate = median([size / mb / pulled["timings"]["download"] for _, pulled in pairs])
        push_wall, pull_wall = median([p["wall"] for p, _ in pairs]), median([p["wall"] for _, p in pairs])
        push_rss, pull_rss = max(p["rss"] for p, _ in pairs), max(p["rss"] for _, p in pairs)
        print(f"{name:<14}{label:<18}{size:>14,}{push_rate:>10.1f}{push_wall:>8.2f}"
              f"{push_rss / mib:>6.0f} MiB{pull_rate:>10.1f}{pull_wall:>8.2f}"
              f"{pull_rss / mib:>6.0f} MiB")  # fmt: skip
    if max(len(pairs) for pairs in runs.values()) > 1:
        print(f"medians of {len(next(iter(runs.values())))} runs per row, the two codes' order alternating")
    print("push MB/s: bytes / the upload stage (upload + read-back check); push s: the whole push (verify, "
          "upload, signing, LATEST); pull MB/s: bytes / the download stage (sha256 as it streams, fsync); "
          "pull s: the whole pull (the signature check first); RSS: each child's peak")  # fmt: skip


if __name__ == "__main__":
    main()
