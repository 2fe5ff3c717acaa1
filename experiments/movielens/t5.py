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
- Learning rate: linear warm-up, then inverse square-root decay (TIGER's schedule, quality.fit). It does
  not depend on the number of epochs, so the model after epoch e is the model a run of e epochs trains.
- T5Family is what quality.fit trains (the stopping rule, checkpoints, --resume); the validation loss is
  the mean token cross-entropy of every user's validation item after its history.

Built from a T5Config (no download); deterministic for a seed and a thread count (up to BLAS rounding:
after other torch work in the same process, weights can differ in the last bit).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .family import DECODER_START, EOS, PAD, SidFamily, SidVocab


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
    batch_size: int = 128
    lr: float = 3e-3
    warmup_steps: int = 300
    weight_decay: float = 0.01
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


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


class T5Family(SidFamily):
    """The T5 family for quality.fit: one example per window (family.epoch_examples), teacher forcing."""

    name = "t5"

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        sids: np.ndarray,
        vocab: SidVocab,
        settings: T5Settings,
        valid_histories: Sequence[np.ndarray],
        valid_targets: np.ndarray,
    ) -> None:
        super().__init__(sequences, sids, vocab, settings)
        self.valid_histories = list(valid_histories)
        self.valid_targets = np.asarray(valid_targets, dtype=np.int64)

    def build(self):
        return build_t5(self.vocab, self.settings)

    def batches(self, rng: np.random.Generator) -> Iterator[dict[str, torch.Tensor]]:
        for batch in self.window_batches(rng):
            histories = [self.sequences[u][a : b - 1] for u, a, b in batch]
            targets = np.array([self.sequences[u][b - 1] for u, _, b in batch], dtype=np.int64)
            yield self._tensors(histories, targets)

    def _tensors(self, histories: Sequence[np.ndarray], targets: np.ndarray) -> dict[str, torch.Tensor]:
        input_ids, mask = encoder_inputs(histories, self.item_tokens, self.settings.max_history)
        labels = torch.from_numpy(self.item_tokens[np.asarray(targets, dtype=np.int64)])
        return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}

    def loss(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        return model(**batch).loss, int(batch["labels"].shape[0])

    def val_loss(self, model, batch_size: int = 256) -> float:
        """Mean token cross-entropy of every user's validation item after its history."""
        total, count = 0.0, 0
        with torch.no_grad():
            for lo in range(0, len(self.valid_targets), batch_size):
                batch = self._tensors(self.valid_histories[lo : lo + batch_size],
                                      self.valid_targets[lo : lo + batch_size])  # fmt: skip
                n = int(batch["labels"].numel())
                total, count = total + float(model(**batch).loss) * n, count + n
        return total / max(count, 1)

    def inputs(self, histories: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return encoder_inputs(histories, self.item_tokens, self.settings.max_history)
