"""The Decoder's immutable beam types: BeamState (the beams after each step) and SearchResult (the final
beams of a search). Decoder.step returns a new BeamState; nothing here runs a search."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


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
    constraints: Any = None  # constraints.RequestConstraints of the search (None: unconstrained items)

    @property
    def num_beams(self) -> int:
        return int(self.batch.shape[0])

    def advance(
        self, values: torch.Tensor, beam: torch.Tensor, token: torch.Tensor, next_row: torch.Tensor
    ) -> BeamState:
        """The state after every request keeps its M continuations (a new state; this one is unchanged).

        Shape: values fp32 [B, M] (new totals, best first; -inf = padding); beam int64 [B, M] (the beam of
        this state each continues); token int64 [B, M]; next_row int64 [B, M] (its row of the next table).
        """
        b, m = self.batch_size, self.beam_width
        real = torch.isfinite(values.reshape(-1))
        beam = beam.reshape(-1)
        token = torch.where(real, token.reshape(-1), torch.zeros_like(beam))
        rows = torch.where(real, next_row.reshape(-1), torch.full_like(beam, -1))
        return BeamState(
            step=self.step + 1,
            prefixes=torch.cat([self.prefixes.index_select(0, beam), token[:, None]], dim=1),
            batch=torch.arange(b, device=beam.device).repeat_interleave(m),
            scores=values.reshape(-1).contiguous(),
            rows=rows,
            batch_size=b,
            beam_width=m,
            order=self.order,
            parents=beam,
            constraints=self.constraints,
        )


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
    constraints: Any = None  # the search's RequestConstraints (dec.items keeps only allowed items)

    @property
    def valid(self) -> torch.Tensor:
        """bool [B, M]: the beam names a real catalog SID."""
        return self.leaves >= 0

    def rescored(self, extra: torch.Tensor) -> SearchResult:
        """This result with extra fp32 [B * M] (or [B, M]) added to its beams' scores, re-sorted best first
        per request (padding stays -inf, last): e.g. the forced EOS step's log-probability."""
        scores = self.scores + extra.reshape(self.scores.shape).to(self.scores)
        order = torch.argsort(scores, dim=1, descending=True, stable=True)
        return SearchResult(
            sids=torch.gather(self.sids, 1, order[:, :, None].expand_as(self.sids)),
            scores=torch.gather(scores, 1, order),
            leaves=torch.gather(self.leaves, 1, order),
            order=self.order,
            constraints=self.constraints,
        )
