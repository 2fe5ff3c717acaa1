"""`zerogr diff` benchmark: wall time and peak RSS of `zerogr diff OLD NEW --json` next to `zerogr build` of
the same catalog, in the same run.

Per size in --items (default 20M and 100M items; L=4, V=2048, int64 item ids, skewed SIDs): catalog A
(zerogr_build.synthetic, seed 0) and catalog B, a model update with churn: A's item ids with SIDs drawn
with another seed, every 33rd item removed (3%) and 5% new items added. Both are written once to --workdir
(not timed). Then, each in its own process (after a small warm-up build, so the numba cache is warm):
`python cli.py build A`, `python cli.py build B --no-promote`, and `python cli.py diff OUT/v1 OUT/v2
--json`: wall time, that process's own peak RSS (os.wait4) and its peak anonymous RSS (RssAnon, sampled
every 20 ms: what the kernel cannot reclaim; the rest of RSS is the memory-mapped step tables and leaf
offsets, page cache it can). The diff's items added and removed are checked against what the catalogs
say.

    python scripts/bench_diff.py                                  # 20M and 100M (about 8 GB of disk)
    python scripts/bench_diff.py --items 1000000 --workdir work   # a quick run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_build import REPO

from zerogr_build import synthetic

SIZES = (2048, 2048, 2048, 2048)
SEED = 0
DEFAULT_ITEMS = (20_000_000, 100_000_000)


@dataclass
class DiffRow:
    items: int
    build_s: float
    build_peak: int
    build_anon: int
    diff_s: float
    diff_peak: int
    diff_anon: int
    checked: str


@dataclass
class Measured:
    wall: float
    peak_rss: int  # bytes, os.wait4's ru_maxrss
    peak_anon: int  # bytes, the largest RssAnon sampled
    code: int
    stdout: str
    stderr: str


def run_measured(command: list[str]) -> Measured:
    """Run `command`; its wall time, peak RSS, peak anonymous RSS, exit code and output."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen(command, stdout=out, stderr=err, cwd=REPO)
        anon = [0]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                try:
                    with open(f"/proc/{proc.pid}/status") as status:
                        for line in status:
                            if line.startswith("RssAnon:"):
                                anon[0] = max(anon[0], int(line.split()[1]) * 1024)
                except OSError:
                    pass
                done.wait(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - started
        done.set()
        sampler.join()
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return Measured(
            wall, usage.ru_maxrss * 1024, anon[0], proc.returncode, out.read().decode(), err.read().decode()
        )


def write_catalogs(items: int, workdir: Path) -> tuple[Path, Path, int, int]:
    """(catalog A, catalog B, items removed, items added) for `items` items, written once."""
    a = workdir / f"diff_a_{items}.parquet"
    b = workdir / f"diff_b_{items}.parquet"
    removed = len(range(0, items, 33))
    added = items // 20
    if not a.exists():
        synthetic.write_catalog(a, items, SIZES, seed=SEED)
    if not b.exists():
        ids = synthetic.make_item_ids(items + added, "int64", SEED)  # A's ids, then new ones
        keep = np.ones(items + added, dtype=bool)
        keep[0:items:33] = False
        sids = synthetic.generate_sids(items + added, SIZES, SEED + 1, "skewed")
        table = synthetic.catalog_table(sids[keep], ids.filter(pa.array(keep)))
        pq.write_table(table, b, row_group_size=1_000_000)
    return a, b, removed, added


def _zerogr(*args: object) -> list[str]:
    return [sys.executable, str(REPO / "cli.py"), *map(str, args)]


def bench(items: int, workdir: Path) -> DiffRow:
    a, b, removed, added = write_catalogs(items, workdir)
    out = workdir / "diff_bundles"
    shutil.rmtree(out, ignore_errors=True)
    sizes = ",".join(map(str, SIZES))
    build = run_measured(_zerogr("build", a, "--out", out, "--codebook-sizes", sizes, "--quiet"))
    if build.code != 0:
        raise RuntimeError(f"build of A failed (exit {build.code}): {build.stderr[-2000:]}")
    second = run_measured(_zerogr("build", b, "--out", out, "--codebook-sizes", sizes, "--no-promote", "-q"))
    if second.code != 0:
        raise RuntimeError(f"build of B failed (exit {second.code})")
    diff = run_measured(_zerogr("diff", out / "v000001", out / "v000002", "--json"))
    if diff.code != 0:
        raise RuntimeError(f"zerogr diff failed (exit {diff.code}): {diff.stderr[-2000:]}")
    got = json.loads(diff.stdout)
    ok = (got["items_added"], got["items_removed"]) == (added, removed)
    checked = "ok" if ok else f"WRONG: added {got['items_added']}, removed {got['items_removed']}"
    shutil.rmtree(out, ignore_errors=True)
    return DiffRow(
        items, build.wall, build.peak_rss, build.peak_anon, diff.wall, diff.peak_rss, diff.peak_anon, checked
    )


def print_table(rows: list[DiffRow]) -> None:
    print("zerogr diff next to zerogr build: L=4 V=2048, int64 item ids; B = A's items with every SID")
    print("redrawn, 3% removed and 5% added; each command in its own process, peak RSS its own (anon: its")
    print("anonymous part; the rest of the diff's RSS is the memory-mapped step tables and leaf offsets)")
    header = (
        f"{'items':>12}{'build s':>9}{'build peak':>12}{'(anon)':>10}{'diff s':>8}{'diff peak':>11}"
        f"{'(anon)':>10}{'diff/build anon':>17}  counts"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.items:>12,}{r.build_s:>9.1f}{r.build_peak / 1e9:>9.2f} GB{r.build_anon / 1e9:>7.2f} GB"
            f"{r.diff_s:>8.1f}{r.diff_peak / 1e9:>8.2f} GB{r.diff_anon / 1e9:>7.2f} GB"
            f"{r.diff_anon / max(r.build_anon, 1):>17.2f}  {r.checked}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--items", default=",".join(map(str, DEFAULT_ITEMS)), help="comma-separated sizes")
    parser.add_argument("--workdir", type=Path, default=None, help="where the catalogs go (default: tmp)")
    args = parser.parse_args(argv)
    workdir = (args.workdir or Path(tempfile.gettempdir()) / "zerogr_bench_diff").resolve()
    workdir.mkdir(parents=True, exist_ok=True)  # kept: catalogs this size are worth reusing
    warm = workdir / "warmup.parquet"
    synthetic.write_catalog(warm, 20_000, SIZES, seed=SEED + 2)
    sizes = ",".join(map(str, SIZES))
    run_measured(_zerogr("build", warm, "--out", workdir / "warm_bundles", "--codebook-sizes", sizes, "-q"))
    shutil.rmtree(workdir / "warm_bundles", ignore_errors=True)
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        print(f"zerogr diff: {items:,} items ...", file=sys.stderr, flush=True)
        rows.append(bench(items, workdir))
    print_table(rows)
    return 0 if all(r.checked == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
