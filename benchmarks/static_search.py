"""The STATIC baseline's decoding: Google STATIC's own torch beam search, ported for the benchmarks.

A port of `sparse_transition_torch` and `generate_and_apply_logprobs_mask` from
youtube/static-constraint-decoding (`static_decoding/decoding_pt.py`, Apache-2.0), operation for operation
on the arrays of benchmarks/static_baseline.py (STATIC's own index layout): score first - the model's logits
over all V tokens, log-softmax over all V - then mask.

    step 0        log-softmax over V, start_mask, top-M per request
    steps < d     "dense specialisation": dense_mask[parent token] masks all V tokens of every beam,
                  top-`tokens_per_beam` per beam, next state from dense_states[parent, token]
    later steps   CSR: every beam reads exactly max_branch_factors[t] consecutive [token, next_state]
                  pairs of packed_csr from its state's row start (clamped at the padding rows), gathers
                  their log-probabilities and masks the reads past the row's end to -inf
    then          beam totals + candidates, top-M per request over beams x candidates, gather histories

The only change is the model: STATIC calls `model(last_tokens)`; here the "model" is the benchmark's own
step function and output layer (hidden = step_fn(step, prefixes, batch), logits = hidden @ W_t.T + b_t, in
the weight's dtype), the same ones every zerogr row of the benchmark uses, so the rows differ only in the
decoding. tokens_per_beam = M (what keeps the dense step exact). Used by scripts/bench_decode.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F


def gather_beams(values: torch.Tensor, beam_indices: torch.Tensor) -> torch.Tensor:
    """values (B, old_M, ...) gathered along dim 1 at beam_indices (B, new_M) -> (B, new_M, ...)."""
    batch_size, new_beams = beam_indices.shape
    view = [batch_size, new_beams] + [1] * (values.dim() - 2)
    expand = [batch_size, new_beams] + list(values.shape[2:])
    return values.gather(1, beam_indices.view(view).expand(expand))


def csr_candidates(
    flat_logprobs: torch.Tensor,
    flat_states: torch.Tensor,
    packed_csr: torch.Tensor,
    csr_indptr: torch.Tensor,
    limit: int,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """STATIC's sparse step: each beam's `limit` candidate (log-prob, token, next state) from the CSR.

    Args:
        flat_logprobs: log-softmax over all V of every beam. Shape: (B * M, V).
        flat_states: each beam's trie state. Shape: (B * M,).
        packed_csr: [token, next_state] pairs grouped by state, V padding rows last. Shape: (E + V, 2).
        csr_indptr: row pointers over states (+ one for the padding rows). Shape: (S + 2,).
        limit: candidates per beam (the level's largest branching factor).
        vocab_size: V.

    Returns:
        (log-probs, -inf past the row's end; tokens; next states), each of shape (B * M, limit).
    """
    states = flat_states.long()
    starts = csr_indptr[states]
    lengths = csr_indptr[states + 1] - starts
    offsets = torch.arange(limit, device=flat_logprobs.device)
    reads = (starts.unsqueeze(1) + offsets.unsqueeze(0)).clamp(max=packed_csr.size(0) - 1)
    pairs = packed_csr[reads]
    tokens, next_states = pairs[..., 0], pairs[..., 1]
    valid = offsets.unsqueeze(0) < lengths.unsqueeze(1)
    logprobs = flat_logprobs.gather(1, tokens.long().clamp(max=vocab_size - 1))
    logprobs = torch.where(valid, logprobs, torch.tensor(float("-inf"), device=flat_logprobs.device))
    return logprobs, tokens, next_states


class StaticTorchSearch:
    """STATIC's `sparse_transition_torch` over a StaticIndex (benchmarks/static_baseline.py), on `device`.

    layers: per-step (weight [V, d], bias [V] | None), the output layers the zerogr rows score with.
    """

    def __init__(self, static_index, layers: Sequence[tuple[torch.Tensor, torch.Tensor | None]], device, d=2):
        self.device = torch.device(device)
        self.layers = list(layers)
        self.d_dense = d
        self.vocab_size = int(static_index.start_mask.shape[0])
        self.max_branch_factors = tuple(int(x) for x in static_index.layer_max_branches)

        def on_device(array: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

        self.packed_csr = on_device(static_index.packed_csr)
        self.csr_indptr = on_device(static_index.indptr)
        self.start_mask = on_device(static_index.start_mask)
        self.dense_mask = on_device(static_index.dense_mask)
        self.dense_states = on_device(static_index.dense_states)

    def _logprobs(self, step_fn: Callable, step: int, prefixes: torch.Tensor, batch: torch.Tensor):
        """The model: log-softmax over all V of hidden @ W_step.T + b_step (score first)."""
        weight, bias = self.layers[step]
        logits = F.linear(step_fn(step, prefixes, batch).to(weight.dtype), weight, bias).float()
        return F.log_softmax(logits, dim=-1)

    @torch.inference_mode()
    def search(self, step_fn: Callable, batch_size: int, beam_size: int, start_token: int = 0):
        """(tokens (B, M, L), scores (B, M)): STATIC's beam search with tokens_per_beam = M."""
        dev, vocab, num_steps = self.device, self.vocab_size, len(self.layers)
        neg_inf = torch.tensor(float("-inf"), device=dev)
        tokens_per_beam = beam_size
        requests = torch.arange(batch_size, device=dev)
        logprobs = self._logprobs(
            step_fn, 0, torch.zeros((batch_size, 0), dtype=torch.long, device=dev), requests
        )
        logprobs = torch.where(self.start_mask, logprobs, neg_inf)
        top_scores, top_tokens = torch.topk(logprobs, beam_size, dim=-1)
        token_buffer = torch.full(
            (batch_size, beam_size, num_steps), start_token, dtype=top_tokens.dtype, device=dev
        )
        token_buffer[:, :, 0] = top_tokens
        states = top_tokens + 1  # level-0 token T is state T + 1
        beam_batch = requests.repeat_interleave(beam_size)
        for step in range(num_steps - 1):
            prefixes = token_buffer[:, :, : step + 1].reshape(batch_size * beam_size, step + 1)
            flat_logprobs = self._logprobs(step_fn, step + 1, prefixes, beam_batch)
            flat_states = states.view(batch_size * beam_size)
            if step < self.d_dense - 1:
                parents = (flat_states - 1).long()
                masked = torch.where(self.dense_mask[parents], flat_logprobs, neg_inf)
                cand_logprobs, cand_tokens = torch.topk(masked, tokens_per_beam, dim=-1)
                cand_states = self.dense_states[parents.unsqueeze(1), cand_tokens.long()]
                limit = tokens_per_beam
            else:
                limit = self.max_branch_factors[step + 1]
                cand_logprobs, cand_tokens, cand_states = csr_candidates(
                    flat_logprobs, flat_states, self.packed_csr, self.csr_indptr, limit, vocab
                )
            totals = top_scores.unsqueeze(2) + cand_logprobs.view(batch_size, beam_size, limit)
            top_scores, flat_top = torch.topk(totals.view(batch_size, beam_size * limit), beam_size, dim=-1)
            top_tokens = gather_beams(cand_tokens.view(batch_size, beam_size * limit), flat_top)
            states = gather_beams(cand_states.view(batch_size, beam_size * limit), flat_top)
            token_buffer = gather_beams(token_buffer, flat_top // limit)
            token_buffer[:, :, step + 1] = top_tokens
        return token_buffer, top_scores
