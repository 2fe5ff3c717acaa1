"""Ranking metrics over top-K item lists (pure Python/numpy; lists are best first).

Every function takes one list per request and averages over requests. A list may be shorter than K (a
request whose beams were padded); it is used as it is.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence

import numpy as np


def top_k_items(beam_items: Sequence[Sequence[Sequence[Hashable]]], k: int) -> list[list[Hashable]]:
    """Per request, the first k distinct items of its beams in beam order (best beam first).

    beam_items: [B][M] lists of the item ids each beam names (several items may share a SID; a padded or
    invalid beam names none), e.g. `Decoder.items(result)`.
    """
    out = []
    for beams in beam_items:
        seen: dict[Hashable, None] = {}
        for items in beams:
            for item in items:
                if len(seen) >= k:
                    break
                seen.setdefault(item, None)
        out.append(list(seen))
    return out


def overlap_at_k(
    reference: Sequence[Sequence[Hashable]], other: Sequence[Sequence[Hashable]], k: int
) -> float:
    """Mean over requests of |ref[:k] ∩ other[:k]| / |ref[:k]|; a request whose ref[:k] is empty while
    other[:k] is not counts as 0 (a miss: the reference found nothing), one where both are empty is
    skipped. NaN when no request counts (nothing was compared).

    With reference = filter-first's lists and other = score-first's: the share of filter-first's top-K
    items that score-first also returns in its top-K.
    """
    if len(reference) != len(other):
        raise ValueError(f"{len(reference)} reference lists vs {len(other)} other lists")
    shares = []
    for ref, oth in zip(reference, other, strict=True):
        ref_k, oth_k = ref[:k], oth[:k]
        if ref_k:
            shares.append(len(set(ref_k) & set(oth_k)) / len(ref_k))
        elif oth_k:
            shares.append(0.0)
    return float(np.mean(shares)) if shares else float("nan")


def recall_at_k(lists: Sequence[Sequence[Hashable]], targets: Sequence[Hashable], k: int) -> float:
    """Mean over requests of [target in list[:k]] (one held-out item per request, so recall = hit rate)."""
    _check_lengths(lists, targets)
    return float(np.mean([t in lst[:k] for lst, t in zip(lists, targets, strict=True)])) if lists else 0.0


def ndcg_at_k(lists: Sequence[Sequence[Hashable]], targets: Sequence[Hashable], k: int) -> float:
    """Mean over requests of 1 / log2(rank + 2) where rank is the target's 0-based position in list[:k]
    (0 when absent). With one relevant item the ideal DCG is 1, so this is already normalised."""
    _check_lengths(lists, targets)
    gains = []
    for lst, target in zip(lists, targets, strict=True):
        head = list(lst[:k])
        gains.append(1.0 / math.log2(head.index(target) + 2) if target in head else 0.0)
    return float(np.mean(gains)) if gains else 0.0


def _check_lengths(lists: Sequence, targets: Sequence) -> None:
    if len(lists) != len(targets):
        raise ValueError(f"{len(lists)} lists vs {len(targets)} targets")
