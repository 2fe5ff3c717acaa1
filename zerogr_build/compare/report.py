"""The result of compare_orders (JSON-ready through to_dict; rendered by the CLI)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class CompareReport:
    """Result of compare_orders (all floats are means over requests or beams; JSON-ready via to_dict).

    overlap {K: share}; recall / ndcg {order: {K: value}} (empty without targets); invalid_mass
    {order: [mean per step]} and invalid_mass_max {order: [max per step]} over the beams alive at each
    step (padded beams excluded); unconstrained_invalid_rate: share of unconstrained final beams that are
    not catalog SIDs; requests_differing {K: share of requests whose top-K lists differ as sets}.
    The mechanism, in log-prob units (nats): filter-first adds boost = -log(1 - mass) to every candidate of
    a beam. boost_spread {order: [per step]}: mean over requests of (max - min) boost among its alive
    beams; score_gap {order: {K: mean over requests of score(beam 1) - score(beam K)}}. When boosts
    differ between beams by more than the gaps between candidates, the two orders rank differently.
    """

    requests: int
    beam_width: int
    ks: list[int]
    overlap: dict[int, float]
    requests_differing: dict[int, float]
    recall: dict[str, dict[int, float]]
    ndcg: dict[str, dict[int, float]]
    invalid_mass: dict[str, list[float]]
    invalid_mass_max: dict[str, list[float]]
    boost_spread: dict[str, list[float]]
    score_gap: dict[str, dict[int, float]]
    unconstrained_invalid_rate: float
    with_targets: int
    seconds: float
    codebook_sizes: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (K keys become strings)."""
        return _with_k_keys(asdict(self), str)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> CompareReport:
        """The inverse of to_dict (K keys back to int). For reports this code wrote; not a validator."""
        return cls(**_with_k_keys(dict(data), int))


_PER_K = ("overlap", "requests_differing")  # {K: value}
_PER_ORDER_PER_K = ("recall", "ndcg", "score_gap")  # {order: {K: value}}


def _with_k_keys(d: dict[str, Any], key: type) -> dict[str, Any]:
    """d with the K keys of its per-K fields converted by `key` (str for JSON, int back)."""
    for name in _PER_K:
        d[name] = {key(k): v for k, v in d[name].items()}
    for name in _PER_ORDER_PER_K:
        d[name] = {o: {key(k): v for k, v in per.items()} for o, per in d[name].items()}
    return d
