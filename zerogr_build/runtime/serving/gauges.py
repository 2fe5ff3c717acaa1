"""The follower's Prometheus gauges: a prometheus_client collector that reads a Follower at scrape time.

    zerogr_follower_live_version                      the version number being served (absent: none yet)
    zerogr_follower_last_swap_timestamp_seconds       when the live version was swapped in (unix seconds)
    zerogr_follower_swaps_total                       swaps done, the first load included
    zerogr_follower_failures_total                    versions that failed to load (or unreadable LATESTs)
    zerogr_follower_last_failure_timestamp_seconds    when the last failure happened
    zerogr_follower_loading                           1 while a load runs (an abandoned one included), else 0
    zerogr_follower_abandoned_loads                   abandoned loads still running (0, 1 or 2)

prometheus_client is imported only when a collector is made (`Follower(..., registry=...)`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol


class FollowerState(Protocol):
    """What the collector reads of a Follower (follow.py)."""

    last_swap_at: float | None
    swaps: int
    failures: int
    last_error_at: float | None

    @property
    def version(self) -> int | None: ...

    @property
    def loading(self) -> bool: ...

    @property
    def abandoned_loads(self) -> tuple[Path, ...]: ...


def follower_collector(follower: FollowerState) -> Any:
    """A prometheus_client collector reading `follower`'s state at scrape time."""
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

    class FollowerCollector:
        def describe(self) -> Iterator[Any]:
            return self._families(with_values=False)

        def collect(self) -> Iterator[Any]:
            return self._families(with_values=True)

        def _families(self, with_values: bool) -> Iterator[Any]:
            def gauge(name: str, doc: str, value: float | None) -> Any:
                family = GaugeMetricFamily(name, doc)
                if with_values and value is not None:
                    family.add_metric([], value)
                return family

            def counter(name: str, doc: str, value: float) -> Any:
                family = CounterMetricFamily(name, doc)
                if with_values:
                    family.add_metric([], value)
                return family

            yield gauge("zerogr_follower_live_version", "The bundle version being served.", follower.version)
            yield gauge(
                "zerogr_follower_last_swap_timestamp_seconds",
                "When the live version was swapped in (unix seconds).",
                follower.last_swap_at,
            )
            yield counter("zerogr_follower_swaps", "Versions swapped in, the first included.", follower.swaps)
            yield counter(
                "zerogr_follower_failures", "Versions that failed to load (kept serving the old one).",
                follower.failures,
            )  # fmt: skip
            yield gauge(
                "zerogr_follower_last_failure_timestamp_seconds",
                "When the last version failed to load (unix seconds).",
                follower.last_error_at,
            )
            yield gauge(
                "zerogr_follower_loading",
                "1 while a version is loading (an abandoned load still running included).",
                float(follower.loading),
            )
            yield gauge(
                "zerogr_follower_abandoned_loads",
                "Loads dropped after load_timeout that are still running (they hold device memory).",
                float(len(follower.abandoned_loads)),
            )

    return FollowerCollector()


__all__ = ["FollowerState", "follower_collector"]
