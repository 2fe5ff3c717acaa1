"""The zerogr Decoder over a Hugging Face model: constrained beam search with the model's own KV cache.

    gen = SidGenerator(model, bundle, sid_map)             # step layers = the head's SID rows, built once
    gen = SidGenerator(model, bundle, sid_map, order="auto")   # the quality gate's recorded order
    res = gen.generate(input_ids, attention_mask, beam_width=M, order="filter_first")
    res.sids, res.scores, res.leaves                       # the Decoder's SearchResult: [B, M, L], [B, M]
    gen.items(res)                                         # item ids per beam
    res = generate(model, bundle, input_ids, beam_width=M, sid_map=sid_map)   # one-off form

Step t's output layer is the rows of the model's head that spell step t's codes (token = o_t + code), with
the head's bias; the hidden vector is what the model hands its head (ModelSession), so code c's logit is
exactly the model's logit of its token. Orders:
  - filter_first: log-softmax over each beam's valid codes only; the full-vocabulary head never runs.
  - score_first: log-softmax over the model's whole vocabulary (HF's normalisation), then the mask - the
    same beams as HF beam search with SidLogitsProcessor.
  - unconstrained: any code of step t, normalised over the whole vocabulary (a speed/quality reference).
After every step the KV cache is reordered with the beams (BeamState.parents). With an EOS in the SidMap,
score_first and unconstrained add each final beam's log p(EOS) over the whole vocabulary and re-sort, as
HF beam search does with the forced EOS; under filter_first EOS is the only valid token, log 1 = 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch

from ...base.errors import InputError
from ...bundle.quality import quality_files
from ...runtime.decoder import ORDERS, Decoder, SearchResult
from ..sid_map import SidMap, catalog_token_table
from .load import model_hash
from .model import ModelSession, output_layer


class SidGenerator:
    """A Decoder whose step layers are a model's head rows for the SID tokens. Build once, generate often.

    model: a transformers model with a language-model head (encoder-decoder or decoder-only).
    bundle: a Bundle (item ids through `items`) or a SidIndex. sid_map: the SID spelling (SidMap).
    device: where the Decoder runs (default: the head's device). plan, slot_caps: as for Decoder.
    order: generate's default order, or "auto": the quality gate's decision recorded in the bundle for
        this model (Decoder(order="auto"); the record is `self.decoder.quality`), filter_first without one.
    model_version: the tag that record is filed under; default the bundle's model_version, else (when the
        bundle holds quality records) load.model_hash(model), the name `zerogr compare --hf-model
        --record` files a record under when neither names the model.
    The head rows are copied here: rebuild the generator after changing the model's weights.
    """

    def __init__(
        self,
        model,
        bundle,
        sid_map: SidMap,
        *,
        device=None,
        plan: Any = None,
        slot_caps: Any = None,
        order: str = "filter_first",
        model_version: str | None = None,
    ) -> None:
        if not isinstance(sid_map, SidMap):
            raise InputError(f"sid_map must be a SidMap, got {type(sid_map).__name__}")
        index = bundle.index if hasattr(bundle, "index") else bundle
        self.model = model
        self.sid_map = sid_map
        table = catalog_token_table(sid_map, index)
        weight, bias = output_layer(model)
        sid_map.check_vocabulary(index.codebook_sizes, int(weight.shape[0]))
        self.step_tokens = [torch.as_tensor(line, device=weight.device) for line in table]
        self.decoder = Decoder(
            bundle,
            [_step_layer(weight, bias, tokens) for tokens in self.step_tokens],
            device=device if device is not None else weight.device,
            plan=plan,
            slot_caps=slot_caps,
            order=order,
            model_version=_record_tag(model, bundle, model_version) if order == "auto" else None,
        )
        self._checked = False

    def generate(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        *,
        beam_width: int,
        order: str | None = None,
        mode: Any = None,
        observe: Callable[[int, Any, torch.Tensor, torch.Tensor], None] | None = None,
    ) -> SearchResult:
        """Beam search over the catalog: SearchResult with sids [B, M, L] (codes), scores [B, M], leaves.

        input_ids int [B, S] (encoder input, or left-padded prompts for decoder-only models).
        order: None = the generator's order (its `order=`, "auto" resolved at construction).
        mode: the Decoder's scoring mode(s) ("full", "selective", ...; None = plan / heuristic).
        observe(t, state, hidden [R, d], log_normalizer fp32 [R]): called before each step with the beams,
        their head inputs and the logsumexp of their logits over the whole vocabulary (computed for
        every order when observe is given), e.g. compare.StepMass.observe.
        """
        order = self.decoder.order if order is None else order
        if order not in ORDERS:
            raise InputError(f"unknown order {order!r} ({', '.join(ORDERS)})")
        dec = self.decoder
        session = ModelSession(self.model, input_ids, attention_mask)
        state = dec.start(session.input_ids.shape[0], beam_width, order)
        hidden = session.first(check=not self._checked)
        self._checked = True
        eos = self.sid_map.eos_token_id if order != "filter_first" else None
        for t in range(dec.num_steps):
            full = None
            if order != "filter_first" or observe is not None:
                full = session.log_normalizer(hidden)
            if observe is not None:
                observe(t, state, hidden, full)
            state = dec.step(state, hidden, mode, log_normalizer=None if order == "filter_first" else full)
            if t + 1 < dec.num_steps or eos is not None:
                codes = state.prefixes[:, -1].to(self.step_tokens[t].device)
                tokens = self.step_tokens[t][codes].clamp(min=0)  # padded beams: any token will do
                hidden = session.next(tokens, state.parents)
        res = dec.finish(state)
        if eos is None:
            return res
        return res.rescored(session.token_log_prob(hidden, eos))

    def items(self, res: SearchResult, items: Sequence[Any] | np.ndarray | None = None):
        """Item ids of every result beam, [B][M] lists (Decoder.items)."""
        return self.decoder.items(res, items)


def generate(
    model,
    bundle,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None = None,
    *,
    beam_width: int,
    sid_map: SidMap,
    order: str = "filter_first",
    mode: Any = None,
    device=None,
) -> SearchResult:
    """One-off SidGenerator(model, bundle, sid_map).generate(...); build a SidGenerator to call it often."""
    gen = SidGenerator(model, bundle, sid_map, device=device)
    return gen.generate(input_ids, attention_mask, beam_width=beam_width, order=order, mode=mode)


def _record_tag(model, bundle, model_version: str | None) -> str | None:
    """The tag order="auto" looks a record up by: model_version, the bundle's model_version, or the
    model's hash when the bundle holds quality records (hashing reads every weight, so only then)."""
    if model_version is not None:
        return model_version
    tag = getattr(bundle, "model_version", None)
    if tag:
        return tag
    if hasattr(bundle, "files") and quality_files(bundle):
        return model_hash(model)
    return None


def _step_layer(weight: torch.Tensor, bias: torch.Tensor | None, tokens: torch.Tensor):
    """(weight [V_t, d], bias [V_t]) of one step: the head rows of its codes' tokens.

    A code the SidMap does not spell (explicit tables) gets a zero row and bias -inf: never chosen.
    """
    spelled = tokens >= 0
    safe = tokens.clamp(min=0)
    rows = weight[safe] * spelled[:, None].to(weight.dtype)
    if bias is None and bool(spelled.all()):
        return rows, None
    step_bias = torch.zeros(tokens.shape[0], dtype=weight.dtype, device=weight.device)
    if bias is not None:
        step_bias = bias[safe].to(weight.dtype)
    return rows, step_bias.masked_fill(~spelled, float("-inf"))


__all__ = ["SidGenerator", "generate"]
