"""SID masking for vLLM, once for both model runners: the request state and the masks of a batch's rows.

    masking = SidMasking(vllm_config, device)     # opens the registry's catalogs (ZEROGR_VLLM_CATALOGS)
    request = masking.request(params)             # a SidRequest, or None for a request without zerogr
    masking.apply(logits, rows, requests, steps, prefix)   # masks those rows of logits, in place

The runners differ only in how a logits row is tied to its request and where its generated tokens live:
processor.py (V1) follows vLLM's batch updates and reads the tokens from the engine's live output lists;
processor_v2.py (V2) maps rows to request slots through the step's LogitsContext and gathers the tokens
from the runner's token buffer on the device. Both hand the same four things to apply().

The SID is a request's first L generated tokens: at step t < L a row keeps only the tokens that extend its
prefix to a catalog prefix (and, with item constraints or the catalog's availability, to a prefix holding an
allowed item); from step L on only EOS is left (the SID map's eos_token_id, else the model's). Rows are
grouped by (version, SID map, item filter, step) and each group is masked with a few tensor ops (VocabMasks,
or the Decoder's slot filters for constrained requests), with no Python loop over the vocabulary. A row
with no allowed SID left (every item excluded or unavailable) gets only EOS: an empty answer, never a token
the mask forbids. A request that fails in the engine (logged), when it enters the batch or while its rows
are masked, gets only the model's EOS from then on: an engine hook cannot fail one request, and an error
escaping it would stop the engine for every request. Nothing here opens, hashes or masks a bundle version:
the masks were built when the engine opened the version (catalogs.py, on its watcher thread).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from ...base.errors import InputError, ZerogrError, one_line
from ...runtime.items.filter import dense_next, mask_children, mask_slots, slot_source
from ...runtime.slots import fill_slots, row_extent
from .admission import FILE_KEY, PIN_KEY
from .catalogs import EngineCatalogs, RequestPlan
from .lru import Lru
from .registry import ENV_VAR, registry_from_env
from .spec import spec_of

logger = logging.getLogger("vllm.zerogr")
NEG_INF = float("-inf")
GROUPS_KEPT = 64  # compiled include / exclude lists of request groups, reused while the group stays


@dataclass(eq=False)
class SidRequest:
    """One opted-in request: its plan (None: it failed in the engine and gets only EOS)."""

    plan: RequestPlan | None


class SidMasking:
    """The engine's zerogr state, shared by the V1 and V2 processors (module docstring)."""

    def __init__(self, vllm_config, device: torch.device) -> None:
        registry = registry_from_env()
        if registry is None:
            raise InputError(f"zerogr: {ENV_VAR} is not set; it names the catalog registry (TOML) to serve")
        self.device = torch.device(device)
        self.model_eos = _model_eos(vllm_config)
        self.catalogs = EngineCatalogs(registry, self.device, _vocab_size(vllm_config))
        self._groups: Lru[tuple] = Lru(GROUPS_KEPT)

    def request(self, params) -> SidRequest | None:
        """The SidRequest of a request entering the batch (None: it does not use zerogr). Its version is
        the one admission pinned; the pin is written into the engine's copy of the params when missing, so
        a preempted and re-added request keeps it."""
        try:
            spec = spec_of(params.extra_args, self.catalogs.registry.limits)
            if spec is None:
                return None
            pin, file = params.extra_args.get(PIN_KEY), params.extra_args.get(FILE_KEY)
            plan = self.catalogs.plan(
                spec, pin if isinstance(pin, str) else None, file if isinstance(file, str) else None
            )
            if pin != plan.catalog.path.name:
                params.extra_args = {**params.extra_args, PIN_KEY: plan.catalog.path.name}
            return SidRequest(plan)
        except (ZerogrError, OSError) as exc:
            logger.error("zerogr: request failed in the engine, ending it with EOS: %s", one_line(exc))
            return SidRequest(None)
        except Exception:  # noqa: BLE001 - a bug here must end one request, not the engine
            logger.exception("zerogr: request failed in the engine, ending it with EOS")
            return SidRequest(None)

    def apply(
        self,
        logits: torch.Tensor,
        rows: Sequence[int],
        requests: Sequence[SidRequest],
        steps: Sequence[int],
        prefix: Callable[[list[int], int], torch.Tensor],
    ) -> torch.Tensor:
        """Mask rows `rows` of logits [num_rows, vocab] in place. requests[i] is row rows[i]'s request,
        steps[i] how many tokens it has generated; prefix(positions, t) gives int [len(positions), t], the
        first t generated tokens of the rows at those positions of `rows` (anything past a row's own count:
        it is called once per apply, with t the largest SID step of the batch)."""
        groups: dict[tuple, list[int]] = {}
        failed: list[int] = []
        for i, request in enumerate(requests):
            plan = request.plan
            if plan is None:
                failed.append(rows[i])
                continue
            t = min(max(int(steps[i]), 0), plan.catalog.index.num_steps)
            groups.setdefault((plan.catalog, plan.sid_key, plan.resident, t), []).append(i)
        # Every grouped row's first t_max tokens in one gather, in group order: a group's rows are a slice.
        grouped = [i for positions in groups.values() for i in positions]
        t_max = max((key[-1] for key in groups), default=0)
        tokens: torch.Tensor | None = None
        try:
            if t_max == 0:  # every row at its first SID step: no tokens to read
                tokens = torch.zeros((len(grouped), 0), dtype=torch.int64)
            elif grouped:
                tokens = prefix(grouped, t_max)
        except Exception:  # noqa: BLE001 - ends these requests, never the engine
            logger.exception(
                "zerogr: reading the generated tokens failed; ending the batch's requests with EOS"
            )
        end = 0
        for (*_, t), positions in groups.items():
            rows_at = torch.as_tensor([rows[i] for i in positions], device=logits.device)
            chosen = [requests[i] for i in positions]
            first, end = end, end + len(positions)
            try:
                if tokens is None:
                    raise InputError("no generated tokens")
                generated = tokens[first:end, :t]
                masked = self._mask_group(logits.index_select(0, rows_at), chosen, t, generated)
            except Exception:  # noqa: BLE001 - a failure here ends these requests, never the engine
                logger.exception("zerogr: masking failed; ending %d request(s) with EOS", len(chosen))
                for request in chosen:
                    request.plan = None  # from now on only EOS, at every step
                failed += [rows[i] for i in positions]
                continue
            logits.index_copy_(0, rows_at, masked)
        if failed and self.model_eos is not None:
            rows_at = torch.as_tensor(failed, device=logits.device)
            kept = logits.index_select(0, rows_at)
            only_eos = torch.full_like(kept, NEG_INF)
            only_eos[:, self.model_eos] = kept[:, self.model_eos]
            logits.index_copy_(0, rows_at, only_eos)
        return logits

    def _mask_group(self, scores: torch.Tensor, group: list[SidRequest], t: int, generated) -> torch.Tensor:
        """scores [n, vocab] of the requests `group`, all on one plan key, at SID step t (t = L: past it);
        generated int64 [n, t] their SID tokens so far. A row with no allowed continuation keeps only EOS."""
        plan = group[0].plan
        assert plan is not None
        catalog, masks = plan.catalog, plan.masks
        if scores.shape[1] != masks.vocab_size:
            raise InputError(f"logits of width {scores.shape[1]}, masks built for {masks.vocab_size} tokens")
        rows = masks.rows(generated.to(self.device))
        eos = plan.sid_map.eos_token_id if plan.sid_map.eos_token_id is not None else self.model_eos
        if t == catalog.index.num_steps:
            return scores if eos is None else masks.apply_eos(scores, rows, eos)
        if plan.resident is None:
            out = masks.apply(scores, rows, t)
        else:
            out = self._filtered(scores, rows, t, group, masks.steps[t].token_of)
        if (
            eos is not None
        ):  # no allowed SID left (everything excluded or unavailable): end, as an empty answer
            dead = torch.isneginf(out).all(dim=1)
            out[:, eos] = torch.where(dead, scores[:, eos], out[:, eos])
        return out

    def _filtered(self, scores, rows, t: int, group: list[SidRequest], token_of) -> torch.Tensor:
        """masks.apply with the group's item constraints (the Decoder's slot filters)."""
        plan = group[0].plan
        assert plan is not None
        # The group's compiled include / exclude lists, reused while its requests stay together (the cache
        # holds the requests themselves, so an id in the key cannot be reused by another while cached).
        key = tuple(id(r) for r in group)
        cached = self._groups.get(key)
        if cached is None:
            cached = self._groups.put(key, (group, plan.constraints([r.plan for r in group])))
        return _constrained(scores, rows, t, plan.catalog.steps(self.device), cached[1], token_of)


def _constrained(scores, rows, t, steps, constraints, token_of) -> torch.Tensor:
    """scores [n, vocab] kept at the tokens of the codes that continue each row of step t to a row holding an
    item its request may return (Decoder semantics: filter.py), -inf elsewhere. rows int64 [n] (the step's
    row count = a prefix outside the catalog)."""
    table = steps[t]
    n = rows.shape[0]
    request = torch.arange(n, device=rows.device)
    rows = torch.where(rows < table.rows, rows, -1)
    if table.format == "sparse":
        start, count = row_extent(table, rows)
        codes = fill_slots(slot_source(constraints, table), start, count, table.max_slots)
        codes = mask_slots(constraints, table, codes, start, count, request).long()
        valid = codes >= 0
    else:
        child = dense_next(constraints, table)[rows.clamp(min=0)]
        valid = (child >= 0) & (rows >= 0)[:, None]
        valid = mask_children(constraints, t, valid, child, rows, request)
        codes = torch.arange(table.codebook_size, device=rows.device).expand(n, -1)
    cols = token_of.take(codes.clamp(min=0))
    valid = valid & (cols >= 0)
    hits = torch.zeros(scores.shape, dtype=torch.int32, device=scores.device)
    hits.scatter_add_(1, cols.clamp(min=0), valid.to(torch.int32))
    return scores.masked_fill(hits == 0, NEG_INF)


def _model_eos(vllm_config) -> int | None:
    """The model's EOS token id (the first, when its config lists several), or None."""
    config = getattr(getattr(vllm_config, "model_config", None), "hf_config", None)
    eos = getattr(config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        eos = eos[0] if eos else None
    return int(eos) if eos is not None else None


def _vocab_size(vllm_config) -> int:
    return int(vllm_config.model_config.get_vocab_size())


__all__ = ["SidMasking", "SidRequest"]
