#!/usr/bin/env python
"""Catalog read benchmark: the in-order read against the pooled read, on ordinary and on many-row-group files.

Reads each catalog with `zerogr_build.read_catalog(..., pack=True)` (what `zerogr build` does), once in
order on one thread (`workers=1`, the baseline of the same run) and once on a pool (`--workers` threads),
best of `--repeat` runs each. The catalogs are written first (not timed) into --workdir:

* "large groups": --items rows, row groups of 100,000 rows (a typical export);
* "tiny groups" rows: files of --tiny-groups row groups holding 10 rows each, as streaming writers or
  per-batch exporters leave them. The pooled read must stay near the in-order read here: a read whose
  cost grows with the square of the row groups shows up as a pooled time many times the in-order one.

    python scripts/bench_catalog_read.py                       # 4M items, 2,000 / 5,000 / 20,000 tiny groups
    python scripts/bench_catalog_read.py --smoke               # tiny sizes, a few seconds
    python scripts/bench_catalog_read.py --tiny-groups 20000 --items 0
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from zerogr_build import read_catalog

SIZES = (256, 256, 256)


def write_catalog(path: Path, rows: int, group_rows: int, seed: int = 0) -> Path:
    """A random catalog of `rows` rows, int64 ids, list<uint16> SIDs of len(SIZES), `group_rows` per group."""
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, rows, dtype=np.uint16) for v in SIZES], axis=1)
    table = pa.table(
        {
            "item_id": pa.array(np.arange(rows, dtype=np.int64)),
            "sid": pa.FixedSizeListArray.from_arrays(pa.array(sids.reshape(-1)), len(SIZES)),
        }
    )
    with pq.ParquetWriter(path, table.schema) as writer:
        for start in range(0, rows, group_rows):  # one write per group: the footer lists every one
            writer.write_table(table.slice(start, group_rows), row_group_size=group_rows)
    return path


def best_seconds(path: Path, workers: int, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        catalog = read_catalog(path, codebook_sizes=SIZES, pack=True, workers=workers)
        best = min(best, time.perf_counter() - started)
        del catalog
    return best


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--items", type=int, default=4_000_000, help="rows of the large-group catalog (0: skip)"
    )
    parser.add_argument(
        "--tiny-groups", default="2000,5000,20000", help="row-group counts of the tiny-group files ('' skips)"
    )
    parser.add_argument("--workers", type=int, default=2, help="threads of the pooled read")
    parser.add_argument("--repeat", type=int, default=3, help="runs per cell; the best is printed")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="where the catalogs go (default: a temp dir)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a few seconds)")
    args = parser.parse_args(argv)
    if args.smoke:
        args.items, args.tiny_groups, args.repeat = 20_000, "200", 1
    tiny = [int(x) for x in args.tiny_groups.split(",") if x.strip()]
    if args.workdir:
        Path(args.workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.workdir) as tmp:
        cases = []
        if args.items:
            cases.append(
                (
                    f"{args.items:,} rows, groups of 100,000",
                    write_catalog(Path(tmp) / "large.parquet", args.items, 100_000),
                )
            )
        for groups in tiny:
            cases.append(
                (
                    f"{groups:,} row groups of 10 rows",
                    write_catalog(Path(tmp) / f"tiny-{groups}.parquet", groups * 10, 10),
                )
            )
        best_seconds(cases[0][1], 1, 1)  # warm the numba cache and the page cache
        print(
            f"catalog read, best of {args.repeat}; in order = workers 1 (baseline), pooled = workers "
            f"{args.workers}"
        )
        print(f"| {'catalog':<34} | {'in order':>9} | {'pooled':>9} | {'pooled / in order':>17} |")
        print(f"|{'-' * 36}|{'-' * 11}|{'-' * 11}|{'-' * 19}|")
        for label, path in cases:
            in_order = best_seconds(path, 1, args.repeat)
            pooled = best_seconds(path, args.workers, args.repeat)
            print(
                f"| {label:<34} | {in_order:>8.3f}s | {pooled:>8.3f}s | {pooled / in_order:>16.2f}x |",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
