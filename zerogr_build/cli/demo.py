"""`zerogr demo-catalog`: a synthetic SID catalog to try zerogr on (zerogr_build.synthetic)."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ..base.errors import InputError
from ._errors import cli_errors


def demo_catalog(
    out: Annotated[Path, typer.Argument(help="Parquet file to write.", metavar="OUT", show_default=False)],
    items: Annotated[int, typer.Option("--items", "-n", help="Items (rows).")] = 20_000,
    codebook_sizes: Annotated[
        str, typer.Option("--codebook-sizes", "-V", help="One size per step, e.g. 256,256,256.")
    ] = "256,256,256",
    seed: Annotated[int, typer.Option("--seed", help="Random seed.")] = 0,
    mode: Annotated[str, typer.Option("--mode", help="skewed (like real RQ codes) or uniform.")] = "skewed",
    item_ids: Annotated[
        str, typer.Option("--item-ids", help="item_id column type: int64 or string.")
    ] = "int64",
) -> None:
    """Write a synthetic catalog (columns item_id and sid), skewed and hierarchical like real RQ codes.

    Then: zerogr build OUT --codebook-sizes <the same sizes> --out bundles"""
    with cli_errors():
        from ..config import parse_int_list
        from ..synthetic import ITEM_ID_TYPES, MODES, write_catalog

        sizes = parse_int_list(codebook_sizes, "--codebook-sizes")
        if items < 1:
            raise InputError(f"--items must be >= 1, got {items}")
        if mode not in MODES:
            raise InputError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
        if item_ids not in ITEM_ID_TYPES:
            raise InputError(f"--item-ids must be one of {', '.join(ITEM_ID_TYPES)}, got {item_ids!r}")
        started = time.perf_counter()
        write_catalog(out, items, sizes, seed=seed, mode=mode, item_id_type=item_ids)
        sys.stderr.write(
            f"wrote {out}: {items:,} items, codebook sizes {','.join(map(str, sizes))} "
            f"({time.perf_counter() - started:.1f} s)\n"
        )
        sys.stdout.write(f"{out}\n")
