"""SidLogitsProcessor against a brute-force reference, driven directly through vLLM's batch interface (no
engine): random sequences of added / removed / moved requests (both move kinds), rows at every SID step,
on and off the catalog, with exclusions and availability, plain rows and a request whose bundle vanished."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from vllm import SamplingParams
from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

from zerogr_build.integrations.vllm import SidLogitsProcessor
from zerogr_build.integrations.vllm import tiny_model as tiny

L = len(tiny.SIZES)
SLOTS = 6


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    base = tiny.catalog_sids(40, seed=3)
    sids = np.concatenate([base, base[:10]])  # items 1040..1049 share the SIDs of 1000..1009
    ids = 1000 + np.arange(sids.shape[0])
    tiny.publish(root / "out", sids, ids)
    sid_map = tiny.sid_map().save(root / "sid_map.json")
    return dict(root=root, sids=sids, ids=ids, sid_map=str(sid_map))


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
    allowed = np.ones(len(world["ids"]), dtype=bool)
    if kind.get("exclude"):
        allowed &= ~np.isin(world["ids"], kind["exclude"])
    if kind.get("available") is not None:
        allowed &= np.isin(world["ids"], kind["available"])
    for row, ok in zip(tokens.tolist(), allowed.tolist(), strict=True):
        if ok and row[:t] == output[:t]:
            out[row[t]] = logits[row[t]]
    return out


def params_of(world, kind: dict) -> SamplingParams:
    if kind["kind"] == "plain":
        return SamplingParams()
    args = {
        "bundle": str(world["root"] / ("out" if kind["kind"] != "broken" else "gone")),
        "sid_map": world["sid_map"],
    }
    for key in ("exclude", "available"):
        if kind.get(key) is not None:
            args[key] = kind[key]
    return SamplingParams(extra_args={"zerogr": args})


item = st.integers(1000, 1049)
kinds = st.one_of(
    st.just({"kind": "plain"}),
    st.just({"kind": "sid"}),
    st.just({"kind": "broken"}),
    st.builds(lambda e: {"kind": "sid", "exclude": sorted(set(e))}, st.lists(item, min_size=1, max_size=30)),
    st.builds(
        lambda a: {"kind": "sid", "available": sorted(set(a))}, st.lists(item, min_size=1, max_size=30)
    ),
)


@st.composite
def outputs(draw, world_sids):
    """An output token list: a catalog SID prefix (often), any SID-shaped tokens, or past the SID."""
    t = draw(st.integers(0, L + 1))
    if draw(st.booleans()):
        row = world_sids[draw(st.integers(0, len(world_sids) - 1))]
        toks = [tiny.SID_OFFSETS[s] + int(row[s]) for s in range(L)]
    else:
        toks = [tiny.SID_OFFSETS[s] + draw(st.integers(0, tiny.SIZES[s] - 1)) for s in range(L)]
    return (toks + [tiny.EOS])[:t]


@st.composite
def updates(draw):
    """A list of batch updates: each removes, adds (index, kind, output) and moves (a, b, swap)."""
    sids = tiny.catalog_sids(40, seed=3)
    steps = []
    for _ in range(draw(st.integers(1, 5))):
        removed = draw(st.lists(st.integers(0, SLOTS - 1), max_size=2, unique=True))
        added = draw(
            st.lists(
                st.tuples(st.integers(0, SLOTS - 1), kinds, outputs(sids)),
                max_size=4,
                unique_by=lambda a: a[0],
            )
        )
        moved = draw(
            st.lists(
                st.tuples(st.integers(0, SLOTS - 1), st.integers(0, SLOTS - 1), st.booleans()), max_size=3
            )
        )
        steps.append((removed, added, [m for m in moved if m[0] != m[1]]))
    return steps


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(plan=updates(), seed=st.integers(0, 2**16))
def test_every_row_equals_the_brute_force_mask(world, plan, seed):
    proc = SidLogitsProcessor(
        SimpleNamespace(model_config=SimpleNamespace(hf_config=SimpleNamespace(eos_token_id=tiny.EOS))),
        torch.device("cpu"), False,
    )  # fmt: skip
    batch: dict[int, tuple[dict, list[int]]] = {}  # the reference: index -> (kind, live output list)
    gen = torch.Generator().manual_seed(seed)
    for removed, added, moved in plan:
        for i in removed:
            batch.pop(i, None)
        ops = []
        for i, kind, output in added:
            output = list(output)
            batch[i] = (kind, output)
            ops.append((i, params_of(world, kind), [1, 5], output))
        moves = []
        for a, b, swap in moved:
            first, second = batch.pop(a, None), batch.pop(b, None)
            if swap and second is not None:
                batch[a] = second
            if first is not None:
                batch[b] = first
            moves.append((a, b, MoveDirectionality.SWAP if swap else MoveDirectionality.UNIDIRECTIONAL))
        proc.update_state(BatchUpdate(batch_size=SLOTS, removed=removed, added=ops, moved=moves))
        logits = torch.randn(SLOTS, tiny.VOCAB, generator=gen)
        got = proc.apply(logits.clone())
        for i in range(SLOTS):
            want = expected_row(world, logits[i], *batch[i]) if i in batch else logits[i]
            torch.testing.assert_close(got[i], want, rtol=0, atol=0)
        for kind, output in batch.values():  # the engine appends a token to the live lists between steps
            if kind["kind"] != "plain" and len(output) < L + 1:
                output.append(tiny.SID_OFFSETS[len(output)] if len(output) < L else tiny.EOS)
    proc.update_state(None)
