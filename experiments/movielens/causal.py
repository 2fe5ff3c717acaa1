"""A decoder-only generative recommender: a Hugging Face GPT-2 over SID tokens, trained causally on CPU.

- Vocabulary: the T5's (family.SidVocab): 0 pad, 1 eos, 2 start, then one token per (step, code); token 2
  opens every sequence (GPT-2's bos).
- A user's sequence is [start, the SID tokens of item 0, of item 1, ...] (4 tokens per item for
  4-token SIDs). Training is next-token prediction at every position, so one pass over a window trains
  every item in it (and every token of each item) as a target, conditioned on the items before it.
- An epoch cuts every user's training sequence into windows of max_history + 1 items from a random offset
  (family.epoch_examples, the T5's cut), so it holds every training event once as a target, about 20 times
  the T5's targets per epoch; windows are right-padded, the padding excluded from the loss.
- Serving and evaluation: the prompt is [start, the tokens of the last max_history items], left-padded
  (the HF integration's convention for decoder-only models: positions from the attention mask), so a
  prompt is a training window without its last item; beam search then decodes the next item's tokens.
- Validation loss: the mean cross-entropy (whole vocabulary) of the validation item's tokens after its
  history's prompt - the same measure as the T5's, so the stopping rule is the same.

Built from a GPT2Config (no download); deterministic for a seed and a thread count.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from .family import DECODER_START, PAD, SidFamily, SidVocab

START = DECODER_START
IGNORE = -100  # the label HF's loss skips


@dataclass(frozen=True)
class CausalSettings:
    """Model and training hyper-parameters (fixed up front from a timing probe; not tuned to any metric)."""

    d_model: int = 128
    num_layers: int = 2
    num_heads: int = 4
    d_ff: int = 512
    dropout: float = 0.1
    max_history: int = 20
    batch_size: int = 64
    lr: float = 2e-3
    warmup_steps: int = 300
    weight_decay: float = 0.01
    seed: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def build_causal(vocab: SidVocab, settings: CausalSettings, tokens_per_item: int):
    """A freshly initialised GPT2LMHeadModel over `vocab` (seeded), long enough for a full window."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=vocab.size,
        n_positions=1 + tokens_per_item * (settings.max_history + 1),
        n_embd=settings.d_model,
        n_layer=settings.num_layers,
        n_head=settings.num_heads,
        n_inner=settings.d_ff,
        resid_pdrop=settings.dropout,
        embd_pdrop=settings.dropout,
        attn_pdrop=settings.dropout,
        bos_token_id=START,
        eos_token_id=START,
        pad_token_id=PAD,
    )
    torch.manual_seed(settings.seed)
    return GPT2LMHeadModel(config)


def window_batch(
    windows: Sequence[np.ndarray], item_tokens: np.ndarray, loss_items: int | None = None
) -> dict[str, torch.Tensor]:
    """Training / validation tensors for item windows (indices, oldest first), right-padded.

    Returns input_ids, attention_mask and labels int64 [B, 1 + L * n] (n = the longest window): the start
    token then every item's L tokens. labels = input_ids except padding and the start token (IGNORE);
    loss_items: label only the last loss_items items of each window (validation: 1), else every item.
    """
    per_item = item_tokens.shape[1]
    width = 1 + per_item * max(len(w) for w in windows)
    ids = np.full((len(windows), width), PAD, dtype=np.int64)
    labels = np.full((len(windows), width), IGNORE, dtype=np.int64)
    mask = np.zeros((len(windows), width), dtype=np.int64)
    for i, w in enumerate(windows):
        row = item_tokens[np.asarray(w, dtype=np.int64)].reshape(-1)
        n = 1 + row.size
        ids[i, 0], ids[i, 1:n] = START, row
        mask[i, :n] = 1
        first = 1 if loss_items is None else n - per_item * loss_items
        labels[i, first:n] = row[first - 1 :]
    return {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask),
            "labels": torch.from_numpy(labels)}  # fmt: skip


def prompt_inputs(
    histories: Sequence[np.ndarray], item_tokens: np.ndarray, max_history: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids int64 [B, S], attention_mask int64 [B, S]): [start, tokens of the last max_history
    items], left-padded (S = 1 + L * the longest kept history). An empty history is the start token."""
    rows = [item_tokens[np.asarray(h[-max_history:] if len(h) else [], dtype=np.int64)].reshape(-1)
            for h in histories]  # fmt: skip
    width = 1 + max(r.size for r in rows)
    ids = np.full((len(rows), width), PAD, dtype=np.int64)
    mask = np.zeros((len(rows), width), dtype=np.int64)
    for i, r in enumerate(rows):
        ids[i, width - r.size - 1] = START
        ids[i, width - r.size :] = r
        mask[i, width - r.size - 1 :] = 1
    return torch.from_numpy(ids), torch.from_numpy(mask)


def token_loss(model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
    """(summed cross-entropy over the labelled tokens, their count): next-token loss, whole vocabulary."""
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"][:, 1:]
    logits = logits[:, :-1]
    keep = labels != IGNORE
    loss = torch.nn.functional.cross_entropy(logits[keep].float(), labels[keep], reduction="sum")
    return loss, int(keep.sum())


class CausalFamily(SidFamily):
    """The decoder-only family for quality.fit: GPT-2 over a split's training sequences."""

    name = "decoder"

    def __init__(
        self,
        sequences: Sequence[np.ndarray],
        sids: np.ndarray,
        vocab: SidVocab,
        settings: CausalSettings,
        valid_histories: Sequence[np.ndarray],
        valid_targets: np.ndarray,
    ) -> None:
        super().__init__(sequences, sids, vocab, settings)
        self.valid = [np.concatenate([np.asarray(h[-settings.max_history :], dtype=np.int64), [t]])
                      for h, t in zip(valid_histories, valid_targets, strict=True)]  # fmt: skip

    def build(self):
        return build_causal(self.vocab, self.settings, self.item_tokens.shape[1])

    def batches(self, rng: np.random.Generator) -> Iterator[dict[str, torch.Tensor]]:
        for chosen in self.window_batches(rng):
            yield window_batch([self.sequences[u][a:b] for u, a, b in chosen], self.item_tokens)

    def loss(self, model, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, int]:
        total, n = token_loss(model, batch)
        return total / max(n, 1), n

    def val_loss(self, model, batch_size: int = 256) -> float:
        total, count = 0.0, 0
        with torch.no_grad():
            for lo in range(0, len(self.valid), batch_size):
                batch = window_batch(self.valid[lo : lo + batch_size], self.item_tokens, loss_items=1)
                loss, n = token_loss(model, batch)
                total, count = total + float(loss), count + n
        return total / max(count, 1)

    def inputs(self, histories: Sequence[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        return prompt_inputs(histories, self.item_tokens, self.settings.max_history)
