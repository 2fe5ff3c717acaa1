"""A Model Runner V2 batch without the runner: vLLM's own RequestState, LogitsContext and V2 loader, with the
buffers written the way the runner's Triton kernels write them. Model Runner V2 needs Triton, which has no
CPU backend; this drives the V2 processor through vLLM's real V2 interface objects on any machine (for the
tests and scripts/bench_vllm.py, not for production).

    batch = V2Batch(vllm_config, max_num_reqs=64)     # builds PROCESSOR_V2 with vLLM's V2 loader
    batch.add("r1", params, prompt=[1, 5, 9], output=[])   # a slot from vLLM's free list (recycled)
    masked = batch.apply(["r1", ...], logits)         # rows in any order: LogitsContext maps them to slots
    batch.processor.apply(logits, batch.context([...]))   # the same, with the step's context made once
    batch.append("r1", token); batch.remove("r1")
"""

from __future__ import annotations

import numpy as np
import torch
from vllm.v1.worker.gpu.sample.logits_processor import LogitsContext, build_custom_logits_processors
from vllm.v1.worker.gpu.states import RequestState


def request_state(vllm_config, max_num_reqs: int) -> RequestState:
    """vLLM's RequestState of Model Runner V2 on the host. Without CUDA there is no pinned memory: vLLM's
    CPU worker patches the runner's buffers for that at import, and so does this (in this process)."""
    if not torch.cuda.is_available():
        import vllm.v1.worker.cpu.shm  # noqa: F401

    model = vllm_config.model_config
    return RequestState(
        max_num_reqs=max_num_reqs, max_model_len=model.max_model_len, max_num_batched_tokens=256,
        num_speculative_steps=0, vocab_size=model.get_vocab_size(), device=torch.device("cpu"),
    )  # fmt: skip


class V2Batch:
    """Requests by id in vLLM's RequestState, and the V2 processor built for it by vLLM's loader."""

    def __init__(self, vllm_config, max_num_reqs: int, processor: str | None = None) -> None:
        from . import PROCESSOR_V2

        self.states = request_state(vllm_config, max_num_reqs)
        (self.processor,) = build_custom_logits_processors(
            vllm_config, self.states, False, [processor or PROCESSOR_V2]
        )
        self._prompt_len: dict[str, int] = {}
        self._length: dict[str, int] = {}

    def add(self, rid: str, params, prompt: list[int], output: list[int]) -> None:
        """A request enters the batch (a preempted one comes back with its partial output as prefill)."""
        tokens = list(prompt) + list(output)
        self.states.add_request(rid, len(prompt), tokens, 0, 8)
        for buffer in (self.states.all_token_ids, self.states.total_len, self.states.num_computed_tokens):
            buffer.clear_staged_writes()  # written below, as the runner's staged-write kernel would
        slot = self.states.req_id_to_index[rid]
        self.states.all_token_ids.gpu[slot, : len(tokens)] = torch.tensor(tokens, dtype=torch.int32)
        self._prompt_len[rid], self._length[rid] = len(prompt), len(tokens)
        self.processor.add_request(slot, params)

    def remove(self, rid: str) -> None:
        self.states.remove_request(rid)

    def append(self, rid: str, token: int) -> None:
        """The token sampled for `rid` this step, committed as the runner's post-update kernel does."""
        slot = self.states.req_id_to_index[rid]
        self.states.all_token_ids.gpu[slot, self._length[rid]] = token
        self._length[rid] += 1

    def apply(self, order: list[str], logits: torch.Tensor) -> torch.Tensor:
        """The processor's apply on logits [len(order), vocab], row i being request order[i]."""
        return self.processor.apply(logits, self.context(order))

    def context(self, order: list[str]) -> LogitsContext:
        """The step's LogitsContext for rows `order` (the runner builds it once per step, for every
        processor)."""
        slots = np.asarray([self.states.req_id_to_index[r] for r in order], dtype=np.int32)
        mapping = torch.from_numpy(slots)
        lengths = np.asarray([self._length[r] for r in order], dtype=np.int32)
        ctx = LogitsContext(
            expanded_idx_mapping=mapping, idx_mapping=mapping, idx_mapping_np=slots,
            expanded_local_pos=torch.zeros(len(order), dtype=torch.int32),
            input_ids=torch.zeros(len(order), dtype=torch.int32),
            pos=torch.from_numpy(lengths.astype(np.int64) - 1), seq_lens_upper_bound_np=lengths,
        )  # fmt: skip
        return ctx


__all__ = ["V2Batch", "request_state"]
