"""A TIGER-style generative recommender as a Hugging Face `T5ForConditionalGeneration`, trained on CPU.

- Vocabulary: 0 pad, 1 eos, 2 decoder start, then the SID tokens, one block per step: code c of step t is
  token offsets[t] + c (TIGER's per-level tokens; `SidVocab.sid_map()` spells it for the integration).
- Encoder input: the SID tokens of the last `max_history` items of the history, oldest first, flattened
  (item i is tokens 4i..4i+3 for 4-token SIDs), right-padded. Decoder target: the next item's L tokens
  (no EOS: beam search decodes exactly L tokens).
- Trained with teacher forcing and cross-entropy over the whole vocabulary (the model is never told which
  codes exist, as in TIGER). An epoch cuts every user's training sequence into windows of max_history + 1
  items, starting at a random offset per user and epoch, and trains one example per window: its last item
  from the ones before it. So an epoch holds about events / (max_history + 1) examples, every user in
  proportion to its events, and different epochs see different targets.
- Learning rate: linear warm-up, then inverse square-root decay (TIGER's schedule). It does not depend
  on the number of epochs, so the model after epoch e is the model `--epochs e` trains.

Built from a T5Config (no download); deterministic for a seed and a thread count (up to BLAS rounding:
after other torch work in the same process, weights can differ in the last bit).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from ..integrations.sid_map import SidMap
from .model import set_determinism

PAD, EOS, DECODER_START = 0, 1, 2
FIRST_SID_TOKEN = 3


@dataclass(frozen=True)
class T5Settings:
    """Model and training hyper-parameters (fixed up front; not tuned toward any metric)."""

    d_model: int = 64
    d_kv: int = 16
    d_ff: int = 256
    num_layers: int = 2
    num_decoder_layers: int = 2
    num_heads: int = 4
    dropout: float = 0.1
    max_history: int = 20
    epochs: int = 10
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 300
    weight_decay: float = 0.01
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class SidVocab:
    """Token layout: offsets[t] = first token of step t's codes; size = the whole vocabulary."""

    codebook_sizes: tuple[int, ...]

    @property
    def offsets(self) -> tuple[int, ...]:
        starts = FIRST_SID_TOKEN + np.concatenate([[0], np.cumsum(self.codebook_sizes)[:-1]])
        return tuple(int(o) for o in starts)

    @property
    def size(self) -> int:
        return FIRST_SID_TOKEN + int(sum(self.codebook_sizes))

    def sid_map(self) -> SidMap:
        return SidMap.from_offsets(self.offsets)

    def tokens(self, sids: np.ndarray) -> np.ndarray:
        """int64 [..., L] SID codes -> their tokens int64 [..., L]."""
        return np.asarray(sids, dtype=np.int64) + np.asarray(self.offsets, dtype=np.int64)


def build_t5(vocab: SidVocab, settings: T5Settings):
    """A freshly initialised T5ForConditionalGeneration over `vocab` (seeded by settings.seed)."""
    from transformers import T5Config, T5ForConditionalGeneration

    config = T5Config(
        vocab_size=vocab.size,
        d_model=settings.d_model,
        d_kv=settings.d_kv,
        d_ff=settings.d_ff,
        num_layers=settings.num_layers,
        num_decoder_layers=settings.num_decoder_layers,
        num_heads=settings.num_heads,
        dropout_rate=settings.dropout,
        feed_forward_proj="relu",
        pad_token_id=PAD,
        eos_token_id=EOS,
        decoder_start_token_id=DECODER_START,
    )
    torch.manual_seed(settings.seed)
    return T5ForConditionalGeneration(config)


def encoder_inputs(
    histories: Sequence[np.ndarray], item_tokens: np.ndarray, max_history: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids int64 [B, S], attention_mask int64 [B, S]) for item histories (indices, oldest first).

    item_tokens int64 [I, L]: the tokens of every item's SID. S = L * the longest history kept (the last
    max_history items); an empty history becomes one EOS token so every row attends to something.
    """
    per_item = item_tokens.shape[1]
    rows = [item_tokens[np.asarray(h[-max_history:] if len(h) else [], dtype=np.int64)].reshape(-1)
            for h in histories]  # fmt: skip
    rows = [r if r.size else np.array([EOS], dtype=np.int64) for r in rows]
    width = max(per_item, max(r.size for r in rows))
    ids = np.full((len(rows), width), PAD, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, : r.size] = r
        mask[i, : r.size] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def epoch_examples(
    sequences: Sequence[np.ndarray], max_history: int, rng: np.random.Generator
) -> list[tuple[int, int, int]]:
    """One epoch's examples (user, start, end): history seq[start:end-1], target seq[end-1].

    Each sequence is cut into windows of max_history + 1 items from a random offset in
    0..max_history (so the first window may be shorter); windows with no history item are skipped.
    """
    out = []
    span = max_history + 1
    for u, seq in enumerate(sequences):
        n = len(seq)
        offset = int(rng.integers(0, span))
        ends = ([n] if offset else []) + list(range(n - offset, 0, -span))
        for end in ends:
            start = max(0, end - span)
            if end - start >= 2:
                out.append((u, start, end))
    return out


def inverse_sqrt_lr(step: int, settings: T5Settings) -> float:
    """Learning-rate factor at optimiser step `step` (1-based): linear warm-up, then sqrt(warmup / step)."""
    w = max(1, settings.warmup_steps)
    return min(step / w, (w / max(step, 1)) ** 0.5)


def train_t5(
    sequences: Sequence[np.ndarray],
    sids: np.ndarray,
    vocab: SidVocab,
    settings: T5Settings,
    *,
    log: Callable[[str], None] | None = None,
    after_epoch: Callable[[int, object], None] | None = None,
):
    """Train a T5 on the users' item sequences (indices into sids int [I, L]); returns it in eval mode.

    after_epoch(epoch, model) runs after every epoch with the model in eval mode (checkpoints), then
    training resumes with torch's generator restored, so checkpoints do not change the training.
    Seeds torch (settings.seed); the caller fixes the thread count (set_determinism).
    """
    set_determinism(settings.seed)
    model = build_t5(vocab, settings)
    item_tokens = vocab.tokens(sids)
    item_tokens_t = torch.from_numpy(item_tokens)
    rng = np.random.default_rng(settings.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: inverse_sqrt_lr(s + 1, settings))
    for epoch in range(1, settings.epochs + 1):
        model.train()
        started, total, count = time.perf_counter(), 0.0, 0
        examples = epoch_examples(sequences, settings.max_history, rng)
        order = rng.permutation(len(examples))
        for lo in range(0, len(order), settings.batch_size):
            batch = [examples[i] for i in order[lo : lo + settings.batch_size]]
            histories = [sequences[u][s : e - 1] for u, s, e in batch]
            targets = np.array([sequences[u][e - 1] for u, _, e in batch], dtype=np.int64)
            input_ids, mask = encoder_inputs(histories, item_tokens, settings.max_history)
            labels = item_tokens_t[torch.from_numpy(targets)]
            loss = model(input_ids=input_ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            total += float(loss.detach()) * len(batch)
            count += len(batch)
        model.eval()
        if log is not None:
            log(
                f"epoch {epoch}/{settings.epochs}: loss {total / max(count, 1):.4f} over {count} examples "
                f"({time.perf_counter() - started:.1f} s)"
            )
        if after_epoch is not None:
            state = torch.get_rng_state()
            after_epoch(epoch, model)
            torch.set_rng_state(state)
    model.eval()
    return model
