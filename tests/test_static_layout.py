"""static_layout_bytes (counts from our tables) against a faithful port of STATIC's build (real arrays)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks import static_baseline
from zerogr_build.index import build_index
from zerogr_build.index.static_layout import static_layout_bytes


@st.composite
def catalogs(draw):
    """(raw SIDs [N, L] int64 with duplicates and unsorted rows, codebook sizes per step)."""
    num_steps = draw(st.integers(2, 5))
    sizes = draw(st.lists(st.integers(1, 12), min_size=num_steps, max_size=num_steps))
    n = draw(st.integers(1, 40))
    rows = draw(st.lists(st.tuples(*[st.integers(0, v - 1) for v in sizes]), min_size=n, max_size=n))
    sids = np.array(rows, dtype=np.int64).reshape(n, num_steps)
    if draw(st.booleans()):  # repeat some rows: several items per SID
        sids = np.concatenate([sids, sids[: draw(st.integers(1, n))]])
    return sids, sizes


def _walk_static(static, sid, d):
    """Follow one SID through STATIC's dense tables then its CSR; returns the final state (0 if complete)."""
    assert static.start_mask[sid[0]]
    assert static.dense_mask[tuple(sid[:d])]
    state = int(static.dense_states[tuple(sid[:d])])
    for level in range(d, len(sid)):
        edges = static.packed_csr[static.indptr[state] : static.indptr[state + 1]]
        hits = edges[edges[:, 0] == sid[level]]
        assert hits.shape[0] == 1, f"token {sid[level]} at level {level} not exactly once under state {state}"
        state = int(hits[0, 1])
    return state


@settings(max_examples=60, deadline=None)
@given(catalogs(), st.integers(1, 3))
def test_counts_equal_the_ported_build(catalog, d):
    sids, sizes = catalog
    vocab = max(sizes)
    dense_depth = min(d, sids.shape[1] - 1)
    static = static_baseline.build_static_from_raw(sids, vocab, dense_depth)
    assert static_layout_bytes(build_index(sids, sizes), d) == static.nbytes()


@settings(max_examples=40, deadline=None)
@given(catalogs(), st.integers(1, 3))
def test_port_is_the_catalog_trie(catalog, d):
    """The port is only a fair yardstick if it is right: every SID walks to the terminal state, and its
    edges are exactly the distinct prefixes of length 2..L."""
    sids, sizes = catalog
    num_steps = sids.shape[1]
    dense_depth = min(d, num_steps - 1)
    vocab = max(sizes)
    static = static_baseline.build_static_from_raw(sids, vocab, dense_depth)
    for sid in sids:
        assert _walk_static(static, sid, dense_depth) == 0
    distinct = {k: {tuple(row[:k]) for row in sids.tolist()} for k in range(1, num_steps + 1)}
    edges = sum(len(distinct[k]) for k in range(2, num_steps + 1))
    assert static.packed_csr.shape == (edges + vocab, 2)
    assert static.packed_csr.dtype == np.int32 and static.indptr.dtype == np.int32
    assert static.start_mask.sum() == len(distinct[1])
    assert static.dense_mask.sum() == len(distinct[dense_depth])
    assert len(static.layer_max_branches) == num_steps


def test_known_catalog():
    # V=4, L=3. Distinct prefixes: length 2 -> (0,1), (2,3); length 3 -> (0,1,2), (0,1,3), (2,3,0).
    sids = np.array([[2, 3, 0], [0, 1, 3], [0, 1, 2], [0, 1, 2]])
    sizes = static_layout_bytes(build_index(sids, [4, 4, 4]), d=2)
    edges = 2 + 3
    states = 1 + 4 + 2
    assert sizes == {
        "packed_csr": (edges + 4) * 8,
        "indptr": (states + 2) * 4,
        "start_mask": 4,
        "dense_mask": 16,
        "dense_states": 64,
        "total": (edges + 4) * 8 + (states + 2) * 4 + 4 + 16 + 64,
    }


def test_single_token_sids_have_no_static_layout():
    with pytest.raises(ValueError, match="at least 2 tokens"):
        static_layout_bytes(build_index(np.array([[1], [2]]), [4]))
