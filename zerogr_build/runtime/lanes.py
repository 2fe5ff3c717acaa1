"""Overflow lanes of a sparse step: the extra slots of beams whose row has more children than the slot cap K.

A heavy beam's K main slots stay empty; its children go into a lane instead (slots.py explains caps and
lanes). Two layouts, the same candidates:

  - dynamic (default): one lane per heavy beam present, heavy beam j (in beam order) -> lane j, sized to fit
    (`lane_count`, `lane_width`). Costs one device -> host read per step (how many lanes, how wide).
  - static (`Decoder(static_shapes=True)`): lane r is beam r, max_slots wide, empty unless the beam is heavy.
    Shapes depend on the step alone and nothing is read back to the host, so a step can be captured in a
    CUDA graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .slots import lane_count, lane_width

NEG_INF = float("-inf")


@dataclass(frozen=True, eq=False)
class Lanes:
    """count lanes, `width` slots each; beam int64 [count]: the beam a lane holds (-1: unused lane), None
    when count is 0; static: lane r is beam r (else heavy beams in order)."""

    count: int
    width: int
    beam: torch.Tensor | None
    static: bool

    def per_request(self, values: torch.Tensor, lane_batch: torch.Tensor, batch_size: int) -> torch.Tensor:
        """Lane candidates grouped by request: values fp32 [count, keep] (one row per lane), lane_batch
        int64 [count] the request of each lane -> fp32 [B, n], -inf where a request has no lane."""
        if self.static:  # a request's lanes are its own beams, in order
            return values.view(batch_size, -1)
        keep = values.shape[1]
        grouped = values.new_full((batch_size, self.count, keep), NEG_INF)
        grouped[lane_batch, torch.arange(self.count, device=values.device)] = values
        return grouped.view(batch_size, self.count * keep)

    def lane_of(self, position: torch.Tensor) -> torch.Tensor:
        """The lane of int64 [B, M] positions in `per_request`'s lane groups (column // keep)."""
        if self.static:
            batch_size = position.shape[0]
            first = torch.arange(batch_size, device=position.device)[:, None] * (self.count // batch_size)
            return first + position
        return position


def plan_lanes(heavy: torch.Tensor, count: torch.Tensor, cap: int, max_slots: int, *, static: bool) -> Lanes:
    """The lanes of one sparse step.

    Args:
        heavy: bool [R], the beams whose row has more children than the cap.
        count: int64 [R], each beam's child count.
        cap: the step's slot cap K.
        max_slots: the step's largest child count (the widest a lane need be).
        static: one max_slots-wide lane per beam (when some row exceeds the cap) instead of sized-to-fit.
    """
    num_beams = heavy.shape[0]
    device = heavy.device
    if static:
        n = num_beams if max_slots > cap else 0
        beam = torch.where(heavy, torch.arange(n, device=device), -1) if n else None
        return Lanes(n, max_slots, beam, True)
    # The one device->host sync of a step: how many lanes, how wide.
    num_heavy, heaviest = (int(x) for x in torch.stack([heavy.sum(), count.max()]).tolist())
    n = lane_count(num_heavy)
    width = lane_width(heaviest, max_slots)
    if not n:
        return Lanes(0, width, None, False)
    # Heavy beam j (in beam order) -> lane j. A scatter by running count, not torch.nonzero (a second
    # device->host sync); light beams land in a discarded slot.
    target = torch.where(heavy, torch.cumsum(heavy, 0) - 1, n)
    beam = torch.full((n + 1,), -1, dtype=torch.int64, device=device)
    beam = beam.scatter_(0, target, torch.arange(num_beams, device=device))[:n]
    return Lanes(n, width, beam, False)


__all__ = ["Lanes", "plan_lanes"]
