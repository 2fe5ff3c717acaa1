"""Bytes the same catalog would take in Google STATIC's index layout, counted from our step tables.

STATIC (youtube/static-constraint-decoding, `static_decoding/csr_utils.py`, `build_static_index`) stores a
catalog as one global trie over "states" with a single vocabulary size V for every step:

* states: the root (id 0), one state per possible first token (ids 1..V, whether used or not), then one
  per distinct prefix of length 2 .. L-1. Full SIDs get no state (every last edge points to state 0).
* `packed_csr` int32 [E + V, 2]: a [token, next_state] pair for every edge out of a prefix of length
  1 .. L-1, i.e. E = P_2 + ... + P_L edges (P_k = distinct length-k prefixes), plus V padding rows.
* `indptr` int32 [states + 2]: CSR row pointers over all states, plus one entry for the padding rows.
* `start_mask` bool [V], and for the first d tokens `dense_mask` bool [V]*d and `dense_states` int32
  [V]*d.

Our tables hold every P_k directly (step t has nnz = P_{t+1}), so nothing needs to be built to count.
"""

from __future__ import annotations

from .tables import SidIndex

_INT32 = 4
_BOOL = 1


def static_layout_bytes(index: SidIndex, d: int = 2) -> dict[str, int]:
    """Byte counts of STATIC's arrays for the catalog behind `index` (counts only, nothing is built).

    V is the largest codebook size (STATIC has one vocabulary for all steps). STATIC requires
    1 <= d < L; a larger d is clamped to L-1, the deepest dense table an L-token SID allows. SIDs of a
    single token have no STATIC layout (ValueError).

    Returns {"packed_csr", "indptr", "start_mask", "dense_mask", "dense_states", "total"} in bytes.
    """
    num_steps = index.num_steps
    if num_steps < 2:
        raise ValueError(f"STATIC's layout needs SIDs of at least 2 tokens, got L={num_steps}")
    if d < 1:
        raise ValueError(f"dense depth d must be >= 1, got {d}")
    dense_depth = min(int(d), num_steps - 1)
    vocab = max(int(v) for v in index.codebook_sizes)
    # distinct[k-1] = P_k, the number of distinct length-k prefixes (k = 1..L).
    distinct = [int(step.nnz) for step in index.steps]
    edges = sum(distinct[1:])  # P_2 .. P_L: edges out of prefixes of length 1 .. L-1
    states = 1 + vocab + sum(distinct[1:-1])  # root, V first-token states, prefixes of length 2 .. L-1
    sizes = {
        "packed_csr": (edges + vocab) * 2 * _INT32,
        "indptr": (states + 2) * _INT32,
        "start_mask": vocab * _BOOL,
        "dense_mask": vocab**dense_depth * _BOOL,
        "dense_states": vocab**dense_depth * _INT32,
    }
    sizes["total"] = sum(sizes.values())
    return sizes
