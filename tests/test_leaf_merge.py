"""The leaf-order merge of `zerogr diff` (bundle/leaf_merge.merge_leaves, and diff_versions around it)
against brute force (Python dicts by item id): which ids are under the same SID in both versions, which
are left over, and the diff's counts when SIDs are shared by several items, ids move within and between
leaves, the codebooks differ, SIDs take more than 64 bits, and the leftovers are spilled."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.bundle import diff as diff_module
from zerogr_build.bundle import id_match as im
from zerogr_build.bundle import leaf_merge as lm
from zerogr_build.bundle.diff import diff_versions

from .test_diff import publish


def _strings(ids: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    return offsets, np.frombuffer(b"".join(ids), dtype=np.uint8)


@st.composite
def two_sides(draw):
    """Two versions as (id, SID key row) lists in leaf order: SIDs drawn from a small pool (several ids
    per SID), ids partly shared, a shared id keeping its SID, moving to another SID (maybe one another id
    left), or to a SID only one side has; key words 1 to 3 with values past 2^63 (> 64-bit SIDs)."""
    words = draw(st.integers(1, 3))
    word = st.sampled_from([0, 1, 2, 2**63, 2**64 - 1])
    pool = draw(st.lists(st.tuples(*[word] * words), min_size=1, max_size=8, unique=True))
    ids = draw(st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=80))
    a, b = {}, {}
    for i in ids:
        where = draw(st.sampled_from(["a", "b", "both", "both", "both"]))
        sid = draw(st.sampled_from(pool))
        if where in ("a", "both"):
            a[i] = sid
        if where in ("b", "both"):
            b[i] = sid if draw(st.booleans()) else draw(st.sampled_from(pool))
    return a, b, words


def _leaf_order(side: dict, words: int, rng: np.random.Generator) -> tuple[list, np.ndarray]:
    """(ids, keys uint64 [n, W]) sorted by SID, ids within a SID in a random (catalog) order."""
    ids = list(side)
    rng.shuffle(ids)
    ids.sort(key=lambda i: side[i])  # stable: the shuffled order stays within a SID
    keys = np.array([side[i] for i in ids], dtype=np.uint64).reshape(len(ids), words)
    return ids, keys


def _merge_in_batches(a, b, sizes_a, sizes_b, pairs_limit):
    """Feed merge_leaves the two sides in batches as diff._Match.merge does (each batch `sizes` items,
    extended to the end of the leaf it ends in; a side reads its next batch once its buffer is used up):
    returns (same, (leftover ids of a, leftover ids of b))."""
    sides = [list(a), list(b)]  # ids, keys, hashes, bytes
    starts, ends, final = [0, 0], [0, 0], [False, False]
    same, left = 0, ([], [])
    for side, sizes in zip(sides, (sizes_a, sizes_b), strict=True):
        side.append(list(sizes))
    while True:
        for s, (ids, keys, _, _, sizes) in enumerate(sides):
            if starts[s] == ends[s] and not final[s]:
                if ends[s] == len(ids):
                    final[s] = True
                    continue
                end = min(ends[s] + (sizes.pop(0) if sizes else 5), len(ids))
                while end < len(ids) and (keys[end] == keys[end - 1]).all():  # to the end of its leaf
                    end += 1
                ends[s] = end
        views = []
        for (_, keys, hashes, strings, _), lo, hi in zip(sides, starts, ends, strict=True):
            strs = None if strings is None else (strings[0][lo : hi + 1], strings[1])
            views.append((keys[lo:hi], hashes[lo:hi], strs))
        (ak, ah, ab), (bk, bh, bb) = views
        got = lm.merge_leaves(
            ak,
            ah,
            bk,
            bh,
            a_final=final[0],
            b_final=final[1],
            a_bytes=ab,
            b_bytes=bb,
            pairs_limit=pairs_limit,
        )
        same += got.same
        for s, (mask, stop) in enumerate(((got.a_left, got.a_stop), (got.b_left, got.b_stop))):
            assert mask.shape[0] == stop
            left[s].extend(sides[s][0][starts[s] + k] for k in np.flatnonzero(mask))
            starts[s] += stop
        if final[0] and final[1]:
            assert starts == ends
            return same, left


@settings(deadline=None, max_examples=200)
@given(
    sides=two_sides(),
    strings=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
    batches=st.lists(st.integers(1, 9), max_size=30),
    pairs_limit=st.sampled_from([0, 1, 4096]),
)
def test_merge_leaves_finds_exactly_the_ids_under_the_same_sid_on_both_sides(
    sides, strings, seed, batches, pairs_limit
):
    """Any batch sizes, pair loops or sorted runs of a large leaf: `same` is the number of ids with one SID
    in both versions, and the leftovers of each side are exactly its other ids."""
    a, b, words = sides
    rng = np.random.default_rng(seed)
    prepared = []
    for side in (a, b):
        ids, keys = _leaf_order(side, words, rng)
        if strings:
            texts = [str(i).encode() for i in ids]
            offsets, data = _strings(texts)
            prepared.append((ids, keys, im.hash_byte_ids(offsets, data, seed), (offsets, data)))
        else:
            prepared.append((ids, keys, im.hash_int_ids(np.array(ids, dtype=np.int64), seed), None))
    split = len(batches) // 2
    same, (left_a, left_b) = _merge_in_batches(*prepared, batches[:split], batches[split:], pairs_limit)
    kept = {i for i in a.keys() & b.keys() if a[i] == b[i]}
    assert same == len(kept)
    assert sorted(left_a) == sorted(a.keys() - kept)
    assert sorted(left_b) == sorted(b.keys() - kept)


def test_merge_leaves_refuses_items_out_of_leaf_order():
    keys = np.array([[2], [1]], dtype=np.uint64)
    hashes = im.hash_int_ids(np.array([1, 2]))
    with pytest.raises(ValueError, match="leaf order"):
        lm.merge_leaves(keys, hashes, keys[:1], hashes[:1], a_final=True, b_final=True)


@st.composite
def churned_versions(draw):
    """Two catalogs (id -> SID) over few SIDs (several items each): ids kept with their SID, moved within
    the codebooks, removed and added; codebook sizes may differ per step, narrow or past 64 bits a SID."""
    wide = draw(st.booleans())
    steps = 3 if wide else draw(st.integers(1, 3))
    size = st.integers(2**22, 2**31 - 2) if wide else st.integers(1, 4)  # wide: 66 to 93 bits a SID
    sizes_a = tuple(draw(st.lists(size, min_size=steps, max_size=steps)))
    sizes_b = tuple(max(1, s + draw(st.sampled_from([0, 0, -1, 1]))) for s in sizes_a)
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    common = np.minimum(sizes_a, sizes_b)
    pool = rng.integers(0, common, size=(draw(st.integers(1, 6)), steps))  # SIDs both codebooks hold
    n = draw(st.integers(1, 70))
    ids = list(rng.permutation(3 * n)[: n + n // 2].tolist())
    a = {i: tuple(pool[rng.integers(len(pool))].tolist()) for i in ids[:n]}
    b = {}
    for i in ids[n // 3 :]:
        if i in a and rng.random() < 0.6:
            b[i] = a[i]
        else:
            b[i] = tuple(pool[rng.integers(len(pool))].tolist())
    strings = draw(st.booleans())
    return a, b, sizes_a, sizes_b, strings


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    versions=churned_versions(),
    memory=st.sampled_from([200, 2000, 1 << 30]),
    batch=st.integers(1, 40),
)
def test_diff_of_a_churn_with_shared_sids_equals_brute_force(tmp_path_factory, versions, memory, batch):
    """diff_versions after a churn where SIDs hold several items: added, removed, common and SID-changed
    counts as Python dicts give them, whatever the batch size and whether the leftovers fit in memory."""
    a, b, sizes_a, sizes_b, strings = versions
    out = tmp_path_factory.mktemp("out")
    made = []
    for side, sizes in ((a, sizes_a), (b, sizes_b)):
        ids = [f"id-{i}" for i in side] if strings else list(side)
        made.append(publish(out, ids, np.array(list(side.values()), dtype=np.int64), sizes, "m"))
    got = diff_versions(*made, memory_bytes=memory, batch_rows=batch)
    both = a.keys() & b.keys()
    assert got.items_common == len(both)
    assert got.items_added == len(b.keys() - a.keys())
    assert got.items_removed == len(a.keys() - b.keys())
    assert got.items_sid_changed == sum(a[i] != b[i] for i in both)


def test_leftovers_past_the_budget_are_spilled_in_chunks_and_matched_exactly(tmp_path: Path, monkeypatch):
    """A churn whose leftovers (items not under the same SID in both versions) pass the matching budget:
    they are appended to the spill files more than once, and the counts stay exact."""
    rng = np.random.default_rng(7)
    n = 3000
    sids_a = rng.integers(0, 8, (n, 3))
    sids_b = sids_a.copy()
    moved = rng.random(n) < 0.3
    sids_b[moved] = rng.integers(0, 8, (int(moved.sum()), 3))
    ids_a = [f"item-{i}" for i in range(n)]
    ids_b = [f"item-{i}" for i in range(200, n + 200)]
    sids_b = np.concatenate([sids_b[200:], rng.integers(0, 8, (200, 3))])
    out = tmp_path / "out"
    old = publish(out, ids_a, sids_a, (8, 8, 8), "m")
    new = publish(out, ids_b, sids_b, (8, 8, 8), "m")
    spills = []
    spill = diff_module._Match.spill

    def counted(self, parts, where):
        spills.append(sum(len(p) for p in parts))
        return spill(self, parts, where)

    monkeypatch.setattr(diff_module._Match, "spill", counted)
    got = diff_versions(old, new, memory_bytes=20_000, batch_rows=256, spill_dir=tmp_path)
    assert len(spills) > 2 and sum(spills) > 0
    a = dict(zip(ids_a, map(tuple, sids_a.tolist()), strict=True))
    b = dict(zip(ids_b, map(tuple, sids_b.tolist()), strict=True))
    both = a.keys() & b.keys()
    assert (got.items_common, got.items_added, got.items_removed) == (len(both), 200, 200)
    assert got.items_sid_changed == sum(a[i] != b[i] for i in both)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_fanout_of_a_wide_codebook_is_sized_by_the_children_not_the_codebook():
    """A step's fan-out histogram never takes one counter per codebook entry (a codebook of 2^62 would
    not fit in memory): rows of 2 and 1 children."""
    from zerogr_build.bundle.diff_math import fanout

    got = fanout(np.array([0, 2, 3], dtype=np.int64), 2**62)
    assert (got.mean, got.p99, got.max) == (1.5, 2, 2)


@settings(deadline=None, max_examples=60)
@given(
    ids=st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=300),
    picks=st.lists(st.sampled_from(["a", "b", "both"]), min_size=300, max_size=300),
    strings=st.booleans(),
    workers=st.integers(2, 5),
    seed=st.integers(0, 2**64 - 1),
)
def test_match_part_shared_by_threads_counts_the_common_ids_exactly(ids, picks, strings, workers, seed):
    """match_part with its groups shared by several threads finds every id in both sides, once."""
    a_ids = [i for i, p in zip(ids, picks, strict=False) if p != "b"]
    b_ids = [i for i, p in zip(ids, picks, strict=False) if p != "a"]
    sides = []
    for side in (a_ids, b_ids):
        if strings:
            texts = _strings([str(i).encode() for i in side])
            sides.append((im.hash_byte_ids(*texts, seed), texts))
        else:
            sides.append((im.hash_int_ids(np.array(side, dtype=np.int64), seed), None))
    (a_hash, a_bytes), (b_hash, b_bytes) = sides
    no_keys = np.zeros((0, 0), dtype=np.uint64)
    got = im.match_part(
        a_hash, no_keys.reshape(len(a_ids), 0), b_hash, no_keys.reshape(len(b_ids), 0),
        a_bytes=a_bytes, b_bytes=b_bytes, workers=workers,
    )  # fmt: skip
    assert got.common == len(set(a_ids) & set(b_ids))


def test_the_diff_holds_no_more_than_a_few_batches_of_item_ids_in_arrow_memory(tmp_path, monkeypatch):
    """Each version's items.parquet is streamed: Arrow memory in use while both are read stays a few
    batches, not the id columns read so far (Parquet pre-buffering keeps every row group it has read)."""
    import pyarrow as pa

    from zerogr_build.bundle import publish as publish_module

    rows_per_group = 2048
    monkeypatch.setattr(publish_module.write_items_in_leaf_order, "__defaults__", (rows_per_group,))
    n, sizes = 200_000, (64, 64, 64)
    rng = np.random.default_rng(7)
    ids = rng.permutation(4 * n)[:n].astype(np.int64)
    sids = rng.integers(0, 64, size=(n, 3))
    old = publish(tmp_path / "a", ids.tolist(), sids, sizes, "m1")
    moved = sids.copy()
    moved[::2] = rng.integers(0, 64, size=(moved[::2].shape[0], 3))  # half the items change SID
    new = publish(tmp_path / "b", ids.tolist(), moved, sizes, "m1")
    peak = [0]
    batches = diff_module._Version.item_batches

    def sampled(self, rows):
        for first, batch in batches(self, rows):
            peak[0] = max(peak[0], pa.total_allocated_bytes())
            yield first, batch

    monkeypatch.setattr(diff_module._Version, "item_batches", sampled)
    before = pa.total_allocated_bytes()
    got = diff_versions(old, new, batch_rows=rows_per_group)
    assert got.items_common == n
    id_column_bytes = 8 * n
    assert peak[0] - before < id_column_bytes / 2, (peak[0] - before, id_column_bytes)
