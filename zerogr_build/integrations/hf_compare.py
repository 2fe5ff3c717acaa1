"""`zerogr compare`'s measurement for a Hugging Face model, decoded through SidGenerator (its KV cache).

    search = hf_search(SidGenerator(model, bundle, sid_map), inputs_of)
    report = compare_searches(bundle, search, requests, beam_width=20, ks=(1, 5, 10, 20))

inputs_of(request_ids) -> (input_ids [B, S], attention_mask [B, S]) encodes a batch of requests. The
report has compare_orders' shape; score_first and unconstrained normalise over the model's whole
vocabulary (as HF beam search does), and the invalid mass of a beam is the model's probability on every
token that is not a valid child of its prefix (other steps' codes and special tokens included).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from ..compare.measure import CONSTRAINED, Search, StepMass
from .hf_generate import SidGenerator


def hf_search(
    gen: SidGenerator, inputs_of: Callable[[list], tuple[torch.Tensor, torch.Tensor | None]]
) -> Search:
    """A compare_searches Search: every order decoded by gen.generate, the mechanism measured on the way."""
    last: dict = {}

    def search(ids: list, order: str, beam_width: int):
        if last.get("ids") is not ids:  # the three orders of a batch share its encoder inputs
            last.update(ids=ids, inputs=inputs_of(ids))
        input_ids, mask = last["inputs"]
        meter = StepMass(gen.decoder)
        observe = meter.observe if order in CONSTRAINED else None
        res = gen.generate(input_ids, mask, beam_width=beam_width, order=order, observe=observe)
        return res, gen.items(res), meter.per_step()

    return search


__all__ = ["hf_search"]
