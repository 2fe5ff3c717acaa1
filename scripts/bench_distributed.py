"""Partitioned build benchmark: `zerogr build` (local engine) against `zerogr build --engine ray` with
P partitions, on one machine, for the same catalog (zerogr_build.synthetic, skewed, seed 0, L=4, V=2048,
int64 ids, row groups of 1M items; written once into --workdir, not timed).

Each build runs as its own `zerogr build` process (numba cache warm: a small warm-up build of each
engine first). The Ray builds connect to a cluster this script starts with `ray start --head --block`
(2 CPUs unless --cpus; its own process group, ended at the end). Per build:

* wall s, and the stage timings the build reports (read, build, publish);
* driver peak RSS: the `zerogr build` process's (its VmHWM) plus, for a Ray build, that of the Ray
  driver process it starts (distributed.ray_process; the sum of the two peaks, an upper bound of their
  peak together), and in bytes per item;
* driver private / object-store pages: the peaks of their RssAnon (own memory; the build's process holds
  the results it received from the Ray process) and RssShmem (pages of the node's Ray object store the
  Ray process mapped while reading the partitions' results, memory of the store), summed;
* worker peak RSS: the largest VmHWM of any Ray worker process (`ray::` task workers whose parent, the
  raylet, is in the cluster's process group), and the sum over workers, polled from /proc every 0.2 s;
* shuffle B/item: bytes the partition and duplicate-check tasks received through the object store,
  per item (as the build reports it).

The goal at 100M items: the Ray driver's peak RSS at most a third of the local build's.

    python scripts/bench_distributed.py --items 20000000 --workdir /tmp/zg-bench
    python scripts/bench_distributed.py --items 20000000 100000000 --partitions 2 8 --workdir DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from zerogr_build import synthetic

SIZES = (2048, 2048, 2048, 2048)
#: The benchmark's cluster listens on 127.0.0.1 only and lives for this run: no token authentication
#: (a token file shared with other Ray users of this machine could disagree with the head's).
BENCH_ENV = {**os.environ, "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled"}


def catalog_for(workdir: Path, items: int) -> Path:
    path = workdir / f"catalog-{items}" / "part-0.parquet"
    if not path.exists():
        print(f"writing the {items:,}-item catalog to {path.parent} ...", flush=True)
        synthetic.write_catalog(path, items, SIZES, seed=0, row_group_size=1_000_000)
    return path.parent


class WorkerWatch:
    """Peak RSS (VmHWM) of every Ray worker process of one cluster, polled from /proc."""

    def __init__(self, group: int) -> None:
        self.group = group
        self.peaks: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> WorkerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.is_set():
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self._sample(int(pid))
            self._stop.wait(0.2)

    def _sample(self, pid: int) -> None:
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
            if not cmdline.startswith("ray::") or "Agent" in cmdline:
                return
            parent = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
            if os.getpgid(parent) != self.group:  # a worker of this cluster's raylet (own session)
                return
            self.peaks[pid] = max(self.peaks.get(pid, 0), _vm_hwm(pid))
        except OSError:
            pass


def _tool(name: str) -> str:
    """The console script `name` of this Python's environment (beside sys.executable), else from PATH."""
    beside = Path(sys.executable).with_name(name)
    return str(beside) if beside.exists() else (shutil.which(name) or name)


def run_build(args: list[str]) -> tuple[dict, float, tuple[int, int, int]]:
    """(summary, wall s, (peak RSS, peak private RSS, peak object-store pages mapped) in bytes) of one
    `zerogr build --json` process. The peak RSS is the child's
    VmHWM, polled from /proc until it exits (rusage's ru_maxrss would also count the high-water mark this
    process had when it forked the child)."""
    started = time.perf_counter()
    child = subprocess.Popen(
        [_tool("zerogr"), "build", *args, "--json", "-q"], stdout=subprocess.PIPE, text=True, env=BENCH_ENV
    )
    peak = [0, 0, 0]  # VmHWM, peak RssAnon, peak RssShmem (the build's process + its Ray process)
    ray_driver = [0]  # the pid of the Ray driver process the build starts, once seen
    hwm = {child.pid: 0}

    def poll() -> None:
        while child.poll() is None:
            if not ray_driver[0]:
                ray_driver[0] = _ray_driver_of(child.pid)
            pids = [child.pid, *([ray_driver[0]] if ray_driver[0] else [])]
            for pid in pids:
                hwm[pid] = max(hwm.get(pid, 0), _status(pid, "VmHWM"))
            peak[0] = sum(hwm.values())
            for i, field in ((1, "RssAnon"), (2, "RssShmem")):
                peak[i] = max(peak[i], sum(_status(pid, field) for pid in pids))
            time.sleep(0.05)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    out = child.stdout.read() if child.stdout else ""
    child.wait()
    watcher.join()
    wall = time.perf_counter() - started
    if child.returncode != 0:
        raise SystemExit(f"zerogr build {' '.join(args)} failed")
    return json.loads(out), wall, tuple(peak)


def _status(pid: int, field: str) -> int:
    """One memory field of /proc/PID/status in bytes (VmHWM: peak RSS so far; RssAnon: private memory
    now; RssShmem: shared-memory pages mapped now, i.e. Ray object-store pages it read), 0 once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def _ray_driver_of(pid: int) -> int:
    """The pid of the Ray driver process (distributed.ray_process's child) that process `pid` started, or
    0 while there is none."""
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or b"ray_process" not in (entry / "cmdline").read_bytes():
                continue
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return 0


def _vm_hwm(pid: int) -> int:
    return _status(pid, "VmHWM")


def start_cluster(cpus: int, temp: Path, object_store: int) -> tuple[subprocess.Popen, str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ray_bin = _tool("ray")
    head = subprocess.Popen(
        [ray_bin, "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}",
         f"--num-cpus={cpus}", f"--object-store-memory={object_store}", "--include-dashboard=false",
         "--disable-usage-stats", f"--temp-dir={temp}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        env=BENCH_ENV,
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                return head, f"127.0.0.1:{port}"
        time.sleep(0.5)
    raise SystemExit("ray start --head did not come up")


def stop_cluster(head: subprocess.Popen) -> None:
    os.killpg(head.pid, signal.SIGTERM)
    with contextlib.suppress(subprocess.TimeoutExpired):
        head.wait(timeout=10)
    with contextlib.suppress(ProcessLookupError):  # what the head started and left behind: its group
        os.killpg(head.pid, signal.SIGKILL)
    head.wait()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--items", type=int, nargs="+", default=[20_000_000, 100_000_000])
    parser.add_argument("--partitions", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--object-store-gb", type=float, default=6.0)
    parser.add_argument("--workdir", type=Path, required=True)
    parser.add_argument("--keep-bundles", action="store_true")
    parser.add_argument("--warmup-items", type=int, default=200_000, help="items of the warm-up builds")
    opts = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the cluster (finally below) on kill
    opts.workdir.mkdir(parents=True, exist_ok=True)
    common = ["--codebook-sizes", ",".join(map(str, SIZES)), "--kernel-archs", ""]
    # Ray's session dir holds Unix sockets, whose paths must stay under ~100 characters: a short temp dir.
    temp = Path(tempfile.mkdtemp(prefix="zg-ray-"))
    head, address = start_cluster(opts.cpus, temp, int(opts.object_store_gb * 2**30))
    rows = []
    try:
        warm = catalog_for(opts.workdir, opts.warmup_items)
        run_build([str(warm), "-o", str(opts.workdir / "warm"), *common])
        run_build(
            [
                str(warm),
                "-o",
                str(opts.workdir / "warm"),
                *common,
                "--engine",
                "ray",
                "--ray-address",
                address,
            ]
        )
        for items in opts.items:
            catalog = catalog_for(opts.workdir, items)
            runs = [("local", [])] + [
                (f"ray P={p}", ["--engine", "ray", "--ray-address", address, "--partitions", str(p)])
                for p in opts.partitions
            ]
            for name, extra in runs:
                out = opts.workdir / f"out-{items}-{name.replace(' ', '').replace('=', '')}"
                with WorkerWatch(head.pid) as watch:
                    summary, wall, (rss, anon, shmem) = run_build(
                        [str(catalog), "-o", str(out), *common, *extra]
                    )
                workers = sorted(watch.peaks.values()) if extra else []
                engine = summary.get("engine") or {}
                rows.append(
                    {
                        "items": items, "build": name, "wall_s": wall, "timings": summary["timings"],
                        "driver_rss": rss, "driver_anon": anon, "driver_shmem": shmem,
                        "worker_rss_max": max(workers, default=0), "worker_rss_sum": sum(workers),
                        "workers": len(workers),
                        "shuffle_b_per_item": engine.get("shuffle_bytes", 0) / items if engine else None,
                    }
                )  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
                if not opts.keep_bundles:
                    shutil.rmtree(out, ignore_errors=True)
    finally:
        stop_cluster(head)
        shutil.rmtree(temp, ignore_errors=True)
        print_table(rows)


def _count(items: int) -> str:
    return f"{items / 1e6:.0f}M" if items >= 1_000_000 else f"{items / 1e3:.0f}K"


def print_table(rows: list[dict]) -> None:
    print()
    header = [
        "items", "build", "wall s", "read s", "build s", "publish s", "driver peak RSS", "driver B/item",
        "driver private / object-store pages", "worker peak RSS (max / sum, n)", "shuffle B/item",
    ]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        t = r["timings"]
        local = next(x for x in rows if x["items"] == r["items"] and x["build"] == "local")
        ratio = r["driver_rss"] / local["driver_rss"]
        workers = (
            f"{r['worker_rss_max'] / 2**30:.2f} / {r['worker_rss_sum'] / 2**30:.2f} GiB, {r['workers']}"
            if r["workers"] else "-"
        )  # fmt: skip
        shuffle = f"{r['shuffle_b_per_item']:.1f}" if r["shuffle_b_per_item"] is not None else "-"
        print(
            f"| {_count(r['items'])} | {r['build']} | {r['wall_s']:.1f} | {t.get('read', 0):.1f} | "
            f"{t.get('build', 0):.1f} | {t.get('publish', 0):.1f} | {r['driver_rss'] / 2**30:.2f} GiB "
            f"({ratio:.2f}x local) | {r['driver_rss'] / r['items']:.1f} | {r['driver_anon'] / 2**30:.2f} / "
            f"{r['driver_shmem'] / 2**30:.2f} GiB | {workers} | {shuffle} |"
        )


if __name__ == "__main__":
    main()
