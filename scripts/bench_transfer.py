#!/usr/bin/env python
"""Push and pull throughput and pull's peak memory against a local S3 API server (moto, in its own process).

For each bundle size it builds a synthetic catalog's bundle, then in child processes (so each measures only
itself): `push_version` (verify, then upload with per-part SHA-256 and a read-back check of every object's
size and sha256) and `pull_version` into an empty OUT (each file streamed to disk with its size and sha256
checked as it arrives), reporting MB/s for each and pull's peak RSS (VmHWM). The baseline row is a
child that imports the same modules and opens the same S3 client but pulls nothing: pull's peak RSS should
stay near it whatever the bundle's size, because downloads stream in 1 MiB chunks.

    PYTHONPATH=. python scripts/bench_transfer.py                 # 1M and 20M items (int64 ids), and a
                                                                  # ~1 GB bundle (25M items, 32-char ids)
    PYTHONPATH=. python scripts/bench_transfer.py --smoke         # tiny, < 20 s
    PYTHONPATH=. python scripts/bench_transfer.py --work /tmp/zg-bench   # keep catalogs and bundles

Needs moto[server] and boto3 (the dev extra). Nothing leaves 127.0.0.1.
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

ROOT = Path(__file__).resolve().parents[1]
BUCKET = "zerogr-bench"

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
what, source, target = sys.argv[1:4]
timings = {}
t0 = time.perf_counter()
if what == "push":
    result = push_version(source, target, timings=timings).as_dict()
elif what == "pull":
    result = pull_version(source, target, trust=Trust.unsigned(), timings=timings).as_dict()
else:  # baseline: the same imports and client, no transfer
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


def child(what: str, source: str, target: str, env: dict[str, str]) -> dict:
    return json.loads(run([sys.executable, "-c", CHILD, what, source, target], env).strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--smoke", action="store_true", help="tiny bundles only (< 20 s)")
    parser.add_argument("--work", type=Path, help="keep catalogs and bundles here (default: a temp dir)")
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
    server, endpoint = start_server(env)
    env["AWS_ENDPOINT_URL"] = endpoint
    try:
        versions = {name: make_bundle(work, name, items, long_ids, env) for name, items, long_ids in sizes}
        wait_ready(server)
        import boto3

        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="bench",
                     aws_secret_access_key="bench").create_bucket(Bucket=BUCKET)  # fmt: skip
        base = child("baseline", f"s3://{BUCKET}/none", "-", env)
        rows = []
        for name, items, _ in sizes:
            version = versions[name]
            url = f"s3://{BUCKET}/{name}"
            pushed = child("push", str(version), url, env)
            host = work / f"host-{name}"
            shutil.rmtree(host, ignore_errors=True)
            pulled = child("pull", url, str(host), env)
            shutil.rmtree(host, ignore_errors=True)
            rows.append((name, items, pushed, pulled))
    finally:
        server.kill()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)

    mb = 1e6
    print(f"push / pull against a local moto S3 server ({endpoint}); checksums on; MB = 10^6 bytes")
    print(f"{'bundle':<14}{'items':>12}{'bytes':>14}{'push s':>9}{'push MB/s':>11}{'pull s':>9}"
          f"{'pull MB/s':>11}{'pull peak RSS':>15}{'vs baseline':>13}")  # fmt: skip
    print(f"{'baseline':<14}{'-':>12}{'-':>14}{'-':>9}{'-':>11}{'-':>9}{'-':>11}"
          f"{base['rss'] / 2**20:>11.0f} MiB{'':>13}")  # fmt: skip
    for name, items, pushed, pulled in rows:
        size = pulled["bytes"]
        push_s = pushed["timings"]["upload"]
        pull_s = pulled["timings"]["download"]
        print(f"{name:<14}{items:>12,}{size:>14,}{push_s:>9.2f}{size / mb / push_s:>11.1f}{pull_s:>9.2f}"
              f"{size / mb / pull_s:>11.1f}{pulled['rss'] / 2**20:>11.0f} MiB"
              f"{(pulled['rss'] - base['rss']) / 2**20:>+9.0f} MiB")  # fmt: skip
    verify = ", ".join(f"{name} {pushed['timings']['verify']:.1f} s" for name, _, pushed, _ in rows)
    print(f"push s: upload + read-back check of every object (before it, the local verify: {verify}); "
          "pull s: download with sha256 as it streams, fsync, header check")  # fmt: skip


if __name__ == "__main__":
    main()
