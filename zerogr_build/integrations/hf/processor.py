"""SidLogitsProcessor: catalog-constrained Hugging Face `generate` (beam search, sampling, greedy).

    proc = SidLogitsProcessor(bundle, sid_map)
    out = model.generate(input_ids, num_beams=M, num_return_sequences=M, max_new_tokens=L,
                         logits_processor=LogitsProcessorList([proc]))

At every call it masks each row of `scores` to the tokens that extend that row's generated SID prefix to a
catalog prefix (after the last step: EOS only, when the SidMap has one). HF hands processors
log_softmax(logits) over the whole vocabulary, so constrained HF beam search is score_first by
construction; `integrations.hf.generate.generate(order="score_first")` reproduces it with the Decoder.

Where the SID starts: a processor sees only input_ids [R, n] (prompt + generated, or decoder start token +
generated). Give `prompt_length` (decoder-only: the padded prompt width; encoder-decoder: 1), or leave it
None and the processor takes the first call of each generation as step 0: a call starts a new generation
unless it continues the previous one (same row count, one token longer, SID not yet complete). A call one
token past the SID's last step (EOS included) with the same prompt is generation going past the SID, and
raises InputError (max_new_tokens too large). Call `reset()` before reusing a processor whose previous
generation stopped early, or before a generation whose prompt is the previous prompt plus its output (which
looks exactly like going past the SID); `prompt_length` avoids the inference altogether.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import LogitsProcessor

from ...base.errors import InputError
from ..sid_map import SidMap, catalog_token_table
from ..vocab_masks import TABLE_BYTES, VocabMasks


class SidLogitsProcessor(LogitsProcessor):
    """Masks a model's scores to catalog SIDs, all beams at once, on the scores' device.

    bundle: a Bundle or SidIndex. sid_map: how codes are spelled as tokens (SidMap).
    prompt_length: tokens before the SID in input_ids (see the module docstring), or None to infer.
    table_bytes: sparse steps up to this many rows * V_t get a bool row table on the device (one row
        copy per beam); larger ones read each beam's children into slots (see vocab_masks.py).
    """

    def __init__(
        self, bundle, sid_map: SidMap, prompt_length: int | None = None, *, table_bytes: int = TABLE_BYTES
    ) -> None:
        self.index = bundle.index if hasattr(bundle, "index") else bundle
        self.sid_map = sid_map
        self.token_table = catalog_token_table(sid_map, self.index)
        if prompt_length is not None and (isinstance(prompt_length, bool) or int(prompt_length) < 0):
            raise InputError(f"prompt_length must be a non-negative integer, got {prompt_length!r}")
        self.prompt_length = None if prompt_length is None else int(prompt_length)
        self.num_steps = len(self.token_table)
        self.eos_token_id = sid_map.eos_token_id
        self.table_bytes = int(table_bytes)
        self._masks: VocabMasks | None = None
        self._start: int | None = None
        self._last: tuple[int, int] | None = None
        self._prompt: torch.Tensor | None = None  # input_ids at step 0 of the current generation

    def reset(self) -> None:
        """Forget the inferred start of the current generation (the next call is step 0)."""
        self._start = self._last = self._prompt = None

    def _same_prompt(self, input_ids: torch.Tensor) -> bool:
        """input_ids [R, n] starts with the current generation's prompt (beam search reorders rows only
        among the beams of one prompt, which share it)."""
        prompt = self._prompt
        return (
            prompt is not None
            and prompt.device == input_ids.device
            and torch.equal(input_ids[:, : prompt.shape[1]], prompt)
        )

    def masks_for(self, vocab_size: int, device) -> VocabMasks:
        """The device tables for this vocabulary width and device (built once, rebuilt on a change)."""
        masks = self._masks
        if masks is None or masks.vocab_size != vocab_size or masks.device != torch.device(device):
            if self.eos_token_id is not None and self.eos_token_id >= vocab_size:
                raise InputError(f"eos_token_id {self.eos_token_id} is outside the vocabulary ({vocab_size})")
            masks = VocabMasks(self.index, self.token_table, vocab_size, device, self.table_bytes)
            self._masks = masks
        return masks

    def generated_length(self, input_ids: torch.Tensor) -> int:
        """How many SID tokens input_ids [R, n] already holds (the step this call masks)."""
        n, r = int(input_ids.shape[1]), int(input_ids.shape[0])
        if self.prompt_length is not None:
            start = self.prompt_length
        else:
            last_step = self.num_steps if self.eos_token_id is not None else self.num_steps - 1
            follows = self._last == (n - 1, r) and self._start is not None
            if follows and self._last[0] - self._start < last_step:
                pass  # the next step of this generation
            elif follows and self._same_prompt(input_ids):
                pass  # one token past the SID's last step: __call__ raises
            else:  # a new generation: this call is its step 0
                self._start = n
                self._prompt = input_ids.detach().clone()
            self._last = (n, r)
            start = self._start
        if n < start:
            raise InputError(f"input_ids has {n} tokens, fewer than prompt_length {start}")
        return n - start

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """scores [R, vocab] -> scores with every token that leaves the catalog set to -inf."""
        step = self.generated_length(input_ids)
        masks = self.masks_for(int(scores.shape[1]), scores.device)
        rows = masks.rows(input_ids[:, input_ids.shape[1] - step :])
        if step < self.num_steps:
            return masks.apply(scores, rows, step)
        if step == self.num_steps and self.eos_token_id is not None:
            return masks.apply_eos(scores, rows, self.eos_token_id)
        raise InputError(
            f"generation went past the SID ({self.num_steps} tokens"
            + (" + EOS" if self.eos_token_id is not None else "")
            + "): set max_new_tokens to "
            + str(self.num_steps + (self.eos_token_id is not None))
        )

    def sids(self, sequences: torch.Tensor) -> np.ndarray:
        """int64 [n, L] codes of the SID at the end of generated sequences [n, >= L] (-1 = not a code).

        With an EOS in the SidMap the sequence's last token is that EOS and the SID ends just before it.
        """
        seq = sequences.detach().cpu().numpy()
        end = seq.shape[1] - (1 if self.eos_token_id is not None else 0)
        return self.sid_map.to_codes(seq[:, end - self.num_steps : end], self.index.codebook_sizes)


__all__ = ["SidLogitsProcessor"]
