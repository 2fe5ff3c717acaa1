"""The registry file, a request's arguments and the bounded caches, without an engine: every registry rule
refused with one line naming the key; any request a client can send either parses or is refused with one
short line quoting only what it sent; a request file is honoured only as a plain name under an allowed root
(no symlink, '.' or '..' part; capped before any filesystem call), a regular file within the byte cap whose
Parquet footer states at most limits.request_ids rows; the engine reads only the file admission checked;
the caches hold one entry per file, never more than their size nor, for request files, their bytes; a
client's API key scopes the catalogs it may name."""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.catalogs import EngineCatalogs
from zerogr_build.integrations.vllm.lru import Lru
from zerogr_build.integrations.vllm.registry import (
    MAX_NAME_CHARS,
    MAX_NAME_PARTS,
    FileRefusal,
    Limits,
    RequestFile,
    load_registry,
)
from zerogr_build.integrations.vllm.spec import spec_of


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("registry")
    tiny.publish(root / "out", tiny.catalog_sids(20, seed=1))
    tiny.sid_map().save(root / "sid_map.json")
    (root / "requests").mkdir()
    tiny.write_available(root / "requests" / "avail.parquet", range(1000, 1010))
    (root / "requests" / "out-link.json").symlink_to(root / "sid_map.json")
    (root / "requests" / "in-link.parquet").symlink_to(root / "requests" / "avail.parquet")
    (root / "requests" / "sub").mkdir()
    tiny.write_available(root / "requests" / "sub" / "deep.parquet", range(1000, 1005))
    (root / "requests" / "dir-link").symlink_to(root / "requests" / "sub")
    os.mkfifo(root / "requests" / "fifo.parquet")
    # 5,000 rows of one id: a few hundred bytes on disk (run-length encoded), over request_ids = 1000
    many = pa.table({"item_id": pa.array([1000] * 5000, pa.int64())})
    pq.write_table(many, root / "requests" / "many.parquet")
    (root / "requests" / "huge-footer.parquet").write_bytes(b"PAR1 not really PAR1")  # "footer" of 0.5 GB
    junk = b"PAR1" + b"\xff" * 8 + (8).to_bytes(4, "little") + b"PAR1"
    (root / "requests" / "not.parquet").write_bytes(junk)
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


def test_request_files_only_as_plain_names_under_the_roots(root):
    registry = load_registry(registry_text(root, limits={"request_file_bytes": 1 << 20, "request_ids": 1000}))
    good = root / "requests" / "avail.parquet"

    def opened(text):
        found = registry.open_request_file(text)
        if isinstance(found, FileRefusal):
            return found
        os.close(found[0])
        return found[1]

    found = opened(str(good))
    assert isinstance(found, RequestFile) and (found.root, found.name) == (0, "avail.parquet")
    assert opened("avail.parquet") == found  # relative to the root: the same file, the same identity
    assert RequestFile.from_token(found.token()) == found
    assert opened(f"{root}/requests/sub/deep.parquet") == opened("sub/deep.parquet") != found
    refused = {
        "/etc/passwd": "not under allow_paths_under",
        "requests/avail.parquet": "No such file",
        str(root / "sid_map.json"): "not under allow_paths_under",
        str(root / "requests"): "not under allow_paths_under",
        f"{root}/requests/": "not a plain relative name",
        "out-link.json": "symlink",
        "in-link.parquet": "symlink",  # a symlink inside the root too: O_NOFOLLOW
        "dir-link/deep.parquet": "symlink",
        "nope.parquet": "No such file",
        "sub": "not a regular file",
        "fifo.parquet": "not a regular file",  # opened without blocking
        f"{root}/requests/../sid_map.json": "not a plain relative name",
        f"{root}/requests/./avail.parquet": "not a plain relative name",
        f"/proc/self/root{good}": "not under allow_paths_under",
        "a\x00b": "NUL",
        "many.parquet": "5000 rows, more than limits.request_ids = 1000",  # the footer, before any page
        "not.parquet": "not a readable Parquet file",
        "huge-footer.parquet": "a footer of 544828524 bytes",
        "out-link.json/x": "symlink",
        "a/" * MAX_NAME_PARTS + "x": f"more than {MAX_NAME_PARTS}",
        str(good.parent) + "/" + "a/../" * 100_000 + "avail.parquet": f"more than {MAX_NAME_CHARS}",
    }
    for text, reason in refused.items():
        answer = opened(text)
        assert isinstance(answer, FileRefusal) and reason in answer.reason, (text[:80], answer)
    small = load_registry(registry_text(root, limits={"request_file_bytes": 16}))
    assert "more than limits.request_file_bytes" in small.open_request_file(str(good)).reason
    closed = load_registry(
        tiny.write_registry(root / "closed.toml", {"c": {"bundle": "out", "sid_map": "sid_map.json"}})
    )
    assert "allows no request paths" in closed.open_request_file(str(good)).reason


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


@settings(max_examples=100, deadline=None)
@given(
    budget=st.integers(1, 30),
    ops=st.lists(st.tuples(st.booleans(), st.integers(0, 9), st.integers(0, 12)), max_size=60),
)
def test_an_lru_bounded_in_bytes_equals_a_reference(budget, ops):
    cache, reference = Lru(4, max_bytes=budget, weight=len), OrderedDict()
    for put, key, size in ops:
        if put:
            cache.put(key, "x" * size)
            reference.pop(key, None)
            if size <= budget:  # heavier than the whole budget: returned, never kept
                reference[key] = "x" * size
            while len(reference) > 4 or sum(map(len, reference.values())) > budget:
                reference.popitem(last=False)
        else:
            assert cache.get(key) == reference.get(key)
            if key in reference:
                reference.move_to_end(key)
        assert len(cache) == len(reference) and cache.nbytes == sum(map(len, reference.values())) <= budget


def test_the_engine_reads_the_file_admission_checked_once(root, engine_config):
    """Both spellings admission accepts make one cache entry; the engine finds it by the identity
    admission handed over; a file replaced after admission is refused, not read."""
    registry = registry_text(root, entry={"bundle": "out"})
    engine_config(registry)
    loaded = load_registry(registry)
    catalogs = EngineCatalogs(loaded, torch.device("cpu"), tiny.VOCAB)
    good = root / "requests" / "avail.parquet"

    def plan(text, token=None):
        return catalogs.plan(spec_of({"zerogr": {"catalog": "c", "available": text}}, Limits()), None, token)

    fd, checked = loaded.open_request_file("avail.parquet")
    os.close(fd)
    plans = [plan(str(good)), plan("avail.parquet"), plan("avail.parquet", checked.token())]
    assert len({id(p.resident) for p in plans}) == 1  # one item filter, built once
    assert len(catalogs._request_files) == 1
    os.utime(good, ns=(1, 1))  # rewritten since admission: a new identity
    assert plan("avail.parquet", checked.token()).resident is plans[0].resident  # cached: no file call
    catalogs._request_files = Lru(8)  # the cached ids forgotten: the engine opens the file again
    with pytest.raises(InputError, match="replaced since the request was admitted"):
        plan("avail.parquet", checked.token())
    plan(str(good))  # a new admission reads it again
    assert len(catalogs._request_files) == 1
    with pytest.raises(InputError, match="rows, more than limits.request_ids"):
        small = EngineCatalogs(
            load_registry(registry_text(root, entry={"bundle": "out"}, limits={"request_ids": 3})),
            torch.device("cpu"),
            tiny.VOCAB,
        )
        small.plan(spec_of({"zerogr": {"catalog": "c", "available": "avail.parquet"}}, Limits()), None)
    catalogs.close()


def test_the_request_file_cache_is_bounded_in_bytes(root, engine_config):
    """Eight files of 800 ids each (6,400 bytes decoded): a budget of 15,000 bytes keeps two of them."""
    files = root / "requests" / "cache"
    files.mkdir(exist_ok=True)
    for i in range(8):
        tiny.write_available(files / f"f{i}.parquet", [1000 + (i + j) % 20 for j in range(800)])
    registry = registry_text(root, entry={"bundle": "out"}, limits={"request_file_cache_bytes": 15_000})
    engine_config(registry)
    catalogs = EngineCatalogs(load_registry(registry), torch.device("cpu"), tiny.VOCAB)
    for i in range(8):
        spec = spec_of({"zerogr": {"catalog": "c", "available": f"cache/f{i}.parquet"}}, Limits())
        catalogs.plan(spec, None)
    assert len(catalogs._request_files) == 2 and catalogs._request_files.nbytes == 12_800
    catalogs.close()


def test_client_scopes_by_api_key(root):
    def digest(key):
        return hashlib.sha256(key.encode()).hexdigest()

    clients = {"a": {"api_key_sha256": digest("key-a"), "catalogs": ["c"]},
               "b": {"api_key_sha256": digest("key-b"), "catalogs": []}}  # fmt: skip
    text = registry_text(root, clients=clients)
    registry = load_registry(text)
    assert registry.client_catalogs("key-a") == {"c"}
    assert registry.client_catalogs("key-b") == registry.client_catalogs("other") == frozenset()
    assert registry.client_catalogs(None) == frozenset()
    assert load_registry(registry_text(root)).client_catalogs(None) is None  # no [clients]: no scopes
    key = digest("k")
    bad = [({"a": {"api_key_sha256": "xyz", "catalogs": ["c"]}}, "api_key_sha256 must be the 64 hex"),
           ({"a": {"api_key_sha256": key, "catalogs": ["nope"]}}, "catalogs names 'nope'"),
           ({"a": {"api_key_sha256": key, "catalogs": ["c"], "key": "k"}}, "unknown key 'key'")]  # fmt: skip
    for clients, message in bad:
        with pytest.raises(InputError, match=message):
            load_registry(registry_text(root, clients=clients))


def test_admission_refuses_forcing_params_and_requests_that_skipped_the_gate(root, engine_config):
    """Through admission as vLLM calls it: the parameters that could force a forbidden token are refused
    (also those the server test cannot send to this tokenizer), min_tokens up to L is not; in a process that
    built vLLM's server, a request without the gate's ticket is refused, one with a ticket is admitted."""
    import sys

    from vllm import SamplingParams
    from vllm.exceptions import VLLMValidationError
    from vllm.sampling_params import StructuredOutputsParams

    from zerogr_build.integrations.vllm import admission

    path = tiny.write_registry(root / "admit.toml", {"c": {"bundle": "out", "sid_map": "sid_map.json"}})
    engine_config(path)

    def params(**kwargs):
        return SamplingParams(max_tokens=4, extra_args={"zerogr": {"catalog": "c"}}, **kwargs)

    refused = [
        (dict(allowed_token_ids=[5, 6]), '"allowed_token_ids" cannot'),
        (dict(structured_outputs=StructuredOutputsParams(choice=["a", "b"])), '"structured_outputs" cannot'),
        (dict(thinking_token_budget=0), '"thinking_token_budget" cannot'),
        (dict(min_tokens=4), '"min_tokens" is 4, more than the 3 tokens'),
        (dict(min_tokens=2, stop_token_ids=[9]), '"stop_token_ids" with "min_tokens"'),
    ]
    for kwargs, message in refused:
        with pytest.raises(VLLMValidationError, match=message):
            admission.admit(params(**kwargs))
    admitted = params(min_tokens=3, logit_bias={5: -100.0})
    admission.admit(admitted)
    assert admission.PIN_KEY not in admitted.extra_args  # admitted; no engine has announced a version
    import vllm.entrypoints.serve.middleware.register  # noqa: F401 - what a process serving vLLM's app loads

    try:
        with pytest.raises(VLLMValidationError, match="only through its gate"):
            admission.admit(params())
        token = admission.TICKET.set(admission.Ticket(api_key=None))
        try:
            admission.admit(params())
        finally:
            admission.TICKET.reset(token)
    finally:
        del sys.modules[admission.SERVER_MODULE]
