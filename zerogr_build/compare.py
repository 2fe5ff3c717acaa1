"""Does filtering first change the recommendations? Filter-first vs score-first (and unconstrained).

The same beam search runs three times per batch of requests through `runtime.Decoder`, once per order,
with the same hidden vectors source; the report compares the resulting top-K item lists:

- overlap@K: share of filter-first's top-K items that score-first also has in its top-K;
- Recall@K / NDCG@K per order (when the requests carry a ground-truth next item);
- invalid mass per step (the mechanism): the probability the model's full softmax over V_t puts on tokens
  that are not valid children of the beam's prefix, averaged over the beams alive at that step. Filter-first
  renormalises over valid tokens only, so a prefix's valid candidates get boosted by 1 / (1 - mass); when
  the mass differs between competing beams, the two orders can keep different beams;
- unconstrained decoding's invalid-SID rate: share of its final beams that name no catalog SID.

The model contract (`zerogr compare --model module:function`)::

    def function(bundle: zerogr_build.Bundle, request_ids: list) -> tuple[weights, step_fn]

- `bundle` is the opened bundle under test; `request_ids` one batch of request ids (Python values of the
  requests file's request column, in file order).
- `weights`: L per-step output layers, weights[t] of shape [V_t, d] with V_t = bundle codebook size of step
  t: a torch tensor / numpy array, a (weight, bias[V_t]) pair, a {"weight", "bias"} dict or an nn.Linear;
  fp32, fp16 or bf16 (the same d at every step). Logits of step t are hidden @ weight.T + bias.
- `step_fn(step: int, prefixes: LongTensor [R, step], batch: LongTensor [R]) -> Tensor [R, d]`: the
  decoder hidden vector of every beam, where prefixes[r] are beam r's tokens so far and batch[r] is the
  position in `request_ids` of the request it belongs to (R = len(request_ids) at step 0, then R = B*M).
  It must be deterministic (it is called once per order with the same prefixes where the orders agree).

The function is called once per batch of requests; its weights should not depend on the batch.
"""

from __future__ import annotations

import importlib
import sys
import time
from collections.abc import Callable, Hashable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from .errors import InputError
from .progress import NULL_PROGRESS, Progress
from .quality.metrics import ndcg_at_k, overlap_at_k, recall_at_k, top_k_items

ORDERS = ("filter_first", "score_first", "unconstrained")
CONSTRAINED = ("filter_first", "score_first")
DEFAULT_KS = (1, 5, 10, 20)
MASS_CHUNK = 1024  # beams per invalid-mass block (logits [chunk, V_t] fp32)

ModelFn = Callable[[Any, list], tuple[Sequence[Any], Callable[..., Any]]]


@dataclass
class CompareReport:
    """Result of compare_orders (all floats are means over requests or beams; JSON-ready via to_dict).

    overlap {K: share}; recall / ndcg {order: {K: value}} (empty without targets); invalid_mass
    {order: [mean per step]} and invalid_mass_max {order: [max per step]} over the beams alive at each
    step (padded beams excluded); unconstrained_invalid_rate: share of unconstrained final beams that are
    not catalog SIDs; requests_differing {K: share of requests whose top-K lists differ as sets}.
    The mechanism, in log-prob units (nats): filter-first adds boost = -log(1 - mass) to every candidate of
    a beam. boost_spread {order: [per step]}: mean over requests of (max - min) boost among its alive
    beams; score_gap {order: {K: mean over requests of score(beam 1) - score(beam K)}}. When boosts
    differ between beams by more than the gaps between candidates, the two orders rank differently.
    """

    requests: int
    beam_width: int
    ks: list[int]
    overlap: dict[int, float]
    requests_differing: dict[int, float]
    recall: dict[str, dict[int, float]]
    ndcg: dict[str, dict[int, float]]
    invalid_mass: dict[str, list[float]]
    invalid_mass_max: dict[str, list[float]]
    boost_spread: dict[str, list[float]]
    score_gap: dict[str, dict[int, float]]
    unconstrained_invalid_rate: float
    with_targets: int
    seconds: float
    codebook_sizes: list[int] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-serialisable dict (K keys become strings)."""
        out = asdict(self)
        for key in ("overlap", "requests_differing"):
            out[key] = {str(k): v for k, v in out[key].items()}
        for key in ("recall", "ndcg", "score_gap"):
            out[key] = {o: {str(k): v for k, v in per.items()} for o, per in out[key].items()}
        return out


@dataclass(frozen=True)
class Requests:
    """Requests to decode: ids (list, file order) and optional ground-truth next items (same length)."""

    ids: list
    targets: list | None
    source: str = "<memory>"


# ---------------------------------------------------------------------------------------------- inputs


def load_model_fn(spec: str) -> ModelFn:
    """Resolve "package.module:function" (the current directory is importable, like `python -m`)."""
    if ":" not in spec:
        raise InputError(f"--model {spec!r}: expected module:function (e.g. mypkg.recsys:zerogr_model)")
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise InputError(f"--model {spec!r}: expected module:function (e.g. mypkg.recsys:zerogr_model)")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"--model {spec!r}: cannot import module {module_name!r} ({exc})") from exc
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise InputError(f"--model {spec!r}: module {module_name!r} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise InputError(f"--model {spec!r}: {attr!r} is not callable")
    return target


def read_requests(
    path: str | Path, *, request_column: str = "request_id", target_column: str = "target_item"
) -> Requests:
    """Read a requests Parquet file: `request_column` required, `target_column` optional (may hold nulls).

    Raises InputError naming the file and the missing column.
    """
    import pyarrow.parquet as pq

    path = Path(path)
    if not path.exists():
        raise InputError(f"{path}: requests file not found")
    try:
        schema = pq.read_schema(path)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises several types for non-Parquet input
        raise InputError(f"{path}: not a Parquet file ({' '.join(str(exc).split())})") from exc
    if request_column not in schema.names:
        raise InputError(
            f"{path}: missing column {request_column!r} (columns: {', '.join(schema.names) or 'none'})"
        )
    columns = [request_column] + ([target_column] if target_column in schema.names else [])
    table = pq.read_table(path, columns=columns)
    ids = table.column(request_column).to_pylist()
    if table.num_rows == 0:
        raise InputError(f"{path}: no requests (0 rows)")
    nulls = [i for i, v in enumerate(ids) if v is None]
    if nulls:
        raise InputError(f"{path}: column {request_column!r} row {nulls[0]} is null")
    targets = table.column(target_column).to_pylist() if target_column in schema.names else None
    return Requests(ids=ids, targets=targets, source=str(path))


def check_weights(weights: Sequence[Any], codebook_sizes: Sequence[int], *, source: str = "model") -> list:
    """Per-step (weight [V_t, d], bias [V_t] | None) after checking them against the bundle's codebooks
    (the Decoder's own check, run before any decoding so a bad model fails with one clear line)."""
    from .runtime.weights import normalize_weights

    return normalize_weights(weights, codebook_sizes, source=source)


def parse_ks(text: str | Sequence[int]) -> list[int]:
    """ "1,5,10,20" -> [1, 5, 10, 20] (sorted, distinct, each >= 1)."""
    if isinstance(text, str):
        try:
            ks = [int(p) for p in text.split(",") if p.strip()]
        except ValueError:
            raise InputError(f"--k {text!r}: expected comma-separated integers like 1,5,10,20") from None
    else:
        ks = [int(k) for k in text]
    if not ks or min(ks) < 1:
        raise InputError(f"--k {text!r}: need at least one K >= 1")
    return sorted(set(ks))


# ---------------------------------------------------------------------------------------- measurement


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
    indptr = np.asarray(table.indptr, dtype=np.int64)
    starts, ends = indptr[rows[real]], indptr[rows[real] + 1]
    counts = ends - starts
    # Flat child positions of every selected row, concatenated: start of its row + offset inside it.
    offsets = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    positions = np.repeat(starts, counts) + offsets
    mask[np.repeat(real, counts), np.asarray(table.tokens)[positions].astype(np.int64)] = True
    return mask


def invalid_mass(hidden: Any, weight: Any, bias: Any, valid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mass, boost), float64 [R] each: the full softmax's probability on tokens where valid[r] is False,
    and filter-first's boost -log(1 - mass) = logsumexp(all logits) - logsumexp(valid logits) (fp32 math).

    Both come from the two logsumexps, so mass stays exact near 0 and boost near mass = 1.
    """
    import torch

    logits = hidden.float() @ weight.float().T
    if bias is not None:
        logits = logits + bias.float()
    valid_t = torch.as_tensor(valid, device=logits.device)
    lse_all = torch.logsumexp(logits, dim=1)
    lse_valid = torch.logsumexp(logits.masked_fill(~valid_t, float("-inf")), dim=1)
    mass = -torch.expm1(lse_valid - lse_all)
    boost = (lse_all - lse_valid).clamp(min=0.0)
    return mass.clamp(0.0, 1.0).double().cpu().numpy(), boost.double().cpu().numpy()


def _run_order(dec: Any, step_fn: Callable, batch_size: int, beam_width: int, order: str, weights: list):
    """One search in `order`; returns (result, per step: (invalid mass float64 [A_t], boost float64 [A_t],
    request int64 [A_t]) of the A_t beams alive at that step)."""
    import torch

    state = dec.start(batch_size, beam_width, order)
    masses: list[list[np.ndarray]] = [[] for _ in range(dec.num_steps)]
    boosts: list[list[np.ndarray]] = [[] for _ in range(dec.num_steps)]
    owners: list[np.ndarray] = [np.zeros(0, dtype=np.int64) for _ in range(dec.num_steps)]
    for t in range(dec.num_steps):
        hidden = step_fn(t, state.prefixes, state.batch)
        if order in CONSTRAINED:
            rows = state.rows.detach().cpu().numpy()
            alive = rows >= 0
            alive_rows = rows[alive]
            owners[t] = state.batch.detach().cpu().numpy()[alive]
            weight, bias = weights[t]
            h_all = torch.as_tensor(hidden).detach()
            h = h_all[torch.as_tensor(np.flatnonzero(alive), device=h_all.device)]
            w = weight.cpu()
            for lo in range(0, h.shape[0], MASS_CHUNK):  # bounded [chunk, V_t] logits for large codebooks
                sel = slice(lo, lo + MASS_CHUNK)
                mask = valid_token_mask(dec.index.steps[t], alive_rows[sel])
                mass, boost = invalid_mass(h[sel].cpu(), w, bias, mask)
                masses[t].append(mass)
                boosts[t].append(boost)
        state = dec.step(state, hidden)
    per_step = [
        (np.concatenate(m) if m else np.zeros(0), np.concatenate(b) if b else np.zeros(0), o)
        for m, b, o in zip(masses, boosts, owners, strict=True)
    ]
    return dec.finish(state), per_step


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
) -> CompareReport:
    """Decode every request in all three orders and compare (see the module docstring).

    bundle: an opened Bundle (open_bundle). beam_width: M (default max(ks); with M < K a top-K list holds
    at most the items of M SIDs). batch_size: requests per model_fn call / search.
    """
    from .runtime.decoder import Decoder

    ks = parse_ks(ks)
    m = int(beam_width) if beam_width is not None else max(ks)
    if m < 1:
        raise InputError(f"--beam-width must be >= 1, got {m}")
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
        ids = requests.ids[lo : lo + batch_size]
        out = model_fn(bundle, list(ids))
        if not isinstance(out, (tuple, list)) or len(out) != 2 or not callable(out[1]):
            raise InputError("model function must return (weights, step_fn) with step_fn callable")
        weights = check_weights(out[0], sizes)
        step_fn = out[1]
        dec = Decoder(bundle, weights, device=device)
        for order in ORDERS:
            res, masses = _run_order(dec, step_fn, len(ids), m, order, weights)
            lists[order].extend(top_k_items(dec.items(res), k_max))
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
) -> CompareReport:
    """`zerogr compare`: open the bundle, resolve the model function, read the requests, compare_orders."""
    from .bundle import open_bundle, resolve_bundle

    ks = parse_ks(ks)
    requests = read_requests(requests_path, request_column=request_column, target_column=target_column)
    model_fn = load_model_fn(model_spec)
    bundle = open_bundle(resolve_bundle(bundle_path))
    report = compare_orders(
        bundle, model_fn, requests, beam_width=beam_width, ks=ks, batch_size=batch_size, device=device,
        progress=progress,
    )  # fmt: skip
    report.extra.update(bundle=str(bundle.path), model=model_spec, requests_file=str(requests_path))
    return report


def report_tables(report: CompareReport, title: str) -> list[Any]:
    """The report as rich renderables, printed by `zerogr compare` and scripts/quality_ml100k.py alike:
    the metric table (`title`, a column per K), the invalid-mass table (a column per step) and a line
    with the unconstrained invalid-SID rate."""
    from rich.table import Table
    from rich.text import Text

    metrics = Table(title=title)
    metrics.add_column("metric")
    for k in report.ks:
        metrics.add_column(f"K={k}", justify="right")
    for row in report_rows(report):
        metrics.add_row(*row)
    mass = Table(title="invalid probability mass per step (full softmax over V_t; beams alive at the step)")
    mass.add_column("order")
    mass.add_column("")
    for t, v in enumerate(report.codebook_sizes):
        mass.add_column(f"step {t} (V={v})", justify="right")
    for row in mass_rows(report):
        mass.add_row(*row)
    rate = 100 * report.unconstrained_invalid_rate
    return [metrics, mass, Text(f"unconstrained decoding: {rate:.2f}% of final beams name no catalog SID")]


def report_rows(report: CompareReport) -> list[list[str]]:
    """Rows [metric, value per K...] of the metric table."""
    rows = [["overlap (ff top-K in sf top-K)"] + [f"{100 * report.overlap[k]:.2f}%" for k in report.ks]]
    rows.append(
        ["requests with different top-K"] + [f"{100 * report.requests_differing[k]:.2f}%" for k in report.ks]
    )
    for order in CONSTRAINED:
        if order in report.score_gap:
            gaps = report.score_gap[order]
            cells = [f"{gaps[k]:.3f}" if k in gaps else "-" for k in report.ks]
            rows.append([f"score gap beam 1..K (nats) {order}"] + cells)
    for metric, values in (("Recall", report.recall), ("NDCG", report.ndcg)):
        for order in ORDERS:
            if order in values:
                rows.append([f"{metric}@K {order}"] + [f"{values[order][k]:.4f}" for k in report.ks])
    return rows


def mass_rows(report: CompareReport) -> list[list[str]]:
    """Rows [order, statistic, value per step...] of the invalid-mass table."""
    rows = []
    for order in CONSTRAINED:
        rows.append([order, "mean"] + [f"{v:.4f}" for v in report.invalid_mass[order]])
        rows.append([order, "max"] + [f"{v:.4f}" for v in report.invalid_mass_max[order]])
        rows.append([order, "boost spread (nats)"] + [f"{v:.3f}" for v in report.boost_spread[order]])
    return rows
