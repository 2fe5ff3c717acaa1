"""Hostile and careless input to the item constraints: every accepted container of ids works, anything else
is refused with one clear InputError; a null id never empties a mask; a mask or sets object is bound to
its item order and copied; concurrent setters lose no update; set words cost no per-pair memory;
availability and sets files are read as strictly as a catalog (exit 2, one line naming the file)."""

from __future__ import annotations

import os
import threading
import tracemalloc
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from zerogr_build.base.errors import InputError
from zerogr_build.bundle import open_bundle, publish_bundle
from zerogr_build.cli import app
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.items import space
from zerogr_build.runtime.items.constraints import ItemMask, ItemSets
from zerogr_build.runtime.items.space import SetBits, check_set_memory
from zerogr_build.testing import SeededModel, stderr_lines

SIZES = (4, 4, 2)
N = 40


def sids_for(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, SIZES, size=(N, 3))


def publish(out, seed: int, ids: pa.Array | None = None):
    ids = pa.array(100 + np.arange(N), pa.int64()) if ids is None else ids
    return open_bundle(publish_bundle(build_index(sids_for(seed), SIZES), ids, out).path)


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """v1 and v2 hold the same item ids 100..139 on different SIDs (so in another leaf order); v3 is v1's
    catalog published again (byte-identical items table)."""
    out = tmp_path_factory.mktemp("bundles")
    return publish(out, 3), publish(out, 4), publish(out, 3)


def available_ids(bundle, mask: ItemMask) -> list[int]:
    return sorted(np.asarray(bundle.items())[mask.available].tolist())


def search_items(dec, batch=2, **kwargs) -> list[set]:
    model = SeededModel(SIZES, 1, batch_size=batch)
    res = dec.search(model.step_fn, batch, 16, **kwargs)
    return [{i for beam in per_request for i in beam} for per_request in dec.items(res)]


# ------------------------------------------------------------------------------ G4: containers of ids

CHOSEN = [100, 105, 120, 139]
CONTAINERS = {
    "list": lambda: list(CHOSEN),
    "tuple": lambda: tuple(CHOSEN),
    "set": lambda: set(CHOSEN),
    "frozenset": lambda: frozenset(CHOSEN),
    "generator": lambda: (i for i in CHOSEN),
    "dict keys": lambda: dict.fromkeys(CHOSEN).keys(),
    "range-like map": lambda: map(int, CHOSEN),
    "numpy int32": lambda: np.asarray(CHOSEN, np.int32),
    "numpy uint64": lambda: np.asarray(CHOSEN, np.uint64),
    "numpy float64": lambda: np.asarray(CHOSEN, np.float64),
    "numpy object": lambda: np.asarray(CHOSEN, dtype=object),
    "numpy 2-D": lambda: np.asarray(CHOSEN).reshape(2, 2),
    "pyarrow": lambda: pa.array(CHOSEN, pa.int32()),
    "pyarrow chunked": lambda: pa.chunked_array([CHOSEN[:2], CHOSEN[2:]]),
    "numpy ints in a list": lambda: [np.int64(i) for i in CHOSEN],
    "integral floats in a list": lambda: [float(i) for i in CHOSEN],
}


@pytest.mark.parametrize("kind", list(CONTAINERS))
def test_every_container_of_ids_works(bundles, kind):
    """G4: ItemMask.from_ids, exclude= and ItemSets.from_mapping take every accepted container as its
    ids (before: a set, generator or dict keys counted as one unknown id, float/object arrays as unknown)."""
    bundle = bundles[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "not in the catalog" warning: every id is found
        assert available_ids(bundle, ItemMask.from_ids(bundle, CONTAINERS[kind]())) == CHOSEN
        sets = ItemSets.from_mapping(bundle, {"chosen": CONTAINERS[kind]()})
        dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
        dec.set_item_sets(sets)
        got = search_items(dec, exclude=[CONTAINERS[kind](), None], include=[None, ["chosen"]])
    assert not got[0] & set(CHOSEN) and got[0]
    assert got[1] == set(CHOSEN)


@pytest.mark.parametrize(
    "ids, match",
    [
        ("100", "single value"),
        (100, "single value"),
        ({100: True}, "mapping"),
        ([100, None], "entry 1 is null"),
        (np.asarray([100.0, np.nan]), "entry 1 is null"),
        ([100, float("nan")], "entry 1 is null"),
        (pa.array([100, None]), "entry 1 is null"),
        ([100.5], "not an integral"),
        (np.asarray([2.0**60]), "beyond 2\\^53"),
        ([True, False], "boolean"),
        (np.asarray([True]), "booleans"),
        ([100, "101"], "mix"),
        (["100", "101"], "strings, the catalog's item ids are integers"),
        ([object()], "not an item id"),
    ],
)
def test_bad_ids_are_refused_not_counted_as_unknown(bundles, ids, match):
    """G4/G2: anything that is not a collection of valid ids is an InputError saying what is wrong."""
    bundle = bundles[0]
    with pytest.raises(InputError, match=match):
        ItemMask.from_ids(bundle, ids)
    dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
    with pytest.raises(InputError, match=f"exclude\\[1\\].*{match}"):
        search_items(dec, exclude=[[], ids])


def test_from_bool_refuses_values_that_are_not_flags(bundles):
    bundle = bundles[0]
    for bad in (["0", "False"] * (N // 2), np.full(N, np.nan), np.full(N, 2)):
        with pytest.raises(InputError, match="availability mask"):
            ItemMask.from_bool(bundle, bad)
    assert ItemMask.from_bool(bundle, np.arange(N) % 2).num_available == N // 2
    with pytest.raises(InputError, match="bool array"):
        ItemMask(np.ones(N, dtype=np.int64))


# ------------------------------------------------------------------------------ G17: uint64 ids


def test_uint64_ids_do_not_alias_negative_ones(tmp_path):
    """G17: in a uint64 catalog, -1 is not 2^64 - 1 (a padding -1 in a seen list excluded that item)."""
    big = 2**64 - 1
    ids = pa.array([1, 2, 3, big] + list(range(10, 10 + N - 4)), pa.uint64())
    bundle = publish(tmp_path, 5, ids)
    with pytest.warns(UserWarning, match="1 of 1 available item ids are not in the catalog"):
        assert ItemMask.from_ids(bundle, [-1]).num_available == 0
    assert available_ids(bundle, ItemMask.from_ids(bundle, [big, 1])) == [1, big]
    assert available_ids(bundle, ItemMask.from_ids(bundle, np.asarray([big], np.uint64))) == [big]
    dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
    with pytest.warns(UserWarning, match="1 of 2 excluded item ids are not in the catalog"):
        got = search_items(dec, exclude=[[-1], [big]])
    assert big in got[0] and big not in got[1]
    signed = publish(tmp_path / "signed", 5, pa.array([-1] + list(range(1, N)), pa.int64()))
    with pytest.warns(UserWarning, match="not in the catalog"):
        assert ItemMask.from_ids(signed, np.asarray([big], np.uint64)).num_available == 0
    assert ItemMask.from_ids(signed, [-1]).num_available == 1


# ------------------------------------------------------------------------------ G5 / G6: binding, copies


def test_a_mask_or_sets_for_another_version_is_refused(bundles):
    """G5: v2 orders the same ids differently, so v1's mask names other items there: refused. v3 has v1's
    byte-identical items table, so v1's mask fits it."""
    v1, v2, v3 = bundles
    mask = ItemMask.from_ids(v1, [110])
    sets = ItemSets.from_mapping(v1, {"a": [110]})
    dec2 = Decoder(v2, SeededModel(SIZES, 1, batch_size=2).layers())
    with pytest.raises(InputError, match="built for .*version 1.*serves .*version 2"):
        dec2.set_availability(mask)
    with pytest.raises(InputError, match="item sets was built for"):
        dec2.set_item_sets(sets)
    dec3 = Decoder(v3, SeededModel(SIZES, 1, batch_size=2).layers())
    dec3.set_availability(mask)
    assert search_items(dec3)[0] == {110}
    index = build_index(sids_for(3), SIZES)  # in-memory indexes: bound to the object
    with pytest.raises(InputError, match="built for an in-memory index"):
        Decoder(build_index(sids_for(3), SIZES), SeededModel(SIZES, 1).layers()).set_availability(
            ItemMask.from_ids(index, [1])
        )


def test_from_bool_copies_its_input(bundles):
    """G6: editing the caller's array after from_bool changes nothing (before, the live host mask
    followed the edit while the masked tables did not: leaves whose items were then filtered out)."""
    bundle = bundles[0]
    buf = np.ones(N, dtype=bool)
    mask = ItemMask.from_bool(bundle, buf)
    dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
    dec.set_availability(mask)
    buf[:] = False
    assert mask.num_available == N and not mask.available.flags.writeable
    assert len(search_items(dec)[0]) >= 16
    arr = np.ones(N, dtype=bool)
    direct = ItemMask(arr)
    arr[:] = False
    assert direct.num_available == N


# ------------------------------------------------------------------------------ G7: concurrent setters


def test_concurrent_setters_lose_no_update(bundles, monkeypatch):
    """G7: set_availability issued while set_item_sets is compiling is not undone when set_item_sets
    finishes (before: set_item_sets assigned a state built from the old mask)."""
    bundle = bundles[0]
    dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
    compiling, release = threading.Event(), threading.Event()
    real_build = SetBits.build.__func__

    def slow_build(cls, sets):
        compiling.set()
        release.wait(5)
        return real_build(cls, sets)

    monkeypatch.setattr(SetBits, "build", classmethod(slow_build))
    mask = ItemMask.from_ids(bundle, [101, 102])
    setter = threading.Thread(target=dec.set_item_sets, args=(ItemSets.from_mapping(bundle, {"a": [101]}),))
    setter.start()
    assert compiling.wait(5)
    masker = threading.Thread(target=dec.set_availability, args=(mask,))
    masker.start()
    masker.join(0.3)  # serialised: it waits for set_item_sets (unserialised, it finishes first)
    release.set()
    setter.join(5)
    masker.join(5)
    assert np.array_equal(dec._resident.available, mask.available) and dec._resident.sets is not None
    assert search_items(dec, include=[["a"], None]) == [{101}, {101, 102}]


# ------------------------------------------------------------------------------ G12: set memory


@settings(max_examples=30, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    num_items=st.integers(1, 40),
    num_sets=st.sampled_from([1, 6, 7, 8, 15, 31, 63, 64, 65, 127, 128, 200]),
)
def test_set_bits_match_brute_force(seed, num_items, num_sets):
    """Every item's word has bit i iff it is in set i (and ANY always); contains() and request_words()
    agree with the memberships, across every word type and several uint64 words."""
    rng = np.random.default_rng(seed)
    member = rng.random((num_sets, num_items)) < rng.choice([0.05, 0.5])
    index = build_index(rng.integers(0, 3, size=(num_items, 2)), (3, 3))
    sets = ItemSets.from_positions(index, [f"s{i}" for i in range(num_sets)],
                                   [np.flatnonzero(m) for m in member])  # fmt: skip
    bits = SetBits.build(sets)
    for i in list(range(num_sets)) + [bits.any_bit]:
        has = (bits.item_bits & bits.word(i)) != 0
        has = has.any(axis=1) if has.ndim == 2 else has
        assert has.tolist() == (member[i] if i < num_sets else np.ones(num_items, bool)).tolist()
    pos = rng.integers(0, num_items, 50)
    sid = rng.integers(0, num_sets, 50)
    assert bits.contains(pos, sid).tolist() == member[sid, pos].tolist()
    chosen = [
        rng.choice(num_sets, int(rng.integers(0, min(num_sets, 5) + 1)), replace=False) for _ in range(4)
    ]
    set_off = np.concatenate([[0], np.cumsum([len(c) for c in chosen])]).astype(np.int64)
    words = bits.request_words(np.concatenate(chosen).astype(np.int64), set_off)
    for b, c in enumerate(chosen):
        expect = np.zeros_like(words[b])
        for i in c if len(c) else [bits.any_bit]:
            expect |= bits.word(i)
        assert np.array_equal(words[b], expect)


def test_set_words_take_no_memory_per_pair_of_sets():
    """G12: 20,000 one-item sets over 20 items: before, a [sets + 1, words] table of every set's word
    (50 MB here, 2.7 GB at 150k sets); now memory O(items x words + set sizes)."""
    index = build_index(np.random.default_rng(0).integers(0, 4, size=(20, 2)), (4, 4))
    num_sets = 20_000
    sets = ItemSets.from_mapping(index, {str(i): [i % 20] for i in range(num_sets)})
    tracemalloc.start()
    try:
        bits = SetBits.build(sets)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert bits.words == 313
    assert peak < 5 * 2**20, peak  # item words 20 x 313 x 8 B = 50 KB, members 20,000 x a few int64


def test_set_words_that_cannot_fit_are_refused():
    with pytest.raises(InputError, match="128,000 item sets over 1,000,000 items need 14.9 GiB"):
        check_set_memory(1_000_000, 2000 * 8, 128_000, limit=8 * 2**30)
    check_set_memory(1_000, 2000 * 8, 128_000, limit=8 * 2**30)
    assert space.physical_memory_bytes() is None or space.physical_memory_bytes() > 2**20


# ------------------------------------------------------------------------------ G2 / G14: files


def write(path, **columns):
    pq.write_table(pa.table(columns), path)
    return path


def test_a_null_id_in_an_availability_file_is_refused_naming_file_column_row(bundles, tmp_path):
    """G2: before, one null turned the column into floats and every id into "not in the catalog"."""
    bundle = bundles[0]
    path = write(tmp_path / "a.parquet", item_id=pa.array([101, 102, None, 104]))
    with pytest.raises(InputError, match=r"a\.parquet: column 'item_id' row 2 is null"):
        ItemMask.from_parquet(bundle, path)
    floats = write(tmp_path / "f.parquet", item_id=pa.array([101.0, 102.0]))
    assert available_ids(bundle, ItemMask.from_parquet(bundle, floats)) == [101, 102]
    flagged = write(tmp_path / "g.parquet", item_id=[101, 102, 103], ok=pa.array([True, None, False]))
    with pytest.raises(InputError, match="column 'ok' row 1 is null"):
        ItemMask.from_parquet(bundle, flagged)
    ints = write(tmp_path / "i.parquet", item_id=[101, 102, 103], ok=[1, 0, 1])
    assert available_ids(bundle, ItemMask.from_parquet(bundle, ints, flag_column="ok")) == [101, 103]
    with pytest.raises(InputError, match="flag column 'ok' row 0 is 2"):
        ItemMask.from_parquet(bundle, write(tmp_path / "j.parquet", item_id=[1], ok=[2]), flag_column="ok")
    with pytest.raises(InputError, match="column 'nope' not found"):
        ItemMask.from_parquet(bundle, ints, flag_column="nope")


def test_a_null_in_an_item_sets_file_is_refused(bundles, tmp_path):
    """G2: before, one null id emptied every set; a null set name became a set named "None"."""
    bundle = bundles[0]
    path = write(
        tmp_path / "s.parquet", set=["a"] * 3 + ["b"] * 2, item_id=pa.array([101, 102, 103, None, 105])
    )
    with pytest.raises(InputError, match=r"s\.parquet: column 'item_id' row 3 is null"):
        ItemSets.from_parquet(bundle, path)
    path = write(tmp_path / "t.parquet", set=["a", None], item_id=[101, 102])
    with pytest.raises(InputError, match="column 'set' row 1 is null"):
        ItemSets.from_parquet(bundle, path)
    path = write(tmp_path / "u.parquet", set=["b", "a", "b", "a"], item_id=[101, 102, 103, 999])
    with pytest.warns(UserWarning, match="1 of 4 rows name item ids that are not in the catalog"):
        sets = ItemSets.from_parquet(bundle, path)
    assert sets.names == ("a", "b")
    items = np.asarray(bundle.items())
    assert [sorted(items[p].tolist()) for p in sets.positions] == [[102], [101, 103]]


def test_bad_sets_files_are_input_errors(bundles, tmp_path):
    """G14 (library): a 0-row file, non-UTF-8 names, a missing or non-Parquet file."""
    bundle = bundles[0]
    empty = write(tmp_path / "e.parquet", set=pa.array([], pa.string()), item_id=pa.array([], pa.int64()))
    with pytest.raises(InputError, match="e.parquet: no rows"):
        ItemSets.from_parquet(bundle, empty)
    binary = write(tmp_path / "b.parquet", set=pa.array([b"\xff\xfe"], pa.binary()), item_id=[101])
    with pytest.raises(InputError, match="row 0 is not UTF-8"):
        ItemSets.from_parquet(bundle, binary)
    with pytest.raises(InputError, match="missing.parquet: no such file"):
        ItemSets.from_parquet(bundle, tmp_path / "missing.parquet")
    (tmp_path / "text.parquet").write_text("set,item_id\na,1\n")
    with pytest.raises(InputError, match="text.parquet: not a readable Parquet file"):
        ItemSets.from_parquet(bundle, tmp_path / "text.parquet")
    lists = write(tmp_path / "l.parquet", set=["a"], item_id=pa.array([[1]], pa.list_(pa.int64())))
    with pytest.raises(InputError, match="has type list<.*>; item ids are integers or strings"):
        ItemSets.from_parquet(bundle, lists)


def bad_available_files(tmp_path):
    (tmp_path / "text.parquet").write_text("item_id\n1\n")
    (tmp_path / "zero.parquet").write_bytes(b"")
    (tmp_path / "dir.parquet").mkdir()
    os.mkfifo(tmp_path / "fifo.parquet")
    write(tmp_path / "rows0.parquet", item_id=pa.array([], pa.int64()))
    write(tmp_path / "strings.parquet", item_id=["a", "b"])
    write(tmp_path / "lists.parquet", item_id=pa.array([[1]], pa.list_(pa.int64())))
    write(tmp_path / "null.parquet", item_id=pa.array([101, None]))
    write(tmp_path / "half.parquet", item_id=[101.5])
    return {
        "missing.parquet": "no such file",
        "text.parquet": "not a readable Parquet file",
        "zero.parquet": "not a readable Parquet file",
        "dir.parquet": "is a directory",
        "fifo.parquet": "not a regular file",
        "rows0.parquet": "no rows",
        "strings.parquet": "ids are strings, the catalog's item ids are integers",
        "lists.parquet": "item ids are integers or strings",
        "null.parquet": "row 1 is null",
        "half.parquet": "row 0 is 101.5, not an integral item id",
    }


@pytest.mark.parametrize("command", ["inspect", "compare"])
def test_cli_bad_available_file_is_exit_2_with_one_line_naming_it(bundles, tmp_path, command):
    """G14: before, exit 1 with FileNotFoundError / ArrowInvalid, or exit 0 with an empty mask."""
    bundle = bundles[0]
    req = write(tmp_path / "requests.parquet", request_id=[0, 1], target_item=[101, 102])
    runner = CliRunner()
    for name, match in bad_available_files(tmp_path).items():
        args = ["inspect", str(bundle.path)]
        if command == "compare":
            args = ["compare", str(bundle.path), "--model", "tests.compare_models:model_fn", "--requests",
                    str(req)]  # fmt: skip
        res = runner.invoke(app, [*args, "--available", str(tmp_path / name)])
        assert res.exit_code == 2, (name, res.output)
        lines = stderr_lines(res.stderr)
        assert len(lines) == 1 and name in lines[0] and match in lines[0], (name, res.stderr)


def test_cli_unknown_ids_warning_is_one_stderr_line(bundles, tmp_path):
    bundle = bundles[0]
    path = write(tmp_path / "a.parquet", item_id=[101, 999])
    res = CliRunner().invoke(app, ["inspect", str(bundle.path), "--available", str(path), "--json"])
    assert res.exit_code == 0, res.output
    assert stderr_lines(res.stderr) == [
        f"WARNING: {path}: column 'item_id': 1 of 2 rows name item ids that are not in the catalog (ignored)"
    ]


def test_torch_is_not_needed_to_build_masks(bundles):
    """The constraint types stay torch-free (they are built in data pipelines): building a mask from a
    torch tensor of ids works through numpy."""
    bundle = bundles[0]
    assert available_ids(bundle, ItemMask.from_ids(bundle, torch.tensor(CHOSEN))) == CHOSEN


def test_hotswap_builds_each_versions_constraints_before_it_goes_live(bundles):
    """G5: HotSwap does not carry a mask to the next version (it would be refused there); on_load builds
    that version's own mask from ids before the swap, so requests never see the new version unmasked."""
    from zerogr_build.runtime.serving.hotswap import HotSwap

    in_stock = [110, 111]
    seen = []

    def on_load(bundle, decoder):
        decoder.set_availability(ItemMask.from_ids(bundle, in_stock))
        seen.append(bundle.version)

    live = HotSwap.for_decoder(SeededModel(SIZES, 1, batch_size=2).layers(), on_load=on_load)
    try:
        for bundle in bundles[:2]:
            live.load_next(bundle.path).result()
            live.swap()
            assert search_items(live.current.decoder)[0] == set(in_stock)
        with pytest.raises(InputError, match="built for"):
            live.current.decoder.set_availability(ItemMask.from_ids(bundles[0], in_stock))
    finally:
        live.close()
    assert seen == [1, 2]


def test_wrong_argument_types_are_input_errors(bundles):
    bundle = bundles[0]
    dec = Decoder(bundle, SeededModel(SIZES, 1, batch_size=2).layers())
    with pytest.raises(InputError, match="expected an ItemMask"):
        dec.set_availability(np.ones(N, dtype=bool))
    with pytest.raises(InputError, match="expected an ItemSets"):
        dec.set_item_sets({"a": [101]})
    dec.set_item_sets(ItemSets.from_mapping(bundle, {"a": [101]}))
    with pytest.raises(InputError, match="include: expected set names"):
        search_items(dec, include=[3, None])
    with pytest.raises(InputError, match="two sets are named '1'"):
        ItemSets.from_mapping(bundle, {1: [101], "1": [102]})


def test_cli_compare_with_nothing_available_is_one_refusal_without_numpy_warnings(bundles, tmp_path):
    """A mask that leaves nothing available is a valid mask, but there is then nothing to compare: exit 2
    with one line saying so, and no raw numpy warning lines."""
    bundle = bundles[0]
    req = write(tmp_path / "requests.parquet", request_id=[0, 1], target_item=[101, 102])
    mask = write(tmp_path / "none.parquet", item_id=[101, 102], ok=[False, False])
    args = ["compare", str(bundle.path), "--model", "tests.compare_models:model_fn", "--requests", str(req)]
    res = CliRunner().invoke(app, [*args, "--k", "5", "--beam-width", "8", "--available", str(mask)])
    assert res.exit_code == 2, res.output
    assert [line for line in stderr_lines(res.stderr) if "nothing to compare" in line], res.stderr
    assert not [line for line in stderr_lines(res.stderr) if line.startswith("WARNING")], res.stderr


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-(2**62), 2**62), max_size=60))
def test_sorted_unique_is_each_key_once_ascending(keys):
    from zerogr_build.runtime.items.kills import sorted_unique

    got = sorted_unique(np.asarray(keys, dtype=np.int64))
    assert got.dtype == np.int64 and got.tolist() == sorted(set(keys))
