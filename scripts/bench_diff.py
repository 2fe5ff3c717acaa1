"""`zerogr diff` benchmark: wall time and peak RSS of `zerogr diff OLD NEW --json` next to `zerogr build` of
the same catalog, in the same run.

Per size in --items (default 20M and 100M items; L=4, V=2048, int64 item ids, skewed SIDs): catalog A
(zerogr_build.synthetic, seed 0) and catalog B, a model update with churn: A's item ids with SIDs drawn
with another seed, every 33rd item removed (3%) and 5% new items added. Both are written once to --workdir
(not timed). Then, each in its own process (after a small warm-up build, so the numba cache is warm):
`python cli.py build A`, `python cli.py build B --no-promote`, and `python cli.py diff OUT/v1 OUT/v2
--json`: wall time and that process's own peak RSS (os.wait4). The diff's items added and removed are
checked against what the catalogs say.

    python scripts/bench_diff.py                                  # 20M and 100M (about 8 GB of disk)
    python scripts/bench_diff.py --items 1000000 --workdir work   # a quick run
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from bench_build import REPO, _run_measured

from zerogr_build import synthetic

SIZES = (2048, 2048, 2048, 2048)
SEED = 0
DEFAULT_ITEMS = (20_000_000, 100_000_000)


@dataclass
class DiffRow:
    items: int
    build_s: float
    build_peak: int
    diff_s: float
    diff_peak: int
    checked: str


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
    build_s, build_peak, code, _, err = _run_measured(
        _zerogr("build", a, "--out", out, "--codebook-sizes", sizes, "--quiet")
    )
    if code != 0:
        raise RuntimeError(f"build of A failed (exit {code}): {err[-2000:]}")
    code = _run_measured(_zerogr("build", b, "--out", out, "--codebook-sizes", sizes, "--no-promote", "-q"))[
        2
    ]
    if code != 0:
        raise RuntimeError(f"build of B failed (exit {code})")
    diff_s, diff_peak, code, stdout, err = _run_measured(
        _zerogr("diff", out / "v000001", out / "v000002", "--json")
    )
    if code != 0:
        raise RuntimeError(f"zerogr diff failed (exit {code}): {err[-2000:]}")
    got = json.loads(stdout)
    ok = (got["items_added"], got["items_removed"]) == (added, removed)
    checked = "ok" if ok else f"WRONG: added {got['items_added']}, removed {got['items_removed']}"
    shutil.rmtree(out, ignore_errors=True)
    return DiffRow(items, build_s, build_peak, diff_s, diff_peak, checked)


def print_table(rows: list[DiffRow]) -> None:
    print("zerogr diff next to zerogr build: L=4 V=2048, int64 item ids; B = A's items with every SID")
    print("redrawn, 3% removed and 5% added; each command in its own process, peak RSS its own")
    header = (
        f"{'items':>12}{'build s':>10}{'build peak':>13}{'diff s':>9}{'diff peak':>12}"
        f"{'diff/build peak':>17}  counts"
    )
    print(header)
    print("-" * len(header))
    for r in rows:
        print(
            f"{r.items:>12,}{r.build_s:>10.1f}{r.build_peak / 1e9:>11.2f} GB{r.diff_s:>9.1f}"
            f"{r.diff_peak / 1e9:>10.2f} GB{r.diff_peak / r.build_peak:>17.2f}  {r.checked}"
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
    _run_measured(_zerogr("build", warm, "--out", workdir / "warm_bundles", "--codebook-sizes", sizes, "-q"))
    shutil.rmtree(workdir / "warm_bundles", ignore_errors=True)
    rows = []
    for items in (int(x) for x in args.items.split(",")):
        print(f"zerogr diff: {items:,} items ...", file=sys.stderr, flush=True)
        rows.append(bench(items, workdir))
    print_table(rows)
    return 0 if all(r.checked == "ok" for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
