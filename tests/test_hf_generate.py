"""integrations.hf with tiny seeded transformers models (conftest `tiny_hf_models`, no downloads).

1. HF beam search with SidLogitsProcessor returns only catalog SIDs, and the same beams and scores as our
   score_first generate (KV cache reordered by the Decoder's parents; HF reorders its own).
2. Exhaustive references: with a beam at least as wide as every candidate set, beam search keeps every
   prefix, so generate must return every candidate scored as below - recomputed here with one full
   forward per prefix (no KV cache) and plain log-softmaxes:
     filter_first: sum_t log-softmax over the prefix's valid children's tokens;
     score_first:  sum_t log-softmax over the whole vocabulary (+ log p(EOS) with an EOS);
     unconstrained: every code combination, whole-vocabulary log-softmax.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_build.base.errors import InputError
from zerogr_build.index import build_index

pytest.importorskip("transformers")
from transformers import LogitsProcessorList  # noqa: E402

from zerogr_build.integrations import hf  # noqa: E402

SID_OFFSET = 3  # conftest's tiny models: 0 pad, 1 eos, 2 bos / decoder start, then SID tokens
TOL = 2e-4
PADDING = -1e8  # HF beam search starts M-1 beams at -1e9: anything below this is HF's padding
REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- inputs
@st.composite
def catalogs(draw, max_steps: int = 3):
    num_steps = draw(st.integers(2, max_steps))
    sizes = [draw(st.integers(2, 5)) for _ in range(num_steps)]
    n = draw(st.integers(2, 14))
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    sids = np.stack([rng.integers(0, v, n) for v in sizes], axis=1)
    formats = {t: draw(st.sampled_from(["auto", "sparse", "dense"])) for t in range(num_steps)}
    return sids, sizes, formats


def sid_map_for(sizes, eos: int | None):
    return hf.SidMap.from_offsets([SID_OFFSET + sum(sizes[:t]) for t in range(len(sizes))], eos_token_id=eos)


def prompts(model, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Two requests; for decoder-only models the second is left-padded (HF's convention)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(SID_OFFSET, model.config.vocab_size, (2, 5), generator=g)
    mask = torch.ones_like(ids)
    if not model.config.is_encoder_decoder:
        ids[1, :2], mask[1, :2] = 0, 0
    return ids, mask


# ---------------------------------------------------------------- the no-cache reference
def next_token_log_probs(model, ids, mask, prefixes: list[tuple[int, ...]]) -> torch.Tensor:
    """fp64 [B, P, V]: log-softmax over the whole vocabulary after each token prefix, full forwards."""
    b, p = ids.shape[0], len(prefixes)
    width = len(prefixes[0])
    tails = torch.tensor(prefixes, dtype=torch.long).reshape(p, width)
    rows_ids, rows_mask = ids.repeat_interleave(p, 0), mask.repeat_interleave(p, 0)
    tails = tails.repeat(b, 1)
    with torch.no_grad():
        if model.config.is_encoder_decoder:
            start = torch.full((b * p, 1), model.generation_config.decoder_start_token_id)
            out = model(
                input_ids=rows_ids, attention_mask=rows_mask, decoder_input_ids=torch.cat([start, tails], 1)
            )
        else:
            full_mask = torch.cat([rows_mask, torch.ones_like(tails)], 1)
            positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=torch.cat([rows_ids, tails], 1), attention_mask=full_mask, position_ids=positions
            )
    return torch.log_softmax(out.logits[:, -1].double(), -1).reshape(b, p, -1)


def exhaustive_scores(model, ids, mask, sids, sizes, order: str, eos: int | None) -> list[dict]:
    """Per request, {sid tuple: total} of every candidate (catalog SIDs; all code tuples if unconstrained)."""
    table = sid_map_for(sizes, eos).token_table(sizes)
    if order == "unconstrained":
        candidates = sorted(itertools.product(*map(range, sizes)))
    else:
        candidates = sorted({tuple(s) for s in np.asarray(sids).tolist()})
    totals = [dict.fromkeys(candidates, 0.0) for _ in range(ids.shape[0])]
    for t in range(len(sizes) + 1):
        if t == len(sizes) and (eos is None or order == "filter_first"):  # filter-first EOS: log 1
            break
        prefixes = sorted({c[:t] for c in candidates})
        lp = next_token_log_probs(
            model, ids, mask, [tuple(int(table[j][c[j]]) for j in range(t)) for c in prefixes]
        )
        where = {p: i for i, p in enumerate(prefixes)}
        for b, total in enumerate(totals):
            for cand in candidates:
                row = lp[b, where[cand[:t]]]
                if t == len(sizes):
                    total[cand] += float(row[eos])
                    continue
                token = int(table[t][cand[t]])
                if order == "filter_first":
                    children = sorted({int(table[t][c[t]]) for c in candidates if c[:t] == cand[:t]})
                    total[cand] += float(row[token] - torch.logsumexp(row[children], 0))
                else:
                    total[cand] += float(row[token])
    return totals


# ---------------------------------------------------------------- comparisons
def assert_same_beams(sids_a, scores_a, sids_b, scores_b) -> None:
    """Best-first beams [M, L] / [M] agree: scores within TOL, SIDs equal up to order within near-ties."""
    np.testing.assert_allclose(scores_a, scores_b, atol=TOL, rtol=0)
    i = 0
    while i < len(scores_a):
        j = i + 1
        while j < len(scores_a) and abs(scores_a[j] - scores_a[i]) < TOL:
            j += 1
        assert {tuple(s) for s in sids_a[i:j]} == {tuple(s) for s in sids_b[i:j]}, (i, sids_a, sids_b)
        i = j


def assert_matches_exhaustive(res, expected: list[dict], beam_width: int) -> None:
    for b, totals in enumerate(expected):
        ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:beam_width]
        real = int(res.valid[b].sum())
        assert real == len(ranked)
        assert_same_beams(
            res.sids[b, :real].numpy(), res.scores[b, :real].double().numpy(),
            np.array([s for s, _ in ranked]), np.array([v for _, v in ranked]),
        )  # fmt: skip
        assert (res.sids[b, real:] == -1).all() and torch.isinf(res.scores[b, real:]).all()


# ---------------------------------------------------------------- 1. HF beam search == score_first
@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=catalogs(),
    kind=st.sampled_from(["t5", "bart", "gpt2", "llama"]),
    eos=st.sampled_from([None, 1]),
    beam_width=st.integers(2, 5),  # num_beams=1 is HF greedy search (no sequences_scores)
)
def test_hf_beam_search_with_processor_equals_score_first_generate(
    tiny_hf_models, case, kind: str, eos, beam_width: int
) -> None:
    sids, sizes, formats = case
    model = tiny_hf_models[kind]
    index = build_index(sids, sizes, step_formats=formats)
    sid_map = sid_map_for(sizes, eos)
    ids, mask = prompts(model)
    proc = hf.SidLogitsProcessor(index, sid_map)
    out = model.generate(
        ids, attention_mask=mask, num_beams=beam_width, num_return_sequences=beam_width, do_sample=False,
        max_new_tokens=len(sizes) + (eos is not None), logits_processor=LogitsProcessorList([proc]),
        length_penalty=0.0, return_dict_in_generate=True, output_scores=True,
    )  # fmt: skip
    hf_sids = proc.sids(out.sequences).reshape(2, beam_width, len(sizes))
    hf_scores = out.sequences_scores.reshape(2, beam_width).double().numpy()
    real = hf_scores > PADDING  # HF pads a request with fewer than M SIDs with -1e9 beams (pad tokens)
    assert {tuple(s) for s in hf_sids[real].tolist()} <= {tuple(s) for s in sids.tolist()}
    if eos is not None:
        assert (out.sequences[torch.as_tensor(real.reshape(-1)), -1] == eos).all()

    res = hf.generate(model, index, ids, mask, beam_width=beam_width, order="score_first", sid_map=sid_map)
    for b in range(2):
        assert torch.equal(res.valid[b], torch.as_tensor(real[b]))
        keep = real[b]
        assert_same_beams(
            hf_sids[b][keep], hf_scores[b][keep], res.sids[b][keep].numpy(), res.scores[b][keep]
        )


# ---------------------------------------------------------------- 2. exhaustive references
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    case=catalogs(),
    kind=st.sampled_from(["t5", "bart", "gpt2", "llama"]),
    order=st.sampled_from(["filter_first", "score_first"]),
    mode=st.sampled_from(["full", "selective", None]),
    eos=st.sampled_from([None, 1]),
    slot_caps=st.sampled_from([None, 1]),
    extra=st.integers(0, 2),
)
def test_generate_equals_exhaustive_scoring_of_every_catalog_sid(
    tiny_hf_models, case, kind: str, order: str, mode, eos, slot_caps, extra: int
) -> None:
    sids, sizes, formats = case
    model = tiny_hf_models[kind]
    index = build_index(sids, sizes, step_formats=formats)
    ids, mask = prompts(model, seed=1)
    beam_width = len({tuple(s) for s in sids.tolist()}) + extra  # every prefix survives; extra = padding
    gen = hf.SidGenerator(model, index, sid_map_for(sizes, eos), slot_caps=slot_caps)
    res = gen.generate(ids, mask, beam_width=beam_width, order=order, mode=mode)
    expected = exhaustive_scores(model, ids, mask, sids, sizes, order, eos)
    assert_matches_exhaustive(res, expected, beam_width)


@pytest.mark.parametrize("kind", ["t5", "gpt2"])
@pytest.mark.parametrize("eos", [None, 1])
def test_unconstrained_generate_equals_exhaustive_scoring_of_every_code_tuple(
    tiny_hf_models, kind, eos
) -> None:
    sizes = [3, 2, 3]
    sids = np.array([[0, 1, 2], [2, 0, 0]])
    model = tiny_hf_models[kind]
    ids, mask = prompts(model, seed=2)
    res = hf.generate(
        model, build_index(sids, sizes), ids, mask, beam_width=18, order="unconstrained",
        sid_map=sid_map_for(sizes, eos),
    )  # fmt: skip
    catalog = {tuple(s) for s in sids.tolist()}
    for b in range(2):
        for sid, leaf in zip(res.sids[b].tolist(), res.leaves[b].tolist(), strict=True):
            assert (leaf >= 0) == (tuple(sid) in catalog)  # leaves -1 outside the catalog
    res_all = type(res)(
        sids=res.sids, scores=res.scores, leaves=torch.zeros_like(res.leaves), order=res.order
    )
    assert_matches_exhaustive(
        res_all, exhaustive_scores(model, ids, mask, sids, sizes, "unconstrained", eos), 18
    )


# ---------------------------------------------------------------- items, errors, the docs example
def test_items_of_each_beam_are_the_catalog_items_with_that_sid(tiny_hf_models) -> None:
    sids = np.array([[0, 1], [1, 1], [0, 1], [2, 0], [1, 2]])
    item_ids = ["a", "b", "c", "d", "e"]
    gen = hf.SidGenerator(tiny_hf_models["t5"], build_index(sids, [3, 3]), sid_map_for([3, 3], None))
    res = gen.generate(*prompts(gen.model), beam_width=6)
    items = gen.items(res, item_ids)
    for b in range(2):
        for sid, got in zip(res.sids[b].tolist(), items[b], strict=True):
            want = [item_ids[i] for i, row in enumerate(sids.tolist()) if row == sid]
            assert got == want


def test_models_that_transform_logits_after_the_head_are_refused() -> None:
    import transformers

    torch.manual_seed(0)
    config = transformers.Gemma2Config(
        vocab_size=40, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=8, final_logit_softcapping=0.5, initializer_range=0.3,
    )  # fmt: skip
    model = transformers.Gemma2ForCausalLM(config).eval()
    sids = np.array([[0, 1], [1, 0]])
    with pytest.raises(InputError, match="transforms its logits"):
        hf.generate(
            model,
            build_index(sids, [2, 2]),
            *prompts(model),
            beam_width=2,
            sid_map=sid_map_for([2, 2], None),
        )


def test_docs_example_runs_and_is_seeded(capsys) -> None:
    """docs/huggingface.md's example runs, and prints the same thing twice (it is seeded)."""
    page = (REPO / "docs" / "huggingface.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    outputs = []
    for _ in range(2):
        exec(compile(code, "hf-docs-example", "exec"), {"__name__": "hf_docs_example"})
        outputs.append(capsys.readouterr().out)
    assert "catalog SIDs" in outputs[0]
    assert outputs[0] == outputs[1]
