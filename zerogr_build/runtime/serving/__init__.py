"""Serving live bundle versions (docs/serving.md).

    hotswap.py      HotSwap: load the next version beside the live one, then swap with one assignment
    follow.py       follow() -> Follower: serve an OUT dir's LATEST and swap as it moves (drives a HotSwap)
    gauges.py       the follower's Prometheus gauges (a collector read at scrape time)

This package imports nothing itself.
"""
