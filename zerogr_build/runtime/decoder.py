"""Filter-first constrained beam search over a SidIndex: the Decoder, its BeamState and SearchResult.

    dec = Decoder(index_or_bundle, weights, device="cpu", order="filter_first", plan=None)
    dec = Decoder(bundle, weights, order="auto")  # the quality gate's recorded order (runtime/order.py)
    state = dec.start(batch_size, beam_width)     # R = B beams (one empty prefix per request)
    state = dec.step(state, hidden, mode=None)    # hidden [R, d] -> a NEW state with R = B * M beams
    res = dec.finish(state)                       # sids [B, M, L], scores [B, M], leaves [B, M]
    res = dec.search(step_fn, batch_size, beam_width, mode=None)   # step_fn(step, prefixes, batch) -> hidden
    dec.items(res)                                # item ids per (request, beam)
    dec.set_availability(ItemMask); dec.set_item_sets(ItemSets)   # item constraints (items/constraints.py)
    dec.search(..., include=[["comedy"], None], exclude=[[seen ids], []])   # per request (also on start)

One step, four stages, all on the decoder's device (see slots.py for slots, the slot cap and overflow lanes):
  1. valid tokens: each beam's row -> its fixed candidate slots (sparse: the row's children from the front,
     capped at K, heavy rows in overflow lanes; dense: slot k = token k, valid where next[row, k] >= 0).
  2. scores: the step's mode - "full" (one GEMM over V_t, slots read out of it), "selective" (torch, only
     the slots' tokens), "selective_cuda" (same contract, CUDA kernel). Dense steps always use the GEMM,
     since their slots are all V_t tokens.
  3. normalise + accumulate: filter_first log-softmaxes over the valid slots only; score_first over all
     V_t (from the GEMM's logsumexp), then masks; unconstrained over all V_t, no mask. Add to beam totals.
  4. select: top-M per request over all of its beams' slots (and lanes), best first; next rows come from
     the index (sparse: the child's flat position; dense: next[row, token]; a leaf at the last step).
On the CPU, a filter-first sparse step in "selective_numba" runs 2-4 in one kernel pass per request
(selected_step.py): the same candidates and totals, without the slot rows.

Padding: a request with fewer than M valid continuations gets padded beams - score -inf, row/leaf -1,
prefix token 0 (so a step_fn can still embed it), sids -1 in the result. -inf never beats a finite
candidate in top-k, and no operation subtracts -inf from -inf, so no NaN appears. A real candidate whose
score underflows to -inf would be treated as padding.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import torch

from ..base.errors import InputError
from ..base.selective_torch import masked_log_softmax_
from ..cuda.bundle_kernels import load_bundle_kernels
from ..index import SidIndex
from .beams import BeamState, SearchResult
from .device_tables import DeviceStep, index_to_device, walk_step_tables
from .items.filter import ConstrainedDecoding, dense_emptier, mask_slots, slot_source
from .lanes import plan_lanes
from .order import auto_order
from .plan import ModeChooser, load_plan, resolve_auto_plan
from .scoring import available_modes, get_mode
from .scoring.full_torch import full_logits, read_slots
from .selected_step import selected_sparse_step
from .slots import fill_slots, row_extent
from .stream import load_marker
from .weights import normalize_weights

ORDERS = ("filter_first", "score_first", "unconstrained")
NEG_INF = float("-inf")

ModeArg = str | Sequence[str | None] | Mapping[int, str] | None


class Decoder(ConstrainedDecoding):
    """Constrained beam search over one index and one set of per-step output layers.

    index_or_bundle: a SidIndex, or a Bundle (anything with `.index`; its `.items()` gives item ids).
    weights: L entries, step t's output layer [V_t, d] (tensor / array), a (weight, bias) pair, a
        {"weight", "bias"} dict or an nn.Linear; fp32, fp16 or bf16.
    device: "cpu", "cuda:0", ...; every step table is copied there once, here.
    order: default order of searches ("filter_first", "score_first", "unconstrained"), or "auto": the
        decision the quality gate recorded in the bundle for `model_version` (order.auto_order; the record
        found is `self.quality`). With no record (or an index without a bundle) "auto" means
        filter_first; a broken record is ignored with one warning.
    model_version: the tag whose quality record order="auto" follows (default: the bundle's own
        model_version, as `zerogr build --model-version` wrote it). Ignored for other orders.
    plan: None (heuristic), a Plan / plan dict / list of entries / plan file (plan.load_plan), or "auto":
        the bundle's plan for this device (plan.find_plan), else one warning naming what did not match
        (device type, model, architecture, CPU threads) and the heuristic; `plan_fallback` keeps that line.
    slot_caps: slot cap K of sparse steps: None (p99-based default, see slots.py), an int, a per-step
        sequence or {step: K}.
    low_priority: on CUDA, stream the tables on low-priority copy streams (loading a new version beside
        a live one, see serving/hotswap.py). With plan="auto" on CUDA the bundle's compiled kernels for this
        architecture (written by tune) are loaded instead of compiling with NVRTC.
    static_shapes: give every beam its own max_slots-wide overflow lane at sparse steps whose largest row
        exceeds the cap, instead of sizing lanes from the heavy beams present. Every tensor shape then
        depends only on (step, batch, beam width) and no step reads anything back to the host, so a step
        can be captured in a CUDA graph. The lanes of light beams are empty slots, which the CUDA kernel
        skips (-inf, no weight read); on CPU the default (dynamic lanes) is faster.
    """

    def __init__(
        self,
        index_or_bundle: Any,
        weights: Sequence[Any],
        device: str | torch.device = "cpu",
        order: str = "filter_first",
        plan: Any = None,
        *,
        slot_caps: int | Sequence[int | None] | Mapping[int, int] | None = None,
        low_priority: bool = False,
        static_shapes: bool = False,
        model_version: str | None = None,
    ) -> None:
        if isinstance(index_or_bundle, SidIndex):
            self.bundle = None
            self.index: SidIndex = index_or_bundle
        elif hasattr(index_or_bundle, "index"):
            self.bundle = index_or_bundle
            self.index = index_or_bundle.index
        else:
            raise InputError(f"Decoder needs a SidIndex or a Bundle, got {type(index_or_bundle).__name__}")
        if model_version is not None and not (isinstance(model_version, str) and model_version):
            raise InputError(f"model_version must be a non-empty string, got {model_version!r}")
        self.quality = None  # the quality record order="auto" followed
        if order == "auto":
            order, self.quality = auto_order(self.bundle, model_version)
        if order not in ORDERS:
            raise InputError(f"unknown order {order!r} ({', '.join(ORDERS)}, auto)")
        self.device = torch.device(device)
        self.order = order
        self.static_shapes = bool(static_shapes)
        self.codebook_sizes = tuple(int(v) for v in self.index.codebook_sizes)
        self.num_steps = len(self.codebook_sizes)
        self.weights = normalize_weights(weights, self.codebook_sizes, self.device)
        self.dtype = self.weights[0][0].dtype
        self.steps: tuple[DeviceStep, ...] = index_to_device(
            self.index, self.device, slot_caps, low_priority=low_priority
        )
        # The end of the load's device work (widening kernels included): HotSwap waits on it before a
        # version can be swapped in, so no serving stream reads a table before it is written.
        self.loaded = load_marker(self.device, low_priority=low_priority)
        self.kernels = None  # the bundle's compiled selective_cuda kernels (plan="auto" on CUDA)
        auto = isinstance(plan, str) and plan == "auto"
        if auto and self.bundle is not None:  # first, so the modes below count only kernels that run
            self.kernels = load_bundle_kernels(self.bundle, self.device)
        self.available_modes = available_modes(self.device)
        # Why plan="auto" found no plan to follow, and what the decoder does instead (None: it follows one).
        self.plan_fallback: str | None = None
        if auto:
            self.plan, self.plan_fallback = resolve_auto_plan(self.bundle, self.device)
        else:
            self.plan = None if plan is None else load_plan(plan)
        self._modes = ModeChooser(self.plan, self.available_modes, self.device.type)

    @property
    def slot_caps(self) -> tuple[int, ...]:
        """Slot cap K of every step (V_t at dense steps)."""
        return tuple(s.cap for s in self.steps)

    # ------------------------------------------------------------------ mode choice
    def mode_for(self, step: int, batch_size: int, mode: ModeArg = None, order: str | None = None) -> str:
        """The scoring mode step `step` runs with: explicit `mode` > plan (nearest batch) > heuristic."""
        order = order or self.order
        requested = mode
        if isinstance(mode, Mapping):
            requested = mode.get(step)
        elif mode is not None and not isinstance(mode, str):
            modes = list(mode)
            if len(modes) != self.num_steps:
                raise InputError(f"mode: {len(modes)} entries for SIDs of length {self.num_steps}")
            requested = modes[step]
        if requested is not None:
            get_mode(requested, self.device)  # raises for unknown / unavailable
            return requested
        table = self.steps[step]
        return self._modes.choose(
            step, batch_size, self.weights[step][0].dtype,
            step_format=table.format, cap=table.cap, codebook_size=table.codebook_size, order=order,
            mean_children=table.nnz / max(table.rows, 1),
        )  # fmt: skip

    # ------------------------------------------------------------------ search
    def start(self, batch_size: int, beam_width: int, order: str | None = None, *, include: Any = None,
              exclude: Any = None) -> BeamState:  # fmt: skip
        """Initial state: one empty-prefix beam per request (R = batch_size), at row 0 of step 0.

        include / exclude: one entry per request (None or [] = no restriction): names of item sets (their
        union) / item ids never to return. They, and the availability mask at this moment, hold for the
        whole search (filter_first and score_first; the unconstrained order ignores them)."""
        order = order or self.order
        if order not in ORDERS:
            raise InputError(f"unknown order {order!r} ({', '.join(ORDERS)})")
        if batch_size < 1 or beam_width < 1:
            raise InputError(f"batch_size and beam_width must be >= 1, got {batch_size}, {beam_width}")
        dev = self.device
        constraints = self._request_constraints(batch_size, order, include, exclude)
        return BeamState(
            step=0,
            prefixes=torch.zeros((batch_size, 0), dtype=torch.int64, device=dev),
            batch=torch.arange(batch_size, device=dev),
            scores=torch.zeros(batch_size, dtype=torch.float32, device=dev),
            rows=torch.zeros(batch_size, dtype=torch.int64, device=dev),
            batch_size=batch_size,
            beam_width=beam_width,
            order=order,
            constraints=constraints,
        )

    def step(
        self,
        state: BeamState,
        hidden: torch.Tensor,
        mode: ModeArg = None,
        *,
        log_normalizer: torch.Tensor | None = None,
    ) -> BeamState:
        """Advance every beam by one token. hidden [R, d] (any float dtype; cast to the weights').

        log_normalizer fp32 [R] (optional): under score_first / unconstrained, each beam's log softmax
        denominator, used instead of the logsumexp over the step's V_t logits - for step layers that are
        a subset of a larger output vocabulary (a language model's, see integrations/hf). Ignored under
        filter_first. Returns a new BeamState with R = B * M beams; `state` is not modified.
        """
        t = state.step
        if t >= self.num_steps:
            raise InputError(f"state is already at step {t} of {self.num_steps}; call finish()")
        weight, bias = self.weights[t]
        hidden = torch.as_tensor(hidden)
        if hidden.ndim != 2 or hidden.shape[0] != state.num_beams or hidden.shape[1] != weight.shape[1]:
            raise InputError(
                f"step {t}: hidden must be [{state.num_beams}, {weight.shape[1]}], got {tuple(hidden.shape)}"
            )
        hidden = hidden.to(device=self.device, dtype=weight.dtype)
        if log_normalizer is not None:
            log_normalizer = torch.as_tensor(log_normalizer).to(device=self.device, dtype=torch.float32)
            if log_normalizer.shape != (state.num_beams,):
                raise InputError(f"step {t}: log_normalizer must be [{state.num_beams}]")
        table = self.steps[t]
        scoring = get_mode(self.mode_for(t, state.batch_size, mode, state.order), self.device)
        with torch.no_grad():
            if state.order == "unconstrained" or table.format == "dense":
                return self._step_dense(state, hidden, table, log_normalizer)
            return self._step_sparse(state, hidden, table, scoring, log_normalizer)

    def finish(self, state: BeamState) -> SearchResult:
        """The final beams of a state that has taken all L steps."""
        if state.step != self.num_steps:
            raise InputError(f"finish() needs a state after {self.num_steps} steps, got step {state.step}")
        b = state.batch_size
        per = state.num_beams // b
        real = torch.isfinite(state.scores)
        if state.order == "unconstrained":
            leaves = self.lookup_leaves(state.prefixes)
            sids = torch.where(real[:, None], state.prefixes, torch.full_like(state.prefixes, -1))
        else:
            leaves = state.rows
            sids = torch.where(
                (real & (leaves >= 0))[:, None], state.prefixes, torch.full_like(state.prefixes, -1)
            )
        leaves = torch.where(real, leaves, torch.full_like(leaves, -1))
        return SearchResult(
            sids=sids.view(b, per, self.num_steps),
            scores=state.scores.view(b, per),
            leaves=leaves.view(b, per),
            order=state.order,
            constraints=state.constraints,
        )

    def search(
        self,
        step_fn: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
        batch_size: int,
        beam_width: int,
        mode: ModeArg = None,
        order: str | None = None,
        *,
        include: Any = None,
        exclude: Any = None,
    ) -> SearchResult:
        """Full beam search: step_fn(step, prefixes int64 [R, step], batch int64 [R]) -> hidden [R, d].
        include / exclude: per-request item constraints (see start)."""
        state = self.start(batch_size, beam_width, order, include=include, exclude=exclude)
        for t in range(self.num_steps):
            state = self.step(state, step_fn(t, state.prefixes, state.batch), mode)
        return self.finish(state)

    # ------------------------------------------------------------------ leaves -> items
    def lookup_leaves(self, sids: torch.Tensor) -> torch.Tensor:
        """int64 [n]: leaf of each SID of int [n, L] (walks the step tables); -1 where not in the catalog."""
        return walk_step_tables(self.steps, torch.as_tensor(sids, device=self.device).long())

    def items(
        self, res: SearchResult, items: Sequence[Any] | np.ndarray | None = None
    ) -> list[list[list[Any]]]:
        """Item ids of every result beam: `[B][M]` lists (several items may share a SID; [] at padding).

        Through the index's leaf map (SidIndex.leaf_items): leaf j owns a run of positions of the
        leaf-ordered items table. What a position resolves to:
          - `items` given (ids in *catalog row order*, i.e. the rows build_index was given; needs an in-memory
            index with item_order): items[item_order[position]];
          - a Bundle: its items table (bundle.items(), leaf order);
          - an in-memory SidIndex: the catalog row number item_order[position];
          - an index without item_order and no bundle: the leaf-order position itself.
        """
        leaves = res.leaves.detach().cpu().numpy()
        table = None  # leaf-order items (None: catalog rows or positions, see SidIndex.leaf_items)
        if items is not None:
            if self.index.item_order is None:
                raise InputError(
                    "items in catalog order need an in-memory index (item_order); bundles carry items"
                )
        elif self.bundle is not None and callable(getattr(self.bundle, "items", None)):
            table = self.bundle.items()
        values, offsets = self.index.leaf_items(leaves, table)
        if items is not None:
            values = np.asarray(items, dtype=object)[values]  # values are catalog rows here
        values = values if isinstance(values, list) else values.tolist()  # numpy and pyarrow alike
        if res.constraints is not None:  # only the items the request may return (a shared SID may lose some)
            values, offsets = res.constraints.filter_leaf_items(self.index, leaves, values, offsets)
        per_beam = [values[a:b] for a, b in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
        m = leaves.shape[1]
        return [per_beam[b * m : (b + 1) * m] for b in range(leaves.shape[0])]

    # ------------------------------------------------------------------ the two step kinds
    def _select(self, state: BeamState, candidates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-M per request of candidates fp32 [B, n] (padded with -inf when n < M): (values, columns)."""
        m = state.beam_width
        if candidates.shape[1] < m:
            pad = candidates.new_full((candidates.shape[0], m - candidates.shape[1]), NEG_INF)
            candidates = torch.cat([candidates, pad], dim=1)
        return torch.topk(candidates, m, dim=1, sorted=True)

    def _step_dense(
        self, state: BeamState, hidden: torch.Tensor, table: DeviceStep, log_normalizer=None
    ) -> BeamState:
        """Dense step or unconstrained order: slot k = token k, one GEMM over V_t."""
        weight, bias = self.weights[table.step]
        vocab = table.codebook_size
        logits = full_logits(hidden, weight, bias)
        alive = state.rows >= 0

        def log_softmax(x: torch.Tensor) -> torch.Tensor:
            return torch.log_softmax(x, dim=1) if log_normalizer is None else x - log_normalizer[:, None]

        if state.order == "unconstrained":
            logp = log_softmax(logits).masked_fill_(~alive[:, None], NEG_INF)
        else:
            assert table.next is not None
            empty = dense_emptier(state.constraints, table, state.rows, state.batch)  # in place
            logp = (
                masked_log_softmax_(empty(logits))
                if state.order == "filter_first"
                else empty(log_softmax(logits))
            )
        b = state.batch_size
        per = state.num_beams // b
        totals = logp.add_(state.scores[:, None]).view(b, per * vocab)  # logp is this step's own tensor
        values, cols = self._select(state, totals)
        cols = cols.clamp(max=per * vocab - 1)
        beam = torch.arange(b, device=self.device)[:, None] * per + cols // vocab
        token = cols % vocab
        if state.order == "unconstrained":
            next_row = torch.zeros_like(token)
        else:
            next_row = table.next[state.rows[beam].clamp(min=0), token].long()
        return state.advance(values, beam, token, next_row)

    def _step_sparse(
        self, state: BeamState, hidden: torch.Tensor, table: DeviceStep, scoring, log_normalizer=None
    ) -> BeamState:
        """Sparse step: K main slots per beam, overflow lanes for heavy beams (see slots.py, lanes.py)."""
        weight, bias = self.weights[table.step]
        b, m = state.batch_size, state.beam_width
        per = state.num_beams // b
        k = table.cap
        start, count = row_extent(table, state.rows)
        if state.order == "filter_first" and scoring.select_top is not None and not self.static_shapes:
            selected = selected_sparse_step(state, hidden, table, weight, bias, scoring, start, count)
            if selected is not None:
                return selected
        heavy = count > k
        main_count = torch.where(heavy, torch.zeros_like(count), count)
        source = slot_source(state.constraints, table)  # the table, or its available children only
        main_tokens = fill_slots(source, start, main_count, k)
        main_tokens = mask_slots(state.constraints, table, main_tokens, start, main_count, state.batch)

        logits = lse = None
        own_lse = state.order == "score_first" and log_normalizer is None
        if scoring.uses_full_logits or own_lse:
            logits = full_logits(hidden, weight, bias)
        if state.order == "score_first":  # padded beams' hidden may be anything: keep their lse finite
            lse = torch.logsumexp(logits, dim=1) if own_lse else log_normalizer.clone()
            lse = lse.masked_fill_(state.rows < 0, 0.0)

        def totals(rows: torch.Tensor | None, slot_tokens: torch.Tensor) -> torch.Tensor:
            """Beam totals fp32 [n, width] of beams `rows` (None = all): their scores plus their slots'
            per-order log-probabilities."""
            h = hidden if rows is None else hidden[rows]
            scores = state.scores if rows is None else state.scores[rows]
            sub = None if logits is None else (logits if rows is None else logits[rows])
            if state.order == "filter_first":
                if scoring.log_softmax_totals is not None:  # the add inside the kernel's pass
                    return scoring.log_softmax_totals(h, weight, bias, slot_tokens, scores)
                if scoring.uses_full_logits:
                    return masked_log_softmax_(read_slots(sub, slot_tokens)).add_(scores[:, None])
                return scores[:, None] + scoring.selective_log_softmax(h, weight, bias, slot_tokens)
            raw = (
                read_slots(sub, slot_tokens)
                if scoring.uses_full_logits
                else scoring.selective_scores(h, weight, bias, slot_tokens)
            )
            assert lse is not None
            return scores[:, None] + (raw - (lse if rows is None else lse[rows])[:, None])

        main = totals(None, main_tokens).view(b, per * k)
        lanes = plan_lanes(heavy, count, k, table.max_slots, static=self.static_shapes)
        if lanes.count:
            assert lanes.beam is not None
            lane_beam = lanes.beam.clamp(min=0)
            lane_count = torch.where(lanes.beam >= 0, count[lane_beam], 0)
            lane_tokens = fill_slots(source, start[lane_beam], lane_count, lanes.width)
            lane_tokens = mask_slots(
                state.constraints, table, lane_tokens, start[lane_beam], lane_count, state.batch[lane_beam]
            )
            lane_totals = totals(lane_beam, lane_tokens)
            keep = min(m, lanes.width)
            lane_values, lane_slot = torch.topk(lane_totals, keep, dim=1, sorted=False)
            extra = lanes.per_request(lane_values, state.batch[lane_beam], b)
            candidates = torch.cat([main, extra], dim=1)
        else:
            candidates = main
        values, cols = self._select(state, candidates)

        num_main = per * k
        is_main = cols < num_main
        main_cols = cols.clamp(max=num_main - 1)
        beam = torch.arange(b, device=self.device)[:, None] * per + main_cols // k
        slot = main_cols % k
        if lanes.count:
            extra_cols = (cols - num_main).clamp(min=0, max=extra.shape[1] - 1)
            lane = lanes.lane_of(extra_cols // keep)
            beam = torch.where(is_main, beam, lane_beam[lane])
            slot = torch.where(is_main, slot, lane_slot[lane, extra_cols % keep])
        flat = (start[beam] + slot).clamp(max=table.nnz - 1)
        assert table.tokens is not None
        token = table.tokens[flat].long()
        return state.advance(values, beam, token, flat)


__all__ = ["ORDERS", "BeamState", "Decoder", "SearchResult"]
