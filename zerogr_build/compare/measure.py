"""The measurement: decode every request in all three orders through `runtime.Decoder`, with the same
hidden-vector source, and compare the top-K item lists and the invalid probability mass per step (see the
package docstring for the metrics)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..base.errors import InputError
from ..base.progress import NULL_PROGRESS, Progress
from ..bundle import open_bundle, resolve_bundle
from ..index.tables import csr_gather
from ..runtime.decoder import ORDERS, Decoder
from ..runtime.items.constraints import ItemMask
from ..runtime.weights import normalize_weights
from .inputs import (
    DEFAULT_KS,
    ModelFn,
    Requests,
    beam_width_for,
    load_model_fn,
    parse_ks,
    read_requests,
)
from .metrics import ndcg_at_k, overlap_at_k, recall_at_k, top_k_items
from .report import CompareReport

CONSTRAINED = ("filter_first", "score_first")
# search(ids, order, beam_width) -> (SearchResult, item ids [B][M], StepMass.per_step()); see compare_searches
Search = Callable[[list, str, int], tuple[Any, list, list]]
MASS_CHUNK = 1024  # beams per invalid-mass block (logits [chunk, V_t] fp32)


def valid_token_mask(table: Any, rows: np.ndarray) -> np.ndarray:
    """bool [R, V_t]: token v is a valid child of rows[r] in one step table (all False where rows[r] < 0)."""
    rows = np.asarray(rows, dtype=np.int64)
    mask = np.zeros((rows.shape[0], int(table.codebook_size)), dtype=bool)
    real = np.flatnonzero(rows >= 0)
    if real.size == 0:
        return mask
    if table.format == "dense":
        mask[real] = np.asarray(table.next)[rows[real]] >= 0
        return mask
    positions, counts = csr_gather(table.indptr, rows[real])
    mask[np.repeat(real, counts), np.asarray(table.tokens)[positions].astype(np.int64)] = True
    return mask


def invalid_mass(
    hidden: Any, weight: Any, bias: Any, valid: np.ndarray, log_normalizer: Any = None
) -> tuple[np.ndarray, np.ndarray]:
    """(mass, boost), float64 [R] each: the full softmax's probability on tokens where valid[r] is False,
    and filter-first's boost -log(1 - mass) = logsumexp(all logits) - logsumexp(valid logits) (fp32 math).

    log_normalizer fp32 [R] (optional): the logsumexp over a larger vocabulary than the step's V_t (a
    language model's, see integrations/hf); then mass also counts every token outside the step's codes.
    Both come from the two logsumexps, so mass stays exact near 0 and boost near mass = 1.
    """
    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    valid_t = torch.as_tensor(valid, device=logits.device)
    if log_normalizer is None:
        lse_all = torch.logsumexp(logits, dim=1)
    else:
        lse_all = torch.as_tensor(log_normalizer, device=logits.device).float()
    lse_valid = torch.logsumexp(logits.masked_fill(~valid_t, float("-inf")), dim=1)
    mass = -torch.expm1(lse_valid - lse_all)
    boost = (lse_all - lse_valid).clamp(min=0.0)
    return mass.clamp(0.0, 1.0).double().cpu().numpy(), boost.double().cpu().numpy()


class StepMass:
    """The mechanism along one constrained search: invalid mass and boost of the beams alive at each step.

    Call observe(t, state, hidden, log_normalizer) with the hidden vectors [R, d] the Decoder is about to
    step with; per_step() then gives, per step, (mass float64 [A_t], boost float64 [A_t], request int64
    [A_t]) of the A_t beams alive at that step. `dec` supplies the step layers and tables.
    """

    def __init__(self, dec: Any) -> None:
        self.dec = dec
        n = dec.num_steps
        self.masses: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.boosts: list[list[np.ndarray]] = [[] for _ in range(n)]
        self.owners: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(n)]

    def observe(self, t: int, state: Any, hidden: Any, log_normalizer: Any = None) -> None:
        rows = state.rows.detach().cpu().numpy()
        alive = np.flatnonzero(rows >= 0)
        alive_rows = rows[alive]
        self.owners[t] = state.batch.detach().cpu().numpy()[alive]
        weight, bias = self.dec.weights[t]
        keep = torch.as_tensor(alive)
        h = torch.as_tensor(hidden).detach().cpu()[keep]
        w, b = weight.cpu(), None if bias is None else bias.cpu()
        norm = None if log_normalizer is None else torch.as_tensor(log_normalizer).detach().cpu()[keep]
        for lo in range(0, h.shape[0], MASS_CHUNK):  # bounded [chunk, V_t] logits for large codebooks
            sel = slice(lo, lo + MASS_CHUNK)
            mask = valid_token_mask(self.dec.index.steps[t], alive_rows[sel])
            mass, boost = invalid_mass(h[sel], w, b, mask, None if norm is None else norm[sel])
            self.masses[t].append(mass)
            self.boosts[t].append(boost)

    def per_step(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        return [
            (np.concatenate(m) if m else np.zeros(0), np.concatenate(b) if b else np.zeros(0), o)
            for m, b, o in zip(self.masses, self.boosts, self.owners, strict=True)
        ]


def _run_order(dec: Any, step_fn: Callable, batch_size: int, beam_width: int, order: str):
    """One search in `order`; returns (result, StepMass.per_step() - empty lists when unconstrained)."""
    state = dec.start(batch_size, beam_width, order)
    meter = StepMass(dec)
    for t in range(dec.num_steps):
        hidden = step_fn(t, state.prefixes, state.batch)
        if order in CONSTRAINED:
            meter.observe(t, state, hidden)
        state = dec.step(state, hidden)
    return dec.finish(state), meter.per_step()


def model_fn_search(bundle: Any, model_fn: ModelFn, device: str = "cpu", available: ItemMask | None = None):
    """The Search (see compare_searches) of a `zerogr compare` model function through runtime.Decoder.

    model_fn is called once per batch of request ids (the three orders of a batch share its result), and
    twice more on the first batch, whose step functions are called at step 0 only: when those two disagree
    (weights, or step 0's hidden vectors) it raises InputError, since the comparison assumes a
    deterministic model.
    """
    sizes = tuple(int(v) for v in bundle.index.codebook_sizes)
    last: dict[str, Any] = {}

    def call(ids: list) -> tuple[list, Callable]:
        out = model_fn(bundle, list(ids))
        if not isinstance(out, (tuple, list)) or len(out) != 2 or not callable(out[1]):
            raise InputError("model function must return (weights, step_fn) with step_fn callable")
        return normalize_weights(out[0], sizes, source="model"), out[1]

    def search(ids: list, order: str, beam_width: int):
        if last.get("ids") is not ids:
            weights, step_fn = call(ids)
            dec = Decoder(bundle, weights, device=device)
            dec.set_availability(available)
            if not last:  # two more calls, so a step_fn that keeps state is searched fresh
                check_deterministic(dec, call(ids), call(ids), len(ids), beam_width)
            last.update(ids=ids, dec=dec, step_fn=step_fn)
        dec = last["dec"]
        res, masses = _run_order(dec, last["step_fn"], len(ids), beam_width, order)
        return res, dec.items(res), masses

    return search


def check_deterministic(
    dec: Any, first: tuple[list, Callable], second: tuple[list, Callable], batch_size: int, beam_width: int
) -> None:
    """InputError unless two calls of a model function on one batch agree: the same per-step weights and
    the same hidden vectors [R, d] at step 0 (to fp32 rounding: GPU reductions may reorder sums)."""
    state = dec.start(batch_size, beam_width, "filter_first")
    hidden = [torch.as_tensor(fn(0, state.prefixes, state.batch)).float().cpu() for _, fn in (first, second)]
    tensors = [(hidden[0], hidden[1])]
    for (w1, b1), (w2, b2) in zip(first[0], second[0], strict=True):
        tensors.append((w1.float().cpu(), w2.float().cpu()))
        if (b1 is None) != (b2 is None):
            tensors.append((torch.zeros(1), torch.ones(1)))
        elif b1 is not None:
            tensors.append((b1.float().cpu(), b2.float().cpu()))
    if any(
        a.shape != b.shape or not torch.allclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)
        for a, b in tensors
    ):
        raise InputError(
            "the model function must be deterministic: two calls on the first batch gave different "
            "outputs (seed it, and call model.eval() to turn dropout off)"
        )


def _boost_spread(boost: np.ndarray, owner: np.ndarray, batch_size: int) -> tuple[float, int]:
    """Sum over requests with >= 2 alive beams of (max - min) of the filter-first boost -log(1 - mass)
    among its beams, and the number of such requests."""
    hi = np.full(batch_size, -np.inf)
    lo = np.full(batch_size, np.inf)
    np.maximum.at(hi, owner, boost)
    np.minimum.at(lo, owner, boost)
    several = np.bincount(owner, minlength=batch_size) >= 2
    return float((hi - lo)[several].sum()), int(several.sum())


def compare_orders(
    bundle: Any,
    model_fn: ModelFn,
    requests: Requests,
    *,
    beam_width: int | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 64,
    device: str = "cpu",
    progress: Progress = NULL_PROGRESS,
    available: ItemMask | None = None,
) -> CompareReport:
    """Decode every request in all three orders and compare (see the module docstring).
    available: decode under this availability mask (the unconstrained order ignores it).

    bundle: an opened Bundle (open_bundle). beam_width: M (default max(ks); every K must be <= M,
    InputError otherwise). batch_size: requests per model_fn call / search.
    """
    search = model_fn_search(bundle, model_fn, device, available)
    return compare_searches(
        bundle, search, requests, beam_width=beam_width, ks=ks, batch_size=batch_size, progress=progress
    )


def compare_searches(
    bundle: Any,
    search: Search,
    requests: Requests,
    *,
    beam_width: int | None = None,
    ks: Sequence[int] = DEFAULT_KS,
    batch_size: int = 64,
    progress: Progress = NULL_PROGRESS,
) -> CompareReport:
    """compare_orders over any beam search: search(ids, order, beam_width) -> (SearchResult, item ids
    [B][M], StepMass.per_step() of that search) for one batch of request ids, called once per order with
    the same `ids` list. model_fn_search makes one from a model function; integrations.hf.compare from a
    Hugging Face model (decoded with its own KV cache).
    """
    ks = parse_ks(ks)
    m = beam_width_for(ks, beam_width)
    if batch_size < 1:
        raise InputError(f"--batch-size must be >= 1, got {batch_size}")
    sizes = tuple(int(v) for v in bundle.index.codebook_sizes)
    n = len(requests.ids)
    started = time.perf_counter()
    lists: dict[str, list[list[Hashable]]] = {o: [] for o in ORDERS}
    mass_sum = {o: np.zeros(len(sizes)) for o in CONSTRAINED}
    mass_max = {o: np.zeros(len(sizes)) for o in CONSTRAINED}
    mass_count = {o: np.zeros(len(sizes)) for o in CONSTRAINED}
    spread_sum = {o: np.zeros(len(sizes)) for o in CONSTRAINED}
    spread_count = {o: np.zeros(len(sizes)) for o in CONSTRAINED}
    gap_sum = {o: dict.fromkeys(ks, 0.0) for o in CONSTRAINED}
    gap_count = {o: dict.fromkeys(ks, 0) for o in CONSTRAINED}
    unconstrained_beams = unconstrained_invalid = 0
    k_max = max(ks)
    progress.stage("compare", n)
    for lo in range(0, n, batch_size):
        ids = list(requests.ids[lo : lo + batch_size])
        for order in ORDERS:
            res, items, masses = search(ids, order, m)
            lists[order].extend(top_k_items(items, k_max))
            for t, (mass, boost, owner) in enumerate(masses):
                if mass.size:
                    mass_sum[order][t] += mass.sum()
                    mass_count[order][t] += mass.size
                    mass_max[order][t] = max(mass_max[order][t], float(mass.max()))
                    spread, count = _boost_spread(boost, owner, len(ids))
                    spread_sum[order][t] += spread
                    spread_count[order][t] += count
            scores = res.scores.detach().cpu().numpy()
            if order in CONSTRAINED:
                for k in ks:
                    if k <= m:
                        with np.errstate(invalid="ignore"):  # -inf - -inf: a request with no item
                            gap = scores[:, 0] - scores[:, k - 1]
                        ok = np.isfinite(gap)
                        gap_sum[order][k] += float(gap[ok].sum())
                        gap_count[order][k] += int(ok.sum())
            else:
                real = np.isfinite(scores)
                unconstrained_beams += int(real.sum())
                unconstrained_invalid += int((real & ~res.valid.detach().cpu().numpy()).sum())
        progress.advance(len(ids))

    ff, sf = lists["filter_first"], lists["score_first"]
    overlap = {k: overlap_at_k(ff, sf, k) for k in ks}
    if any(math.isnan(value) for value in overlap.values()):
        raise InputError(
            f"nothing to compare: no request of {n} has an item in either order's results (an --available "
            "mask that names no catalog item, or requests the model gives no valid SID)"
        )
    differing = {
        k: float(np.mean([set(a[:k]) != set(b[:k]) for a, b in zip(ff, sf, strict=True)])) for k in ks
    }
    recall: dict[str, dict[int, float]] = {}
    ndcg: dict[str, dict[int, float]] = {}
    with_targets = 0
    if requests.targets is not None:
        keep = [i for i, t in enumerate(requests.targets) if t is not None]
        with_targets = len(keep)
        if keep:
            targets = [requests.targets[i] for i in keep]
            for order in ORDERS:
                chosen = [lists[order][i] for i in keep]
                recall[order] = {k: recall_at_k(chosen, targets, k) for k in ks}
                ndcg[order] = {k: ndcg_at_k(chosen, targets, k) for k in ks}
    return CompareReport(
        requests=n,
        beam_width=m,
        ks=list(ks),
        overlap=overlap,
        requests_differing=differing,
        recall=recall,
        ndcg=ndcg,
        invalid_mass={o: (mass_sum[o] / np.maximum(mass_count[o], 1)).tolist() for o in CONSTRAINED},
        invalid_mass_max={o: mass_max[o].tolist() for o in CONSTRAINED},
        boost_spread={o: (spread_sum[o] / np.maximum(spread_count[o], 1)).tolist() for o in CONSTRAINED},
        score_gap={
            o: {k: gap_sum[o][k] / gap_count[o][k] for k in ks if gap_count[o][k]} for o in CONSTRAINED
        },
        unconstrained_invalid_rate=unconstrained_invalid / max(unconstrained_beams, 1),
        with_targets=with_targets,
        seconds=time.perf_counter() - started,
        codebook_sizes=list(sizes),
    )


def run_compare(
    bundle_path: str | Path | None,
    model_spec: str,
    requests_path: str | Path,
    *,
    beam_width: int | None = None,
    ks: str | Sequence[int] = DEFAULT_KS,
    batch_size: int = 64,
    device: str = "cpu",
    request_column: str = "request_id",
    target_column: str = "target_item",
    progress: Progress = NULL_PROGRESS,
    available: str | Path | None = None,
) -> CompareReport:
    """`zerogr compare`: open the bundle, resolve the model function, read the requests, compare_orders.
    available: a Parquet availability file (ItemMask.from_parquet): every search decodes under it."""
    ks = parse_ks(ks)
    beam_width_for(ks, beam_width)
    requests = read_requests(requests_path, request_column=request_column, target_column=target_column)
    model_fn = load_model_fn(model_spec)
    bundle = open_bundle(resolve_bundle(bundle_path))
    mask = None if available is None else ItemMask.from_parquet(bundle, available)
    report = compare_orders(
        bundle, model_fn, requests, beam_width=beam_width, ks=ks, batch_size=batch_size, device=device,
        progress=progress, available=mask,
    )  # fmt: skip
    report.extra.update(bundle=str(bundle.path), model=model_spec, requests_file=str(requests_path))
    if mask is not None:
        report.extra.update(available_file=str(available), available_items=mask.num_available)
    return report
