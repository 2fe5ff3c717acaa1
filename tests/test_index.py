"""build_index against a brute-force trie, for every format, both sort paths, L 1..6, wide codebooks."""

from __future__ import annotations

import dataclasses
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.reference import reference_steps
from zerogr_build import InputError, build_index
from zerogr_build.base import memory as _memory
from zerogr_build.index import FormatPolicy, SidIndex, csr_gather, parse_step_formats
from zerogr_build.index.sort import _lexsort_layout, sort_and_mark


@st.composite
def catalogs(draw, max_steps: int = 6, max_codebook: int = 12):
    """(sids [N, L] int64, codebook_sizes): small codebooks so prefixes collide and rows get many children."""
    num_steps = draw(st.integers(1, max_steps))
    sizes = [draw(st.integers(1, max_codebook)) for _ in range(num_steps)]
    n = draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    sids = np.stack([rng.integers(0, v, n) for v in sizes], axis=1).astype(np.int64)
    if draw(st.booleans()):  # duplicates: several items share a SID
        sids = sids[rng.integers(0, n, n)]
    return sids, sizes


def assert_matches_reference(index: SidIndex, sids: np.ndarray) -> None:
    steps, leaves, leaf_items = reference_steps(sids)
    assert index.num_steps == len(steps)
    for t, (table, expected_rows) in enumerate(zip(index.steps, steps, strict=True)):
        assert table.rows == len(expected_rows)
        assert table.nnz == sum(len(r) for r in expected_rows)
        for r, expected in enumerate(expected_rows):
            tokens, next_rows = table.children(r)
            assert list(zip(tokens.tolist(), next_rows.tolist(), strict=True)) == expected, (t, r)
        widest = max(len(r) for r in expected_rows)
        assert table.max_slots == (table.codebook_size if table.format == "dense" else widest)
    assert index.num_leaves == len(leaves)
    assert [tuple(x) for x in index.leaf_sids().tolist()] == leaves
    assert index.item_order is not None
    for leaf, rows in leaf_items.items():
        lo, hi = index.leaf_offsets[leaf], index.leaf_offsets[leaf + 1]
        assert index.item_order[lo:hi].tolist() == rows


@settings(max_examples=150, deadline=None)
@given(catalogs(), st.sampled_from(["auto", "sparse", "dense", "mixed"]))
def test_tables_equal_brute_force_trie(catalog, fmt):
    sids, sizes = catalog
    if fmt == "mixed":
        fmt = ",".join(f"{t}={'dense' if t % 2 else 'sparse'}" for t in range(len(sizes)))
    index = build_index(sids, sizes, step_formats=fmt, workers=2)
    assert_matches_reference(index, sids)


@settings(max_examples=60, deadline=None)
@given(catalogs(max_steps=5, max_codebook=6))
def test_parallel_layout_equals_lexsort_layout(catalog):
    sids, sizes = catalog
    fast, simple = sort_and_mark(sids, sizes, workers=2), _lexsort_layout(sids)
    for a, b in zip(
        fast.prefix_tokens + fast.prefix_starts, simple.prefix_tokens + simple.prefix_starts, strict=True
    ):
        np.testing.assert_array_equal(a, b)
    np.testing.assert_array_equal(fast.leaf_offsets, simple.leaf_offsets)
    np.testing.assert_array_equal(fast.item_order, simple.item_order)


def test_large_buckets_use_radix_path_and_match_lexsort():
    rng = np.random.default_rng(7)
    sids = np.column_stack(
        [rng.integers(0, 3, 50_000), rng.zipf(1.5, 50_000) % 1000, rng.integers(0, 1000, 50_000)]
    )
    fast, simple = sort_and_mark(sids, [3, 1000, 1000], workers=2), _lexsort_layout(sids)
    np.testing.assert_array_equal(fast.item_order, simple.item_order)
    for a, b in zip(fast.prefix_tokens, simple.prefix_tokens, strict=True):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 40))
def test_codebooks_past_65536_use_int32_tokens_and_wide_fallback(seed, n):
    """V = 2^20 at six steps cannot pack into one word: the multi-word (lexsort) path builds the tables."""
    rng = np.random.default_rng(seed)
    sizes = [70_000, 2**20, 5, 2**20, 3, 2**20]
    sids = np.stack([rng.integers(0, min(v, 4), n) for v in sizes], axis=1)
    sids[:, 1] = rng.integers(0, 2**20, n) % 3 + 2**20 - 3
    index = build_index(sids, sizes, step_formats="sparse")
    assert index.steps[0].tokens.dtype == np.int32 and index.steps[2].tokens.dtype == np.uint16
    assert_matches_reference(index, sids)


def test_auto_format_picks_dense_for_full_steps_and_sparse_for_sparse_ones():
    rng = np.random.default_rng(0)
    sids = np.column_stack([rng.permutation(np.repeat(np.arange(64), 40)), rng.integers(0, 4096, 2560)])
    index = build_index(sids, [64, 4096])
    assert [s.format for s in index.steps] == ["dense", "sparse"]
    forced = build_index(sids, [64, 4096], policy=FormatPolicy(dense_min_share=0.0))
    assert [s.format for s in forced.steps] == ["dense", "dense"]
    capped = build_index(sids, [64, 4096], policy=FormatPolicy(dense_max_bytes=16))
    assert [s.format for s in capped.steps] == ["sparse", "sparse"]


def test_smallest_dtypes():
    index = build_index(np.array([[1, 2], [3, 4]]), [5, 70_000], step_formats="sparse")
    assert index.steps[0].tokens.dtype == np.uint16
    assert index.steps[1].tokens.dtype == np.int32
    assert index.steps[0].indptr.dtype == np.int32
    assert index.leaf_offsets.dtype == np.int32  # positions fit int32 below 2^31 items


@pytest.mark.parametrize(
    ("sids", "sizes", "message"),
    [
        (np.zeros((0, 3), dtype=np.int64), [4, 4, 4], "empty catalog"),
        (np.array([[0, 1], [2, 5]]), [4, 4], "row 1: token 5 at step 1"),
        (np.array([[0, -1]]), [4, 4], "row 0: token -1 at step 1"),
        (np.array([[0, 1]]), [4, 4, 4], "3 codebook sizes"),
        (np.array([[0.5, 1.0]]), [4, 4], "integers"),
        (np.array([0, 1]), [4], "2-D"),
    ],
)
def test_bad_input_is_an_input_error(sids, sizes, message):
    with pytest.raises(InputError, match=message):
        build_index(sids, sizes)


def test_step_formats_parsing():
    assert parse_step_formats("0=dense,2=sparse", 3) == {0: "dense", 1: "auto", 2: "sparse"}
    assert parse_step_formats(None, 2) == {0: "auto", 1: "auto"}
    assert parse_step_formats("dense", 2) == {0: "dense", 1: "dense"}
    for bad in ["0=csr", "5=dense", "csr", "x=dense"]:
        with pytest.raises(InputError):
            parse_step_formats(bad, 3)


# --- the shared CSR helpers (index/tables.py) -------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(
    counts=st.lists(st.integers(0, 5), min_size=0, max_size=12),
    picks=st.lists(st.integers(-2, 11), min_size=0, max_size=15),
    int32=st.booleans(),
)
def test_csr_gather_equals_brute_force(counts, picks, int32):
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32 if int32 else np.int64)
    rows = [r for r in picks if r < len(counts)]  # negative rows are padding, >= n an IndexError
    positions, got_counts = csr_gather(offsets, np.array(rows, dtype=np.int64))
    expected = [list(range(offsets[r], offsets[r + 1])) if r >= 0 else [] for r in rows]
    assert positions.dtype == np.int64 and got_counts.dtype == np.int64
    assert got_counts.tolist() == [len(e) for e in expected]
    assert positions.tolist() == [p for e in expected for p in e]
    if counts:
        with pytest.raises(IndexError):
            csr_gather(offsets, np.array([len(counts)]))


@settings(max_examples=40, deadline=None)
@given(catalog=catalogs(max_steps=4), fmt=st.sampled_from(["sparse", "dense"]))
def test_child_parents_and_leaf_items_equal_brute_force(catalog, fmt):
    sids, sizes = catalog
    index = build_index(sids, sizes, step_formats=fmt)
    steps, leaves, leaf_items = reference_steps(sids)
    for table, rows in zip(index.steps, steps, strict=True):
        # Flat child order is the next-row order: child j's parent is the row whose children include j.
        parents = {next_row: r for r, children in enumerate(rows) for _, next_row in children}
        assert table.child_parents().tolist() == [parents[j] for j in range(table.nnz)]
        assert table.format == fmt
    picks = np.array([len(leaves) - 1, -1, 0, -1, len(leaves) // 2])
    values, offsets = index.leaf_items(picks)  # catalog rows (in-memory index)
    got = [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    assert got == [leaf_items[j] if j >= 0 else [] for j in picks.tolist()]
    bare = dataclasses.replace(index, item_order=None)  # e.g. a bundle's index: leaf-order positions
    values, offsets = bare.leaf_items(picks)
    lo, hi = index.leaf_offsets[:-1], index.leaf_offsets[1:]
    expected = [list(range(lo[j], hi[j])) if j >= 0 else [] for j in picks.tolist()]
    assert [values[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:], strict=True)] == expected
    names = [f"item-{i}" for i in np.asarray(index.item_order)]  # a leaf-order items table (list)
    values, offsets = index.leaf_items(picks, names)
    got = [values[a:b] for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    assert got == [[f"item-{i}" for i in leaf_items[j]] if j >= 0 else [] for j in picks.tolist()]


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(0, 4000),
    buckets=st.integers(1, 2500),
    token_bits=st.integers(0, 12),
    distinct=st.integers(1, 300),
    segments=st.integers(1, 5),
    mapped=st.booleans(),
    chunks=st.integers(1, 40),
)
def test_bucket_scatter_and_sort_equal_a_full_sort(
    seed, n, buckets, token_bits, distinct, segments, mapped, chunks
):
    """The first-token scatter (in rounds, handing consumed source rows back) and the per-bucket sort give
    every bucket its words in ascending order of the whole word (tokens, then row): exactly
    np.lexsort((words, first)), for skewed buckets, few distinct token values (long runs of equal SIDs),
    no token bits, any number of parallel segments, and sources that are fresh mappings or plain arrays.
    The sort's marks (the leaf-start bit of every position, new prefixes per chunk and step, also where
    chunks share a byte of bits) equal a brute-force scan of the sorted (first, tokens) pairs."""
    rng = np.random.default_rng(seed)
    row_bits = max(1, int(n).bit_length())
    first = (rng.zipf(1.3, n) % buckets).astype(np.uint16)
    token_values = rng.integers(0, 1 << token_bits, distinct, dtype=np.uint64)
    tokens = token_values[rng.integers(0, distinct, n)] if n else np.zeros(0, np.uint64)
    words = (tokens << np.uint64(row_bits)) | np.arange(n, dtype=np.uint64)
    order = np.lexsort((words, first))
    expect = words[order]
    src_first, src_words = first.copy(), words.copy()
    with mock.patch.object(_memory, "MAPPED_MIN_BYTES", 0 if mapped else _memory.MAPPED_MIN_BYTES):
        if mapped and n:  # tiny fresh mappings, so their consumed pages are really handed back
            src_first, src_words = _memory.fresh_zeros(n, np.uint16), _memory.fresh_zeros(n, np.uint64)
            src_first[:], src_words[:] = first, words
        got, leaf_bits, counts = _scatter_and_sort(
            src_first, src_words, first, buckets, segments, row_bits, token_bits, chunks
        )
    np.testing.assert_array_equal(got, expect)
    pairs = list(zip(first[order].tolist(), tokens[order].tolist(), strict=True))
    want = [
        0 if p == 0 or pairs[p][0] != pairs[p - 1][0] else 1 if pairs[p] != pairs[p - 1] else 2
        for p in range(n)
    ]
    assert np.unpackbits(leaf_bits, bitorder="little")[:n].tolist() == [int(f < 2) for f in want]
    assert counts.sum(axis=0).tolist() == [sum(f <= t for f in want) for t in range(2)]


def _scatter_and_sort(src_first, src_words, first, buckets, segments, row_bits, token_bits, chunks):
    from zerogr_build.index import in_place
    from zerogr_build.index.buckets import merge_edge_bits, sort_and_mark_buckets
    from zerogr_build.index.sort import _chunk_buckets, _segment_histograms

    n = first.shape[0]
    cuts = np.linspace(0, n, segments + 1).astype(np.int64)
    hist = _segment_histograms(first, cuts, buckets)
    starts = np.zeros(buckets + 1, dtype=np.int64)
    np.cumsum(hist.sum(axis=0), out=starts[1:])
    offsets = starts[:-1][None, :] + np.cumsum(hist, axis=0) - hist
    got = in_place.scatter_releasing(src_first, src_words, cuts, offsets)
    chunks = _chunk_buckets(starts, chunks)
    leaf_bits = np.zeros((n + 7) // 8, dtype=np.uint8)
    edges = np.zeros((chunks.shape[0] - 1, 2), dtype=np.uint8)
    shifts = np.array([0, row_bits], dtype=np.int64)  # SIDs of two steps: first, then the token bits
    counts = sort_and_mark_buckets(got, starts, chunks, row_bits, token_bits, shifts, leaf_bits, edges)
    merge_edge_bits(leaf_bits, edges, starts, chunks)
    return got, leaf_bits, counts


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), max_size=10, unique=True), min_size=1, max_size=12))
def test_dense_next_equals_brute_force(rows):
    """A dense step written from its CSR form: next[r, v] is the flat number of child (r, v), -1 elsewhere."""
    from zerogr_build.index.dense import dense_next

    indptr = np.cumsum([0] + [len(r) for r in rows]).astype(np.int32)
    tokens = np.array([v for r in rows for v in sorted(r)], dtype=np.uint16)
    want = np.full((len(rows), 10), -1, dtype=np.int32)
    j = 0
    for r, children in enumerate(rows):
        for v in sorted(children):
            want[r, v] = j
            j += 1
    got = dense_next(indptr, tokens, len(rows), 10)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, want)
