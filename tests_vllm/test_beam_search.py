"""zerogr's beam_search over a real vLLM engine equals the zerogr Decoder over the same model run by
transformers (SidGenerator: the model's head rows, its own KV cache), within 1e-4, in both orders, with and
without an EOS in the SID map (score_first then counts the EOS step in both, as the quality gate does); with
include / exclude / availability it equals the Decoder over a bundle rebuilt from the allowed items."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from vllm import LLM

from zerogr_build import open_bundle
from zerogr_build.integrations.hf import SidGenerator
from zerogr_build.integrations.vllm import beam_search
from zerogr_build.integrations.vllm import tiny_model as tiny

ATOL = 1e-4
# vLLM's and transformers' fp32 forward passes differ by about 1e-6 relative; moderate weights keep the
# SID scores (sums of log-probabilities) small enough for that to stay well inside ATOL.


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm_beam")
    model_dir = tiny.make_model(root / "model", seed=3, init_std=0.1)
    sids = np.concatenate([tiny.catalog_sids(60, seed=6), tiny.catalog_sids(60, seed=6)[:15]])
    ids = 1000 + np.arange(sids.shape[0])
    out = root / "out"
    tiny.publish(out, sids, ids)
    sid_map = tiny.sid_map(eos=False)
    llm = LLM(
        model=str(model_dir), tokenizer=str(model_dir), dtype="float32", enforce_eager=True,
        max_model_len=64, max_num_seqs=64, seed=0, gpu_memory_utilization=0.5,
    )  # fmt: skip
    hf = transformers.LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    rng = np.random.default_rng(2)
    prompts = [tiny.prompt(rng, length=7) for _ in range(4)]
    yield dict(llm=llm, hf=hf, root=root, out=out, sids=sids, ids=ids, sid_map=sid_map, prompts=prompts)
    del llm


def decoder_reference(world, bundle_dir, order: str, beam_width: int, sid_map=None):
    """The Decoder over the transformers model (SidGenerator): (sids [B, M, L], scores)."""
    gen = SidGenerator(world["hf"], open_bundle(bundle_dir), sid_map or world["sid_map"])
    res = gen.generate(torch.tensor(world["prompts"]), beam_width=beam_width, order=order)
    return res.sids.numpy(), res.scores.numpy()


def assert_same_beams(got_sids, got_scores, ref_sids, ref_scores) -> None:
    """Scores within ATOL beam by beam; SIDs equal except where two neighbouring scores are within ATOL
    (their order is then a rounding matter)."""
    np.testing.assert_allclose(got_scores, ref_scores, atol=ATOL, rtol=0)
    finite = np.isfinite(ref_scores)
    gap = np.abs(np.diff(ref_scores, axis=1))
    near = np.zeros_like(finite)
    near[:, 1:] |= gap < ATOL
    near[:, :-1] |= gap < ATOL
    same = (got_sids == ref_sids).all(axis=2)
    assert (same | near | ~finite).all()
    assert finite.sum() > 0


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
@pytest.mark.parametrize("beam_width", [4, 16])
@pytest.mark.parametrize("eos", [False, True], ids=["no-eos", "eos"])
def test_beam_search_equals_the_decoder(world, order, beam_width, eos):
    sid_map = tiny.sid_map(eos=eos)
    out = beam_search(world["llm"], world["prompts"], str(world["out"]), sid_map, beam_width, order=order)
    ref_sids, ref_scores = decoder_reference(world, world["out"], order, beam_width, sid_map)
    got = out.result
    assert_same_beams(got.sids.numpy(), got.scores.numpy(), ref_sids, ref_scores)
    catalog = {tuple(s) for s in world["sids"].tolist()}
    for b, beams in enumerate(got.sids.numpy()):
        for m, sid in enumerate(beams):
            assert tuple(sid.tolist()) in catalog
            tokens = [tiny.SID_OFFSETS[t] + int(c) for t, c in enumerate(sid)]
            assert out.token_ids[b][m] == tokens
            assert out.items[b][m]  # every beam names its item(s)


@pytest.mark.parametrize("order", ["filter_first", "score_first"])
def test_constraints_equal_the_decoder_over_the_rebuilt_subset(world, order):
    root, ids, sids = world["root"], world["ids"], world["sids"]
    sets_file = tiny.write_sets(root / "sets.parquet", {"a": ids[::2].tolist(), "b": ids[1::3].tolist()})
    available = ids[ids % 5 != 0].tolist()
    exclude = [int(i) for i in ids[:30:3]]
    include = ["a", "b"]
    allowed = np.isin(ids, np.union1d(ids[::2], ids[1::3])) & np.isin(ids, available) & ~np.isin(ids, exclude)
    subset = root / f"subset-{order}"
    tiny.publish(subset, sids[allowed], ids[allowed])
    b = len(world["prompts"])
    out = beam_search(
        world["llm"], world["prompts"], str(world["out"]), world["sid_map"], 8, order=order,
        include=[include] * b, exclude=[exclude] * b, available=available, item_sets=str(sets_file),
    )  # fmt: skip
    ref_sids, ref_scores = decoder_reference(world, subset, order, 8)
    assert_same_beams(out.result.sids.numpy(), out.result.scores.numpy(), ref_sids, ref_scores)
    allowed_ids = set(ids[allowed].tolist())
    for beams in out.items:
        for items in beams:
            assert items and set(items) <= allowed_ids
