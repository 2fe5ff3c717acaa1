"""Train until the validation loss stops improving, checkpointing every epoch so a cut run resumes.

    family = ...                       # a Family: builds its model, cuts an epoch into batches, losses
    result = fit(family, stop, checkpoint_path, resume=True, after_epoch=..., log=print)

The stopping rule (StopRule): after every epoch the loss on the validation targets is measured; an epoch
improves when it beats the best so far by more than `min_delta`; training stops after `patience`
epochs in a row without improvement, or after `max_epochs`. The model kept is the best epoch's.

The checkpoint (one torch file, rewritten atomically after every epoch) holds everything the next epoch
depends on: the model, optimiser and scheduler states, the epoch, the numpy and torch generator states,
the best validation loss with its weights and epoch, the patience count, the per-epoch history and the
evaluations so far (`curve`, plain dicts). So `fit(..., resume=True)` after a cut continues exactly where
the last checkpoint left off: the same weights as a run that was never cut (up to BLAS rounding).
"""

from __future__ import annotations

import copy
import hashlib
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch

from zerogr_build.base.errors import InputError

from .model import set_determinism

CHECKPOINT_FORMAT = "zerogr-quality-checkpoint/1"


@dataclass(frozen=True)
class StopRule:
    """Early stopping: stop after `patience` epochs without a validation-loss improvement larger than
    `min_delta` (nats), or after `max_epochs`. patience=None: always train max_epochs epochs."""

    max_epochs: int
    patience: int | None = 2
    min_delta: float = 1e-4

    def __post_init__(self) -> None:
        if self.max_epochs < 1:
            raise InputError(f"max epochs must be >= 1, got {self.max_epochs}")
        if self.patience is not None and self.patience < 1:
            raise InputError(f"patience must be >= 1, got {self.patience}")
        if not (self.min_delta >= 0 and math.isfinite(self.min_delta)):
            raise InputError(f"min delta must be a finite number >= 0, got {self.min_delta}")


class Family(Protocol):
    """A model family as the loop sees it (t5.T5Family, causal.CausalFamily)."""

    name: str
    settings: Any  # a frozen dataclass with seed, lr, warmup_steps, weight_decay; to_dict()

    def build(self) -> torch.nn.Module:
        """A freshly initialised model (seeded by settings.seed)."""

    def batches(self, rng: np.random.Generator) -> Iterator[Any]:
        """One epoch's training batches, drawn with rng."""

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """(mean loss over the batch, the number of examples it averages)."""

    def val_loss(self, model: torch.nn.Module) -> float:
        """Mean cross-entropy per token of the validation targets (model in eval mode, no grad)."""

    def fingerprint(self) -> str:
        """A digest of the data the model is trained on (the SIDs): a checkpoint of other data is refused."""


@dataclass
class EpochRecord:
    """One epoch: mean training loss, validation loss, whether it improved, seconds (training + val)."""

    epoch: int
    train_loss: float
    val_loss: float
    improved: bool
    seconds: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class FitState:
    """The loop's state after `epoch` epochs (what the checkpoint stores, besides tensors)."""

    epoch: int = 0
    best_val: float = math.inf
    best_epoch: int = 0
    bad_epochs: int = 0
    stopped: bool = False
    stop_reason: str = ""
    train_seconds: float = 0.0
    history: list[EpochRecord] = field(default_factory=list)
    curve: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] | None = None


@dataclass
class FitResult:
    """The best model (eval mode), the loop's state, and the model after the last epoch (eval mode).
    paused: the deadline stopped training before the rule did (the checkpoint continues it)."""

    model: torch.nn.Module
    state: FitState
    last_model: torch.nn.Module
    paused: bool = False


def inverse_sqrt_lr(step: int, warmup_steps: int) -> float:
    """Learning-rate factor at optimiser step `step` (1-based): linear warm-up, then sqrt(warmup / step).
    Independent of the number of epochs, so stopping early or resuming never changes the schedule."""
    w = max(1, int(warmup_steps))
    return min(step / w, (w / max(step, 1)) ** 0.5)


def sids_fingerprint(sids: np.ndarray) -> str:
    """sha256 of the SID table int64 [I, L] (shape included)."""
    a = np.ascontiguousarray(np.asarray(sids, dtype=np.int64))
    return hashlib.sha256(repr(a.shape).encode() + a.tobytes()).hexdigest()


def _optimiser(model: torch.nn.Module, settings: Any):
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    warmup = settings.warmup_steps
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt_lr(s + 1, warmup))
    return opt, sched


def save_checkpoint(path: Path, blob: dict[str, Any]) -> None:
    """torch.save to path atomically (a temporary file in the same folder, fsynced, then renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        torch.save(blob, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def load_checkpoint(path: Path, family: Family) -> dict[str, Any]:
    """The checkpoint at path, checked against the family (InputError naming what differs)."""
    try:
        blob = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - any unreadable file is one error for the user
        raise InputError(f"{path}: not a readable training checkpoint ({type(exc).__name__}: {exc})") from exc
    if not isinstance(blob, dict) or blob.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path}: not a {CHECKPOINT_FORMAT} training checkpoint")
    if blob.get("family") != family.name:
        raise InputError(f"{path}: a checkpoint of the {blob.get('family')!r} family, not {family.name!r}")
    if blob.get("settings") != family.settings.to_dict():
        ours, theirs = family.settings.to_dict(), blob.get("settings") or {}
        diff = sorted(k for k in set(ours) | set(theirs) if ours.get(k) != theirs.get(k))
        raise InputError(f"{path}: the checkpoint was trained with other settings ({', '.join(diff)}); "
                         "use the same settings or another work dir")  # fmt: skip
    if blob.get("fingerprint") != family.fingerprint():
        raise InputError(f"{path}: the checkpoint was trained on other SIDs (data, codebooks or seed differ)")
    return blob


def fit(
    family: Family,
    stop: StopRule,
    checkpoint_path: str | Path,
    *,
    resume: bool = False,
    after_epoch: Callable[[int, torch.nn.Module, FitState], None] | None = None,
    log: Callable[[str], None] | None = None,
    checkpoint_seconds: float = 300.0,
    deadline: float | None = None,
) -> FitResult:
    """Train `family` under `stop`, checkpointing after every epoch; returns the best model.

    checkpoint_seconds: also checkpoint inside an epoch once this many seconds passed since the last
    checkpoint (and log the epoch's progress), so a cut loses at most that much training. A resume from
    such a checkpoint redraws the epoch's batches from the generator state at the epoch's start and skips
    the ones already trained: the result is the uninterrupted run's.

    deadline: a time.perf_counter() value. Once it has passed, training pauses at the next batch boundary
    (after at least one batch of this call), writes the checkpoint there and returns with paused=True;
    a resume continues it exactly as from any other checkpoint.

    resume: continue from checkpoint_path when it exists (a fresh start otherwise). Without resume an
    existing checkpoint is refused (InputError), so no run is overwritten by accident.
    after_epoch(epoch, model, state): after the epoch's validation, before the checkpoint is written (the
    model in eval mode; e.g. append an evaluation to state.curve). Torch's generator is restored after it,
    so evaluations never change the training. The caller fixes the thread count.
    """
    path = Path(checkpoint_path)
    settings = family.settings
    set_determinism(settings.seed)
    model = family.build()
    opt, sched = _optimiser(model, settings)
    rng = np.random.default_rng(settings.seed)
    state = FitState()
    best_weights = copy.deepcopy(model.state_dict())
    partial: dict[str, Any] | None = None
    if path.exists() and not resume:
        raise InputError(f"{path} exists: pass --resume to continue it, or use another work dir")
    if path.exists():
        blob = load_checkpoint(path, family)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["optimizer"])
        sched.load_state_dict(blob["scheduler"])
        rng.bit_generator.state = blob["numpy_rng"]
        torch.set_rng_state(blob["torch_rng"])
        best_weights = blob["best_model"]
        partial = blob.get("partial")
        s = blob["state"]
        state = FitState(**{**s, "history": [EpochRecord(**h) for h in s["history"]]})
        if log is not None:
            inside = f"; inside epoch {state.epoch + 1} after batch {partial['batches']}" if partial else ""
            log(f"resumed {path}: epoch {state.epoch}, best validation loss {state.best_val:.4f} "
                f"(epoch {state.best_epoch}), {state.bad_epochs} epoch(s) without improvement"
                + inside)  # fmt: skip
    # The rule is the one given now: a run stopped by a smaller budget (or patience) continues under a
    # larger one; its counts (best loss, epochs without improvement) carry over.
    state.stopped, state.stop_reason = _stopped(stop, state)
    last_saved = time.perf_counter()
    trained = 0  # batches trained by this call
    paused = False

    def checkpoint_inside(batches: int) -> float:
        """Checkpoint the epoch in progress after its first `batches` batches; returns its seconds so far."""
        seconds = before + time.perf_counter() - started
        inside = {"batches": batches, "total": total, "count": count, "seconds": seconds}
        write_checkpoint(path, family, model, opt, sched, epoch_rng, best_weights, state, inside)
        return seconds

    while not state.stopped and not paused:
        epoch = state.epoch + 1
        started = time.perf_counter()
        model.train()
        total, count, done, before = 0.0, 0, 0, 0.0
        epoch_rng = copy.deepcopy(rng.bit_generator.state)  # every draw of the epoch happens after this
        if partial is not None:
            total, count, before = partial["total"], partial["count"], partial["seconds"]
            skip, partial = int(partial["batches"]), None
        else:
            skip = 0
        for batch in family.batches(rng):
            done += 1
            if done <= skip:
                continue
            if trained and deadline is not None and time.perf_counter() >= deadline:
                checkpoint_inside(done - 1)
                if log is not None:
                    log(f"{family.name} epoch {epoch}: paused at the deadline after {done - 1} batches "
                        "(checkpointed)")  # fmt: skip
                paused = True
                break
            trained += 1
            loss, n = family.loss(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach()) * n
            count += n
            if time.perf_counter() - last_saved >= checkpoint_seconds:
                seconds = checkpoint_inside(done)
                last_saved = time.perf_counter()
                if log is not None:
                    mean = total / max(count, 1)
                    log(f"{family.name} epoch {epoch}: {done} batches, train loss {mean:.4f} "
                        f"({seconds:.0f} s; checkpointed)")  # fmt: skip
        if paused:
            break
        model.eval()
        val = family.val_loss(model)
        improved = val < state.best_val - stop.min_delta
        if improved:
            state.best_val, state.best_epoch, state.bad_epochs = val, epoch, 0
            best_weights = copy.deepcopy(model.state_dict())
        else:
            state.bad_epochs += 1
        seconds = before + time.perf_counter() - started
        state.train_seconds += seconds
        state.epoch = epoch
        state.history.append(EpochRecord(epoch, total / max(count, 1), val, improved, seconds))
        state.stopped, state.stop_reason = _stopped(stop, state)
        if log is not None:
            log(f"{family.name} epoch {epoch}: train loss {total / max(count, 1):.4f}, validation loss "
                f"{val:.4f}{' (best)' if improved else ''} ({seconds:.0f} s)"
                + (f"; stopping: {state.stop_reason}" if state.stopped else ""))  # fmt: skip
        if after_epoch is not None:
            rng_state = torch.get_rng_state()
            after_epoch(epoch, model, state)
            torch.set_rng_state(rng_state)
        write_checkpoint(path, family, model, opt, sched, rng.bit_generator.state, best_weights, state)
        last_saved = time.perf_counter()
        if not state.stopped and deadline is not None and time.perf_counter() >= deadline:
            paused = True
            if log is not None:
                log(f"{family.name}: paused at the deadline after epoch {epoch} (checkpointed)")
    best = family.build()
    best.load_state_dict(best_weights)
    best.eval()
    model.eval()
    return FitResult(best, state, model, paused)


def _stopped(stop: StopRule, state: FitState) -> tuple[bool, str]:
    """(stop now?, why) after state.epoch epochs under the rule."""
    if stop.patience is not None and state.bad_epochs >= stop.patience:
        return True, f"no improvement for {stop.patience} epochs (best: epoch {state.best_epoch})"
    if state.epoch >= stop.max_epochs:
        return True, f"max epochs ({stop.max_epochs}) reached"
    return False, ""


def write_checkpoint(
    path: Path,
    family: Family,
    model: torch.nn.Module,
    opt: Any,
    sched: Any,
    numpy_rng: dict[str, Any],
    best_weights: dict[str, torch.Tensor],
    state: FitState,
    partial: dict[str, Any] | None = None,
) -> None:
    """The whole loop state to path (atomic). Inside an epoch: numpy_rng is the generator's state at the
    epoch's start and partial {batches, total, count, seconds} says how far the epoch got."""
    s = asdict(state)
    blob = {
        "format": CHECKPOINT_FORMAT,
        "family": family.name,
        "settings": family.settings.to_dict(),
        "fingerprint": family.fingerprint(),
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "scheduler": sched.state_dict(),
        "numpy_rng": numpy_rng,
        "torch_rng": torch.get_rng_state(),
        "best_model": best_weights,
        "state": s,
        "partial": partial,
    }
    save_checkpoint(path, blob)


def update_checkpoint_state(path: str | Path, family: Family, state: FitState) -> None:
    """Rewrite only the loop state of the checkpoint at path (e.g. after the final evaluation)."""
    path = Path(path)
    blob = load_checkpoint(path, family)
    blob["state"] = asdict(state)
    save_checkpoint(path, blob)
