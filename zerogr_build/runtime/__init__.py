"""The serving side: filter-first constrained beam search over a bundle's step tables.

    decoder.py      Decoder (zerogr_build.Decoder loads it on first use); beams.py: BeamState, SearchResult
    items/          item constraints: ItemMask, ItemSets (items/constraints.py), how the Decoder applies them
    serving/        live versions: HotSwap (serving/hotswap.py), follow() and Follower (serving/follow.py)
    slots.py        slot caps and candidate slots per beam; lanes.py: overflow lanes of heavy beams
    device_tables.py  step tables on the decoder's device; stream.py: double-buffered loading onto a device
    scoring/        scoring modes (full, selective, selective_cuda) and the CUDA kernels
    plan.py         tuned plans (plans/<device>.json) and the mode heuristic; order.py: order="auto"
    weights.py      per-step output layers
    device.py       device strings and identity; dtypes.py: dtype names

This package imports nothing itself, so `import zerogr_build.base.device` does not pay for torch.
"""
