"""zerogr: per-step constrained-decoding indexes for generative recommenders.

This is the public API of zerogr; everything else is reached through its submodules.

    read_catalog(path, ...) -> Catalog                      a Parquet SID catalog, validated
    build_index(sids, codebook_sizes) -> SidIndex           the step tables, in memory (pure numpy/numba)
    publish_bundle / promote_bundle                         the versioned on-disk bundle (bundle-format.md)
    open_bundle(path) -> Bundle / verify_bundle(path)       read (checksums, shapes) / check every invariant
    build_bundle(catalog, settings) / inspect_bundle(path)  `zerogr build` / `zerogr inspect` as calls
    Decoder(index_or_bundle, weights, device, order, plan)  constrained beam search (torch)
    SearchResult                                             what Decoder.search returns
    ItemMask / ItemSets                                      serve-time item constraints (docs/constraints.md)
    HotSwap                                                  load the next version beside the live one, swap
    follow(out, weights, ...) -> Follower                    serve OUT/LATEST, swap as it moves (serving.md)
    tune_bundle(bundle, ...)                                 per-step scoring plans measured on a device
    run_compare(bundle, model, requests) / run_gate(...)     filter-first vs score-first; the quality gate
    ZerogrError / InputError / BundleError                   what zerogr raises

Nothing here imports torch, cupy or CUDA at import time: the names that need torch load on first use.
The Decoder's step state (BeamState) and everything else is reached through its submodule.
"""

from .base.errors import BundleError, InputError, ZerogrError
from .bundle import Bundle, open_bundle, promote_bundle, publish_bundle, verify_bundle
from .catalog import Catalog, read_catalog
from .index import SidIndex, build_index
from .runtime.items.constraints import ItemMask, ItemSets
from .runtime.serving.follow import Follower, follow
from .runtime.serving.hotswap import HotSwap

__version__ = "0.1.0"

_LAZY = {
    "Decoder": "zerogr_build.runtime.decoder",
    "SearchResult": "zerogr_build.runtime.decoder",
    "tune_bundle": "zerogr_build.tune",
    "build_bundle": "zerogr_build.pipeline",
    "inspect_bundle": "zerogr_build.pipeline",
    "run_compare": "zerogr_build.compare",
    "run_gate": "zerogr_build.compare",
}


def __getattr__(name: str):
    """The names that import torch or the build pipeline (the Decoder, tune, build, compare) load on
    first use."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerogr_build' has no attribute {name!r}")


__all__ = [
    "Bundle",
    "BundleError",
    "Catalog",
    "Decoder",
    "Follower",
    "HotSwap",
    "InputError",
    "ItemMask",
    "ItemSets",
    "SearchResult",
    "SidIndex",
    "ZerogrError",
    "build_bundle",
    "build_index",
    "follow",
    "inspect_bundle",
    "open_bundle",
    "promote_bundle",
    "publish_bundle",
    "read_catalog",
    "run_compare",
    "run_gate",
    "tune_bundle",
    "verify_bundle",
]
