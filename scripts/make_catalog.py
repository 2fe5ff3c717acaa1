#!/usr/bin/env python
"""Write a synthetic SID catalog (skewed and hierarchical like real RQ codes) as Parquet.

The generator is zerogr_build.synthetic (its docstring describes the process); this is its command line.

Usage:
    python scripts/make_catalog.py data/catalog.parquet --items 1000000 --steps 3 --codebook-sizes 8192
    python scripts/make_catalog.py out.parquet -n 20000000 -L 3 -V 8192 --item-ids string --stats
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from zerogr_build.base.errors import InputError
from zerogr_build.config import parse_int_list
from zerogr_build.synthetic import ITEM_ID_TYPES, MODES, SID_TYPES, children_stats, write_catalog


def parse_codebook_sizes(text: str, num_steps: int | None) -> list[int]:
    """Codebook sizes from "8192" (one size, repeated over --steps) or "2048,2048,4096" (one per step)."""
    sizes = list(parse_int_list(text, "-V/--codebook-sizes"))
    if len(sizes) == 1 and num_steps is not None:
        return sizes * num_steps
    if num_steps is not None and len(sizes) != num_steps:
        raise InputError(f"-V/--codebook-sizes: {len(sizes)} codebook sizes given for --steps {num_steps}")
    return sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="Parquet file to write")
    parser.add_argument("-n", "--items", type=int, default=1_000_000, help="number of items (rows)")
    parser.add_argument("-L", "--steps", type=int, default=None, help="SID length (default: from -V)")
    parser.add_argument(
        "-V", "--codebook-sizes", default="8192", help="one size for every step, or one per step: 2048,2048"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mode", choices=MODES, default="skewed")
    parser.add_argument("--item-ids", choices=ITEM_ID_TYPES, default="int64", help="item_id column type")
    parser.add_argument("--sid-type", choices=SID_TYPES, default="auto", help="token type of the sid list")
    parser.add_argument("--fixed-size-list", action="store_true", help="write sid as fixed_size_list<L>")
    parser.add_argument("--row-group-size", type=int, default=1_000_000)
    parser.add_argument("--compression", default="snappy")
    parser.add_argument("--stats", action="store_true", help="print children-per-row stats per step")
    args = parser.parse_args(argv)
    steps = args.steps if args.steps is not None else (3 if "," not in args.codebook_sizes else None)
    try:
        sizes = parse_codebook_sizes(args.codebook_sizes, steps)
    except InputError as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    sids = write_catalog(
        args.out,
        args.items,
        sizes,
        seed=args.seed,
        mode=args.mode,
        item_id_type=args.item_ids,
        row_group_size=args.row_group_size,
        sid_type=args.sid_type,
        fixed_size_list=args.fixed_size_list,
        compression=args.compression,
    )
    print(
        f"wrote {args.out}: {args.items} items, L={len(sizes)}, V={sizes}, mode={args.mode}, "
        f"seed={args.seed} in {time.perf_counter() - started:.1f}s",
        file=sys.stderr,
    )
    if args.stats and args.items:
        for row in children_stats(sids):
            extra = ""
            if "leaves" in row:
                extra = (
                    f"  leaves {row['leaves']}  items sharing a SID {row['collided_items']}"
                    f"  max items/leaf {row['max_items_per_leaf']}"
                )
            print(
                f"step {row['step']}: rows {row['rows']}  children max {row['max']}  "
                f"mean {row['mean']:.2f}  p99 {row['p99']:.0f}{extra}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
