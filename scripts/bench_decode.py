"""Decoding benchmark: every (order, mode) on one index and one set of weights, per step and whole search.

    python scripts/bench_decode.py                       # CPU: 1M items, L=3, V=8192, d=128, 16 x 64 beams
    python scripts/bench_decode.py --device cuda:0       # same on a GPU (adds selective_cuda when available)
    python scripts/bench_decode.py --sweep 2048,4096,8192,16384   # codebook sweep (default); --sweep "" skips
    python scripts/bench_decode.py --neighbour 2         # search latency beside a busy 2-thread process
    python scripts/bench_decode.py --threads 1           # a busy shared CPU: one torch thread (no pool waits)

Rows of the main table (same index, weights and step function in every row):
  score_first/full       STATIC's order: GEMM over V_t, log-softmax over V_t, read the valid slots, top-M
  score_first/selective  the same normaliser from the GEMM, slot logits from the selective path
  filter_first/full      GEMM, then log-softmax over the valid slots only
  filter_first/selective only the slots' tokens scored (capped slots + overflow lanes)
  filter_first/selective_numba  the same with the CPU numba kernel (slot rows read in place, fused
                         log-softmax; CPU only)
  filter_first/auto      the decoder's own per-step choice (plan or heuristic) - what a user gets
  unconstrained/full     no filter at all (speed reference; outputs may be invalid)
  naive filter_first     the baseline that must lose: children packed into a ragged list, a gathered
                         [n, d] weight matrix, segment log-softmax, sort-based top-M per request
  STATIC torch search    STATIC's own beam search (decoding_pt.py `sparse_transition_torch`, ported in
                         benchmarks/static_search.py) on STATIC's own index (benchmarks/static_baseline.py),
                         same weights and step function; whole search only (needs one V for all steps)
Targets on CPU: the middle steps with the default choice (filter_first/auto) >= 2x faster than
filter_first/full; the last step >= 30x faster than score_first/full; the whole filter_first/auto search
>= 3x faster than the STATIC torch search and >= 10x faster than score_first/full, in the median and in
every round; naive slower than filter_first/auto.
Each number is the median of `--repeats` interleaved rounds (round 0 warms up, incl. numba's compile); a
second table lists every round's whole-search ms of score_first/full and filter_first/auto and their ratio
(the same round's pair), with the worst.

Tails (--tails N, default 1000; 0 skips): N more searches of filter_first/auto and score_first/full,
interleaved, each step timed inside its search; per step and per whole search the p50, p99 and p99.9 in ms
(mask-latency style, as grammar engines report it). p99.9 means something only from about 1000 searches.

--neighbour N: instead of the tables above, whole-search latency (p50 and p99 over --neighbour-searches
searches per row and condition) of filter_first/auto, filter_first/full and score_first/full, quiet and with
a neighbour: another process running N CPU-bound threads (sha256 over 1 MiB, which releases the GIL) for the
length of the run. The neighbour is paused (SIGSTOP) and resumed (SIGCONT) between phases, so quiet and
busy phases alternate and drift on a shared machine hits both alike. Target: filter_first/auto's busy p99
<= 2x its quiet p99, and its busy/quiet p99 ratio no worse than score_first/full's. Run it with and
without OMP_WAIT_POLICY=PASSIVE in the environment (the header says which): the default policy keeps
torch's OpenMP workers spinning, which is what a busy neighbour punishes (docs/cpu-threads.md).

The catalog comes from scripts/make_catalog.py's skewed generator (the same process as its CLI); weights
and the step function from zerogr_build.testing.SeededModel; timing from zerogr_build.tune.timing.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from _decode_latency import bench_neighbour, bench_tails
from _yardsticks import yardstick

from zerogr_build.base.dtypes import DTYPE_NAMES, torch_dtype
from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import BeamState, Decoder
from zerogr_build.runtime.scoring import available_modes
from zerogr_build.runtime.slots import child_counts
from zerogr_build.testing import SeededModel
from zerogr_build.tune.timing import timer


def make_sids(items: int, sizes: list[int], seed: int, catalog: Path | None) -> tuple[np.ndarray, list[int]]:
    """(SIDs, codebook sizes): a Parquet catalog's (its own sizes), or `items` SIDs of `sizes` drawn with
    make_catalog.py's skewed generator."""
    if catalog is not None:
        from zerogr_build.catalog import read_catalog

        read = read_catalog(catalog)
        return read.sids, [int(v) for v in read.codebook_sizes]
    from zerogr_build.synthetic import generate_sids

    return generate_sids(items, sizes, seed=seed, mode="skewed"), sizes


class NaiveFilterFirst:
    """Filter-first done naively: per step, pack every beam's children into one ragged list, gather an
    [n, d] weight matrix, score, segment log-softmax, and a sort-based top-M per request."""

    def __init__(self, dec: Decoder):
        self.dec = dec

    def step(self, state: BeamState, hidden: torch.Tensor) -> BeamState:
        dec = self.dec
        table = dec.steps[state.step]
        weight, bias = dec.weights[state.step]
        hidden = hidden.to(weight.dtype)
        alive = state.rows >= 0
        rows = state.rows.clamp(min=0)
        num = state.num_beams
        if table.format == "dense":
            beam_of, tok = torch.nonzero((table.next[rows] >= 0) & alive[:, None], as_tuple=True)
            nxt = table.next[rows[beam_of], tok].long()
        else:
            start = table.indptr[rows]
            count = torch.where(alive, table.indptr[rows + 1] - start, torch.zeros_like(start))
            beam_of = torch.repeat_interleave(torch.arange(num, device=dec.device), count)
            first = torch.cumsum(count, 0) - count
            nxt = start[beam_of] + torch.arange(beam_of.numel(), device=dec.device) - first[beam_of]
            tok = table.tokens[nxt].long()
        gathered = weight[tok]  # [n, d] temporary weight matrix
        s = (gathered.float() * hidden[beam_of].float()).sum(1)
        if bias is not None:
            s = s + bias.float()[tok]
        mx = torch.full((num,), float("-inf"), device=dec.device).scatter_reduce(0, beam_of, s, "amax")
        se = torch.zeros(num, device=dec.device).index_add_(0, beam_of, torch.exp(s - mx[beam_of]))
        total = state.scores[beam_of] + s - mx[beam_of] - torch.log(se[beam_of])
        req = state.batch[beam_of]
        order = torch.argsort(total, descending=True)
        order = order[torch.argsort(req[order], stable=True)]
        b, m = state.batch_size, state.beam_width
        per_req = torch.bincount(req, minlength=b)
        first_req = torch.cumsum(per_req, 0) - per_req
        rank = torch.arange(m, device=dec.device)
        pick = first_req[:, None] + rank[None, :]
        ok = rank[None, :] < per_req[:, None]
        sel = order[pick.clamp(max=max(order.numel() - 1, 0))]
        values = torch.where(ok, total[sel], torch.full_like(total[sel], float("-inf")))
        beam = torch.where(ok, beam_of[sel], torch.zeros_like(sel))
        return state.advance(values, beam, tok[sel], nxt[sel])

    def search(self, step_fn, batch_size, beam_width):
        state = self.dec.start(batch_size, beam_width, "filter_first")
        for t in range(self.dec.num_steps):
            state = self.step(state, step_fn(t, state.prefixes, state.batch))
        return self.dec.finish(state)


def variants(device: torch.device) -> list[tuple[str, str, str | None]]:
    """(label, order, mode) of every row; mode None = the decoder's own choice."""
    rows = [
        ("score_first/full", "score_first", "full"),
        ("score_first/selective", "score_first", "selective"),
        ("filter_first/full", "filter_first", "full"),
        ("filter_first/selective", "filter_first", "selective"),
    ]
    if "selective_cuda" in available_modes(device):
        rows += [("filter_first/selective_cuda", "filter_first", "selective_cuda")]
    if "selective_numba" in available_modes(device):
        rows += [("filter_first/selective_numba", "filter_first", "selective_numba")]
    rows += [("filter_first/auto", "filter_first", None), ("unconstrained/full", "unconstrained", "full")]
    return rows


def bench_one(index, sizes, args, device, time_once, static_index=None):
    """{label: {"steps": [ms per step], "search": ms}} for every variant plus the naive baseline (and the
    STATIC torch search over `static_index` when given: search only, steps inf).

    Rounds are interleaved (every variant once per round, round 0 = warm-up) and each number is the median
    (--stat min: the best) of `repeats` rounds, so a burst of load on a shared machine hits every variant
    alike instead of skewing whichever happened to run during it."""
    model = SeededModel(
        sizes, args.seed, args.batch, dim=args.dim, scale=args.dim**-0.5, emb_scale=0.3, req_scale=0.3
    )
    step_fn = model.to(device).step_fn
    dec = Decoder(index, model.layers(torch_dtype(args.dtype)), device=device)
    naive = NaiveFilterFirst(dec)
    plans = []  # (label, step(state, hidden), search(), [(state_t, hidden_t)])
    with torch.no_grad():
        for label, order, mode in [*variants(device), ("naive filter_first", "filter_first", "naive")]:
            if mode == "naive":
                run_step = naive.step

                def run_search():
                    return naive.search(step_fn, args.batch, args.beam)
            else:

                def run_step(state, hidden, mode=mode):
                    return dec.step(state, hidden, mode=mode)

                def run_search(order=order, mode=mode):
                    return dec.search(step_fn, args.batch, args.beam, mode=mode, order=order)

            inputs = []
            state = dec.start(args.batch, args.beam, order)
            for t in range(dec.num_steps):
                hidden = step_fn(t, state.prefixes, state.batch)
                inputs.append((state, hidden))
                state = run_step(state, hidden)
            plans.append((label, run_step, run_search, inputs))
        if static_index is not None:
            StaticTorchSearch = yardstick("static_search").StaticTorchSearch

            static = StaticTorchSearch(static_index, dec.weights, device)
            plans.append(
                ("STATIC torch search", None, lambda: static.search(step_fn, args.batch, args.beam), [])
            )
        samples: dict[str, dict] = {
            label: {"steps": [[] for _ in range(dec.num_steps)], "search": []} for label, *_ in plans
        }
        for round_ in range(args.repeats + 1):
            for label, run_step, run_search, inputs in plans:
                for t, (state, hidden) in enumerate(inputs):
                    ms = time_once(lambda s=state, h=hidden, f=run_step: f(s, h))
                    if round_:
                        samples[label]["steps"][t].append(ms)
                ms = time_once(run_search)
                if round_:
                    samples[label]["search"].append(ms)
    stat = min if getattr(args, "stat", "median") == "min" else statistics.median
    best = {
        label: {
            "steps": [stat(v) if v else float("inf") for v in r["steps"]],
            "search": stat(r["search"]),
            "rounds": r["search"],
        }
        for label, r in samples.items()
    }
    modes = [dec.mode_for(t, args.batch) for t in range(dec.num_steps)]
    if static_index is not None:
        best["STATIC torch search"]["agrees"] = static_agreement(static, dec, step_fn, args)
    return best, dec, modes


def static_agreement(static, dec: Decoder, step_fn, args) -> float:
    """Share of final beams where the STATIC port and score_first/full decode the same SID (both are
    score-first and exact, so they should agree up to ties: a check that the port is faithful)."""
    with torch.no_grad():
        tokens, _ = static.search(step_fn, args.batch, args.beam)
        ours = dec.search(step_fn, args.batch, args.beam, mode="full", order="score_first")
    same = (tokens.cpu() == ours.sids.cpu()).all(dim=-1) | ~ours.valid.cpu()
    return float(same.float().mean())


def warm_up_kernels(device: torch.device, dtype: str) -> str:
    """Compile (or load from numba's cache) the CPU kernel before anything is timed; says how long."""
    if "selective_numba" not in available_modes(device):
        return "no numba kernel on this device"
    from zerogr_build.runtime.scoring import selective_numba

    t0 = time.perf_counter()
    selective_numba.warm_up((torch_dtype(dtype),))
    return f"numba kernel warm-up (compile or cache load) {time.perf_counter() - t0:.1f} s, untimed"


def target_lines(results: dict, num_steps: int) -> list[str]:
    """The CPU decoding targets, each with its ratio from this run and PASS / FAIL."""
    auto, ff_full, sf_full = (
        results["filter_first/auto"],
        results["filter_first/full"],
        results["score_first/full"],
    )

    def verdict(ratio: float, target: float) -> str:
        return f"{ratio:.2f}x (target >= {target:g}x): {'PASS' if ratio >= target else 'FAIL'}"

    lines = []
    for t in range(1, num_steps - 1):
        ratio = ff_full["steps"][t] / auto["steps"][t]
        lines.append(f"middle step {t}: filter_first/auto vs filter_first/full {verdict(ratio, 2)}")
    last = num_steps - 1
    ratio = sf_full["steps"][last] / auto["steps"][last]
    lines.append(f"last step {last}: filter_first/auto vs score_first/full {verdict(ratio, 30)}")
    if "STATIC torch search" in results:
        static = results["STATIC torch search"]
        ratio = static["search"] / auto["search"]
        lines.append(f"whole search: filter_first/auto vs STATIC torch search {verdict(ratio, 3)}")
        lines.append(f"  (STATIC port decodes the same beams as score_first/full: {static['agrees']:.1%})")
    ratio = sf_full["search"] / auto["search"]
    lines.append(f"whole search: filter_first/auto vs score_first/full {verdict(ratio, WHOLE_SEARCH_TARGET)}")
    worst = min(round_ratios(results))
    lines.append(f"whole search, worst round (table above): {verdict(worst, WHOLE_SEARCH_TARGET)}")
    naive_loses = results["naive filter_first"]["search"] > auto["search"]
    lines.append(f"naive filter_first slower than filter_first/auto: {'PASS' if naive_loses else 'FAIL'}")
    return lines


WHOLE_SEARCH_TARGET = 10.0
"""The whole filter_first/auto search against score_first/full, in every round."""


def round_ratios(results: dict) -> list[float]:
    """score_first/full / filter_first/auto whole-search ms of each timed round (the two ran in the same
    round, interleaved with the other rows)."""
    sf, auto = results["score_first/full"]["rounds"], results["filter_first/auto"]["rounds"]
    return [a / b for a, b in zip(sf, auto, strict=True)]


def round_lines(results: dict) -> list[str]:
    """Every timed round's whole-search ms of score_first/full and filter_first/auto, and their ratio."""
    sf, auto = results["score_first/full"]["rounds"], results["filter_first/auto"]["rounds"]
    ratios = round_ratios(results)
    lines = [
        "# whole search per round (every row once per round, interleaved; round 0 warm-up, not timed)",
        f"{'round':>5}{'score_first/full ms':>21}{'filter_first/auto ms':>22}{'ratio':>9}",
    ]
    for i, (a, b, r) in enumerate(zip(sf, auto, ratios, strict=True), start=1):
        lines.append(f"{i:>5}{a:>21.2f}{b:>22.2f}{r:>8.2f}x")
    lines.append(
        f"ratio over {len(ratios)} rounds: worst {min(ratios):.2f}x, "
        f"median {statistics.median(ratios):.2f}x, best {max(ratios):.2f}x"
    )
    return lines


def index_summary(index, dec) -> str:
    lines = ["step  format  rows       nnz        max_slots  p99  cap(K)"]
    for t, table in enumerate(index.steps):
        counts = child_counts(table)
        p99 = float(np.percentile(counts, 99))
        lines.append(
            f"{t:<5} {table.format:<7} {table.rows:<10} {table.nnz:<10} {table.max_slots:<10} "
            f"{p99:<4.0f} {dec.slot_caps[t]}"
        )
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--codebook", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=64)
    parser.add_argument("--dtype", choices=sorted(DTYPE_NAMES), default="fp32")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--catalog", type=Path, default=None, help="Parquet catalog instead of generating")
    parser.add_argument("--sweep", default="2048,4096,8192,16384", help="codebook sizes ('' to skip)")
    parser.add_argument("--stat", choices=("median", "min"), default="median", help="per-round reduction")
    parser.add_argument("--no-static", action="store_true", help="skip the STATIC torch search baseline")
    parser.add_argument(
        "--tails",
        type=int,
        default=1000,
        help="searches per row for the p50 / p99 / p99.9 table (0 skips it; p99.9 needs about 1000)",
    )
    parser.add_argument(
        "--neighbour",
        type=int,
        default=0,
        help="N > 0: only the busy-neighbour table, with N CPU-bound threads beside the run",
    )
    parser.add_argument(
        "--neighbour-searches",
        type=int,
        default=200,
        help="searches per row and condition in the neighbour table (p99 needs >= 100)",
    )
    parser.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default); 1 on a busy box"
    )
    parser.add_argument("--neighbour-phases", type=int, default=10,
                        help="alternating quiet / busy phases of the neighbour table")  # fmt: skip
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)  # the numba kernel follows (docs/cpu-threads.md)
    device = torch.device(args.device)
    time_once = timer(device)
    warm = warm_up_kernels(device, args.dtype)

    t0 = time.perf_counter()
    sids, sizes = make_sids(args.items, [args.codebook] * args.steps, args.seed, args.catalog)
    index = build_index(sids, sizes)
    num_steps = len(sizes)
    print(
        f"# {len(sids)} items, L={num_steps}, V={','.join(map(str, sizes))}, d={args.dim}, "
        f"batch {args.batch} x beam {args.beam}, {args.dtype}, {device}, "
        f"torch threads {torch.get_num_threads()} (catalog+index {time.perf_counter() - t0:.1f} s)"
    )
    if args.neighbour > 0:
        print("\n".join(bench_neighbour(index, sizes, args, device, time_once)))
        return 0
    static_index = None
    if not args.no_static and len(set(sizes)) == 1 and num_steps > 2:
        build_static_from_raw = yardstick("static_baseline").build_static_from_raw

        static_index = build_static_from_raw(np.asarray(sids), sizes[0], 2)
    results, dec, modes = bench_one(index, sizes, args, device, time_once, static_index)
    print(index_summary(index, dec))
    print(
        f"filter_first/auto modes per step: {modes}; times: {args.stat} of {args.repeats} interleaved "
        f"rounds; {warm}\n"
    )
    head = "".join(f"{'step ' + str(t) + ' ms':>12}" for t in range(num_steps))
    print(f"{'order/mode':<30}{head}{'search ms':>12}{'vs score_first':>16}")
    base = results["score_first/full"]
    for label, r in results.items():
        cells = "".join(f"{ms:>12.2f}" if ms < float("inf") else f"{'-':>12}" for ms in r["steps"])
        print(f"{label:<30}{cells}{r['search']:>12.2f}{base['search'] / r['search']:>15.2f}x")
    print()
    print("\n".join(round_lines(results)))
    print()
    print("\n".join(target_lines(results, num_steps)))
    if args.tails > 0:
        print()
        print("\n".join(bench_tails(index, sizes, args, device)))

    sweep = [int(v) for v in args.sweep.split(",") if v.strip()]
    if sweep:
        print(f"\n# codebook sweep ({args.items} items, L={args.steps}): last step and whole search, ms")
        print(
            f"{'V':>6} {'max_slots':>9} {'K':>4} {'sf/full last':>13} {'ff/sel last':>12} {'speedup':>8} "
            f"{'sf/full search':>15} {'ff/auto search':>15} {'naive search':>13} {'speedup':>8}"
        )
        for v in sweep:
            vs = [v] * args.steps
            idx = build_index(make_sids(args.items, vs, args.seed, None)[0], vs)
            r, d2, _ = bench_one(idx, vs, args, device, time_once)
            sf, ff = r["score_first/full"], r["filter_first/selective"]
            auto, nv = r["filter_first/auto"], r["naive filter_first"]
            print(
                f"{v:>6} {idx.steps[-1].max_slots:>9} {d2.slot_caps[-1]:>4} {sf['steps'][-1]:>13.2f} "
                f"{ff['steps'][-1]:>12.2f} {sf['steps'][-1] / ff['steps'][-1]:>7.1f}x {sf['search']:>15.2f} "
                f"{auto['search']:>15.2f} {nv['search']:>13.2f} {sf['search'] / auto['search']:>7.2f}x"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
