"""The serving side: filter-first constrained beam search over a bundle's step tables.

    decoder.py      Decoder, BeamState, SearchResult (zerogr_build.Decoder loads it on first use)
    constraints.py  ItemMask, ItemSets (torch-free; ids checked in item_ids.py, files read by item_files.py);
                    item_space.py (per mask / sets), item_requests.py + item_kills.py (per search),
                    item_filter.py (per step): how the Decoder applies them
    slots.py        slot caps and candidate slots per beam; lanes.py: overflow lanes of heavy beams
    scoring/        scoring modes (full, selective, selective_cuda) and the CUDA kernels
    plan.py         tuned plans (plans/<device>.json) and the mode heuristic
    weights.py      per-step output layers
    device.py       device strings and identity; dtypes.py: dtype names
    stream.py, hotswap.py   loading tables onto a device, swapping versions

This package imports nothing itself, so `import zerogr_build.runtime.device` does not pay for torch.
"""
