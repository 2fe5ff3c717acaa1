"""Item-constraint benchmark: the same search with and without item constraints, and a mask swap.

    python scripts/bench_constraints.py                  # CPU: 1M items, L=3, V=8192, d=128, 16 x 64 beams
    python scripts/bench_constraints.py --device cuda:0  # the same on a GPU (scripts/gpu_check.sh)
    python scripts/bench_constraints.py --swap-items 0   # skip the 10M-item mask swap
    python scripts/bench_constraints.py --threads 1      # a shared CPU: one torch thread (no pool waits)

Rows (same index, weights, step function, order and mode in every search row; median of --iters, after
--warmup untimed calls, interleaved so drift hits every row alike):
  no item constraints           the baseline
  availability 50%              a global ItemMask with half the items available
  + exclude 200 / request       each request also excludes 200 item ids (already seen)
  + include 2 of 20 sets        each request also names 2 of 20 overlapping item sets (category-only)
  start() of that search        the host-side compile of the include/exclude lists (included above)
The min column is there for shared machines (other jobs only ever add time). "paired x" is the median over
iterations of (the row's time / the baseline's time in the same iteration): the rows of one iteration run
back to back, so a neighbour's burst inflates both and the ratio holds up on a busy machine.
Target: the last search row <= 1.3x the baseline on CPU (paired). Then set_availability on the same
decoder (sets attached: their per-row words are recomputed too), the device bytes of one mask + sets
(O(rows)), and set_availability on a bundle of --swap-items items without sets (target <= 60 ms on CPU).
Every iteration's times and ratios are printed too (--quiet: only the medians), so a shared machine's
bursts show instead of hiding in a median.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from zerogr_build.index import build_index
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.runtime.items.constraints import ItemMask, ItemSets
from zerogr_build.synthetic import generate_sids
from zerogr_build.testing import SeededModel
from zerogr_build.tune.timing import timer


def make_decoder(items: int, sizes: list[int], dim: int, batch: int, device: str, seed: int):
    sids = generate_sids(items, sizes, seed=seed, mode="skewed")
    t0 = time.perf_counter()
    index = build_index(sids, sizes)
    build_s = time.perf_counter() - t0
    model = SeededModel(sizes, seed, batch_size=batch, dim=dim, bias=True)
    model.base, model.req = model.base.to(device), model.req.to(device)
    model.emb = [e.to(device) for e in model.emb]
    return index, model, Decoder(index, model.layers(), device=device), build_s


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000)
    ap.add_argument("--sizes", default="8192,8192,8192")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--beam", type=int, default=64)
    ap.add_argument("--order", default="filter_first")
    ap.add_argument("--mode", default=None, help="scoring mode of every step (default: the decoder's choice)")
    ap.add_argument("--available", type=float, default=0.5, help="share of available items")
    ap.add_argument("--exclude", type=int, default=200, help="excluded item ids per request")
    ap.add_argument("--sets", type=int, default=20)
    ap.add_argument("--include", type=int, default=2, help="include sets named per request")
    ap.add_argument(
        "--swap-items", type=int, default=10_000_000, help="items of the mask-swap bundle (0: skip)"
    )
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=7)
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads", type=int, default=0, help="torch intra-op threads (0: torch's default); 1 on a busy box"
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quiet", action="store_true", help="print only the medians, not every iteration")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    sizes = [int(v) for v in args.sizes.split(",")]
    rng = np.random.default_rng(args.seed)
    time_ms = timer(args.device)

    index, model, dec, build_s = make_decoder(args.items, sizes, args.dim, args.batch, args.device, args.seed)
    n = index.num_items  # an in-memory index: item ids are catalog rows 0..n-1
    mask = ItemMask.from_bool(index, rng.random(n) < args.available)
    set_of = rng.integers(0, args.sets, size=n)
    second = rng.random(n) < 0.2  # 20% of items also belong to a second set: the sets overlap
    sets = {}
    for s in range(args.sets):
        also = np.flatnonzero(second & (set_of == (s + 1) % args.sets))
        sets[f"c{s}"] = np.concatenate([np.flatnonzero(set_of == s), also])
    item_sets = ItemSets.from_mapping(index, sets)
    exclude = [rng.choice(n, args.exclude, replace=False).tolist() for _ in range(args.batch)]
    include = [
        [f"c{s}" for s in rng.choice(args.sets, args.include, replace=False)] for _ in range(args.batch)
    ]

    plain = Decoder(index, model.layers(), device=args.device)  # no item constraints ever set
    dec.set_availability(mask)
    dec.set_item_sets(item_sets)
    avail_only = Decoder(index, model.layers(), device=args.device)
    avail_only.set_availability(mask)

    def search(decoder, excl=None, incl=None):
        return decoder.search(model.step_fn, args.batch, args.beam, mode=args.mode, order=args.order,
                              include=incl, exclude=excl)  # fmt: skip

    cases = {
        "no item constraints": lambda: search(plain),
        f"availability {args.available:.0%}": lambda: search(avail_only),
        f"+ exclude {args.exclude} / request": lambda: search(dec, exclude),
        f"+ include {args.include} of {args.sets} sets": lambda: search(dec, exclude, include),
        "start() of that search": lambda: dec.start(
            args.batch, args.beam, args.order, include=include, exclude=exclude
        ),  # fmt: skip
    }
    for _ in range(args.warmup):
        for fn in cases.values():
            fn()
    times: dict[str, list[float]] = {name: [] for name in cases}
    for _ in range(args.iters):
        for name, fn in cases.items():
            times[name].append(time_ms(fn))
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}
    base, base_low = med["no item constraints"], best["no item constraints"]

    print(f"# bench_constraints: {n:,} items, L={len(sizes)}, V={sizes}, d={args.dim}, batch {args.batch} x "
          f"beam {args.beam}, {args.order}, mode={args.mode or 'auto'}, device {args.device}, "
          f"torch threads {torch.get_num_threads()}, index build {build_s:.1f} s")  # fmt: skip
    baseline = times["no item constraints"]
    ratios = {name: [t / b for t, b in zip(v, baseline, strict=True)] for name, v in times.items()}
    paired = {name: statistics.median(v) for name, v in ratios.items()}
    if not args.quiet:
        print("every iteration, ms (x the baseline of the same iteration):")
        for name, v in times.items():
            runs = " ".join(f"{t:.1f}({r:.2f}x)" for t, r in zip(v, ratios[name], strict=True))
            print(f"  {name:<32} {runs}")
    print(f"{'search':<34} {'median ms':>10} {'x baseline':>11} {'min ms':>10} {'x baseline':>11} "
          f"{'paired x':>9}")  # fmt: skip
    for name, ms in med.items():
        low = best[name]
        print(f"{name:<34} {ms:>10.2f} {ms / base:>10.2f}x {low:>10.2f} {low / base_low:>10.2f}x "
              f"{paired[name]:>8.2f}x")  # fmt: skip
    verdict = paired[f"+ include {args.include} of {args.sets} sets"]
    verdict_word = "PASS" if verdict <= 1.3 else "FAIL"
    print(f"target: all constraints <= 1.30x baseline (paired): {verdict:.2f}x {verdict_word}")
    flipped = ItemMask(~mask.available, mask.binding)
    with_sets = [time_ms(lambda m=m: dec.set_availability(m)) for m in (mask, flipped) * 3]
    dec.set_availability(mask)
    label = f"set_availability + {args.sets} sets"
    print(f"{label:<34} {statistics.median(with_sets):>10.2f} ms   (min {min(with_sets):.2f}; {n:,} items, "
          "the sets' row words follow the mask)")  # fmt: skip
    held = dec._resident.device_bytes()
    print(f"one mask + {args.sets} sets on the device: {held / 2**20:.1f} MiB ({index.num_items:,} items, "
          f"{sum(dec._resident.space.rows):,} rows)")  # fmt: skip

    if args.swap_items:
        del dec, index
        big, big_model, big_dec, big_build = make_decoder(
            args.swap_items, sizes, 8, 1, args.device, args.seed + 1
        )
        masks = [ItemMask.from_bool(big, rng.random(big.num_items) < args.available) for _ in range(3)]
        big_dec.set_availability(
            masks[0]
        )  # the first call also lays out the item geometry (once per decoder)
        # each swap to a mask other than the one in place (setting the current mask again is a no-op)
        swap = [time_ms(lambda m=m: big_dec.set_availability(m)) for m in (masks[1:] + masks[:1]) * 3]
        ms = statistics.median(swap)
        held = big_dec._resident.device_bytes()
        if not args.quiet:
            print(f"every swap, ms: {' '.join(f'{t:.1f}' for t in swap)}")
        print(f"{'set_availability, ' + f'{big.num_items:,} items':<34} {ms:>10.2f} ms   "
              f"(min {min(swap):.2f}) target <= 60 ms: {'PASS' if ms <= 60 else 'FAIL'}; on the device "
              f"{held / 2**20:.1f} MiB (rows {sum(big_dec._resident.space.rows):,}), "
              f"build {big_build:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main()
