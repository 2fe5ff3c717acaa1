"""The registry file, a request's arguments and the bounded caches, without an engine: every registry rule
refused with one line naming the key; any request a client can send either parses or is refused with one
short line quoting only what it sent; a request path is honoured only as a real regular file under an
allowed root and within the cap; the caches hold one entry per file whatever the spelling, and never more
than their size."""

from __future__ import annotations

import os
from collections import OrderedDict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.catalogs import EngineCatalogs
from zerogr_build.integrations.vllm.lru import Lru
from zerogr_build.integrations.vllm.registry import FileRefusal, Limits, load_registry
from zerogr_build.integrations.vllm.spec import spec_of


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    tiny.publish(root / "out", tiny.catalog_sids(20, seed=1))
    tiny.sid_map().save(root / "sid_map.json")
    (root / "requests").mkdir()
    tiny.write_available(root / "requests" / "avail.parquet", range(1000, 1010))
    (root / "requests" / "out-link.json").symlink_to(root / "sid_map.json")
    return root


def registry_text(root, **changes) -> str:
    entry = {"bundle": "out", "sid_map": "sid_map.json"} | changes.pop("entry", {})
    path = tiny.write_registry(
        root / "catalogs.toml", {"c": entry}, allow_paths_under=["requests"], **changes
    )
    return str(path)


def test_a_registry_resolves_its_paths_and_limits(root):
    registry = load_registry(registry_text(root, limits={"request_ids": 7}, poll_seconds=0.5))
    entry = registry.catalogs["c"]
    assert entry.bundle == root / "out" and entry.sid_map == root / "sid_map.json" and not entry.follow
    assert registry.allow_paths_under == (root / "requests",)
    assert registry.limits == Limits(request_ids=7) and registry.poll_seconds == 0.5


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"entry": {"colour": "red"}}, "unknown key 'colour'"),
        ({"entry": {"follow": "yes"}}, "follow must be true or false"),
        ({"entry": {"bundle": ""}}, "bundle must be a path"),
        ({"limits": {"request_ids": 0}}, "request_ids must be a positive integer"),
        ({"limits": {"cache": 3}}, "unknown key 'cache'"),
        ({"poll_seconds": -1}, "poll_seconds must be a positive number"),
        ({"tenants": 1}, "unknown key 'tenants'"),
    ],
)
def test_registry_rules(root, changes, message):
    with pytest.raises(InputError, match=message):
        load_registry(registry_text(root, **changes))


def test_registry_file_errors(root, tmp_path):
    with pytest.raises(InputError, match="catalog registry not found"):
        load_registry(tmp_path / "nope.toml")
    (tmp_path / "bad.toml").write_text("[catalogs.c\n")
    with pytest.raises(InputError, match="invalid TOML"):
        load_registry(tmp_path / "bad.toml")
    (tmp_path / "empty.toml").write_text("poll_seconds = 1\n")
    with pytest.raises(InputError, match="no \\[catalogs.NAME\\] table"):
        load_registry(tmp_path / "empty.toml")
    (tmp_path / "name.toml").write_text('[catalogs."a b"]\nbundle = "x"\nsid_map = "y"\n')
    with pytest.raises(InputError, match="a catalog name is 1 to 64 letters"):
        load_registry(tmp_path / "name.toml")


def test_request_files_only_under_the_roots(root):
    registry = load_registry(registry_text(root, limits={"request_file_bytes": 1 << 20}))
    good = root / "requests" / "avail.parquet"
    found = registry.request_file(str(good))
    assert not isinstance(found, FileRefusal) and found[0] == good
    for spelling in (f"{root}/requests/./avail.parquet", f"{root}/requests/../requests/avail.parquet",
                     f"/proc/self/root{good}"):  # fmt: skip
        assert registry.request_file(spelling) == found  # the same file, the same identity
    refused = ["/etc/passwd", "requests/avail.parquet", str(root / "sid_map.json"), str(root / "requests"),
               str(root / "requests" / "out-link.json"), str(root / "requests" / "nope.parquet"),
               f"{root}/requests/../sid_map.json", "a\x00b"]  # fmt: skip
    for path in refused:
        assert isinstance(registry.request_file(path), FileRefusal), path
    small = load_registry(registry_text(root, limits={"request_file_bytes": 16}))
    assert "more than limits.request_file_bytes" in small.request_file(str(good)).reason
    closed = load_registry(
        tiny.write_registry(root / "closed.toml", {"c": {"bundle": "out", "sid_map": "sid_map.json"}})
    )
    assert "allows no request paths" in closed.request_file(str(good)).reason


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=10), inner, max_size=5),
    max_leaves=20,
)
keys = st.sampled_from(["catalog", "include", "exclude", "available", "bundle", "sid_map"]) | st.text(
    max_size=8
)


@settings(max_examples=200, deadline=None)
@given(raw=st.dictionaries(keys, json_values, max_size=5) | json_values)
def test_any_request_parses_or_gets_one_short_line(raw):
    try:
        spec = spec_of({"zerogr": raw}, Limits(request_ids=4, request_sets=3))
    except InputError as exc:
        text = str(exc)
        assert "\n" not in text and len(text) < 300
        return
    assert spec is not None and spec.catalog == raw["catalog"]
    for ids in (spec.exclude, spec.available if not isinstance(spec.available, str) else None):
        assert ids is None or len(ids) <= 4


@settings(max_examples=100, deadline=None)
@given(size=st.integers(1, 5), ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9)), max_size=60))
def test_lru_equals_a_reference_and_stays_bounded(size, ops):
    cache, reference = Lru(size), OrderedDict()
    for put, key in ops:
        if put:
            cache.put(key, key * 10)
            reference[key] = key * 10
            reference.move_to_end(key)
            while len(reference) > size:
                reference.popitem(last=False)
        else:
            assert cache.get(key) == reference.get(key)
            if key in reference:
                reference.move_to_end(key)
        assert len(cache) == len(reference) <= size


def test_many_spellings_of_one_request_file_make_one_cache_entry(root, engine_config):
    registry = registry_text(root, entry={"bundle": "out"})
    engine_config(registry)
    catalogs = EngineCatalogs(load_registry(registry), torch.device("cpu"), tiny.VOCAB)
    good = root / "requests" / "avail.parquet"
    spellings = [f"/proc/self/root{good}", f"{root}/requests/./avail.parquet"] + [
        f"{root}/requests/{'../requests/' * n}avail.parquet" for n in range(1, 40)
    ]
    plans = [
        catalogs.plan(spec_of({"zerogr": {"catalog": "c", "available": s}}, Limits()), None)
        for s in spellings
    ]
    assert len({id(p.resident) for p in plans}) == 1  # one item filter, built once
    assert len(catalogs._request_files) == 1
    os.utime(good)  # touched: a new identity, read again
    catalogs.plan(spec_of({"zerogr": {"catalog": "c", "available": str(good)}}, Limits()), None)
    assert len(catalogs._request_files) == 2
    catalogs.close()
