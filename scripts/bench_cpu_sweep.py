"""Where the CPU selective kernel overtakes the GEMM: one sparse step timed per scoring mode over a sweep
of children per row, next to the choice the default heuristic (no plan) makes there.

    python scripts/bench_cpu_sweep.py                          # both sweeps below, CPU, fp32
    python scripts/bench_cpu_sweep.py --items "" --children 4,16,64,256,1024,4096
    python scripts/bench_cpu_sweep.py --items 100000,1000000,20000000 --children ""

Two sweeps, both timing `Decoder.step` (slot lookup, scoring, log-softmax, top-M) under filter_first with
batch x beam beams, V=--codebook tokens, d=--dim, from the same beam state for every mode:

  --children  two-step catalogs (--rows first tokens, then ~m children per row drawn without repeats
              from V; step 1 forced sparse) for every m: a search's middle step, density set directly;
  --items     make_catalog.py's skewed catalogs (zerogr_build.synthetic) of L=3, step 1 forced sparse:
              catalogs from 100k to 20M items; density grows with the catalog.

Columns: mean children of the table's rows and of the rows the beams are on, the slot cap K, the median
ms of each mode over --repeats interleaved rounds (round 0 warms up), full / selective_numba, and the
mode the heuristic picks with whether it is the fastest measured mode ("ok"), or how much slower than it
the pick is.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.scoring import available_modes
from zerogr_build.runtime.slots import child_counts
from zerogr_build.synthetic import generate_sids
from zerogr_build.testing import SeededModel
from zerogr_build.tune.timing import timer


def two_step_sids(rows: int, children: int, codebook: int, seed: int) -> np.ndarray:
    """SIDs [rows * ~children, 2]: `rows` first tokens, each with ~`children` distinct second tokens (the
    count varies +-50% from row to row, so some rows overflow the p99 slot cap like real ones)."""
    rng = np.random.default_rng(seed)
    counts = np.clip(rng.integers(children // 2, children + children // 2 + 1, size=rows), 1, codebook)
    parts = []
    for row, count in enumerate(counts.tolist()):
        tokens = rng.choice(codebook, size=count, replace=False)
        parts.append(np.stack([np.full(count, row), tokens], axis=1))
    return np.concatenate(parts).astype(np.int64)


def time_step(index, sizes, step: int, args, time_once) -> dict:
    """Median ms of Decoder.step at `step` per available mode, plus the table's and beams' densities."""
    device = torch.device("cpu")
    model = SeededModel(  # the weights and step function of scripts/bench_decode.py
        sizes, args.seed, args.batch, dim=args.dim, scale=args.dim**-0.5, emb_scale=0.3, req_scale=0.3
    )
    step_fn = model.step_fn
    dec = Decoder(index, model.layers(), device=device)
    modes = [m for m in args.modes.split(",") if m in available_modes(device)]
    with torch.no_grad():
        state = dec.start(args.batch, args.beam)
        for t in range(step):
            state = dec.step(state, step_fn(t, state.prefixes, state.batch), mode="full")
        hidden = step_fn(step, state.prefixes, state.batch)
        samples: dict[str, list[float]] = {m: [] for m in modes}
        for round_ in range(args.repeats + 1):
            for mode in modes:
                ms = time_once(lambda m=mode: dec.step(state, hidden, mode=m))
                if round_:
                    samples[mode].append(ms)
    table = dec.steps[step]
    counts = child_counts(index.steps[step])
    alive = state.rows[state.rows >= 0].numpy()
    return {
        "format": index.steps[step].format,
        "mean": float(counts.mean()),
        "visited": float(counts[alive].mean()) if alive.size else 0.0,
        "cap": table.cap,
        "ms": {m: statistics.median(v) for m, v in samples.items()},
        "auto": dec.mode_for(step, args.batch),
    }


def row(label: str, r: dict) -> str:
    ms = r["ms"]
    best = min(ms, key=ms.__getitem__)
    pick = r["auto"]
    verdict = "ok" if pick == best else f"{ms[pick] / ms[best]:.2f}x slower than {best}"
    cells = "".join(f"{ms.get(m, float('nan')):>12.2f}" for m in ("full", "selective", "selective_numba"))
    speedup = ms["full"] / ms["selective_numba"] if "selective_numba" in ms else float("nan")
    return (
        f"{label:>10} {r['mean']:>9.1f} {r['visited']:>9.1f} {r['cap']:>6} {cells} {speedup:>9.2f}x"
        f"  {pick:<16} {verdict}"
    )


HEADER = (
    f"{'':>10} {'mean ch':>9} {'beams ch':>9} {'K':>6} {'full ms':>12} {'selective':>12} {'sel_numba':>12}"
    f" {'full/numba':>10}  {'heuristic':<16} pick"
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--children", default="2,4,8,16,32,64,128,256,512,1024,2048,4096")
    parser.add_argument("--rows", type=int, default=1024, help="first tokens of the two-step catalogs")
    parser.add_argument("--items", default="100000,300000,1000000,3000000,10000000,20000000")
    parser.add_argument("--codebook", type=int, default=8192)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--beam", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--modes", default="full,selective,selective_numba", help="modes to time")
    args = parser.parse_args(argv)
    time_once = timer(torch.device("cpu"))
    if "selective_numba" in available_modes("cpu"):
        from zerogr_build.runtime.scoring import selective_numba

        t0 = time.perf_counter()
        selective_numba.warm_up((torch.float32,))
        print(f"# numba kernel warm-up {time.perf_counter() - t0:.1f} s (untimed)")
    print(
        f"# CPU, torch threads {torch.get_num_threads()}, V={args.codebook}, d={args.dim}, "
        f"batch {args.batch} x beam {args.beam}, fp32, filter_first; "
        f"median of {args.repeats} interleaved rounds"
    )
    children = [int(v) for v in args.children.split(",") if v.strip()]
    if children:
        print(f"\n## two-step catalogs: {args.rows} rows x ~m children, step 1 timed")
        print(HEADER.replace(f"{'':>10}", f"{'m':>10}", 1))
        for m in children:
            sizes = [args.rows, args.codebook]
            sids = two_step_sids(args.rows, m, args.codebook, args.seed)
            index = build_index(sids, sizes, step_formats="1=sparse")
            print(row(str(m), time_step(index, sizes, 1, args, time_once)), flush=True)
    items = [int(v) for v in args.items.split(",") if v.strip()]
    if items:
        print("\n## skewed catalogs (make_catalog.py), L=3, step 1 (the middle step, forced sparse) timed")
        print(HEADER.replace(f"{'':>10}", f"{'items':>10}", 1))
        for n in items:
            sizes = [args.codebook] * 3
            sids = generate_sids(n, sizes, seed=args.seed, mode="skewed")  # bench_decode.py's catalogs
            index = build_index(sids, sizes, step_formats="1=sparse")
            print(row(f"{n:,}", time_step(index, sizes, 1, args, time_once)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
