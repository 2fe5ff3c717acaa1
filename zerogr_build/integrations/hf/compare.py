"""`zerogr compare`'s measurement for a Hugging Face model, decoded through SidGenerator (its KV cache).

    search = hf_search(SidGenerator(model, bundle, sid_map), inputs_of)
    report = compare_searches(bundle, search, requests, beam_width=20, ks=(1, 5, 10, 20))
    report = run_hf_compare(bundle_dir, "ckpt/", "sid_map.json", "requests.parquet")   # the CLI's path

inputs_of(request_ids) -> (input_ids [B, S], attention_mask [B, S]) encodes a batch of requests;
token_inputs(token_requests, ...) makes one from a requests file of token ids (compare.read_token_requests).
The report has compare_orders' shape; score_first and unconstrained normalise over the model's whole
vocabulary (as HF beam search does), and the invalid mass of a beam is the model's probability on every
token that is not a valid child of its prefix (other steps' codes and special tokens included).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from ...base.errors import InputError
from ...base.progress import NULL_PROGRESS, Progress
from ...bundle import open_bundle, resolve_bundle
from ...compare.inputs import DEFAULT_KS, TokenRequests, beam_width_for, parse_ks, read_token_requests
from ...compare.measure import CONSTRAINED, Search, StepMass, compare_searches
from ...compare.report import CompareReport
from ...runtime.items.constraints import ItemMask
from ..sid_map import SidMap
from .generate import SidGenerator
from .load import load_hf_model, model_hash


def hf_search(
    gen: SidGenerator, inputs_of: Callable[[list], tuple[torch.Tensor, torch.Tensor | None]]
) -> Search:
    """A compare_searches Search: every order decoded by gen.generate, the mechanism measured on the way."""
    last: dict = {}

    def search(ids: list, order: str, beam_width: int):
        if last.get("ids") is not ids:  # the three orders of a batch share its encoder inputs
            last.update(ids=ids, inputs=inputs_of(ids))
        input_ids, mask = last["inputs"]
        meter = StepMass(gen.decoder)
        observe = meter.observe if order in CONSTRAINED else None
        res = gen.generate(input_ids, mask, beam_width=beam_width, order=order, observe=observe)
        return res, gen.items(res), meter.per_step()

    return search


def token_inputs(
    requests: TokenRequests, *, pad_token_id: int = 0, left_pad: bool = True
) -> Callable[[Sequence[int]], tuple[torch.Tensor, torch.Tensor]]:
    """inputs_of for hf_search: the rows `ids` of a token requests file, padded to the batch's longest
    (left for decoder-only models, as HF generate expects; right for encoder-decoder models) with
    pad_token_id and attention 0. Returns (input_ids int64 [B, S], attention_mask int64 [B, S])."""

    def inputs_of(ids: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = [requests.input_ids[i] for i in ids]
        masks = [
            requests.attention_mask[i] if requests.attention_mask is not None else [1] * len(rows[j])
            for j, i in enumerate(ids)
        ]
        width = max(len(r) for r in rows)
        input_ids = torch.full((len(rows), width), int(pad_token_id), dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for j, (row, row_mask) in enumerate(zip(rows, masks, strict=True)):
            span = slice(width - len(row), width) if left_pad else slice(0, len(row))
            input_ids[j, span] = torch.as_tensor(row, dtype=torch.long)
            mask[j, span] = torch.as_tensor(row_mask, dtype=torch.long)
        return input_ids, mask

    return inputs_of


def run_hf_compare(
    bundle_path: str | Path | None,
    model_dir: str | Path,
    sid_map_path: str | Path,
    requests_path: str | Path,
    *,
    beam_width: int | None = None,
    ks: str | Sequence[int] = DEFAULT_KS,
    batch_size: int = 64,
    device: str = "cpu",
    target_column: str = "target_item",
    progress: Progress = NULL_PROGRESS,
    available: str | Path | None = None,
) -> CompareReport:
    """`zerogr compare --hf-model DIR --sid-map FILE --requests FILE`: load the saved model offline
    (load.load_hf_model), the SidMap (SidMap.load) and the token requests, then compare_searches over
    hf_search. report.extra gets bundle, model (the dir), model_hash (load.model_hash), sid_map and
    requests_file. available: a Parquet availability file, as for run_compare."""
    ks = parse_ks(ks)
    beam_width_for(ks, beam_width)
    sid_map = SidMap.load(sid_map_path)
    bundle = open_bundle(resolve_bundle(bundle_path))
    model = load_hf_model(model_dir, device)
    try:
        sid_map.check_vocabulary(bundle.index.codebook_sizes, _vocab_size(model.get_output_embeddings()))
    except InputError as exc:
        raise InputError(f"{sid_map_path}: {exc}") from None
    requests = read_token_requests(
        requests_path, target_column=target_column, vocab_size=_vocab_size(model.get_input_embeddings()),
        max_length=prompt_limit(model, bundle.index.num_steps, sid_map.eos_token_id, model_dir),
    )  # fmt: skip
    mask = None if available is None else ItemMask.from_parquet(bundle, available)
    gen = SidGenerator(model, bundle, sid_map, device=device)
    gen.decoder.set_availability(mask)
    pad = getattr(model.config, "pad_token_id", None)
    inputs_of = token_inputs(
        requests,
        pad_token_id=0 if pad is None else int(pad),
        left_pad=not getattr(model.config, "is_encoder_decoder", False),
    )
    report = compare_searches(
        bundle, hf_search(gen, inputs_of), requests.requests, beam_width=beam_width, ks=ks,
        batch_size=batch_size, progress=progress,
    )  # fmt: skip
    report.extra.update(
        bundle=str(bundle.path),
        model=str(model_dir),
        model_hash=model_hash(model),
        sid_map=str(sid_map_path),
        requests_file=str(requests_path),
    )
    if mask is not None:
        report.extra.update(available_file=str(available), available_items=mask.num_available)
    return report


def prompt_limit(
    model, num_steps: int, eos_token_id: int | None, name: str | Path = "the model"
) -> int | None:
    """The most prompt tokens a request may have for this model, or None when its config states no
    position limit (`max_position_embeddings`; GPT-2's n_positions answers to that name too).

    The SID tokens fed back to the model (every step's but the last, plus the forced EOS when the SidMap
    has one) take positions after the prompt in a decoder-only model, and after the start token in an
    encoder-decoder model's decoder, whose encoder takes the prompt. InputError naming the model when they
    alone do not fit."""
    positions = getattr(model.config, "max_position_embeddings", None)
    if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
        return None
    fed_back = num_steps - 1 + (eos_token_id is not None)
    if fed_back + 1 > positions:
        raise InputError(f"--hf-model {name}: its {positions} positions cannot hold {num_steps} SID tokens")
    encoder_decoder = getattr(model.config, "is_encoder_decoder", False)
    return positions if encoder_decoder else positions - fed_back


def _vocab_size(embeddings) -> int:
    """Rows of an embedding or head module (its weight's first dimension)."""
    return int(embeddings.weight.shape[0])


__all__ = ["hf_search", "prompt_limit", "run_hf_compare", "token_inputs"]
