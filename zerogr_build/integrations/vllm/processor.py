"""SidLogitsProcessor: a vLLM V1 batch-level logits processor that keeps opted-in requests on catalog SIDs.

    llm = LLM(model, logits_processors=[SidLogitsProcessor])
    params = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": {"bundle": "bundles/",
                                                                      "sid_map": "sid_map.json"}})

A request opts in with extra_args["zerogr"] (spec.py); every other row of the batch is left untouched. The
SID is the request's first L generated tokens: at step t < L a row keeps only the tokens that extend its
prefix to a catalog prefix (and, with include / exclude / available, to a prefix holding an allowed item);
from step L on only EOS is left (the SID map's eos_token_id, else the model's). Rows at different steps share
a batch (continuous batching): they are grouped by (version, SID map, item filter, step) and each group is
masked with a few tensor ops (VocabMasks, or the Decoder's slot filters for constrained requests), with no
Python loop over the vocabulary.

Bad arguments: `validate_params` runs in the front end when a request is admitted and refuses it with one
line (vLLM raises it from LLM.generate / returns HTTP 400 from the server; the engine is untouched). A
request that passed admission but fails in the engine (its bundle deleted in between) is logged and ends
with EOS at once; an engine hook has no way to fail a single request.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch
from vllm import SamplingParams
from vllm.exceptions import VLLMValidationError
from vllm.logger import init_logger
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality

from ...base.errors import ZerogrError, one_line
from ...runtime.items.filter import dense_next, mask_children, mask_slots, slot_source
from ...runtime.slots import fill_slots, row_extent
from .catalogs import RequestPlan, prepare
from .spec import spec_of

logger = init_logger("vllm.zerogr")
PIN_KEY = "_zerogr_pinned_version"  # engine-side: the version dir a request was resolved to
NEG_INF = float("-inf")


@dataclass(eq=False)
class _Slot:
    """One opted-in request of the persistent batch: its plan (None: failed in the engine) and a live
    reference to its output token list."""

    plan: RequestPlan | None
    output: list[int]


class SidLogitsProcessor(LogitsProcessor):
    """Catalog-constrained generation for requests with extra_args["zerogr"] (module docstring)."""

    @classmethod
    def validate_params(cls, sampling_params: SamplingParams) -> None:
        """Admission check (front end): the request's zerogr arguments, every file they name opened and
        checked. Raises VLLMValidationError with one line; requests without zerogr pass untouched."""
        extra = sampling_params.extra_args
        if extra and PIN_KEY in extra:
            what = f"zerogr: extra_args key {PIN_KEY!r} is reserved"
            raise VLLMValidationError(what, parameter="extra_args")
        try:
            spec = spec_of(extra)
            if spec is not None:
                prepare(spec, torch.device("cpu"))
        except (ZerogrError, OSError) as exc:
            raise VLLMValidationError(f"zerogr: {one_line(exc)}", parameter="extra_args") from None

    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool) -> None:
        self.device = torch.device(device)
        self.model_eos = _model_eos(vllm_config)
        self._slots: dict[int, _Slot] = {}
        self._constraints: OrderedDict[tuple, object] = OrderedDict()  # group -> RequestConstraints

    def is_argmax_invariant(self) -> bool:
        return False

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        """Follow the persistent batch: removed, then added, then moved (the interface's order)."""
        if batch_update is None:
            return
        slots = self._slots
        for index in batch_update.removed:
            slots.pop(index, None)
        for index, params, _prompt, output in batch_update.added:
            slot = self._slot(params, output)
            if slot is None:
                slots.pop(index, None)
            else:
                slots[index] = slot
        for a, b, direction in batch_update.moved:
            first, second = slots.pop(a, None), slots.pop(b, None)
            if direction == MoveDirectionality.SWAP and second is not None:
                slots[a] = second
            if first is not None:
                slots[b] = first

    def _slot(self, params: SamplingParams, output: list[int]) -> _Slot | None:
        """The slot of a newly added request (None: it does not use zerogr). The version is resolved once
        and written into the engine's own copy of the params, so a preempted and re-added request keeps it."""
        try:
            spec = spec_of(params.extra_args)
            if spec is None:
                return None
            pinned = params.extra_args.get(PIN_KEY)
            plan = prepare(spec, self.device, Path(pinned) if pinned else None)
            if not pinned:
                params.extra_args = {**params.extra_args, PIN_KEY: str(plan.catalog.path)}
            return _Slot(plan, output)
        except (ZerogrError, OSError) as exc:
            logger.error("zerogr: request failed in the engine, ending it with EOS: %s", one_line(exc))
            return _Slot(None, output)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Mask every opted-in row of logits [num_reqs, vocab] for its step (in place); others untouched."""
        if not self._slots:
            return logits
        groups: dict[tuple, list[int]] = {}
        failed: list[int] = []
        for index, slot in self._slots.items():
            if index >= logits.shape[0]:
                continue
            if slot.plan is None:
                failed.append(index)
                continue
            plan = slot.plan
            t = min(len(slot.output), plan.catalog.index.num_steps)
            key = (plan.catalog, plan.sid_key, plan.resident, t)
            groups.setdefault(key, []).append(index)
        for (*_, t), indices in groups.items():
            rows_at = torch.as_tensor(indices, device=logits.device)
            masked = self._mask_group(logits.index_select(0, rows_at), indices, t)
            logits.index_copy_(0, rows_at, masked)
        if failed and self.model_eos is not None:
            rows_at = torch.as_tensor(failed, device=logits.device)
            only_eos = torch.full_like(logits.index_select(0, rows_at), NEG_INF)
            only_eos[:, self.model_eos] = logits.index_select(0, rows_at)[:, self.model_eos]
            logits.index_copy_(0, rows_at, only_eos)
        return logits

    def _mask_group(self, scores: torch.Tensor, indices: list[int], t: int) -> torch.Tensor:
        """scores [n, vocab] of requests `indices`, all on one plan key, at SID step t (t = L: past it)."""
        slots = [self._slots[i] for i in indices]
        plan = slots[0].plan
        assert plan is not None
        catalog = plan.catalog
        masks = catalog.masks(plan.sid_map, plan.sid_key, scores.shape[1], self.device)
        generated = torch.tensor([s.output[:t] for s in slots], dtype=torch.int64).view(len(slots), t)
        rows = masks.rows(generated)
        if t == catalog.index.num_steps:
            eos = plan.sid_map.eos_token_id if plan.sid_map.eos_token_id is not None else self.model_eos
            return scores if eos is None else masks.apply_eos(scores, rows, eos)
        if plan.resident is None:
            return masks.apply(scores, rows, t)
        # The group's compiled include / exclude lists, reused while its requests stay together (the cache
        # holds the slots themselves, so an id in the key cannot be reused by another slot while cached).
        key = tuple(id(s) for s in slots)
        cached = self._constraints.get(key)
        if cached is None:
            constraints = plan.constraints([s.plan for s in slots])
            self._constraints[key] = (slots, constraints)
            while len(self._constraints) > 64:
                self._constraints.popitem(last=False)
        else:
            constraints = cached[1]
            self._constraints.move_to_end(key)
        return _constrained(scores, rows, t, catalog.steps(self.device), constraints, masks.steps[t].token_of)


def _constrained(scores, rows, t, steps, constraints, token_of) -> torch.Tensor:
    """scores [n, vocab] kept at the tokens of the codes that continue each row of step t to a row holding an
    item its request may return (Decoder semantics: filter.py), -inf elsewhere. rows int64 [n] (the step's
    row count = a prefix outside the catalog)."""
    table = steps[t]
    n = rows.shape[0]
    request = torch.arange(n, device=rows.device)
    rows = torch.where(rows < table.rows, rows, -1)
    if table.format == "sparse":
        start, count = row_extent(table, rows)
        codes = fill_slots(slot_source(constraints, table), start, count, table.max_slots)
        codes = mask_slots(constraints, table, codes, start, count, request).long()
        valid = codes >= 0
    else:
        child = dense_next(constraints, table)[rows.clamp(min=0)]
        valid = (child >= 0) & (rows >= 0)[:, None]
        valid = mask_children(constraints, t, valid, child, rows, request)
        codes = torch.arange(table.codebook_size, device=rows.device).expand(n, -1)
    cols = token_of.take(codes.clamp(min=0))
    valid = valid & (cols >= 0)
    hits = torch.zeros(scores.shape, dtype=torch.int32, device=scores.device)
    hits.scatter_add_(1, cols.clamp(min=0), valid.to(torch.int32))
    return scores.masked_fill(hits == 0, NEG_INF)


def _model_eos(vllm_config) -> int | None:
    """The model's EOS token id (the first, when its config lists several), or None."""
    config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else None


__all__ = ["PIN_KEY", "SidLogitsProcessor"]
