"""`zerogr diff` / bundle.diff.diff_versions against a brute-force reference (Python dicts and sets over the
catalogs the two versions were built from), for every number it reports: items added, removed, whose SID
changed, common; per version items, distinct SIDs, items in shared SIDs, fan-out per step, the first
token's items. Small batches and a tiny memory budget force many batches and matching rounds."""

from __future__ import annotations

import json
import math
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

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
