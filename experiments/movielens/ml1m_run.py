"""The MovieLens-1M check, reusable: dataset -> SIDs -> bundle -> a model family -> filter-first vs
score-first along the training curve.

`experiments/quality_ml1m.py` runs it on the real data; the tests on a tiny generated dataset. Two families:
"t5" (t5.T5Family, TIGER's encoder-decoder) and "decoder" (causal.CausalFamily, a GPT-2 trained causally
on every position). Both train under quality.fit's stopping rule (validation loss, fixed patience) with a
checkpoint after every epoch, so a cut run resumes (`resume=True`). Every order is decoded through the
Hugging Face integration (SidGenerator, the model's own KV cache) and measured by
zerogr_build.compare.compare_searches, so the report has the ML-100K report's shape.

The curve: after every `eval_every`-th epoch and after the last, the model is evaluated (all three orders,
full report) on a fixed seeded subset of `checkpoint_users` test users. At the end the best epoch's model
(lowest validation loss) is evaluated on `final_users` users (default: all) - the result at convergence.
`on_report` receives the run after every evaluation (write it out incrementally).
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from zerogr_build.base.errors import InputError, ZerogrError
from zerogr_build.bundle.files import atomic_replace_bytes
from zerogr_build.compare import CompareReport, Requests, compare_searches

from .causal import CausalFamily, CausalSettings
from .data import Interactions, ItemInfo, Split, leave_one_out
from .family import SidFamily, SidVocab
from .fit import FitState, StopRule, fit, update_checkpoint_state
from .run import SidCatalog, build_bundle, make_sids, write_catalog
from .t5 import T5Family, T5Settings

FAMILIES = ("t5", "decoder")
# Each family's settings type -> the SidFamily that trains and evaluates it.
FAMILY_BY_SETTINGS: dict[type, type[SidFamily]] = {T5Settings: T5Family, CausalSettings: CausalFamily}


@dataclass
class Checkpoint:
    """One evaluation: the model after `epoch` epochs (train_seconds of training so far, its validation
    loss), on `users` test users."""

    epoch: int
    users: int
    train_seconds: float
    val_loss: float
    report: CompareReport

    def to_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "users": self.users, "train_seconds": self.train_seconds,
                "val_loss": self.val_loss, "report": self.report.to_dict()}  # fmt: skip

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Checkpoint:
        """The inverse of to_dict."""
        return cls(int(d["epoch"]), int(d["users"]), float(d["train_seconds"]), float(d["val_loss"]),
                   CompareReport.from_dict(d["report"]))  # fmt: skip


@dataclass
class Ml1mRun:
    """Everything a run produced: the split, SIDs, bundle, vocabulary, the family, the curve so far and
    (once trained) the training state, the best model and its evaluation on the final users."""

    split: Split
    catalog: SidCatalog
    catalog_path: Path
    bundle: Any
    vocab: SidVocab
    family: Any
    prepare_seconds: float
    checkpoints: list[Checkpoint] = field(default_factory=list)
    final: Checkpoint | None = None
    state: FitState | None = None
    model: Any = None

    @property
    def settings(self) -> Any:
        return self.family.settings


def prepare(
    inter: Interactions,
    info: ItemInfo | None,
    work_dir: str | Path,
    *,
    codebook_sizes: Sequence[int],
    settings: T5Settings | CausalSettings,
    model_version: str = "ml1m",
) -> Ml1mRun:
    """Leave-one-out split (histories of at most settings.max_history items), SIDs, catalog, bundle, and
    the family of `settings` (T5Settings: "t5", CausalSettings: "decoder") over the training sequences."""
    started = time.perf_counter()
    work = Path(work_dir)
    split = leave_one_out(inter, max_history=settings.max_history)
    key = _prepare_key(split, info, codebook_sizes, settings.seed, model_version)
    cached = _cached_prepare(work, key)
    if cached is not None:
        catalog, bundle = cached
        catalog_path = work / "catalog.parquet"
    else:
        catalog = make_sids(split, info, codebook_sizes=codebook_sizes, seed=settings.seed)
        catalog_path = write_catalog(work / "catalog.parquet", catalog)
        bundle = build_bundle(catalog, work / "bundles", model_version=model_version)
        _save_prepare(work, key, catalog, bundle)
    vocab = SidVocab(tuple(int(v) for v in bundle.index.codebook_sizes))
    family_cls: Any = next((f for t, f in FAMILY_BY_SETTINGS.items() if isinstance(settings, t)), None)
    if family_cls is None:
        known = " or ".join(t.__name__ for t in FAMILY_BY_SETTINGS)
        raise InputError(f"settings must be {known}, got {type(settings).__name__}")
    family = family_cls(split.train_sequences, catalog.sids, vocab, settings, split.valid_histories,
                        split.valid_targets)  # fmt: skip
    return Ml1mRun(split, catalog, catalog_path, bundle, vocab, family, time.perf_counter() - started)


PREPARE_CACHE = "prepared.npz"


def _prepare_key(
    split: Split, info: ItemInfo | None, codebook_sizes: Sequence[int], seed: int, model_version: str
) -> str:
    """sha256 of everything the SIDs and the bundle depend on (the training events, genres, codebooks)."""
    h = hashlib.sha256()
    h.update(repr((tuple(int(v) for v in codebook_sizes), int(seed), model_version)).encode())
    h.update(np.ascontiguousarray(split.item_ids, dtype=np.int64).tobytes())
    for seq in split.train_sequences:
        h.update(np.int64(len(seq)).tobytes() + np.ascontiguousarray(seq, dtype=np.int64).tobytes())
    if info is not None:
        h.update(repr((info.item_ids.tolist(), info.genres)).encode())
    return h.hexdigest()


def _cached_prepare(work: Path, key: str) -> tuple[SidCatalog, Any] | None:
    """(catalog, bundle) from an earlier prepare in `work` with the same key, or None (nothing usable)."""
    from zerogr_build.bundle import open_bundle

    path = work / PREPARE_CACHE
    try:
        with np.load(path, allow_pickle=False) as z:
            if str(z["key"]) != key:
                return None
            catalog = SidCatalog(z["sids"].astype(np.int64), tuple(int(v) for v in z["codebook_sizes"]),
                                 z["item_ids"].astype(np.int64))  # fmt: skip
            bundle = open_bundle(str(z["bundle"]))
    except (OSError, KeyError, ValueError, ZerogrError):
        return None
    if not (work / "catalog.parquet").exists():
        return None
    return catalog, bundle


def _save_prepare(work: Path, key: str, catalog: SidCatalog, bundle: Any) -> None:
    """Remember a prepare's SIDs and bundle for the next run in `work` (atomic)."""
    tmp = work / (PREPARE_CACHE + ".tmp.npz")
    np.savez(tmp, key=np.array(key), sids=catalog.sids, codebook_sizes=np.array(catalog.codebook_sizes),
             item_ids=catalog.item_ids, bundle=np.array(str(bundle.path)))  # fmt: skip
    os.replace(tmp, work / PREPARE_CACHE)


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
    from zerogr_build.integrations.hf import SidGenerator, hf_search

    split = run.split
    row_of = {int(split.user_ids[r]): int(r) for r in rows}

    def inputs_of(ids: list):
        return run.family.inputs([split.test_histories[row_of[u]] for u in ids])

    requests = Requests(
        ids=[int(split.user_ids[r]) for r in rows],
        targets=[int(split.item_ids[split.test_targets[r]]) for r in rows],
    )
    gen = SidGenerator(model, run.bundle, run.vocab.sid_map())
    return compare_searches(
        run.bundle, hf_search(gen, inputs_of), requests, beam_width=beam_width, ks=ks, batch_size=batch_size
    )


def write_gate_inputs(run: Ml1mRun, rows: np.ndarray, out_dir: str | Path) -> tuple[Path, Path]:
    """The files `zerogr compare --hf-model <work dir>/<family>-best` needs to run the quality gate on
    the test requests of users `rows` (int64 [n], indices into run.split), written atomically:

    - out_dir/sid_map.json: how the family spells SIDs (SidMap.save);
    - out_dir/requests.parquet: row i is user run.split.user_ids[rows[i]]; input_ids and attention_mask
      (list<int64>) are what the family feeds the model for that user alone, as `evaluate` decodes it;
      target_item (int64) is the held-out test item.

    Returns (sid map path, requests path).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    split = run.split
    input_ids: list[list[int]] = []
    masks: list[list[int]] = []
    for r in rows:
        ids, mask = run.family.inputs([split.test_histories[int(r)]])
        input_ids.append(ids[0].tolist())
        masks.append(mask[0].tolist())
    table = pa.table({
        "input_ids": pa.array(input_ids, type=pa.list_(pa.int64())),
        "attention_mask": pa.array(masks, type=pa.list_(pa.int64())),
        "target_item": pa.array([int(split.item_ids[split.test_targets[int(r)]]) for r in rows], pa.int64()),
    })  # fmt: skip
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    requests = out / "requests.parquet"
    atomic_replace_bytes(requests, sink.getvalue().to_pybytes())
    return run.vocab.sid_map().save(out / "sid_map.json"), requests


def checkpoint_path(work_dir: str | Path, family: str) -> Path:
    """Where a family's training checkpoint lives in a work dir."""
    return Path(work_dir) / f"{family}-train.pt"


def train_and_check(
    run: Ml1mRun,
    *,
    stop: StopRule,
    work_dir: str | Path,
    resume: bool = False,
    eval_every: int = 1,
    checkpoint_users: int | None = None,
    final_users: int | None = None,
    beam_width: int = 20,
    ks: Sequence[int] = (1, 5, 10, 20),
    batch_size: int = 64,
    log: Callable[[str], None] | None = None,
    on_report: Callable[[Ml1mRun], None] | None = None,
    checkpoint_seconds: float = 300.0,
    deadline: float | None = None,
) -> Ml1mRun:
    """Train run.family under `stop` (checkpoint `<work_dir>/<family>-train.pt` after every epoch; resume
    continues it) and evaluate along the curve. Then save the best model (save_pretrained) as
    `<work_dir>/<family>-best` and evaluate it on the final users as `zerogr compare --hf-model` loads it
    (integrations.hf.load), so the gate on that dir decodes the same model. eval_every=0: evaluate only
    after the last epoch.
    checkpoint_seconds: also checkpoint inside an epoch this often (quality.fit).
    deadline: a time.perf_counter() value; once passed, training pauses at the next batch (checkpointed,
    quality.fit) and the run returns with run.final None: the same call with resume=True continues it."""
    if eval_every < 0:
        raise InputError(f"eval every must be >= 0 epochs, got {eval_every}")
    family = run.family
    seed = family.settings.seed
    subset = user_subset(run.split, checkpoint_users, seed)
    final = user_subset(run.split, final_users, seed)
    path = checkpoint_path(work_dir, family.name)

    def evaluated(epoch: int, model: Any, rows: np.ndarray, state: FitState, val: float) -> Checkpoint:
        seconds = sum(h.seconds for h in state.history if h.epoch <= epoch)
        report = evaluate(run, model, rows, beam_width=beam_width, ks=ks, batch_size=batch_size)
        if log is not None:
            log(f"evaluation after epoch {epoch}: {len(rows)} users, overlap@"
                + ", @".join(f"{k} {v:.4f}" for k, v in report.overlap.items())
                + f" (evaluated in {report.seconds:.0f} s)")  # fmt: skip
        return Checkpoint(epoch, len(rows), seconds, val, report)

    def after_epoch(epoch: int, model: Any, state: FitState) -> None:
        if state.stopped or (eval_every and epoch % eval_every == 0):
            point = evaluated(epoch, model, subset, state, state.history[-1].val_loss)
            state.curve.append(point.to_dict())
            run.checkpoints.append(point)
            run.state = state
            if on_report is not None:
                on_report(run)

    result = fit(family, stop, path, resume=resume, after_epoch=after_epoch, log=log,
                 checkpoint_seconds=checkpoint_seconds, deadline=deadline)  # fmt: skip
    state = result.state
    run.state, run.model = state, result.model
    run.checkpoints = [Checkpoint.from_dict(d) for d in state.curve]
    if result.paused:
        run.final = None
        return run
    best_dir = Path(work_dir) / f"{family.name}-best"
    result.model.save_pretrained(best_dir)
    if (
        state.final is None
        or state.final.get("epoch") != state.best_epoch
        or state.final["users"] != len(final)
    ):
        from zerogr_build.integrations.hf.load import load_hf_model

        best_val = next((h.val_loss for h in state.history if h.epoch == state.best_epoch), float("nan"))
        # The saved model, not the one in memory: reloaded, a T5's logits can move by ~1e-7.
        saved = load_hf_model(best_dir)
        state.final = evaluated(state.best_epoch, saved, final, state, best_val).to_dict()
        update_checkpoint_state(path, family, state)
    run.final = Checkpoint.from_dict(state.final)
    if on_report is not None:
        on_report(run)
    return run
