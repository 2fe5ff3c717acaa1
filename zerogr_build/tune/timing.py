"""Timing for tune (and the decode benchmark): one call in milliseconds, interleaved rounds, medians."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch


def timer(device: str | torch.device) -> Callable[[Callable[[], Any]], float]:
    """Returns time_ms(fn): one call of fn, in milliseconds (CUDA events on a GPU, perf_counter on CPU)."""
    if torch.device(device).type == "cuda":

        def time_cuda(fn: Callable[[], Any]) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return float(start.elapsed_time(end))

        return time_cuda

    def time_cpu(fn: Callable[[], Any]) -> float:
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3

    return time_cpu


def time_modes(
    run: Callable[[str], Any], modes: Sequence[str], time_ms: Callable, *, warmup: int, iters: int
) -> dict[str, float]:
    """Median ms of run(mode) per mode: `warmup` untimed calls each, then `iters` interleaved rounds (each
    round times every mode once, so drift in clock speed or load hits all modes alike)."""
    for mode in modes:
        for _ in range(warmup):
            run(mode)
    samples: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(iters):
        for mode in modes:
            samples[mode].append(time_ms(lambda m=mode: run(m)))
    return {m: float(statistics.median(v)) for m, v in samples.items()}


def fastest(timings: dict[str, float]) -> str:
    """The mode with the smallest median (ties: the first listed, i.e. the registry's order)."""
    return min(timings, key=lambda m: timings[m])


__all__ = ["fastest", "time_modes", "timer"]
