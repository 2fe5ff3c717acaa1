"""beam_search: constrained beam search over a vLLM engine - the engine's forward passes, the zerogr
Decoder's selection, so every returned SID is a catalog SID (include / exclude / availability honoured).

    out = beam_search(llm, prompts, "bundles/", "sid_map.json", beam_width=20, order="filter_first")
    out.result.sids, out.result.scores   # the Decoder's SearchResult: codes [B, M, L], scores [B, M]
    out.items, out.token_ids             # item ids and the SID spelled as tokens, per (request, beam)

Each step submits every live beam as a one-token request through LLM.generate: its prompt is the request's
prompt followed by the beam's SID tokens so far (prefix caching serves the shared part), and it asks for the
log-probabilities of exactly the beam's catalog children (SamplingParams.logprob_token_ids, at most 128 a
request; wider rows are split). Those values are the Decoder's logits: step t's output layer is the identity
on its V_t codes, so Decoder.step sees exactly the engine's numbers and selects as it does for any model:
  - filter_first: log-softmax over each beam's valid children (a shift of the logits cancels, so the
    engine's log-probabilities and its logits give the same scores);
  - score_first: the engine's log-probabilities as they are, normalised over the whole vocabulary. That
    needs logprobs_mode "raw_logprobs" (the default) or "processed_logprobs" (the beam requests use
    temperature 1 and no processor, so both are the raw values); the *_logits modes are refused for it.
The SID's score is the sum of its L steps, as Decoder.search returns it. With an EOS in the SID map,
score_first then adds each final beam's log p(EOS) over the whole vocabulary and re-sorts (one more
one-token request per beam): the same score as SidGenerator's and the quality gate's score_first, so the
gate's verdict carries over. Under filter_first EOS is the only valid token after the SID, log 1 = 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from ...bundle import open_bundle
from ...runtime.beams import SearchResult
from ...runtime.decoder import Decoder
from ...runtime.items.constraints import ItemMask, ItemSets
from ..sid_map import SidMap, catalog_token_table

MAX_TOKEN_IDS = 128  # vllm.sampling_params.MAX_LOGPROB_TOKEN_IDS
LOGPROB_MODES = ("raw_logprobs", "processed_logprobs")


@dataclass(frozen=True)
class BeamSearchOutput:
    """result: the Decoder's SearchResult (sids int64 [B, M, L] codes, -1 at padding; scores fp32 [B, M];
    leaves); items: [B][M] lists of item ids; token_ids: [B][M] the SID as model tokens ([] at padding)."""

    result: SearchResult
    items: list[list[list[Any]]]
    token_ids: list[list[list[int]]]


def beam_search(
    llm,
    prompts: Sequence[Any],
    bundle: Any,
    sid_map: SidMap | str | Path,
    beam_width: int,
    *,
    order: str = "filter_first",
    include: Sequence[Any] | None = None,
    exclude: Sequence[Any] | None = None,
    available: ItemMask | str | Path | Sequence[Any] | None = None,
    item_sets: ItemSets | str | Path | None = None,
) -> BeamSearchOutput:
    """Constrained beam search of `beam_width` beams per prompt over `llm` (a vllm.LLM).

    prompts: B prompts, each a string (tokenized by the engine's tokenizer), a list of token ids, or a dict
        with "prompt_token_ids" (vllm.TokensPrompt).
    bundle: a Bundle, or a path (an OUT dir, meaning its LATEST, or a version dir).
    sid_map: a SidMap or the file SidMap.save wrote. order: "filter_first" or "score_first".
    include / exclude: one entry per prompt (None = no restriction): item set names (from item_sets) /
        item ids never to return. available: an ItemMask, a Parquet availability file or a list of the
        available item ids. item_sets: ItemSets or a Parquet file of (set, item_id) rows.
    """
    if order not in ("filter_first", "score_first"):
        raise InputError(f"order must be filter_first or score_first, got {order!r}")
    if isinstance(beam_width, bool) or int(beam_width) != beam_width or beam_width < 1:
        raise InputError(f"beam_width must be a positive integer, got {beam_width!r}")
    mode = _logprobs_mode(llm)
    if order == "score_first" and mode not in LOGPROB_MODES:
        raise InputError(f"score_first needs the engine's logprobs_mode in {LOGPROB_MODES}, it is {mode!r}")
    bundle = open_bundle(bundle) if isinstance(bundle, (str, Path)) else bundle
    sid_map = sid_map if isinstance(sid_map, SidMap) else SidMap.load(sid_map)
    table = catalog_token_table(sid_map, bundle.index)
    vocab = _vocab_size(llm)
    sid_map.check_vocabulary(bundle.index.codebook_sizes, vocab)
    token_prompts = [_prompt_tokens(llm, p) for p in prompts]
    if not token_prompts:
        raise InputError("beam_search needs at least one prompt")
    dec = _decoder(bundle, available, item_sets)
    state = dec.start(len(token_prompts), int(beam_width), order, include=include, exclude=exclude)
    width = max(dec.codebook_sizes)
    for t in range(dec.num_steps):
        logits = _step_logits(llm, dec, state, t, token_prompts, table, width)
        normalizer = None if order == "filter_first" else torch.zeros(state.num_beams)
        state = dec.step(state, logits, "full", log_normalizer=normalizer)
    res = dec.finish(state)
    if order == "score_first" and sid_map.eos_token_id is not None:
        res = res.rescored(_eos_logprobs(llm, res, token_prompts, table, sid_map.eos_token_id))
    sids = res.sids.numpy()
    spelled = [
        [[int(table[s][c]) for s, c in enumerate(sid)] if sid[0] >= 0 else [] for sid in beams]
        for beams in sids
    ]
    return BeamSearchOutput(result=res, items=dec.items(res), token_ids=spelled)


def _decoder(bundle, available, item_sets) -> Decoder:
    """A Decoder whose step t output layer is the identity on the V_t codes (padded to the widest step),
    so the hidden vector it is given is the codes' logits themselves."""
    width = max(int(v) for v in bundle.index.codebook_sizes)
    weights = [torch.eye(int(v), width) for v in bundle.index.codebook_sizes]
    dec = Decoder(bundle, weights)
    if item_sets is not None:
        if not isinstance(item_sets, ItemSets):
            item_sets = ItemSets.from_parquet(bundle, item_sets)
        dec.set_item_sets(item_sets)
    if available is not None:
        if isinstance(available, ItemMask):
            mask = available
        elif isinstance(available, (str, Path)):
            mask = ItemMask.from_parquet(bundle, available)
        else:
            mask = ItemMask.from_ids(bundle, list(available))
        dec.set_availability(mask)
    return dec


def _children(dec: Decoder, t: int, row: int) -> np.ndarray:
    """int64 codes of the children of `row` at step t (catalog only; the Decoder applies the item filter)."""
    table = dec.index.steps[t]
    if table.next is not None:
        return np.flatnonzero(np.asarray(table.next[row]) >= 0)
    indptr = table.indptr
    return np.asarray(table.tokens[int(indptr[row]) : int(indptr[row + 1])], dtype=np.int64)


def _step_logits(
    llm, dec: Decoder, state, t: int, prompts: list[list[int]], table, width: int
) -> torch.Tensor:
    """fp32 [R, width]: the engine's log-probabilities of every live beam's children at step t, in code
    columns (0 elsewhere: those codes are not valid children, so the Decoder never reads them)."""
    from vllm import SamplingParams, TokensPrompt

    rows = state.rows.cpu().numpy()
    prefixes = state.prefixes.cpu().numpy()
    batch = state.batch.cpu().numpy()
    asks: list[tuple[int, np.ndarray]] = []
    inputs, params = [], []
    for i in np.flatnonzero(rows >= 0).tolist():
        codes = _children(dec, t, int(rows[i]))
        sid = [int(table[s][prefixes[i, s]]) for s in range(t)]
        for lo in range(0, codes.shape[0], MAX_TOKEN_IDS):
            part = codes[lo : lo + MAX_TOKEN_IDS]
            asks.append((i, part))
            inputs.append(TokensPrompt(prompt_token_ids=prompts[batch[i]] + sid))
            params.append(
                SamplingParams(
                    max_tokens=1, temperature=1.0, top_p=1.0, top_k=0, detokenize=False,
                    logprob_token_ids=table[t][part].tolist(),
                )
            )  # fmt: skip
    out = torch.zeros((state.num_beams, width), dtype=torch.float32)
    results = llm.generate(inputs, params, use_tqdm=False) if inputs else []
    for (i, part), result in zip(asks, results, strict=True):
        logprobs = result.outputs[0].logprobs[0]
        values = [logprobs[tok].logprob for tok in table[t][part].tolist()]
        out[i, torch.as_tensor(part)] = torch.tensor(values, dtype=torch.float32)
    return out


def _eos_logprobs(llm, res: SearchResult, prompts: list[list[int]], table, eos: int) -> torch.Tensor:
    """fp32 [B, M]: each final beam's log p(EOS) after its SID, over the whole vocabulary (0 at padding)."""
    from vllm import SamplingParams, TokensPrompt

    sids = res.sids.numpy()
    beams = [(b, m) for b, m in zip(*np.nonzero(sids[:, :, 0] >= 0), strict=True)]
    params = SamplingParams(
        max_tokens=1, temperature=1.0, top_p=1.0, top_k=0, detokenize=False, logprob_token_ids=[eos]
    )
    inputs = [
        TokensPrompt(prompt_token_ids=prompts[b] + [int(table[s][c]) for s, c in enumerate(sids[b, m])])
        for b, m in beams
    ]
    out = torch.zeros(sids.shape[:2], dtype=torch.float32)
    results = llm.generate(inputs, params, use_tqdm=False) if inputs else []
    for (b, m), result in zip(beams, results, strict=True):
        out[b, m] = result.outputs[0].logprobs[0][eos].logprob
    return out


def _prompt_tokens(llm, prompt: Any) -> list[int]:
    if isinstance(prompt, str):
        return list(llm.get_tokenizer().encode(prompt))
    if isinstance(prompt, dict):
        if "prompt_token_ids" in prompt:
            return [int(x) for x in prompt["prompt_token_ids"]]
        if "prompt" in prompt:
            return list(llm.get_tokenizer().encode(prompt["prompt"]))
        raise InputError("a prompt dict needs 'prompt_token_ids' or 'prompt'")
    try:
        return [int(x) for x in prompt]
    except (TypeError, ValueError):
        what = f"a prompt must be a string, token ids or a TokensPrompt, got {prompt!r}"
        raise InputError(what[:200]) from None


def _logprobs_mode(llm) -> str:
    return str(llm.llm_engine.model_config.logprobs_mode)


def _vocab_size(llm) -> int:
    return int(llm.llm_engine.model_config.get_vocab_size())


__all__ = ["BeamSearchOutput", "beam_search"]
