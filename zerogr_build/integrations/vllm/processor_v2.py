"""SidLogitsProcessorV2: the same catalog constraint for vLLM's Model Runner V2 (vLLM 0.32's default
wherever Triton runs, i.e. every CUDA install).

    ZEROGR_VLLM_CATALOGS=catalogs.toml
    llm = LLM(model, logits_processors=[PROCESSOR_V2])   # "...integrations.vllm:SidLogitsProcessorV2"

The V2 interface differs from V1's in where things are, not in what the processor does: a request enters a
persistent slot (add_request; slots are recycled, so every field of the slot is set again), and each step's
apply(logits, ctx) gets rows in the step's own order, ctx.idx_mapping_np telling the slot of each row. A
request's generated tokens are read on the device from the runner's token buffer (all_token_ids from
prompt_len on; every row's in one gather, its flat indices made on the host); how many it has is the
host-side seq_lens_upper_bound_np minus prompt_len, exact without speculative decoding. Under speculative
decoding a request owns one row per draft token, whose tokens are not committed yet: this processor
refuses to start there rather than mask them approximately.

The request state and the masking are masking.py's, shared with the V1 processor (processor.py);
admission (validate_params) is admission.py's.
"""

from __future__ import annotations

import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, LogitsProcessor, LogitsProcRequestState

from ...base.errors import InputError
from .admission import admit
from .masking import SidMasking, SidRequest


class SidLogitsProcessorV2(LogitsProcessor):
    """Catalog-constrained generation for requests with extra_args["zerogr"] under Model Runner V2."""

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        """Admission (front end): refuse a bad zerogr request with one line, else pin its version."""
        admit(sampling_params)

    def __init__(self, vllm_config, req_states: LogitsProcRequestState) -> None:
        if getattr(vllm_config, "speculative_config", None) is not None:
            raise InputError(
                "zerogr: SidLogitsProcessorV2 cannot mask draft tokens exactly under speculative decoding; "
                "serve without a speculative config"
            )
        self.req_states = req_states
        self.masking = SidMasking(vllm_config, req_states.device)
        self._slots: list[SidRequest | None] = [None] * req_states.max_num_reqs

    def add_request(self, req_idx: int, sampling_params) -> bool:
        """A request enters slot req_idx (a recycled slot's old request is forgotten); True when it is a
        zerogr request, whose rows this processor masks."""
        self._slots[req_idx] = request = self.masking.request(sampling_params)
        return request is not None

    def apply(self, logits: torch.Tensor, ctx: LogitsContext) -> torch.Tensor:
        """Mask the rows of zerogr requests of logits [num_rows, vocab] (in place); other rows untouched."""
        # Host-side bookkeeping in plain Python: a batch has at most a few hundred rows, and each numpy or
        # torch call costs more than a row of this loop (this is what kept V2's apply near V1's).
        slot_of = ctx.idx_mapping_np.tolist()
        held = self._slots
        rows = [row for row, slot in enumerate(slot_of) if held[slot] is not None]
        if not rows:
            return logits
        if logits.shape[0] != len(slot_of):
            raise RuntimeError(f"zerogr: {logits.shape[0]} logits rows for {len(slot_of)} requests")
        prompt_len, seq_len = self.req_states.prompt_len.np, ctx.seq_lens_upper_bound_np.tolist()
        slots = [slot_of[row] for row in rows]
        first = [int(prompt_len[slot]) for slot in slots]  # the token index of each row's first output
        steps = [seq_len[row] - start for row, start in zip(rows, first, strict=True)]
        tokens = self.req_states.all_token_ids.gpu
        width, last = tokens.shape[1], tokens.numel() - 1

        def prefix(positions: list[int], t: int) -> torch.Tensor:
            at = [[min(slots[i] * width + first[i] + k, last) for k in range(t)] for i in positions]
            # take: flat indices into the buffer, in at's shape (a row's padding past its buffer: never read)
            return tokens.take(torch.tensor(at, dtype=torch.int64, device=tokens.device))

        requests = [held[slot] for slot in slots]
        return self.masking.apply(logits, rows, requests, steps, prefix)  # type: ignore[arg-type]


__all__ = ["SidLogitsProcessorV2"]
