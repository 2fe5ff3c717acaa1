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

Nothing here imports numpy, torch, cupy or CUDA at import time: every name but the errors loads on first
use.
The Decoder's step state (BeamState) and everything else is reached through its submodule.
"""

from typing import TYPE_CHECKING

from .base.errors import BundleError, InputError, ZerogrError
from .base.version import __version__ as __version__

if TYPE_CHECKING:  # for type checkers and the API docs; at run time these load on first use (_LAZY)
    from .bundle import Bundle, open_bundle, promote_bundle, publish_bundle, verify_bundle
    from .catalog import Catalog, read_catalog
    from .compare import run_compare, run_gate
    from .index import SidIndex, build_index
    from .pipeline import build_bundle, inspect_bundle
    from .runtime.decoder import Decoder, SearchResult
    from .runtime.items.constraints import ItemMask, ItemSets
    from .runtime.serving.follow import Follower, follow
    from .runtime.serving.hotswap import HotSwap
    from .tune import tune_bundle

#: Every other public name loads on first use, so `import zerogr_build` (and the `zerogr` command's start,
#: before its signal handlers are installed) stays light.
_LAZY = {
    "Bundle": "zerogr_build.bundle",
    "open_bundle": "zerogr_build.bundle",
    "promote_bundle": "zerogr_build.bundle",
    "publish_bundle": "zerogr_build.bundle",
    "verify_bundle": "zerogr_build.bundle",
    "Catalog": "zerogr_build.catalog",
    "read_catalog": "zerogr_build.catalog",
    "SidIndex": "zerogr_build.index",
    "build_index": "zerogr_build.index",
    "ItemMask": "zerogr_build.runtime.items.constraints",
    "ItemSets": "zerogr_build.runtime.items.constraints",
    "Follower": "zerogr_build.runtime.serving.follow",
    "follow": "zerogr_build.runtime.serving.follow",
    "HotSwap": "zerogr_build.runtime.serving.hotswap",
    "Decoder": "zerogr_build.runtime.decoder",
    "SearchResult": "zerogr_build.runtime.decoder",
    "tune_bundle": "zerogr_build.tune",
    "build_bundle": "zerogr_build.pipeline",
    "inspect_bundle": "zerogr_build.pipeline",
    "run_compare": "zerogr_build.compare",
    "run_gate": "zerogr_build.compare",
}


def __getattr__(name: str):
    """The public names but the errors load on first use (numpy, pyarrow, numba, torch: see _LAZY)."""
    if name in _LAZY:
        import importlib

        value = globals()[name] = getattr(importlib.import_module(_LAZY[name]), name)
        return value
    raise AttributeError(f"module 'zerogr_build' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


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
