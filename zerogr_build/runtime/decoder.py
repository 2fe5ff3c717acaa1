"""Filter-first constrained beam search over a SidIndex: the Decoder, its BeamState and SearchResult.

    dec = Decoder(index_or_bundle, weights, device="cpu", order="filter_first", plan=None)
    state = dec.start(batch_size, beam_width)     # R = B beams (one empty prefix per request)
    state = dec.step(state, hidden, mode=None)    # hidden [R, d] -> a NEW state with R = B * M beams
    res = dec.finish(state)                       # sids [B, M, L], scores [B, M], leaves [B, M]
    res = dec.search(step_fn, batch_size, beam_width, mode=None)   # step_fn(step, prefixes, batch) -> hidden
    dec.items(res)                                # item ids per (request, beam)

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

Padding: a request with fewer than M valid continuations gets padded beams - score -inf, row/leaf -1,
prefix token 0 (so a step_fn can still embed it), sids -1 in the result. -inf never beats a finite
candidate in top-k, and no operation subtracts -inf from -inf, so no NaN appears. A real candidate whose
score underflows to -inf would be treated as padding.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import InputError
from ..index import SidIndex
from .plan import dtype_name, find_bundle_plan, heuristic_mode, load_plan, planned_mode
from .scoring import available_modes, get_mode
from .scoring.full_torch import full_logits, read_slots
from .scoring.selective_torch import masked_log_softmax
from .slots import DeviceStep, fill_slots, index_to_device, lane_count, lane_width, row_extent
from .weights import normalize_weights

ORDERS = ("filter_first", "score_first", "unconstrained")
NEG_INF = float("-inf")

ModeArg = str | Sequence[str | None] | Mapping[int, str] | None


@dataclass(frozen=True, eq=False)
class BeamState:
    """Beams after `step` decoding steps. Never mutated: Decoder.step returns a new state.

    prefixes int64 [R, step]: tokens chosen so far (0 at padded beams).
    batch    int64 [R]: request of each beam; beams of request b are rows b*R/B .. (b+1)*R/B - 1.
    scores   fp32 [R]: sum of per-step log-probabilities (-inf at padded beams).
    rows     int64 [R]: each beam's row of step `step`'s table (its leaf once step == L); -1 = padding.
    parents  int64 [R] or None: each beam's beam in the previous state (None at start), e.g. to reorder a
             model's KV cache with the beams.
    """

    step: int
    prefixes: torch.Tensor
    batch: torch.Tensor
    scores: torch.Tensor
    rows: torch.Tensor
    batch_size: int
    beam_width: int
    order: str
    parents: torch.Tensor | None = None

    @property
    def num_beams(self) -> int:
        return int(self.batch.shape[0])


@dataclass(frozen=True, eq=False)
class SearchResult:
    """Final beams per request, best first.

    sids int64 [B, M, L] (-1 rows at padding), scores fp32 [B, M] (-inf at padding), leaves int64 [B, M]
    (-1 at padding; under "unconstrained" also -1 where the decoded SID is not in the catalog).
    """

    sids: torch.Tensor
    scores: torch.Tensor
    leaves: torch.Tensor
    order: str

    @property
    def valid(self) -> torch.Tensor:
        """bool [B, M]: the beam names a real catalog SID."""
        return self.leaves >= 0


class Decoder:
    """Constrained beam search over one index and one set of per-step output layers.

    index_or_bundle: a SidIndex, or a Bundle (anything with `.index`; its `.items()` gives item ids).
    weights: L entries, step t's output layer [V_t, d] (tensor / array), a (weight, bias) pair, a
        {"weight", "bias"} dict or an nn.Linear; fp32, fp16 or bf16.
    device: "cpu", "cuda:0", ...; every step table is copied there once, here.
    order: default order of searches ("filter_first", "score_first", "unconstrained").
    plan: None (heuristic), a plan dict / list of entries / JSON path, or "auto" (the bundle's plan for
        this device, with a warning and the heuristic when none fits).
    slot_caps: slot cap K of sparse steps: None (p99-based default, see slots.py), an int, a per-step
        sequence or {step: K}.
    low_priority: on CUDA, stream the tables on low-priority copy streams (loading a new version beside
        a live one, see hotswap.py). With plan="auto" on CUDA the bundle's compiled kernels for this
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
    ) -> None:
        if isinstance(index_or_bundle, SidIndex):
            self.bundle = None
            self.index: SidIndex = index_or_bundle
        elif hasattr(index_or_bundle, "index"):
            self.bundle = index_or_bundle
            self.index = index_or_bundle.index
        else:
            raise InputError(f"Decoder needs a SidIndex or a Bundle, got {type(index_or_bundle).__name__}")
        if order not in ORDERS:
            raise InputError(f"unknown order {order!r} ({', '.join(ORDERS)})")
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
        self.leaf_offsets = np.asarray(self.index.leaf_offsets, dtype=np.int64)
        self.available_modes = available_modes(self.device)
        auto_plan = isinstance(plan, str) and plan == "auto"
        if auto_plan:
            self.plan = find_bundle_plan(self.bundle, self.device)
        else:
            self.plan = load_plan(plan) if plan is not None else None
        self._warned: set[tuple[int, str]] = set()
        self.kernels = None  # compiled selective_cuda kernels loaded from the bundle (plan="auto", CUDA)
        if auto_plan and self.bundle is not None and self.device.type == "cuda":
            from ..tune import load_bundle_kernels

            self.kernels = load_bundle_kernels(self.bundle, self.device)

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
        planned = planned_mode(
            self.plan, step, batch_size, self.weights[step][0].dtype, available=self.available_modes
        )
        if planned is not None:
            if planned in self.available_modes:
                return planned
            self._warn_once(step, planned, f"plan mode {planned!r} for step {step} unavailable here")
        elif self.plan:
            dtype = dtype_name(self.weights[step][0].dtype)
            self._warn_once(step, dtype, f"the plan has no entry for step {step} at {dtype}")
        return heuristic_mode(
            step_format=table.format, cap=table.cap, codebook_size=table.codebook_size, order=order,
            device_type=self.device.type, available=self.available_modes,
        )  # fmt: skip

    def _warn_once(self, step: int, what: str, message: str) -> None:
        """Warn once per (step, what) that the plan could not be followed (the heuristic is used)."""
        if (step, what) not in self._warned:
            self._warned.add((step, what))
            warnings.warn(f"{message}; heuristic used", stacklevel=4)

    # ------------------------------------------------------------------ search
    def start(self, batch_size: int, beam_width: int, order: str | None = None) -> BeamState:
        """Initial state: one empty-prefix beam per request (R = batch_size), at row 0 of step 0."""
        order = order or self.order
        if order not in ORDERS:
            raise InputError(f"unknown order {order!r} ({', '.join(ORDERS)})")
        if batch_size < 1 or beam_width < 1:
            raise InputError(f"batch_size and beam_width must be >= 1, got {batch_size}, {beam_width}")
        dev = self.device
        return BeamState(
            step=0,
            prefixes=torch.zeros((batch_size, 0), dtype=torch.int64, device=dev),
            batch=torch.arange(batch_size, device=dev),
            scores=torch.zeros(batch_size, dtype=torch.float32, device=dev),
            rows=torch.zeros(batch_size, dtype=torch.int64, device=dev),
            batch_size=batch_size,
            beam_width=beam_width,
            order=order,
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
        )

    def search(
        self,
        step_fn: Callable[[int, torch.Tensor, torch.Tensor], torch.Tensor],
        batch_size: int,
        beam_width: int,
        mode: ModeArg = None,
        order: str | None = None,
    ) -> SearchResult:
        """Full beam search: step_fn(step, prefixes int64 [R, step], batch int64 [R]) -> hidden [R, d]."""
        state = self.start(batch_size, beam_width, order)
        for t in range(self.num_steps):
            state = self.step(state, step_fn(t, state.prefixes, state.batch), mode)
        return self.finish(state)

    # ------------------------------------------------------------------ leaves -> items
    def lookup_leaves(self, sids: torch.Tensor) -> torch.Tensor:
        """int64 [n]: leaf of each SID of int [n, L] (walks the step tables); -1 where not in the catalog."""
        sids = torch.as_tensor(sids, device=self.device).long()
        row = torch.zeros(sids.shape[0], dtype=torch.int64, device=self.device)
        for t, table in enumerate(self.steps):
            tok = sids[:, t]
            ok = (row >= 0) & (tok >= 0) & (tok < table.codebook_size)
            safe_row, safe_tok = row.clamp(min=0), tok.clamp(0, table.codebook_size - 1)
            if table.format == "dense":
                assert table.next is not None
                nxt = table.next[safe_row, safe_tok].long()
            else:
                keys = table.flat_keys()
                key = safe_row * table.codebook_size + safe_tok
                pos = torch.searchsorted(keys, key).clamp(max=table.nnz - 1)
                nxt = torch.where(keys[pos] == key, pos, torch.full_like(pos, -1))
            row = torch.where(ok, nxt, torch.full_like(nxt, -1))
        return row

    def items(
        self, res: SearchResult, items: Sequence[Any] | np.ndarray | None = None
    ) -> list[list[list[Any]]]:
        """Item ids of every result beam: [B][M] lists (several items may share a SID; [] at padding).

        Through leaf_offsets: leaf j owns positions leaf_offsets[j]:leaf_offsets[j+1] of the leaf-ordered
        items table. What a position resolves to:
          - `items` given (ids in *catalog row order*, i.e. the rows build_index was given; needs an in-memory
            index with item_order): items[item_order[position]];
          - a Bundle: its items table (bundle.items(), leaf order);
          - an in-memory SidIndex: the catalog row number item_order[position];
          - an index without item_order and no bundle: the leaf-order position itself.
        """
        leaves = res.leaves.detach().cpu().numpy()
        flat_leaves = leaves.reshape(-1)
        real = flat_leaves >= 0
        safe = np.clip(flat_leaves, 0, None)
        lo = np.where(real, self.leaf_offsets[safe], 0)
        counts = np.where(real, self.leaf_offsets[safe + 1], 0) - lo
        ends = np.cumsum(counts)  # beam i's items are values[ends[i] - counts[i] : ends[i]]
        positions = np.repeat(lo - (ends - counts), counts) + np.arange(int(counts.sum()))
        order = self.index.item_order
        if items is not None:
            if order is None:
                raise InputError(
                    "items in catalog order need an in-memory index (item_order); bundles carry items"
                )
            values = np.asarray(items, dtype=object)[np.asarray(order)[positions]].tolist()
        elif self.bundle is not None and callable(getattr(self.bundle, "items", None)):
            table = self.bundle.items()
            values = (
                table.take(positions).to_pylist() if hasattr(table, "take") else [table[i] for i in positions]
            )
        elif order is not None:
            values = np.asarray(order)[positions].tolist()
        else:
            values = positions.tolist()
        per_beam = [values[end - n : end] for n, end in zip(counts.tolist(), ends.tolist(), strict=True)]
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

    def _new_state(self, state: BeamState, values, beam, token, next_row) -> BeamState:
        b, m = state.batch_size, state.beam_width
        real = torch.isfinite(values.reshape(-1))
        beam = beam.reshape(-1)
        token = torch.where(real, token.reshape(-1), torch.zeros_like(beam))
        rows = torch.where(real, next_row.reshape(-1), torch.full_like(beam, -1))
        return BeamState(
            step=state.step + 1,
            prefixes=torch.cat([state.prefixes[beam], token[:, None]], dim=1),
            batch=torch.arange(b, device=self.device).repeat_interleave(m),
            scores=values.reshape(-1).contiguous(),
            rows=rows,
            batch_size=b,
            beam_width=m,
            order=state.order,
            parents=beam,
        )

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
            valid = (table.next[state.rows.clamp(min=0)] >= 0) & alive[:, None]
            if state.order == "filter_first":
                logp = masked_log_softmax(logits.masked_fill_(~valid, NEG_INF))
            else:
                logp = log_softmax(logits).masked_fill_(~valid, NEG_INF)
        b = state.batch_size
        per = state.num_beams // b
        totals = (state.scores[:, None] + logp).view(b, per * vocab)
        values, cols = self._select(state, totals)
        cols = cols.clamp(max=per * vocab - 1)
        beam = torch.arange(b, device=self.device)[:, None] * per + cols // vocab
        token = cols % vocab
        if state.order == "unconstrained":
            next_row = torch.zeros_like(token)
        else:
            next_row = table.next[state.rows[beam].clamp(min=0), token].long()
        return self._new_state(state, values, beam, token, next_row)

    def _step_sparse(
        self, state: BeamState, hidden: torch.Tensor, table: DeviceStep, scoring, log_normalizer=None
    ) -> BeamState:
        """Sparse step: K main slots per beam, overflow lanes for heavy beams (see slots.py)."""
        weight, bias = self.weights[table.step]
        b, m = state.batch_size, state.beam_width
        per = state.num_beams // b
        k = table.cap
        start, count = row_extent(table, state.rows)
        heavy = count > k
        main_tokens = fill_slots(table, start, torch.where(heavy, torch.zeros_like(count), count), k)

        logits = lse = None
        own_lse = state.order == "score_first" and log_normalizer is None
        if scoring.uses_full_logits or own_lse:
            logits = full_logits(hidden, weight, bias)
        if state.order == "score_first":  # padded beams' hidden may be anything: keep their lse finite
            lse = torch.logsumexp(logits, dim=1) if own_lse else log_normalizer.clone()
            lse = lse.masked_fill_(state.rows < 0, 0.0)

        def log_probs(rows: torch.Tensor | None, slot_tokens: torch.Tensor) -> torch.Tensor:
            """Per-order log-probabilities fp32 [n, width] of the slots of beams `rows` (None = all)."""
            h = hidden if rows is None else hidden[rows]
            sub = None if logits is None else (logits if rows is None else logits[rows])
            if state.order == "filter_first":
                if scoring.uses_full_logits:
                    return masked_log_softmax(read_slots(sub, slot_tokens))
                return scoring.selective_log_softmax(h, weight, bias, slot_tokens)
            raw = (
                read_slots(sub, slot_tokens)
                if scoring.uses_full_logits
                else scoring.selective_scores(h, weight, bias, slot_tokens)
            )
            assert lse is not None
            return raw - (lse if rows is None else lse[rows])[:, None]

        main = (state.scores[:, None] + log_probs(None, main_tokens)).view(b, per * k)
        if self.static_shapes:
            # Lane r is beam r, max_slots wide (empty unless the beam is heavy): shapes depend on the step
            # alone and nothing is read back to the host, so the step can be captured in a CUDA graph.
            lanes = state.num_beams if table.max_slots > k else 0
            lane_beam = torch.where(heavy, torch.arange(lanes, device=self.device), -1) if lanes else None
            width = table.max_slots
        else:
            # The one device->host sync of a step: how many lanes, how wide.
            num_heavy, heaviest = (int(x) for x in torch.stack([heavy.sum(), count.max()]).tolist())
            lanes = lane_count(num_heavy)
            width = lane_width(heaviest, table.max_slots)
            if lanes:
                # Heavy beam j (in beam order) -> lane j, -1 = unused lane. A scatter by running count, not
                # torch.nonzero (a second device->host sync); light beams land in a discarded slot.
                target = torch.where(heavy, torch.cumsum(heavy, 0) - 1, lanes)
                all_beams = torch.arange(state.num_beams, device=self.device)
                lane_beam = torch.full((lanes + 1,), -1, dtype=torch.int64, device=self.device)
                lane_beam = lane_beam.scatter_(0, target, all_beams)[:lanes]
        if lanes:
            lane_alive = lane_beam >= 0
            lb = lane_beam.clamp(min=0)
            lane_tokens = fill_slots(table, start[lb], torch.where(lane_alive, count[lb], 0), width)
            lane_totals = state.scores[lb][:, None] + log_probs(lb, lane_tokens)
            lane_keep = min(m, width)
            lane_values, lane_slot = torch.topk(lane_totals, lane_keep, dim=1, sorted=False)
            if self.static_shapes:  # a request's lanes are its own beams, in order
                extra = lane_values.view(b, per * lane_keep)
            else:
                extra = main.new_full((b, lanes, lane_keep), NEG_INF)
                extra[state.batch[lb], torch.arange(lanes, device=self.device)] = lane_values
                extra = extra.view(b, lanes * lane_keep)
            candidates = torch.cat([main, extra], dim=1)
        else:
            candidates = main
        values, cols = self._select(state, candidates)

        num_main = per * k
        is_main = cols < num_main
        main_cols = cols.clamp(max=num_main - 1)
        beam = torch.arange(b, device=self.device)[:, None] * per + main_cols // k
        slot = main_cols % k
        if lanes:
            extra_cols = (cols - num_main).clamp(min=0, max=extra.shape[1] - 1)
            lane, rank = extra_cols // lane_keep, extra_cols % lane_keep
            if self.static_shapes:
                lane = torch.arange(b, device=self.device)[:, None] * per + lane
            beam = torch.where(is_main, beam, lb[lane])
            slot = torch.where(is_main, slot, lane_slot[lane, rank])
        flat = (start[beam] + slot).clamp(max=table.nnz - 1)
        assert table.tokens is not None
        token = table.tokens[flat].long()
        return self._new_state(state, values, beam, token, flat)


__all__ = ["ORDERS", "BeamState", "Decoder", "SearchResult"]
