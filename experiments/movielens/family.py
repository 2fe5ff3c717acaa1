"""What the two transformers families share: the SID token layout, the epoch's windows, the family's data.

- Vocabulary (SidVocab): 0 pad, 1 eos, 2 start (the T5's decoder start, GPT-2's bos), then the SID
  tokens, one block per step: code c of step t is token offsets[t] + c (TIGER's per-level tokens;
  `SidVocab.sid_map()` spells it for the integration).
- An epoch (epoch_examples) cuts every user's training sequence into windows of max_history + 1 items
  from a random offset; the T5 trains each window's last item from the ones before it, the decoder-only
  model every item of it.
- SidFamily holds what quality.fit needs of both families besides the model: the sequences, the item
  tokens, the epoch's shuffled windows in batches, and the fingerprint a checkpoint is bound to.

No torch here: each family's module brings its own.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zerogr_build.integrations.sid_map import SidMap

from .fit import sids_fingerprint

PAD, EOS, DECODER_START = 0, 1, 2
FIRST_SID_TOKEN = 3

Window = tuple[int, int, int]  # (user, start, end): the items sequences[user][start:end]


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


def epoch_examples(
    sequences: Sequence[np.ndarray], max_history: int, rng: np.random.Generator
) -> list[Window]:
    """One epoch's windows (user, start, end): history seq[start:end-1], target seq[end-1].

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


class SidFamily:
    """A model family's data for quality.fit; subclasses add build, batches, loss, val_loss and inputs.

    settings: a frozen dataclass with at least max_history, batch_size, seed, lr, warmup_steps,
    weight_decay and to_dict().
    """

    name = ""

    def __init__(
        self, sequences: Sequence[np.ndarray], sids: np.ndarray, vocab: SidVocab, settings: Any
    ) -> None:
        self.sequences = sequences
        self.sids = np.asarray(sids, dtype=np.int64)
        self.vocab = vocab
        self.settings = settings
        self.item_tokens = vocab.tokens(self.sids)  # int64 [I, L]

    def window_batches(self, rng: np.random.Generator) -> Iterator[list[Window]]:
        """The epoch's windows in a random order, settings.batch_size at a time (the last may be short)."""
        examples = epoch_examples(self.sequences, self.settings.max_history, rng)
        order = rng.permutation(len(examples))
        for lo in range(0, len(order), self.settings.batch_size):
            yield [examples[i] for i in order[lo : lo + self.settings.batch_size]]

    def fingerprint(self) -> str:
        return sids_fingerprint(self.sids)
