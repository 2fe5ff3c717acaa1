"""Latency distributions of scripts/bench_decode.py: the tails table (--tails) and the busy-neighbour table
(--neighbour); what each measures and its target are in bench_decode.py's docstring."""

from __future__ import annotations

import os
import time

import numpy as np
import torch

from zerogr_build.base.dtypes import torch_dtype
from zerogr_build.runtime.decoder import Decoder
from zerogr_build.testing import SeededModel

TAIL_ROWS = (
    ("filter_first/auto", "filter_first", None),
    ("score_first/full", "score_first", "full"),
)
TAIL_PERCENTILES = (50.0, 99.0, 99.9)


def timed_search(dec: Decoder, step_fn, args, order: str, mode, clock) -> tuple[list[float], float]:
    """One search as Decoder.search runs it (step_fn, then the step, L times; finish), with each step's
    ms (the decoder's step alone) and the whole search's ms (step_fn and finish included)."""
    t_start = clock()
    state = dec.start(args.batch, args.beam, order)
    steps = []
    for t in range(dec.num_steps):
        hidden = step_fn(t, state.prefixes, state.batch)
        t0 = clock()
        state = dec.step(state, hidden, mode=mode)
        steps.append((clock() - t0) * 1e3)
    dec.finish(state)
    return steps, (clock() - t_start) * 1e3


def tail_lines(samples: dict[str, dict], num_steps: int) -> list[str]:
    """The tails table: one line per row and per step / whole search, with p50, p99 and p99.9 in ms."""
    names = "".join(f"{'p' + format(p, 'g'):>10}" for p in TAIL_PERCENTILES)
    lines = [f"{'order/mode':<22}{'what':<10}{names}{'max':>10}"]
    for label, r in samples.items():
        rows = [*((f"step {t}", r["steps"][t]) for t in range(num_steps)), ("search", r["search"])]
        for what, values in rows:
            cells = "".join(f"{float(np.percentile(values, p)):>10.2f}" for p in TAIL_PERCENTILES)
            lines.append(f"{label:<22}{what:<10}{cells}{max(values):>10.2f}")
    return lines


def bench_tails(index, sizes, args, device) -> list[str]:
    """Lines of the tails table: `args.tails` searches per row of TAIL_ROWS, interleaved (one of each row
    in turn, so load on a shared machine hits both alike), after one untimed warm-up search per row."""
    model = SeededModel(
        sizes, args.seed, args.batch, dim=args.dim, scale=args.dim**-0.5, emb_scale=0.3, req_scale=0.3
    )
    step_fn = model.to(device).step_fn
    dec = Decoder(index, model.layers(torch_dtype(args.dtype)), device=device)
    if device.type == "cuda":

        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
    else:
        clock = time.perf_counter
    samples = {label: {"steps": [[] for _ in range(dec.num_steps)], "search": []} for label, *_ in TAIL_ROWS}
    with torch.no_grad():
        for _, order, mode in TAIL_ROWS:
            timed_search(dec, step_fn, args, order, mode, clock)
        for _ in range(args.tails):
            for label, order, mode in TAIL_ROWS:
                steps, search = timed_search(dec, step_fn, args, order, mode, clock)
                for t, ms in enumerate(steps):
                    samples[label]["steps"][t].append(ms)
                samples[label]["search"].append(search)
    head = (
        f"# tails: {args.tails} searches per row, interleaved; ms per step (the decoder's step alone) and "
        "per whole search (step function and finish included)"
    )
    fast, slow = (samples[label]["search"] for label, *_ in TAIL_ROWS)
    ratios = ", ".join(
        f"p{p:g} {np.percentile(slow, p) / np.percentile(fast, p):.2f}x" for p in TAIL_PERCENTILES
    )
    ratio_line = f"whole search, {TAIL_ROWS[1][0]} / {TAIL_ROWS[0][0]} at the same percentile: {ratios}"
    return [head, *tail_lines(samples, dec.num_steps), ratio_line]


NEIGHBOUR_CODE = """
import hashlib, sys, threading
block = bytes(1 << 20)
def spin():
    while True:
        hashlib.sha256(block).digest()
for _ in range(int(sys.argv[1])):
    threading.Thread(target=spin, daemon=True).start()
threading.Event().wait()
"""
NEIGHBOUR_ROWS = (
    ("filter_first/auto", "filter_first", None),
    ("filter_first/full", "filter_first", "full"),
    ("score_first/full", "score_first", "full"),
)


def bench_neighbour(index, sizes, args, device, time_once) -> list[str]:
    """Lines of the neighbour table: p50 / p99 whole-search ms per row, quiet and busy (see docstring)."""
    import signal
    import subprocess
    import sys

    model = SeededModel(
        sizes, args.seed, args.batch, dim=args.dim, scale=args.dim**-0.5, emb_scale=0.3, req_scale=0.3
    )
    step_fn = model.to(device).step_fn
    dec = Decoder(index, model.layers(torch_dtype(args.dtype)), device=device)
    searches = {
        label: (lambda o=order, m=mode: dec.search(step_fn, args.batch, args.beam, mode=m, order=o))
        for label, order, mode in NEIGHBOUR_ROWS
    }
    for run in searches.values():  # warm-up (numba compile or cache load, first-touch pages)
        run()
    samples = {(label, busy): [] for label in searches for busy in (False, True)}
    phases = max(2, args.neighbour_phases)
    per_phase = max(1, -(-args.neighbour_searches // (phases // 2)))
    neighbour = subprocess.Popen([sys.executable, "-c", NEIGHBOUR_CODE, str(args.neighbour)])
    try:
        neighbour.send_signal(signal.SIGSTOP)
        with torch.no_grad():
            for phase in range(phases):
                busy = phase % 2 == 1
                neighbour.send_signal(signal.SIGCONT if busy else signal.SIGSTOP)
                time.sleep(0.3)  # the neighbour's threads running (or gone) before the first search
                for _ in range(per_phase):
                    for label, run in searches.items():
                        samples[(label, busy)].append(time_once(run))
    finally:
        neighbour.send_signal(signal.SIGCONT)
        neighbour.kill()
        neighbour.wait()
    count = len(samples[(NEIGHBOUR_ROWS[0][0], False)])
    lines = [
        f"# beside a neighbour: {args.neighbour} CPU-bound threads in another process; {count} searches per "
        f"row and condition, in {phases} alternating quiet / busy phases; torch threads "
        f"{torch.get_num_threads()}; OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY') or 'unset'}",
        f"{'order/mode':<22}{'quiet p50':>11}{'quiet p99':>11}{'busy p50':>11}{'busy p99':>11}"
        f"{'p99 busy/quiet':>16}",
    ]
    ratio = {}
    for label in searches:
        quiet, busy = samples[(label, False)], samples[(label, True)]
        q50, q99 = (float(np.percentile(quiet, p)) for p in (50, 99))
        b50, b99 = (float(np.percentile(busy, p)) for p in (50, 99))
        ratio[label] = b99 / q99
        lines.append(f"{label:<22}{q50:>11.2f}{q99:>11.2f}{b50:>11.2f}{b99:>11.2f}{ratio[label]:>15.2f}x")
    auto, score = ratio["filter_first/auto"], ratio["score_first/full"]
    ok = auto <= 2.0 and auto <= score * 1.05
    lines.append(
        f"target: filter_first/auto p99 busy/quiet {auto:.2f}x <= 2x and <= score_first/full's {score:.2f}x "
        f"(5% tolerance): {'PASS' if ok else 'FAIL'}"
    )
    return lines
