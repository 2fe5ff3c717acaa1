"""`zerogr diff` / bundle.diff.diff_versions against a brute-force reference (Python dicts and sets over the
catalogs the two versions were built from), for every number it reports: items added, removed, whose SID
changed, common; per version items, distinct SIDs, items in shared SIDs, fan-out per step, the first
token's items. Small batches and a tiny memory budget force many batches and spilled parts."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from zerogr_build.bundle import id_match as im
from zerogr_build.bundle import publish_bundle
from zerogr_build.bundle.diff import diff_versions
from zerogr_build.bundle.diff_math import fanout, rank_right
from zerogr_build.index import build_index

from .cli_runs import invoke


def publish(out: Path, ids: list, sids: np.ndarray, sizes: tuple[int, ...], tag: str | None, formats=None):
    """Build and publish one version of (item id -> SID) into OUT `out`; returns its dir."""
    index = build_index(sids, sizes, step_formats=formats, workers=1)
    fields = {"model_version": tag, "settings": {}}
    return publish_bundle(index, pa.array(ids), out, manifest_fields=fields).path


def reference_stats(ids: list, sids: np.ndarray) -> dict:
    """What diff reports about one version, by brute force."""
    rows = [tuple(s) for s in sids.tolist()]
    per_sid = Counter(rows)
    steps = []
    for t in range(sids.shape[1]):
        children: dict[tuple, set] = {}
        for sid in per_sid:
            children.setdefault(sid[:t], set()).add(sid[t])
        counts = sorted(len(c) for c in children.values())
        steps.append(
            {
                "rows": len(counts),
                "nnz": sum(counts),
                "fanout_mean": sum(counts) / len(counts),
                "fanout_p99": counts[max(math.ceil(0.99 * len(counts)), 1) - 1],
                "fanout_max": counts[-1],
            }
        )
    first = Counter(sid[0] for sid in rows)
    top = max(first.values())
    return {
        "items": len(ids),
        "distinct_sids": len(per_sid),
        "items_in_shared_sids": sum(n for n in per_sid.values() if n > 1),
        "first_token": min(token for token, n in first.items() if n == top),
        "first_token_items": top,
        "steps": steps,
    }


@st.composite
def two_versions(draw):
    """Two catalogs over partly shared item ids: some items removed, some added, some with a new SID;
    codebook sizes (and the SID length) may change; ids are int64 or strings."""
    steps = draw(st.integers(1, 3))
    sizes_a = tuple(draw(st.lists(st.integers(1, 6), min_size=steps, max_size=steps)))
    same_length = draw(st.booleans())
    steps_b = steps if same_length else draw(st.integers(1, 3))
    sizes_b = tuple(draw(st.lists(st.integers(1, 6), min_size=steps_b, max_size=steps_b)))
    if same_length and draw(st.booleans()):
        sizes_b = sizes_a
    n_a = draw(st.integers(1, 60))
    pool = draw(st.permutations(range(3 * n_a + 40)))
    ids_a = list(pool[:n_a])
    kept = [i for i in ids_a if draw(st.booleans()) or draw(st.booleans())]
    added = list(pool[n_a : n_a + draw(st.integers(0, 30))])
    ids_b = kept + added
    if not ids_b:
        ids_b = added = [pool[n_a]]
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    sids_a = rng.integers(0, sizes_a, size=(n_a, steps))
    fresh = rng.integers(0, sizes_b, size=(len(ids_b), steps_b))
    sids_b = fresh.copy()
    if same_length:  # most kept items keep their SID when it still fits the new codebooks
        old_sid = dict(zip(ids_a, sids_a.tolist(), strict=True))
        for row, item in enumerate(ids_b):
            if (
                item in old_sid
                and rng.random() < 0.7
                and all(v < s for v, s in zip(old_sid[item], sizes_b, strict=True))
            ):
                sids_b[row] = old_sid[item]
    order_b = rng.permutation(len(ids_b))
    ids_b, sids_b = [ids_b[i] for i in order_b], sids_b[order_b]
    strings = draw(st.booleans())
    if strings:
        ids_a, ids_b = [f"item-{i}" for i in ids_a], [f"item-{i}" for i in ids_b]
    formats = []
    for length in (steps, steps_b):  # some steps forced dense (their fan-out read from `next`)
        dense = [t for t in range(length) if draw(st.booleans())]
        formats.append(",".join(f"{t}=dense" for t in dense) or None)
    return (ids_a, sids_a, sizes_a, formats[0]), (ids_b, sids_b, sizes_b, formats[1])


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(versions=two_versions(), memory=st.sampled_from([900, 3000, 1 << 30]), batch=st.integers(1, 70))
def test_diff_equals_brute_force(tmp_path_factory, versions, memory, batch):
    (ids_a, sids_a, sizes_a, formats_a), (ids_b, sids_b, sizes_b, formats_b) = versions
    out = tmp_path_factory.mktemp("out")
    old = publish(out, ids_a, sids_a, sizes_a, "m1", formats_a)
    new = publish(out, ids_b, sids_b, sizes_b, "m2", formats_b)
    got = diff_versions(old, new, memory_bytes=memory, batch_rows=batch).to_json()

    a = dict(zip(ids_a, map(tuple, sids_a.tolist()), strict=True))
    b = dict(zip(ids_b, map(tuple, sids_b.tolist()), strict=True))
    common = a.keys() & b.keys()
    assert got["items_added"] == len(b.keys() - a.keys())
    assert got["items_removed"] == len(a.keys() - b.keys())
    assert got["items_common"] == len(common)
    assert got["items_sid_changed"] == sum(a[i] != b[i] for i in common)
    assert got["sids_comparable"] == (len(sizes_a) == len(sizes_b))
    for side, ids, sids in (("old", ids_a, sids_a), ("new", ids_b, sids_b)):
        want = reference_stats(ids, sids)
        steps = [{k: s[k] for k in want["steps"][0]} for s in got[side]["steps"]]
        assert steps == want.pop("steps")
        assert {k: got[side][k] for k in want} == want
        assert got[side]["shared_sid_items_ratio"] == want["items_in_shared_sids"] / want["items"]


@settings(deadline=None)
@given(st.lists(st.integers(1, 50), min_size=1, max_size=400))
@example(counts=[1] * 98 + [2, 3])  # p99 2, p95 1, max 3
def test_fanout_is_mean_nearest_rank_p99_and_max(counts):
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    got = fanout(starts, 50)
    ranked = sorted(counts)
    assert got.p99 == ranked[math.ceil(0.99 * len(ranked)) - 1] and got.max == ranked[-1]
    assert math.isclose(got.mean, sum(counts) / len(counts))


@settings(deadline=None)
@given(
    st.sampled_from([np.int32, np.int64, np.uint32]),
    st.lists(st.integers(0, 2**31 - 1), max_size=60),
    st.integers(-(2**40), 2**40),
)
@example(np.int32, [0, 5, 5, 9], 2**33)  # past the dtype: everything is <= it
@example(np.uint32, [0, 5, 5, 9], -1)  # below it: nothing is
def test_rank_right_counts_the_values_at_or_below(dtype, values, value):
    sorted_values = np.array(sorted(values), dtype=dtype)
    assert rank_right(sorted_values, value) == sum(v <= value for v in values)


def test_rank_right_does_not_convert_the_array():
    """Given a Python int, NumPy converted an int32 array to int64 whole on every search (O(n) time and
    memory per batch of a diff); the search allocates nothing the size of the array."""
    import tracemalloc

    big = np.arange(4_000_000, dtype=np.int32)  # 16 MB; an int64 copy would be 32 MB
    tracemalloc.start()
    try:
        assert rank_right(big, 1_234_567) == 1_234_568
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000, f"the search allocated {peak:,} bytes"


def test_ids_of_different_kinds_never_match(tmp_path):
    sids = np.array([[0, 1], [1, 0]])
    old = publish(tmp_path, [1, 2], sids, (2, 2), None)
    new = publish(tmp_path, ["1", "2"], sids, (2, 2), None)
    got = diff_versions(old, new)
    assert (got.items_added, got.items_removed, got.items_common) == (2, 2, 0)


def test_zerogr_diff_compares_an_out_dirs_latest_with_a_version(tmp_path):
    out = tmp_path / "out"
    sids = np.array([[0, 1], [1, 0], [1, 1]])
    publish(out, [1, 2, 3], sids, (2, 2), "m1")
    publish(out, [2, 3, 4], np.array([[1, 0], [0, 0], [0, 1]]), (2, 2), "m2")
    (out / "LATEST").write_text("v000001\n")
    done = invoke("diff", out, out / "v000002", "--json")
    assert done.exit_code == 0, done.output
    got = json.loads(done.stdout)
    assert (got["items_added"], got["items_removed"], got["items_sid_changed"]) == (1, 1, 1)
    assert got["model_tag_changed"] and got["old"]["version"] == 1 and got["new"]["version"] == 2
    table = invoke("diff", out, out / "v000002")
    assert table.exit_code == 0 and "items whose SID changed" in table.stdout and "m2" in table.stdout
    missing = invoke("diff", out, tmp_path / "nope")
    assert missing.exit_code == 2 and "nope" in missing.stderr


def _as_strings(ids: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(i) for i in ids])]).astype(np.int64)
    return offsets, np.frombuffer(b"".join(ids), dtype=np.uint8)


@st.composite
def two_sides(draw, strings: bool):
    """Ids unique within each side, some in both (integers, or their decimal text as bytes), and the
    number of key words (0 to 2)."""
    pool = draw(st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=120))
    a_ids = [i for i in pool if draw(st.booleans())]
    b_ids = [i for i in pool if draw(st.booleans())]
    if strings:
        a_ids, b_ids = [str(i).encode() for i in a_ids], [str(i).encode() for i in b_ids]
    return a_ids, b_ids, draw(st.integers(0, 2))


def _reference(a_ids, b_ids, a_keys, b_keys):
    a = {i: tuple(k) for i, k in zip(a_ids, a_keys, strict=True)}
    b = {i: tuple(k) for i, k in zip(b_ids, b_keys, strict=True)}
    common = a.keys() & b.keys()
    return len(common), sum(a[i] != b[i] for i in common)


@settings(deadline=None, max_examples=150)
@given(
    data=st.data(),
    strings=st.booleans(),
    seed=st.integers(0, 2**64 - 1),
    bits=st.integers(0, 6),
    pairs_limit=st.sampled_from([0, 1, 4096]),
)
def test_join_slots_counts_common_and_changed_ids_exactly(data, strings, seed, bits, pairs_limit):
    """join_slots (slot tables of seeded hashes; any slot count, pair loops or sorted runs) and match_part
    (the same in groups) against Python dicts: the ids in both, and those whose key differs."""
    a_ids, b_ids, words = data.draw(two_sides(strings))
    rng = np.random.default_rng(seed % 2**32)
    a_keys = rng.integers(0, 3, size=(len(a_ids), words)).astype(np.uint64)
    b_keys = rng.integers(0, 3, size=(len(b_ids), words)).astype(np.uint64)
    shared = {i: k for i, k in zip(a_ids, a_keys, strict=True)}
    for row, i in enumerate(b_ids):  # half the shared ids keep their key
        if i in shared and rng.random() < 0.5:
            b_keys[row] = shared[i]
    if strings:
        a_bytes, b_bytes = _as_strings(a_ids), _as_strings(b_ids)
        a_hash, b_hash = im.hash_byte_ids(*a_bytes, seed), im.hash_byte_ids(*b_bytes, seed)
    else:
        a_bytes = b_bytes = None
        a_hash = im.hash_int_ids(np.array(a_ids, dtype=np.int64), seed)
        b_hash = im.hash_int_ids(np.array(b_ids, dtype=np.int64), seed)
    a = im.slot_table(a_hash, a_keys, bits, with_index=strings)
    b = im.slot_table(b_hash, b_keys, bits, with_index=strings)
    got = im.join_slots(a, b, a_bytes=a_bytes, b_bytes=b_bytes, pairs_limit=pairs_limit)
    want = _reference(a_ids, b_ids, a_keys, b_keys)
    assert (got.common, got.changed) == want
    grouped = im.match_part(a_hash, a_keys, b_hash, b_keys, a_bytes=a_bytes, b_bytes=b_bytes)
    assert (grouped.common, grouped.changed) == want


@settings(deadline=None, max_examples=40)
@given(
    seed=st.integers(0, 2**32 - 1),
    low_bits=st.integers(0, 64 - im.GROUP_BITS),
    words=st.integers(0, 2),
    workers=st.sampled_from([1, 3]),
)
def test_match_part_of_integer_ids_counts_crowded_groups_exactly(seed, low_bits, words, workers):
    """Integer ids take the probe join: hashes that share their `low_bits` lowest bits (one group, and one
    probe run as long as the group, wrapping around the table) still match exactly: against Python sets,
    with keys that differ for some common ids."""
    rng = np.random.default_rng(seed)
    pool = np.unique(rng.integers(0, 2**63, 3000, dtype=np.int64).view(np.uint64) << np.uint64(low_bits))
    pool |= np.uint64((1 << low_bits) - 1) & np.uint64(seed)  # low bits alike: one group, crowded probes
    pool = np.unique(pool)
    a_hash, b_hash = pool[rng.random(pool.shape[0]) < 0.6], pool[rng.random(pool.shape[0]) < 0.6]
    rng.shuffle(b_hash)
    a_keys = rng.integers(0, 2, size=(a_hash.shape[0], words)).astype(np.uint64)
    b_keys = rng.integers(0, 2, size=(b_hash.shape[0], words)).astype(np.uint64)
    got = im.match_part(a_hash, a_keys, b_hash, b_keys, workers=workers)
    want = _reference(a_hash.tolist(), b_hash.tolist(), a_keys, b_keys)
    assert (got.common, got.changed) == want


@settings(deadline=None, max_examples=80)
@given(
    st.lists(st.binary(max_size=3), unique=True, max_size=40),
    st.lists(st.binary(max_size=3), unique=True, max_size=40),
    st.integers(1, 3),
    st.sampled_from([0, 4096]),
)
def test_join_slots_compares_colliding_string_ids_byte_for_byte(a_ids, b_ids, buckets, pairs_limit):
    """Hashes that collide on purpose (a string's length mod `buckets`): only equal bytes match."""
    a_bytes, b_bytes = _as_strings(a_ids), _as_strings(b_ids)
    a_hash = np.array([len(i) % buckets for i in a_ids], dtype=np.uint64)
    b_hash = np.array([len(i) % buckets for i in b_ids], dtype=np.uint64)
    a_keys = np.array([[len(i) % 2] for i in a_ids], dtype=np.uint64).reshape(-1, 1)
    b_keys = np.array([[i.count(b"a") % 2] for i in b_ids], dtype=np.uint64).reshape(-1, 1)
    a = im.slot_table(a_hash, a_keys, 1, with_index=True)
    b = im.slot_table(b_hash, b_keys, 1, with_index=True)
    got = im.join_slots(a, b, a_bytes=a_bytes, b_bytes=b_bytes, pairs_limit=pairs_limit)
    assert (got.common, got.changed) == _reference(a_ids, b_ids, a_keys, b_keys)


@settings(deadline=None)
@given(st.lists(st.integers(-(2**63), 2**63 - 1), unique=True, max_size=200), st.integers(0, 2**64 - 1))
def test_hash_int_ids_is_one_to_one_and_parts_split_by_its_top_bits(ids, seed):
    """Distinct ids keep distinct hashes under any seed (the matching of integer ids relies on it), and
    part_of is the hash's top bits."""
    hashes = im.hash_int_ids(np.array(ids, dtype=np.int64), seed)
    assert len(set(hashes.tolist())) == len(ids)
    for bits in (0, 1, 7, 16):
        want = [h >> (64 - bits) if bits else 0 for h in hashes.tolist()]
        assert im.part_of(hashes, bits).tolist() == want


def test_a_diff_spills_each_version_once_into_parts(tmp_path, monkeypatch):
    """Above its memory budget the diff reads each version's items once (not once per part) and spills
    them into parts under spill_dir, which it leaves empty."""
    from zerogr_build.bundle import diff as diff_module

    rng = np.random.default_rng(3)
    old = publish(tmp_path / "out", list(range(400)), rng.integers(0, 4, (400, 2)), (4, 4), "m")
    new = publish(tmp_path / "out", list(range(100, 500)), rng.integers(0, 4, (400, 2)), (4, 4), "m")
    reads = []
    batches = diff_module._Version.item_batches

    def counted(self, rows):
        reads.append(self.bundle.path.name)
        yield from batches(self, rows)

    monkeypatch.setattr(diff_module._Version, "item_batches", counted)
    spill = tmp_path / "spill"
    spill.mkdir()
    got = diff_versions(old, new, memory_bytes=2000, batch_rows=64, spill_dir=spill)
    assert sorted(reads) == ["v000001", "v000002"]
    assert (got.items_common, got.items_added, got.items_removed) == (300, 100, 100)
    assert list(spill.iterdir()) == []


def test_a_spill_that_fails_on_its_thread_fails_the_diff_and_leaves_no_spill(tmp_path, monkeypatch):
    """Spills run on a helper thread while the merge goes on: a spill that fails there (a full disk) is
    raised by the diff itself, after the thread has stopped writing, and its temporary dir is removed."""
    import errno
    import threading

    from zerogr_build.bundle import diff as diff_module

    rng = np.random.default_rng(5)
    out = tmp_path / "out"
    old = publish(out, list(range(300)), rng.integers(0, 4, (300, 2)), (4, 4), "m")
    new = publish(out, list(range(50, 350)), rng.integers(0, 4, (300, 2)), (4, 4), "m")
    spill_dir = tmp_path / "spill"
    spill_dir.mkdir()
    threads: list[str] = []
    real = diff_module._Match.spill

    def full(self, parts, where):
        threads.append(threading.current_thread().name)
        if len(threads) == 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(where))
        return real(self, parts, where)

    monkeypatch.setattr(diff_module._Match, "spill", full)
    with pytest.raises(OSError, match="No space left on device"):
        diff_versions(old, new, memory_bytes=2000, batch_rows=64, spill_dir=spill_dir)
    assert threads and all(name.startswith("zerogr-diff-spill") for name in threads)
    assert list(spill_dir.iterdir()) == []


def test_a_spill_left_in_out_by_a_killed_diff_is_swept_as_a_stale_temp(tmp_path, monkeypatch):
    """The guards spill into OUT: a process killed mid-diff leaves its spill dir there, and it is named so
    that the OUT's stale-temp sweep (run by every writer holding the OUT lock) removes it once stale."""
    import os
    import time

    from zerogr_build.bundle import diff as diff_module
    from zerogr_build.bundle.lock import UNCLAIMED_TEMP_MAX_AGE_S, remove_stale_temps

    rng = np.random.default_rng(4)
    out = tmp_path / "out"
    old = publish(out, list(range(300)), rng.integers(0, 4, (300, 2)), (4, 4), "m")
    new = publish(out, list(range(50, 350)), rng.integers(0, 4, (300, 2)), (4, 4), "m")
    seen: list[str] = []

    def killed(self, side, where):  # the process dies while the first version spills
        seen.extend(p.name for p in out.iterdir() if p.is_dir() and not p.name.startswith("v"))
        raise KeyboardInterrupt

    monkeypatch.setattr(diff_module._Match, "spill", killed)
    with pytest.raises(KeyboardInterrupt):
        diff_versions(old, new, memory_bytes=2000, batch_rows=64, spill_dir=out)
    assert len(seen) == 1 and seen[0].startswith(diff_module.SPILL_PREFIX)
    left = out / seen[0]
    left.mkdir(exist_ok=True)  # what a kill -9 leaves (TemporaryDirectory's clean-up never ran)
    assert remove_stale_temps(out) == []  # a live diff's spill is never taken
    stale = time.time() - UNCLAIMED_TEMP_MAX_AGE_S - 60
    os.utime(left, (stale, stale))
    assert remove_stale_temps(out) == [seen[0]] and not left.exists()
    assert sorted(p.name for p in out.iterdir() if p.name.startswith("v")) == ["v000001", "v000002"]
