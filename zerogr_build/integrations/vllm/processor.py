"""SidLogitsProcessor: the V1 model runner's logits processor (VLLM_USE_V2_MODEL_RUNNER=0, vLLM's CPU
backend, or any install without Triton) that keeps opted-in requests on catalog SIDs.

    ZEROGR_VLLM_CATALOGS=catalogs.toml   # the registry: which catalogs requests may name (registry.py)
    llm = LLM(model, logits_processors=[PROCESSOR])   # "zerogr_build.integrations.vllm:SidLogitsProcessor"
    params = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"catalog": "movies"}})

vLLM's V1 interface hands the processor batch updates (requests added with their live output token lists,
removed, moved between rows) and then the logits [num_reqs, vocab], one row per request. This class only
keeps the row -> request map; the masking and the request state are masking.py's, shared with the V2
processor (processor_v2.py). Admission (validate_params, in the front end) is admission.py's.
"""

from __future__ import annotations

import torch
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from .admission import admit
from .masking import SidMasking, SidRequest


class SidLogitsProcessor(LogitsProcessor):
    """Catalog-constrained generation for requests with extra_args["zerogr"] (module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Admission (front end): refuse a bad zerogr request with one line, else pin its version."""
        admit(sampling_params)

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.masking = SidMasking(vllm_config, device)
        self._rows: dict[int, tuple[SidRequest, list[int]]] = {}  # batch row -> (request, live output)

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the persistent batch: removed, then added, then moved (the interface's order)."""
        if batch_update is None:
            return
        rows = self._rows
        for index in batch_update.removed:
            rows.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            request = self.masking.request(params)
            if request is None:
                rows.pop(index, None)
            else:
                rows[index] = (request, output)
        for a, b, direction in batch_update.moved:
            first, second = rows.pop(a, None), rows.pop(b, None)
            if direction == MoveDirectionality.SWAP and second is not None:
                rows[a] = second
            if first is not None:
                rows[b] = first

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask every opted-in row of logits [num_reqs, vocab] for its step (in place); others untouched."""
        live = [(index, held) for index, held in self._rows.items() if index < logits.shape[0]]
        if not live:
            return logits
        outputs = [held[1] for _, held in live]
        steps = [len(output) for output in outputs]

        def prefix(positions: list[int], t: int) -> torch.Tensor:
            pad = [0] * t  # rows at an earlier step have fewer than t tokens: padded (never read)
            tokens = [(outputs[i][:t] + pad)[:t] for i in positions]
            return torch.tensor(tokens, dtype=torch.int64).view(len(positions), t)

        rows = [index for index, _ in live]
        return self.masking.apply(logits, rows, [held[0] for _, held in live], steps, prefix)


__all__ = ["SidLogitsProcessor"]
