"""Does filtering first change the recommendations? Filter-first vs score-first (and unconstrained).

The same beam search runs three times per batch of requests through `runtime.Decoder`, once per order,
with the same hidden vectors source; the report compares the resulting top-K item lists:

- overlap@K: share of filter-first's top-K items that score-first also has in its top-K;
- Recall@K / NDCG@K per order (when the requests carry a ground-truth next item);
- invalid mass per step (the mechanism): the probability the model's full softmax over V_t puts on tokens
  that are not valid children of the beam's prefix, averaged over the beams alive at that step. Filter-first
  renormalises over valid tokens only, so a prefix's valid candidates get boosted by 1 / (1 - mass); when
  the mass differs between competing beams, the two orders can keep different beams;
- unconstrained decoding's invalid-SID rate: share of its final beams that name no catalog SID.

The model contract (`zerogr compare --model module:function`)::

    def function(bundle: zerogr_build.Bundle, request_ids: list) -> tuple[weights, step_fn]

- `bundle` is the opened bundle under test; `request_ids` one batch of request ids (Python values of the
  requests file's request column, in file order).
- `weights`: L per-step output layers, weights[t] of shape [V_t, d] with V_t = bundle codebook size of step
  t: a torch tensor / numpy array, a (weight, bias[V_t]) pair, a {"weight", "bias"} dict or an nn.Linear;
  fp32, fp16 or bf16 (the same d at every step). Logits of step t are hidden @ weight.T + bias.
- `step_fn(step: int, prefixes: LongTensor [R, step], batch: LongTensor [R]) -> Tensor [R, d]`: the
  decoder hidden vector of every beam, where prefixes[r] are beam r's tokens so far and batch[r] is the
  position in `request_ids` of the request it belongs to (R = len(request_ids) at step 0, then R = B*M).
  It must be deterministic (it is called once per order with the same prefixes where the orders agree).

The function is called once per batch of requests; its weights should not depend on the batch.

The quality gate (`gate`): `--min-overlap X [--max-recall-gap Y]` turns the report into a decision,
filter_first when overlap@K >= X at every K (and the recall filter-first loses is at most Y), else
score_first; `--record` writes it into the bundle as quality/<model tag>.json, which
`Decoder(order="auto")` follows (run_gate: the decision and the record; `zerogr compare` exits 10 when
the gate fails).

Modules: `inputs` (the model function, the requests files, K), `gate` (thresholds, decision, record),
`measure` (compare_orders, run_compare, and
compare_searches for any beam search, e.g. a Hugging Face model's), `metrics` (overlap@K, Recall@K,
NDCG@K, top-K item lists), `report` (CompareReport), `tables` (the report as rich tables).
"""

from __future__ import annotations

import importlib
from typing import Any

#: Each public name and the module that defines it. Imported on first use, so a process that only needs
#: `inputs` (the rebuild's set-up checks) does not import torch through `measure` and the runtime.
_WHERE = {
    "ORDERS": "..runtime.decoder",
    **dict.fromkeys(
        (
            "GateDecision",
            "GateOutcome",
            "GateThresholds",
            "decide",
            "quality_document",
            "record_quality",
            "run_gate",
        ),
        ".gate",
    ),
    **dict.fromkeys(
        (
            "DEFAULT_KS",
            "ModelFn",
            "Requests",
            "TokenRequests",
            "beam_width_for",
            "load_model_fn",
            "parse_ks",
            "read_requests",
            "read_token_requests",
        ),
        ".inputs",
    ),
    **dict.fromkeys(
        (
            "CONSTRAINED",
            "MASS_CHUNK",
            "Search",
            "StepMass",
            "compare_orders",
            "compare_searches",
            "invalid_mass",
            "model_fn_search",
            "run_compare",
            "valid_token_mask",
        ),
        ".measure",
    ),
    "CompareReport": ".report",
}


def __getattr__(name: str) -> Any:
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name], __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "CONSTRAINED",
    "DEFAULT_KS",
    "MASS_CHUNK",
    "ORDERS",
    "CompareReport",
    "GateDecision",
    "GateOutcome",
    "GateThresholds",
    "ModelFn",
    "Requests",
    "Search",
    "StepMass",
    "TokenRequests",
    "beam_width_for",
    "compare_orders",
    "compare_searches",
    "decide",
    "invalid_mass",
    "load_model_fn",
    "model_fn_search",
    "parse_ks",
    "quality_document",
    "read_requests",
    "read_token_requests",
    "record_quality",
    "run_gate",
    "run_compare",
    "valid_token_mask",
]
