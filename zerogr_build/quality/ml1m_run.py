"""The MovieLens-1M check, reusable: dataset -> SIDs -> bundle -> T5 -> filter-first vs score-first.

`scripts/quality_ml1m.py` runs it on the real data; the tests on a tiny generated dataset. Every order is
decoded through the Hugging Face integration (SidGenerator, the model's own KV cache) and measured by
zerogr_build.compare.compare_searches, so the report has the ML-100K report's shape.

Checkpoints: after the epochs in `checkpoints`, the model is evaluated (all three orders, full report)
on a fixed seeded subset of `checkpoint_users` test users; after the last epoch on `final_users` users
(default: all). `on_report` receives the results after every evaluation (write them out incrementally).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..compare import CompareReport, Requests, compare_searches
from .data import Interactions, ItemInfo, Split, leave_one_out
from .run import SidCatalog, build_bundle, make_sids, write_catalog
from .t5 import SidVocab, T5Settings, encoder_inputs, train_t5


@dataclass
class Checkpoint:
    """One evaluation: after `epoch` epochs (train_seconds of training so far), on `users` test users."""

    epoch: int
    users: int
    train_seconds: float
    report: CompareReport

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "users": self.users, "train_seconds": self.train_seconds,
                "report": self.report.to_dict()}  # fmt: skip


@dataclass
class Ml1mRun:
    """Everything a run produced: the split, SIDs, bundle, vocabulary and the checkpoints so far."""

    split: Split
    catalog: SidCatalog
    catalog_path: Path
    bundle: Any
    vocab: SidVocab
    settings: T5Settings
    prepare_seconds: float
    checkpoints: list[Checkpoint] = field(default_factory=list)
    model: Any = None


def prepare(
    inter: Interactions,
    info: ItemInfo | None,
    work_dir: str | Path,
    *,
    codebook_sizes: Sequence[int],
    settings: T5Settings,
    model_version: str = "ml1m-t5",
) -> Ml1mRun:
    """Leave-one-out split (histories of at most settings.max_history items), SIDs, catalog, bundle."""
    started = time.perf_counter()
    work = Path(work_dir)
    split = leave_one_out(inter, max_history=settings.max_history)
    catalog = make_sids(split, info, codebook_sizes=codebook_sizes, seed=settings.seed)
    catalog_path = write_catalog(work / "catalog.parquet", catalog)
    bundle = build_bundle(catalog, work / "bundles", model_version=model_version)
    vocab = SidVocab(tuple(int(v) for v in bundle.index.codebook_sizes))
    return Ml1mRun(split, catalog, catalog_path, bundle, vocab, settings, time.perf_counter() - started)


def user_subset(split: Split, n: int | None, seed: int) -> np.ndarray:
    """Row indices int64 [n] of a seeded random subset of the split's users, ascending (all when None)."""
    total = len(split.user_ids)
    if n is None or n >= total:
        return np.arange(total, dtype=np.int64)
    return np.sort(np.random.default_rng(seed).choice(total, size=int(n), replace=False)).astype(np.int64)


def evaluate(
    run: Ml1mRun,
    model: Any,
    rows: np.ndarray,
    *,
    beam_width: int,
    ks: Sequence[int],
    batch_size: int,
) -> CompareReport:
    """All three orders through SidGenerator on the test requests of users `rows` (indices into split)."""
    from ..integrations.hf import SidGenerator, hf_search

    split = run.split
    item_tokens = run.vocab.tokens(run.catalog.sids)
    row_of = {int(split.user_ids[r]): int(r) for r in rows}

    def inputs_of(ids: list):
        return encoder_inputs([split.test_histories[row_of[u]] for u in ids], item_tokens,
                              run.settings.max_history)  # fmt: skip

    requests = Requests(
        ids=[int(split.user_ids[r]) for r in rows],
        targets=[int(split.item_ids[split.test_targets[r]]) for r in rows],
    )
    gen = SidGenerator(model, run.bundle, run.vocab.sid_map())
    return compare_searches(
        run.bundle, hf_search(gen, inputs_of), requests, beam_width=beam_width, ks=ks, batch_size=batch_size
    )


def train_and_check(
    run: Ml1mRun,
    *,
    checkpoints: Sequence[int],
    checkpoint_users: int | None,
    final_users: int | None = None,
    beam_width: int = 20,
    ks: Sequence[int] = (1, 5, 10, 20),
    batch_size: int = 64,
    log: Callable[[str], None] | None = None,
    on_report: Callable[[Ml1mRun], None] | None = None,
    save_dir: str | Path | None = None,
) -> Ml1mRun:
    """Train run.settings.epochs epochs; evaluate after each epoch in `checkpoints` and after the last.
    save_dir: also save each evaluated model there (save_pretrained, as t5-epoch<E>)."""
    settings = run.settings
    subset = user_subset(run.split, checkpoint_users, settings.seed)
    final = user_subset(run.split, final_users, settings.seed)
    wanted = {int(e) for e in checkpoints if 0 < int(e) < settings.epochs}
    clock = {"train": 0.0, "since": time.perf_counter()}

    def after_epoch(epoch: int, model: Any) -> None:
        clock["train"] += time.perf_counter() - clock["since"]
        if epoch in wanted or epoch == settings.epochs:
            rows = final if epoch == settings.epochs else subset
            report = evaluate(run, model, rows, beam_width=beam_width, ks=ks, batch_size=batch_size)
            run.checkpoints.append(Checkpoint(epoch, len(rows), clock["train"], report))
            if save_dir is not None:
                model.save_pretrained(Path(save_dir) / f"t5-epoch{epoch}")
            if log is not None:
                log(
                    f"checkpoint epoch {epoch}: {len(rows)} users, overlap@"
                    + ", @".join(f"{k} {v:.4f}" for k, v in report.overlap.items())
                    + f" (evaluated in {report.seconds:.0f} s)"
                )
            if on_report is not None:
                on_report(run)
        clock["since"] = time.perf_counter()

    run.model = train_t5(run.split.train_sequences, run.catalog.sids, run.vocab, settings, log=log,
                         after_epoch=after_epoch)  # fmt: skip
    return run
