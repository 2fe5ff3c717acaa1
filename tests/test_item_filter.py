"""The item-constraint index math against brute force, part by part (the end-to-end oracle is
test_constraints.py): the masked step tables and per-row set words of a Resident, the rows a search's
exclusions empty (kills), and the id -> position lookup."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.test_constraints import BATCH, allowed_rows, random_case
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.items.constraints import ItemIds, ItemMask, ItemSets, row_item_bounds
from zerogr_build.testing import SeededModel


def decoder_for(seed: int, length: int, num_sets: int, formats: str):
    sids, sizes, available, sets, include, exclude = random_case(seed, length, num_sets)
    index = build_index(sids, sizes, step_formats=formats)
    dec = Decoder(index, SeededModel(sizes, 1, batch_size=BATCH).layers(), slot_caps=1)
    dec.set_item_sets(ItemSets.from_mapping(index, sets))
    dec.set_availability(ItemMask.from_bool(index, available))
    position = np.empty(len(sids), dtype=np.int64)  # catalog row -> leaf-order position
    position[np.asarray(index.item_order)] = np.arange(len(sids))
    return dec, index, sids, available, sets, include, exclude, position


def rows_meeting(index, positions: np.ndarray) -> list[set[int]]:
    """Per step s = 1..L: the rows of step s holding at least one of the leaf-order positions."""
    return [
        {int(r) for r in np.searchsorted(bounds, positions, side="right") - 1}
        for bounds in row_item_bounds(index)
    ]


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 3),
    num_sets=st.sampled_from([1, 3, 9, 21, 70]),
    formats=st.sampled_from(["sparse", "dense", "auto"]),
)
def test_resident_tables_and_set_words_match_brute_force(seed, length, num_sets, formats):
    """Masked tables: a child is -1 iff it is not in the catalog or its row has no available item. Set words:
    bit i of a row's word iff the row has an available item of set i; the ANY bit iff any available item."""
    dec, index, sids, available, sets, _, _, position = decoder_for(seed, length, num_sets, formats)
    resident = dec._resident
    valid = rows_meeting(index, position[np.flatnonzero(available)])
    for t, table in enumerate(dec.steps):
        masked = resident.tables[t]
        if table.next is not None:
            nxt = table.next.numpy()
            expect = np.where((nxt >= 0) & np.isin(nxt, sorted(valid[t])), nxt, -1)
        else:
            tokens = table.tokens.numpy()
            expect = np.where(np.isin(np.arange(table.nnz), sorted(valid[t])), tokens, -1)
        np.testing.assert_array_equal(masked.numpy(), expect)
    set_bits = resident.set_bits
    for s, words in enumerate(resident.row_bits, start=1):
        rows = resident.space.rows[s - 1]
        words = words.numpy()
        assert (words[rows:] == 0).all()  # the zero padding past the last row
        for i in range(num_sets + 1):  # i == num_sets: ANY
            members = available if i == num_sets else available & np.isin(np.arange(len(sids)), sets[f"s{i}"])
            has = rows_meeting(index, position[np.flatnonzero(members)])[s - 1]
            bit = (words[:rows] & set_bits.word(i).view(words.dtype)) != 0
            bit = bit.any(axis=1) if bit.ndim == 2 else bit
            assert set(np.flatnonzero(bit).tolist()) == has, (s, i)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    length=st.integers(1, 3),
    num_sets=st.sampled_from([1, 3, 21, 70]),
    formats=st.sampled_from(["sparse", "dense", "auto"]),
)
def test_kills_are_exactly_the_rows_exclusions_empty(seed, length, num_sets, formats):
    """Per step, the (request, row) kills of a search are the rows holding an item the request may return
    without its exclude list, and none with it - computed by brute force from each request's allowed
    items; for dense step tables the kill's parent row and token are the row's."""
    dec, index, sids, available, sets, include, exclude, position = decoder_for(
        seed, length, num_sets, formats
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        constraints = dec._request_constraints(BATCH, "filter_first", include, exclude)
    for s in range(1, length + 1):
        stride = dec._resident.space.rows[s - 1] + 1
        kills = constraints.kills[s - 1]
        got = set() if kills is None else {(int(q) // stride, int(q) % stride) for q in kills.slot_query}
        expect = set()
        for b in range(BATCH):
            before = rows_meeting(index, position[allowed_rows(len(sids), available, sets, include[b], [])])
            after = rows_meeting(
                index, position[allowed_rows(len(sids), available, sets, include[b], exclude[b])]
            )
            expect |= {(b, r) for r in before[s - 1] - after[s - 1]}
        assert got == expect, s
        table = index.steps[s - 1]
        if kills is not None and table.next is not None:  # (parent row, token) name the killed child
            parents = dec._resident.space.rows[s - 2] + 1 if s >= 2 else 2
            nxt = np.asarray(table.next)
            for q, beam_q, column in zip(kills.slot_query, kills.beam_query, kills.column, strict=True):
                assert int(beam_q) // parents == int(q) // stride
                assert nxt[int(beam_q) % parents, int(column)] == int(q) % stride


@pytest.mark.parametrize("static", [False, True])
@pytest.mark.parametrize("formats", ["sparse", "dense", "auto"])
def test_device_path_of_the_kill_lookups_equals_the_numpy_one(monkeypatch, static, formats):
    """On the CPU the kill lookups run in numpy; the torch path (what CUDA runs) must decode the same."""
    from zerogr_build.runtime.items import filter as items_filter

    for seed in range(6):
        sids, sizes, available, sets, include, exclude = random_case(seed, 3, 9)
        model = SeededModel(sizes, seed, batch_size=BATCH, bias=True)
        index = build_index(sids, sizes, step_formats=formats)
        dec = Decoder(index, model.layers(), slot_caps=1, static_shapes=static)
        dec.set_availability(ItemMask.from_bool(index, available))
        dec.set_item_sets(ItemSets.from_mapping(index, sets))
        results = []
        for numpy_path in (True, False):
            monkeypatch.setattr(items_filter, "NUMPY_ON_CPU", numpy_path)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(dec.search(model.step_fn, BATCH, 6, include=include, exclude=exclude))
        assert torch.equal(results[0].sids, results[1].sids)
        assert torch.equal(results[0].scores, results[1].scores)


@pytest.mark.parametrize("kind", ["dense", "sparse", "strings"])
def test_item_ids_lookup_matches_a_dict(kind):
    """Dense numeric ids take the direct table, sparse ones the sorted search, strings the dict: all give
    the position of each known id and -1 for unknown ones (and positions() drops them with one warning)."""
    rng = np.random.default_rng(4)
    ids = {
        "dense": rng.permutation(500) + 7,
        "sparse": rng.choice(10**12, 500, replace=False),
        "strings": np.array([f"item{i}" for i in rng.permutation(500)], dtype=object),
    }[kind]

    class Source:
        index = build_index(rng.integers(0, 4, size=(500, 2)), (4, 4))

        def items(self):
            return ids

    lookup = ItemIds(Source())
    assert (lookup._direct is not None) == (kind == "dense")
    table = {v: p for p, v in enumerate(ids.tolist())}
    unknown = [-1, 10**13, 3] if kind != "strings" else ["nope", "item-1"]
    queries = list(rng.choice(ids, 50)) + unknown
    expect = [table.get(v, -1) for v in queries]
    assert lookup.lookup(np.asarray(queries, dtype=ids.dtype)).tolist() == expect
    with pytest.warns(UserWarning, match=f"{sum(e < 0 for e in expect)} of {len(queries)}"):
        assert lookup.positions(np.asarray(queries, dtype=ids.dtype)).tolist() == [
            e for e in expect if e >= 0
        ]


@settings(max_examples=80, deadline=None)
@given(
    unsigned=st.booleans(),
    dense=st.booleans(),
    seed=st.integers(0, 2**31 - 1),
    query_kind=st.sampled_from(["int64", "uint64", "python"]),
)
def test_item_ids_lookup_compares_values_in_the_catalogs_domain(unsigned, dense, seed, query_kind):
    """Ids are matched by their integer value: against a dict of the catalog's Python ints, for int64 and
    uint64 catalogs (dense: the direct table, else the sorted search), whatever the query's integer type
    (G17: -k never matches 2^64 - k). Extreme values of both domains are always in the mix."""
    rng = np.random.default_rng(seed)
    edges = [0, 1, 2**63 - 1, 2**63, 2**64 - 1] if unsigned else [-(2**63), -1, 0, 1, 2**63 - 1]
    if dense:
        base = int(rng.integers(0, 2**20)) + (2**64 - 2**21 if unsigned and rng.random() < 0.5 else 0)
        values = [base + int(v) for v in rng.permutation(60)]
    else:
        some = rng.integers(-(2**40), 2**40, 50).tolist()
        picked = {edges[i] for i in rng.integers(0, len(edges), 3)}
        values = sorted(picked | {v for v in some if not unsigned or v >= 0})
    ids = np.asarray(values, dtype=np.uint64 if unsigned else np.int64)

    class Source:
        index = build_index(rng.integers(0, 4, size=(len(values), 2)), (4, 4))

        def items(self):
            return ids

    lookup = ItemIds(Source())
    assert (lookup._direct is not None) == (dense and len(values) > 0)
    table = {v: p for p, v in enumerate(ids.tolist())}
    pool = values + [-v for v in values] + [2**64 - 1, -1, 2**64 - 1 - values[0], -(2**63), 2**63]
    pool += [(v + 2**64) % 2**64 for v in values if v < 0]  # the uint64 twin of each negative id
    queries = [int(q) for q in rng.choice(np.asarray(pool, dtype=object), 40)]
    if query_kind == "int64":
        queries = [q for q in queries if -(2**63) <= q < 2**63]
        arr = np.asarray(queries, dtype=np.int64)
    elif query_kind == "uint64":
        queries = [q for q in queries if 0 <= q < 2**64]
        arr = np.asarray(queries, dtype=np.uint64)
    else:
        arr = queries
    assert lookup.lookup(arr).tolist() == [table.get(q, -1) for q in queries]


@settings(max_examples=150, deadline=None)
@given(
    items=st.integers(1, 400),
    density=st.floats(0.0, 1.0),
    row_share=st.floats(0.01, 1.0),
    seed=st.integers(0, 2**31 - 1),
)
def test_swap_kernels_match_a_prefix_sum(items, density, row_share, seed):
    """The swap's rank structure and its one-pass kernels against np.cumsum over the mask: counts of
    arbitrary runs, and per row (runs that start anywhere in a word, span several words, or share one)
    the masked token and the validity. Row runs are random cuts of 1..400 items, so words end mid-row."""
    from zerogr_build.runtime.items._mask_kernels import masked_children, valid_rows
    from zerogr_build.runtime.items.space import AvailabilityRank, run_starts

    rng = np.random.default_rng(seed)
    available = rng.random(items) < density
    cum = np.concatenate([[0], np.cumsum(available)])
    rank = AvailabilityRank.of(available)
    lo = rng.integers(0, items + 1, size=50)
    hi = np.maximum(lo, rng.integers(0, items + 1, size=50))
    np.testing.assert_array_equal(rank.count(lo, hi), cum[hi] - cum[lo])
    cuts = np.flatnonzero(rng.random(items - 1) < row_share) + 1
    bounds = np.concatenate([[0], cuts, [items]]).astype(np.int64)
    rows = bounds.shape[0] - 1
    tokens = rng.integers(0, 2**31 - 1, size=rows).astype(np.int32)
    has = cum[bounds[1:]] > cum[bounds[:-1]]
    out = np.full(rows, 7, dtype=np.int32)
    masked_children(run_starts(bounds, items), rank.words, tokens, out)
    np.testing.assert_array_equal(out, np.where(has, tokens, -1))
    valid = np.zeros(rows, dtype=bool)
    valid_rows(run_starts(bounds, items), rank.words, valid)
    np.testing.assert_array_equal(valid, has)


def test_swaps_reuse_retired_tables_but_never_a_held_snapshot():
    """A swap writes into the buffers of a retired mask's tables only once nothing holds them: a search
    started before several swaps keeps its own tables bit for bit, and once it ends a swap writes into
    buffers it had before instead of new ones - with the right contents."""
    dec, index, sids, *_ = decoder_for(5, 3, 3, "sparse")
    rng = np.random.default_rng(0)
    masks = [ItemMask.from_bool(index, rng.random(len(sids)) < 0.5) for _ in range(4)]
    sparse = [t for t, table in enumerate(dec.steps) if table.next is None]
    assert sparse

    def pointers() -> set[int]:
        return {dec._resident.tables[t].data_ptr() for t in sparse}

    dec.set_availability(masks[0])
    held = dec.start(BATCH, 4)  # holds the first mask's snapshot
    snapshot = [dec._resident.tables[t].clone() for t in sparse]
    first, seen = pointers(), pointers()
    for mask in masks[1:] * 2:
        dec.set_availability(mask)
        assert not first & pointers()
        seen |= pointers()
    for kept, t in zip(snapshot, sparse, strict=True):
        assert torch.equal(kept, held.constraints.resident.tables[t])
    del held
    dec.set_availability(masks[0])
    assert pointers() <= seen
    valid = rows_meeting(index, np.flatnonzero(masks[0].available))  # the mask is in leaf order
    for t in sparse:
        tokens = dec.steps[t].tokens.numpy()
        expect = np.where(np.isin(np.arange(tokens.shape[0]), sorted(valid[t])), tokens, -1)
        np.testing.assert_array_equal(dec._resident.tables[t].numpy(), expect)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    rows=st.integers(1, 12),
    masked=st.booleans(),
    shuffled=st.booleans(),
)
def test_plain_step_kills_match_brute_force_in_any_entry_order(seed, rows, masked, shuffled):
    """plain_step_kills: a (request, row) pair is killed iff its entries are all the row's available items,
    and the entries of killed pairs are kept; entries given out of (request, row) order are grouped as
    sorted ones are."""
    from zerogr_build.runtime.items._kill_kernels import plain_step_kills
    from zerogr_build.runtime.items.space import AvailabilityRank

    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 5, rows)
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    items = int(bounds[-1])
    available = rng.random(items) < 0.7 if masked else np.ones(items, dtype=bool)
    rank = AvailabilityRank.of(available)
    drawn = zip(rng.integers(0, 3, 30).tolist(), rng.integers(0, items, 30).tolist(), strict=True)
    pairs = sorted({(b, p) for b, p in drawn if available[p]})
    req = np.asarray([b for b, _ in pairs], dtype=np.int64)
    pos = np.asarray([p for _, p in pairs], dtype=np.int64)
    row = np.searchsorted(bounds, pos, side="right") - 1
    if shuffled:
        order = rng.permutation(req.shape[0])
        req, pos, row = req[order], pos[order], row[order]
    killed, keep = plain_step_kills(req, row, rows, bounds, rank.words, rank.before, masked)
    groups: dict[tuple[int, int], int] = {}
    for b, r in zip(req.tolist(), row.tolist(), strict=True):
        groups[(b, r)] = groups.get((b, r), 0) + 1
    dead = {
        key for key, n in groups.items() if n == int(available[bounds[key[1]] : bounds[key[1] + 1]].sum())
    }
    assert killed.tolist() == sorted(b * rows + r for b, r in dead)
    assert keep.tolist() == [(b, r) in dead for b, r in zip(req.tolist(), row.tolist(), strict=True)]
