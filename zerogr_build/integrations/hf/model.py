"""A Hugging Face model driven one SID token at a time, for the Decoder: hidden in, KV cache reordered.

    head_weight, head_bias = output_layer(model)          # what turns the head's input into logits
    session = ModelSession(model, input_ids, attention_mask)
    x = session.first()                                    # [B, d]: input of the output layer at step 0
    x = session.next(tokens, parents)                      # [R, d] after feeding one token per beam

`x` is the tensor the model hands its output layer (`get_output_embeddings()`), captured by a forward
pre-hook: whatever the model does between its last block and the head (T5 scales by d_model**-0.5 with
tied embeddings; others do nothing) is already applied, in every transformers version, so
`x @ head_weight.T + head_bias` are the model's logits. The hook hands the head a zero-length sequence, so
the model computes no full-vocabulary logits on these calls (filter-first scores only valid rows).
`ModelSession.check_logits` compares against the model's own logits once, and raises for models that
transform logits after the head (soft-capping, logit scales) - those are not reproduced.

Inputs follow HF generate: encoder-decoder models encode once and start from decoder_start_token_id;
decoder-only models take left-padded prompts, position ids from the attention mask (cumsum - 1) and one
more attention column per generated token.
"""

from __future__ import annotations

import inspect

import torch
from transformers.modeling_outputs import BaseModelOutput

from ...base.errors import InputError


def output_layer(model) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(weight [V, d], bias [V] or None) of the model's output layer, BART's final_logits_bias included."""
    head = model.get_output_embeddings()
    if head is None or not hasattr(head, "weight"):
        raise InputError(f"{type(model).__name__} has no output embeddings (a language-model head) to score")
    weight = head.weight.detach()
    bias = getattr(head, "bias", None)
    bias = None if bias is None else bias.detach()
    extra = getattr(model, "final_logits_bias", None)  # BART, mBART, Pegasus, Marian: added after the head
    if extra is not None:
        extra = extra.detach().reshape(-1)
        bias = extra if bias is None else bias + extra
    return weight, bias


def reorder_cache(cache, parents: torch.Tensor):
    """The cache with batch row i taken from row parents[i] (a Cache object in place, or legacy tuples)."""
    if hasattr(cache, "reorder_cache"):
        cache.reorder_cache(parents)
        return cache
    return tuple(tuple(t.index_select(0, parents.to(t.device)) for t in layer) for layer in cache)


class ModelSession:
    """One batch of B requests fed to a model token by token, with its KV cache and each row's request.

    input_ids int64 [B, S] (decoder-only: left-padded prompts), attention_mask int [B, S] or None.
    """

    def __init__(self, model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> None:
        self.model = model
        self.device = model.get_output_embeddings().weight.device
        input_ids = torch.as_tensor(input_ids).to(self.device).long()
        if input_ids.ndim != 2 or input_ids.shape[0] < 1 or input_ids.shape[1] < 1:
            raise InputError(
                f"input_ids must be [batch, length] with both >= 1, got {tuple(input_ids.shape)}"
            )
        mask = torch.ones_like(input_ids) if attention_mask is None else torch.as_tensor(attention_mask)
        if mask.shape != input_ids.shape:
            raise InputError(
                f"attention_mask {tuple(mask.shape)} differs from input_ids {tuple(input_ids.shape)}"
            )
        self.input_ids = input_ids
        self.mask = mask.to(self.device).long()
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5
        self.takes_positions = "position_ids" in params
        self.rows_batch = torch.arange(input_ids.shape[0], device=self.device)  # request of each row
        self.steps_done = 0
        self.cache = None
        self.encoded = None

    # ------------------------------------------------------------------ the two calls
    def first(self, check: bool = False) -> torch.Tensor:
        """[B, d]: the head's input for the first SID token (check: compare with the model's own logits)."""
        b = self.input_ids.shape[0]
        if self.encoder_decoder:
            start = self._decoder_start()
            with torch.no_grad():
                self.encoded = self.model.get_encoder()(
                    input_ids=self.input_ids, attention_mask=self.mask, return_dict=True
                ).last_hidden_state
            tokens = torch.full((b, 1), start, dtype=torch.long, device=self.device)
            return self._forward(self._decoder_inputs(tokens), check)
        inputs = {"input_ids": self.input_ids, "attention_mask": self.mask}
        if self.takes_positions:
            inputs["position_ids"] = (self.mask.cumsum(-1) - 1).masked_fill(self.mask == 0, 0)
        return self._forward(inputs, check)

    def next(self, tokens: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
        """[R, d] after row i continues row parents[i] of the previous call with token tokens[i]."""
        parents = parents.to(self.device).long()
        self.cache = reorder_cache(self.cache, parents)
        self.rows_batch = self.rows_batch[parents]
        self.steps_done += 1
        tokens = tokens.to(self.device).long()[:, None]
        if self.encoder_decoder:
            return self._forward(self._decoder_inputs(tokens))
        mask = self.mask[self.rows_batch]
        new_columns = torch.ones(mask.shape[0], self.steps_done, dtype=mask.dtype, device=self.device)
        inputs = {"input_ids": tokens, "attention_mask": torch.cat([mask, new_columns], dim=1)}
        if self.takes_positions:
            inputs["position_ids"] = (mask.sum(-1) + self.steps_done - 1)[:, None]
        return self._forward(inputs)

    def log_normalizer(self, hidden: torch.Tensor) -> torch.Tensor:
        """fp32 [R]: logsumexp of the model's logits over its whole vocabulary (HF's log_softmax)."""
        weight, bias = output_layer(self.model)
        logits = torch.nn.functional.linear(hidden.to(weight.dtype), weight, bias)
        return torch.logsumexp(logits.float(), dim=-1)

    def token_log_prob(self, hidden: torch.Tensor, token: int) -> torch.Tensor:
        """fp32 [R]: log-softmax over the whole vocabulary of one token (the forced EOS), per row."""
        weight, bias = output_layer(self.model)
        logit = hidden.to(weight.dtype) @ weight[token] + (0.0 if bias is None else bias[token])
        return logit.float() - self.log_normalizer(hidden)

    # ------------------------------------------------------------------ plumbing
    def _decoder_start(self) -> int:
        config = self.model.generation_config
        start = getattr(config, "decoder_start_token_id", None)
        start = start if start is not None else getattr(self.model.config, "decoder_start_token_id", None)
        start = start if start is not None else getattr(config, "bos_token_id", None)
        if start is None:
            raise InputError(f"{type(self.model).__name__} has no decoder_start_token_id (nor bos_token_id)")
        return int(start[0] if isinstance(start, list | tuple) else start)

    def _decoder_inputs(self, tokens: torch.Tensor) -> dict:
        rows = self.rows_batch
        return {
            "encoder_outputs": BaseModelOutput(last_hidden_state=self.encoded[rows]),
            "attention_mask": self.mask[rows],
            "decoder_input_ids": tokens,
        }

    def _forward(self, inputs: dict, check: bool = False) -> torch.Tensor:
        """Run the model once; return its output layer's input at the last position, [R, d]."""
        captured: list[torch.Tensor] = []

        def grab(_module, args):
            captured.append(args[0][:, -1, :])
            if check:
                return None
            # Why: a zero-length sequence makes the head compute nothing; we score rows ourselves.
            return (args[0][:, :0, :], *args[1:])

        head = self.model.get_output_embeddings()
        handle = head.register_forward_pre_hook(grab)
        try:
            with torch.no_grad():
                out = self.model(**inputs, **{self.cache_arg: self.cache}, use_cache=True, return_dict=True)
        finally:
            handle.remove()
        if len(captured) != 1:
            raise InputError(f"{type(self.model).__name__} called its output layer {len(captured)} times")
        cache = getattr(out, "cache", None)
        self.cache = cache if cache is not None else out.past_key_values
        if check:
            self._check_logits(captured[0], out.logits[:, -1, :])
        return captured[0]

    def _check_logits(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        weight, bias = output_layer(self.model)
        ours = torch.nn.functional.linear(hidden, weight, bias).float()
        theirs = logits.float()
        tol = 1e-3 * (1.0 + float(theirs.abs().max()))
        if ours.shape != theirs.shape or float((ours - theirs).abs().max()) > tol:
            raise InputError(
                f"{type(self.model).__name__} transforms its logits after the output layer (e.g. "
                "soft-capping or a logit scale); zerogr's generate cannot reproduce them - use "
                "SidLogitsProcessor instead"
            )


__all__ = ["ModelSession", "output_layer", "reorder_cache"]
