"""The STATIC-style baseline: Google STATIC's index build, ported to plain vectorised numpy.

A port of `build_static_index` from youtube/static-constraint-decoding (`static_decoding/csr_utils.py`,
Apache-2.0), kept step for step, with the same dtypes and intermediate arrays so that its time and memory
are STATIC's: the same trie states, the same edge order, the same padding rows. STATIC takes sorted SIDs;
`sort_unique_sids` gives it that from a raw catalog the way STATIC's own tests do (np.lexsort), and drops
exact duplicates, which STATIC would map onto the same path anyway.

Used by scripts/bench_build.py (timing and bytes) and tests/test_static_layout.py (exact byte counts), as
`from benchmarks.static_baseline import ...` from the repository root.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class StaticIndex(NamedTuple):
    """STATIC's arrays. E = P_2 + ... + P_L edges (P_k distinct length-k prefixes), S states.

    packed_csr   int32 [E + V, 2]  [token, next_state] per edge, grouped by parent state; V padding rows
    indptr       int32 [S + 2]     CSR row pointers over states, then one more for the padding rows
    layer_max_branches tuple[int]  largest child count per level (L entries)
    start_mask   bool [V]          valid first tokens
    dense_mask   bool [V]*d        valid length-d prefixes
    dense_states int32 [V]*d       state reached after the first d tokens
    """

    packed_csr: np.ndarray
    indptr: np.ndarray
    layer_max_branches: tuple[int, ...]
    start_mask: np.ndarray
    dense_mask: np.ndarray
    dense_states: np.ndarray

    def nbytes(self) -> dict[str, int]:
        """Bytes per array (same keys as zerogr_build.index.static_layout.static_layout_bytes) + total."""
        sizes = {
            "packed_csr": int(self.packed_csr.nbytes),
            "indptr": int(self.indptr.nbytes),
            "start_mask": int(self.start_mask.nbytes),
            "dense_mask": int(self.dense_mask.nbytes),
            "dense_states": int(self.dense_states.nbytes),
        }
        sizes["total"] = sum(sizes.values())
        return sizes


def sort_unique_sids(raw_sids: np.ndarray) -> np.ndarray:
    """Distinct rows of raw SIDs [N, L] in lexicographic order (np.lexsort, as STATIC's tests sort)."""
    order = np.lexsort(raw_sids.T[::-1])
    ordered = raw_sids[order]
    keep = np.ones(ordered.shape[0], dtype=bool)
    keep[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    return ordered[keep]


def build_static_index(sorted_sids: np.ndarray, vocab_size: int, d: int = 2) -> StaticIndex:
    """STATIC's index of sorted SIDs [N, L] (any integer dtype), one vocabulary of `vocab_size` tokens."""
    n, num_levels = sorted_sids.shape
    if d >= num_levels:
        raise ValueError(f"d ({d}) must be less than the SID length L ({num_levels})")

    # 1. Valid first tokens.
    start_mask = np.zeros(vocab_size, dtype=bool)
    start_mask[np.unique(sorted_sids[:, 0])] = True

    # 2. Where each distinct prefix starts. Rows are sorted, so row i starts a new length-(k+1) prefix
    #    exactly when the first column where it differs from row i-1 is <= k.
    differs = sorted_sids[1:] != sorted_sids[:-1]
    first_diff = np.full(n - 1, num_levels, dtype=np.int8)
    any_diff = differs.any(axis=1)
    first_diff[any_diff] = differs[any_diff].argmax(axis=1)
    starts_prefix = np.zeros((n, num_levels), dtype=bool)
    starts_prefix[0, :] = True
    for level in range(num_levels):
        starts_prefix[1:, level] = first_diff <= level

    # 3. State ids of every row's prefixes of length 1 .. L-1. Length 1: token + 1 (ids 1..V, fixed).
    #    Longer: numbered in order after the V first-token states; rows that repeat a prefix inherit its
    #    id through a running maximum (ids grow down the sorted rows).
    state_ids = np.zeros((n, num_levels - 1), dtype=np.int32)
    state_ids[:, 0] = sorted_sids[:, 0].astype(np.int32) + 1
    level_id_ranges = []
    next_id = vocab_size + 1
    for level in range(1, num_levels - 1):
        new_rows = starts_prefix[:, level]
        count = int(np.sum(new_rows))
        level_id_ranges.append((next_id, next_id + count))
        state_ids[new_rows, level] = np.arange(next_id, next_id + count, dtype=np.int32)
        state_ids[:, level] = np.maximum.accumulate(state_ids[:, level])
        next_id += count
    num_states = next_id

    # 4. Edges (parent state, token, child state) out of every prefix of length 1 .. L-1; edges into a
    #    full SID point to state 0 (terminal).
    parent_parts, token_parts, child_parts = [], [], []
    for level in range(1, num_levels):
        new_rows = starts_prefix[:, level]
        parents = state_ids[new_rows, level - 1]
        parent_parts.append(parents)
        token_parts.append(sorted_sids[new_rows, level].astype(np.int32))
        if level < num_levels - 1:
            child_parts.append(state_ids[new_rows, level])
        else:
            child_parts.append(np.zeros_like(parents, dtype=np.int32))

    # 5. Dense tables for the first d tokens.
    dense_shape = (vocab_size,) * d
    dense_mask = np.zeros(dense_shape, dtype=bool)
    dense_states = np.zeros(dense_shape, dtype=np.int32)
    dense_index = tuple(sorted_sids[:, level].astype(np.int32) for level in range(d))
    dense_mask[dense_index] = True
    dense_states[dense_index] = state_ids[:, d - 1]

    # 6. CSR over states. Edges are already grouped by parent: level by level, and within a level in
    #    sorted order, so parent ids ascend.
    parents = np.concatenate(parent_parts)
    tokens = np.concatenate(token_parts)
    children = np.concatenate(child_parts)
    del state_ids, starts_prefix, parent_parts, token_parts, child_parts
    counts = np.bincount(parents, minlength=num_states)
    indptr = np.zeros(num_states + 1, dtype=np.int32)
    indptr[1:] = np.cumsum(counts)

    # 7. Largest branching per level (static shapes for compiled kernels).
    max_branches = [int(np.sum(start_mask))]
    first_level_counts = counts[1 : vocab_size + 1]
    max_branches.append(int(first_level_counts.max()) if len(first_level_counts) else 0)
    for lo, hi in level_id_ranges:
        level_counts = counts[lo:hi] if lo < len(counts) else counts[:0]
        max_branches.append(int(level_counts.max()) if len(level_counts) else 0)
    max_branches += [1] * (num_levels - len(max_branches))

    # 8. Pack [token, next_state] pairs, plus V padding rows (token V, state 0) for out-of-range reads.
    all_tokens = np.concatenate([tokens, np.full(vocab_size, vocab_size, dtype=np.int32)])
    all_children = np.concatenate([children, np.zeros(vocab_size, dtype=np.int32)])
    indptr = np.append(indptr, indptr[-1] + vocab_size)
    packed_csr = np.ascontiguousarray(np.vstack([all_tokens, all_children]).T)
    return StaticIndex(packed_csr, indptr, tuple(max_branches), start_mask, dense_mask, dense_states)


def build_static_from_raw(raw_sids: np.ndarray, vocab_size: int, d: int = 2) -> StaticIndex:
    """The whole baseline from a raw catalog: sort + dedupe, then STATIC's build."""
    return build_static_index(sort_unique_sids(raw_sids), vocab_size, d)
