"""The V1 and V2 processors against a brute-force reference and each other, driven through vLLM's own
interfaces without an engine: V1 through BatchUpdate (rows added, removed, moved both ways), V2 through a
real RequestState (vLLM's slot free list: slots recycled) and LogitsContext built from real tensors, its rows
in a new order every step, preempted requests re-added with their partial output. Same requests, same
logits: every row of both equals the brute-force mask, at every SID step, on and off the catalog, with
include / exclude / availability, plain rows, and a request that fails in the engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from zerogr_build.integrations.vllm import SidLogitsProcessor
from zerogr_build.integrations.vllm import tiny_model as tiny
from zerogr_build.integrations.vllm.admission import admit
from zerogr_build.integrations.vllm.v2_batch import V2Batch

L = len(tiny.SIZES)
SLOTS = 6
PROMPT = [1, 5, 6]


@pytest.fixture(scope="module")
def world(tmp_path_factory, engine_config):
    """A catalog "c" (items 1040..1049 share the SIDs of 1000..1009) with two item sets, registered."""
    root = tmp_path_factory.mktemp("batch")
    base = tiny.catalog_sids(40, seed=3)
    sids = np.concatenate([base, base[:10]])
    ids = 1000 + np.arange(sids.shape[0])
    tiny.publish(root / "out", sids, ids)
    sets = {"a": ids[::2].tolist(), "b": ids[1::3].tolist()}
    tiny.write_sets(root / "sets.parquet", sets)
    tiny.sid_map().save(root / "sid_map.json")
    entry = {"bundle": "out", "sid_map": "sid_map.json", "item_sets": "sets.parquet"}
    registry = tiny.write_registry(root / "catalogs.toml", {"c": entry})
    config = engine_config(registry, max_num_seqs=SLOTS)
    return World(root=root, sids=sids, ids=ids, sets=sets, config=config)


class World(dict):
    """The module's catalog and engine config (shown by name in hypothesis' failure reports)."""

    def __repr__(self) -> str:
        return "world"


def allowed_items(world, kind: dict) -> np.ndarray:
    allowed = np.ones(len(world["ids"]), dtype=bool)
    if kind.get("exclude"):
        allowed &= ~np.isin(world["ids"], kind["exclude"])
    if kind.get("available") is not None:
        allowed &= np.isin(world["ids"], kind["available"])
    if kind.get("include"):
        members = [i for name in kind["include"] for i in world["sets"][name]]
        allowed &= np.isin(world["ids"], members)
    return allowed


def expected_row(world, logits: torch.Tensor, kind: dict, output: list[int]) -> torch.Tensor:
    """The brute-force mask of one row: every catalog item's SID checked against the prefix."""
    if kind["kind"] == "plain":
        return logits
    out = torch.full_like(logits, float("-inf"))
    if kind["kind"] == "broken":
        out[tiny.EOS] = logits[tiny.EOS]
        return out
    t = min(len(output), L)
    tokens = world["sids"] + np.asarray(tiny.SID_OFFSETS)
    if t == L:
        if any(list(row) == output[:L] for row in tokens.tolist()):
            out[tiny.EOS] = logits[tiny.EOS]
        return out
    for row, ok in zip(tokens.tolist(), allowed_items(world, kind).tolist(), strict=True):
        if ok and row[:t] == output[:t]:
            out[row[t]] = logits[row[t]]
    if torch.isneginf(out).all():  # no allowed SID continues the prefix: EOS, an empty answer
        out[tiny.EOS] = logits[tiny.EOS]
    return out


def params_of(kind: dict) -> SamplingParams:
    """The engine's own copy of a request's params, admitted by the front end as vLLM does (a request of
    a catalog the engine does not know fails in the engine, not at admission)."""
    if kind["kind"] == "plain":
        return SamplingParams()
    args = {"catalog": "c" if kind["kind"] != "broken" else "gone"}
    args.update({k: kind[k] for k in ("include", "exclude", "available") if kind.get(k) is not None})
    params = SamplingParams(extra_args={"zerogr": args})
    if kind["kind"] != "broken":
        admit(params)
    return params


item = st.integers(995, 1052)  # a few ids the catalog lacks: ignored, as Decoder.search does
kinds = st.one_of(
    st.just({"kind": "plain"}),
    st.just({"kind": "sid"}),
    st.just({"kind": "broken"}),
    st.builds(lambda e: {"kind": "sid", "exclude": sorted(set(e))}, st.lists(item, min_size=1, max_size=30)),
    st.builds(lambda a: {"kind": "sid", "available": sorted(set(a))}, st.lists(item, max_size=30)),
    st.builds(
        lambda s, e: {"kind": "sid", "include": s, "exclude": sorted(set(e)) or None},
        st.lists(st.sampled_from(["a", "b"]), min_size=1, max_size=2, unique=True),
        st.lists(item, max_size=10),
    ),
)


@st.composite
def outputs(draw):
    """An output token list: a catalog SID prefix (often), any SID-shaped tokens, or past the SID."""
    t = draw(st.integers(0, L + 1))
    if draw(st.booleans()):
        row = tiny.catalog_sids(40, seed=3)[draw(st.integers(0, 39))]
        toks = [tiny.SID_OFFSETS[s] + int(row[s]) for s in range(L)]
    else:
        toks = [tiny.SID_OFFSETS[s] + draw(st.integers(0, tiny.SIZES[s] - 1)) for s in range(L)]
    return (toks + [tiny.EOS])[:t]


@st.composite
def plans(draw):
    """Steps of (removed, added, preempted, V1 moves, V2 row order seed), on requests named by number."""
    steps, live, next_id = [], [], 0
    for _ in range(draw(st.integers(1, 6))):
        removed = draw(st.lists(st.sampled_from(live), max_size=2, unique=True)) if live else []
        live = [r for r in live if r not in removed]
        room = SLOTS - len(live)
        added = draw(st.lists(st.tuples(kinds, outputs()), max_size=min(3, room)))
        new = list(range(next_id, next_id + len(added)))
        next_id += len(added)
        preempted = draw(st.lists(st.sampled_from(live), max_size=2, unique=True)) if live else []
        live += new
        moves = draw(st.lists(st.tuples(st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1), st.booleans()),
                              max_size=3))  # fmt: skip
        order_seed = draw(st.integers(0, 999))
        steps.append((removed, list(zip(new, added, strict=True)), preempted, moves, order_seed))
    return steps


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=plans(), seed=st.integers(0, 2**16))
def test_v1_and_v2_equal_the_brute_force_mask(world, plan, seed):
    v1 = SidLogitsProcessor(world["config"], torch.device("cpu"), False)
    v2 = V2Batch(world["config"], SLOTS)
    requests: dict[int, tuple[dict, list[int]]] = {}  # the reference: request -> (kind, live output)
    index: dict[int, int] = {}  # request -> its V1 batch row
    gen = torch.Generator().manual_seed(seed)
    for removed, added, preempted, moves, order_seed in plan:
        gone = [index.pop(r) for r in removed + preempted]
        for r in removed:
            requests.pop(r)
            v2.remove(str(r))
        ops = []
        for r, (kind, output) in added:
            requests[r] = (kind, list(output))
        for r in preempted + [r for r, _ in added]:
            kind, output = requests[r]
            index[r] = min(set(range(SLOTS)) - set(index.values()))
            ops.append((index[r], params_of(kind), PROMPT, output))
            if r in preempted:
                v2.remove(str(r))
            v2.add(str(r), params_of(kind), PROMPT, output)
        row_of = {row: r for r, row in index.items()}
        moved = []
        for a, b, swap in moves:
            if a == b:
                continue
            swap = swap or b in row_of  # vLLM moves a row one way only into a hole
            first, second = row_of.pop(a, None), row_of.pop(b, None)
            if swap and second is not None:
                row_of[a] = second
            if first is not None:
                row_of[b] = first
            moved.append((a, b, MoveDirectionality.SWAP if swap else MoveDirectionality.UNIDIRECTIONAL))
        index = {r: row for row, r in row_of.items()}
        v1.update_state(BatchUpdate(batch_size=SLOTS, removed=gone, added=ops, moved=moved))

        logits = {r: torch.randn(tiny.VOCAB, generator=gen) for r in requests}
        v1_logits = torch.randn(SLOTS, tiny.VOCAB, generator=gen)
        for r, row in index.items():
            v1_logits[row] = logits[r]
        got_v1 = v1.apply(v1_logits.clone())
        order = [int(r) for r in np.random.default_rng(order_seed).permutation(sorted(requests))]
        if order:
            stacked = torch.stack([logits[r] for r in order])
            got_v2 = v2.apply([str(r) for r in order], stacked.clone())
        for r, (kind, output) in requests.items():
            want = expected_row(world, logits[r], kind, output)
            torch.testing.assert_close(got_v1[index[r]], want, rtol=0, atol=0)
            torch.testing.assert_close(got_v2[order.index(r)], want, rtol=0, atol=0)
        for r, (kind, output) in requests.items():  # the engine appends a token between steps
            if kind["kind"] != "plain" and len(output) < L + 1:
                token = tiny.SID_OFFSETS[len(output)] if len(output) < L else tiny.EOS
                v2.append(str(r), token)
                output.append(token)
    v1.update_state(None)
